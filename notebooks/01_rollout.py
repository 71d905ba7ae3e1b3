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
# # 01 · Generation: B prompts x G samples
#
# The rollout samples G completions for each of B prompts in **one** `generate` call (left padding, KV
# cache, model in eval mode, seeded), and keeps the sampler's own log-probability of every sampled token,
# so phase 2 can check that recomputing them gives the same numbers.

# %% [markdown]
# The sampling itself, the readable path (`StepConfig.fast`, on by default, computes each prompt's keys and
# values once per group instead: the same samples, tested):

# %%
from grpo_debug.rollout import sample
from grpo_debug.ui.notebook import show_source

show_source(sample)

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

# %%
run = step.run(cfg, until="rollout")
r = run.rollout
print(f"{r.num_samples} samples = {len(r.prompts)} prompts x {r.num_generations}; "
      f"prompt width {r.prompt_ids.shape[1]} tokens (left-padded), completion width {r.completion_ids.shape[1]}")

# %%
import pandas as pd

table = pd.DataFrame({"group": [i // r.num_generations for i in range(r.num_samples)],
                      "task": [r.prompts[i // r.num_generations][:2] for i in range(r.num_samples)],
                      "length": r.completion_lengths.tolist(), "finished": r.finished.tolist(),
                      "completion": [c[:80] for c in r.completions]})
table.head(16)

# %% [markdown]
# The table cuts each completion short. An A: completion carries its fields (the position after
# the move, the reward, whether the game ended or the move was illegal) after that point; two in full:

# %%
env_rows = [i for i in range(r.num_samples) if r.prompts[i // r.num_generations].startswith("A:")]
for i in env_rows[:2]:
    print(r.prompts[i // r.num_generations] + "|" + r.completions[i])
if not env_rows:
    print("no A: prompt in this batch")

# %%
print("left padding per prompt:", (r.prompt_mask == 0).sum(1)[::r.num_generations].tolist())
print("groups whose G completions are identical:", r.identical_groups)
print("completions/mean_length:", round(r.completion_lengths.float().mean().item(), 2))

# %% [markdown]
# **What to notice.** P: prompts (the policy task) are shorter than A: prompts, so they are left-padded:
# phase 2 shows what happens when a forward pass ignores that. Identical groups give zero reward std and
# no learning signal (phase 4). One `generate` call per prompt instead of one for the batch is
# `generation="loop"`; its cost against the one-call rollout is in notebook 08.

# %% [markdown]
# ## Checks
#
# The claims the sentences above make, checked against the numbers the cells computed. nbval runs every
# notebook in CI, so a sentence that stops being true fails here instead of going stale. (An identity a cell
# demonstrates, such as "bit for bit", stays in that cell: it is part of the lesson.)

# %%
assert r.finished.all() or r.completion_lengths.max() == cfg.max_new_tokens
if CAPTURE is None:  # the bundled step's mixed task: A: prompts are longer than P: prompts
    assert (r.prompt_mask == 0).any(), "A: prompts are longer than P: prompts, so P: rows are left-padded"
print("every claim above holds")
