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
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 · Log-probs: six ways to get them wrong
#
# GRPO needs log pi(token) for every sampled token, under the policy and under the reference. With every
# fix on, recomputing them gives what the sampler used (up to float rounding). Each pitfall from the
# seeds breaks that on its own:
#
# | toggle | pitfall | seed |
# |---|---|---|
# | `logprob_temperature=False` | sampled at T=0.7, scored at T=1 | 004 |
# | `mask="drop_eos_and_pad"` | EOS dropped; with pad == eos a value mask drops it too | 004 |
# | `dropout=True` | model left in train mode while scoring (dropout 0.1) | RookWorld log |
# | `position_ids=False` | left-padded rows scored with shifted positions | DESIGN 4 |
# | `dtype="bfloat16"` | scored in bfloat16 | |
# | `gather="first_position"` | every token gathered from the first position's distribution | 003 |

# %%
from grpo_debug.notebook import setup
setup()  # one torch thread: the same numbers on every run

# The model by name: None is the bundled model; "jrahn/RookWorld-LM-124M" works where the hub is reachable.
MODEL = None

# %%
from grpo_debug.config import StepConfig
from grpo_debug.paths import DEFAULT_MODEL
from grpo_debug.step import GRPOStep

cfg = StepConfig(model=MODEL or DEFAULT_MODEL)
step = GRPOStep(cfg)
run = step.run(cfg, until="logprobs")
print(f"all fixes on: max |sampler - recomputed| = {run.logprobs.max_sampler_gap:.2e} nats")
assert run.logprobs.max_sampler_gap < 1e-4

# %%
from grpo_debug.tables import compare_variants

pitfalls = {"all fixes on": {}, "temperature not applied": {"logprob_temperature": False},
            "dropout on": {"dropout": True}, "no position_ids": {"position_ids": False},
            "bfloat16": {"dtype": "bfloat16"}, "seed-003 gather": {"gather": "seed003"},
            "seed-004 mask": {"mask": "seed004"}, "no mask": {"mask": "none"}}
table = compare_variants(step, pitfalls, until="loss",
                         columns=["logps/max_sampler_gap", "logps/eos_kept", "kl", "loss"])
table

# %%
from grpo_debug import plots
plots.gap_by_toggle(table["logps/max_sampler_gap"].to_dict())

# %%
for name in ["temperature not applied", "dropout on", "no position_ids", "bfloat16", "seed-003 gather"]:
    assert table.loc[name, "logps/max_sampler_gap"] > 1e-2, name
assert table.loc["all fixes on", "logps/eos_kept"] == 1.0 and table.loc["seed-004 mask", "logps/eos_kept"] == 0.0
assert table.loc["dropout on", "kl"] > 1.0  # policy with dropout vs reference without: a huge KL at step 0

# %% [markdown]
# ## Where the gap sits: no position_ids
#
# Only the left-padded rows (the P: prompts, shorter than the A: ones) are shifted; the longest prompts
# have no padding and are unaffected.

# %%
run = step.run(cfg.replace(position_ids=False), until="logprobs")
fig = plots.logprob_gap_heatmap(run.logprobs, "no position_ids: |sampler - recomputed|")
step.run(cfg, until="loss")
fig

# %% [markdown]
# ## The EOS with pad == eos
#
# GPT-2 (and RookWorld-LM-124M) pad with the EOS token. A mask built from token values (`ids != pad`)
# cannot tell the real EOS from padding and drops it: the model is never rewarded for stopping. TRL keeps
# the first EOS and masks what follows, from the lengths.

# %%
import pandas as pd
from grpo_debug.logprobs import completion_mask

r = step.result.rollout
i = int(r.finished.nonzero()[0])
end = int(r.completion_lengths[i])
ids = r.completion_ids[i, end - 3:end + 2].tolist()
pd.DataFrame({mode: completion_mask(r, mode)[i, end - 3:end + 2].tolist() for mode in ["trl", "seed004", "none"]},
             index=[f"{t}{' (EOS)' if t == r.eos_token_id else ''}" for t in ids]).T

# %% [markdown]
# **What to notice.** With every fix on the gap is float rounding (~1e-6). Dropout gives the largest
# error and, because the reference is scored without dropout (as TRL does), a KL far from 0 at step 0:
# the RookWorld debug log's "policy -440 vs reference -45". bfloat16 is small per token but not zero.
