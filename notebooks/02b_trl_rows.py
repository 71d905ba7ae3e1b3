# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02b · Which rows TRL 1.16 gets wrong, and why
#
# **What you will learn.** Which rows of a batch TRL 1.16 as shipped scores wrong on a GPT-2 model: missing
# position_ids shift every left-padded row, dropout moves every row; and the drop-in fix for the positions.
#
# **What you need first.** Notebook 02 (the gap, and its table of pitfalls).

# %%
from grpo_debug.ui.notebook import open_step

# The model by name: None is the bundled model; "jrahn/RookWorld-LM-124M" works where the hub is reachable.
MODEL = None
# Or a step captured from your own TRL run (`grpo_debug.capture`, notebook 10): its batch, under its config.
CAPTURE = None
# With CAPTURE, your registered task (the run's reward functions): needed only where new completions are sampled.
TASK = None
# setup() first: one torch thread, the same numbers on every run
cfg, step = open_step(MODEL, CAPTURE, TASK)

# %% [markdown]
# ## Which rows TRL 1.16 gets wrong, and why
#
# GPT-2 (and so RookWorld-LM-124M) adds a learned embedding of each token's absolute position. `generate()`
# counts positions from the attention mask, so a row behind k pad tokens starts at position 0. TRL 1.16 scores
# without `position_ids`: the model counts from the first column, and every token of a padded row sits k positions
# later than when it was sampled. Unpadded rows, and models with rotary positions (Llama, Qwen), are unaffected.
# Dropout, on in TRL's default, moves every row. Below, each row's largest gap (02) on the same rollout:

# %%
import pandas as pd

from grpo_debug.config import StepConfig

pitfalls = {"no position_ids": {"position_ids": False}, "dropout on": {"dropout": True},
            "TRL 1.16 as shipped": StepConfig.preset_fields("trl")}
r = step.run(cfg, until="logprobs").rollout
rows = pd.DataFrame({"task": [p[:2] for p in r.prompts for _ in range(r.num_generations)],
                     "left padding": (r.prompt_mask == 0).sum(1).tolist()})
for name, fields in pitfalls.items():
    lp = step.run(cfg.replace(**fields), until="logprobs", remember=False).logprobs
    rows[name] = lp.sampler_gap.max(1).values.tolist()  # each row's largest gap
padded = rows["left padding"] > 0
print(f"{padded.sum()} of {len(rows)} rows are left-padded ({', '.join(sorted(set(rows.task[padded])))} prompts)")
rows.groupby(["task", "left padding"]).max().round(4)

# %% [markdown]
# The fix outside this notebook: `grpo_debug.capture.trl_bridge.PositionIdsGRPOTrainer`, a drop-in `GRPOTrainer`
# that passes `position_ids` on every scoring pass (tested on a real TRL step); `disable_dropout=True` in
# `GRPOConfig` turns dropout off.

# %% [markdown]
# ## Summary
#
# - Without `position_ids`, a GPT-2 model scores every left-padded row at shifted positions, no unpadded one.
# - Dropout moves every row; TRL 1.16 as shipped is hit by both.
# - The fixes: `PositionIdsGRPOTrainer`, and `disable_dropout=True`.

# %% [markdown]
# ## Checks
#
# *Maintainers' check, run by nbval in CI; a reader may skip it.* The claims the sentences above make, checked
# against the numbers the cells computed.

# %%
if CAPTURE is None:  # measured on the bundled step
    assert padded.any() and (~padded).any(), "the bundled batch has no padded row, or no unpadded one"
    assert rows["no position_ids"][padded].min() > 1.0, "no position_ids leaves a left-padded row in place"
    assert rows["no position_ids"][~padded].max() < 1e-4, "no position_ids moves an unpadded row"
    assert rows["dropout on"].min() > 1e-2, "dropout does not move every row"
    assert rows["TRL 1.16 as shipped"].min() > 1e-2, "TRL 1.16 as shipped leaves a row in place"
    assert rows["TRL 1.16 as shipped"][padded].min() > 1.0, "TRL 1.16 as shipped is not off by nats on padded rows"
print("every claim above holds")
