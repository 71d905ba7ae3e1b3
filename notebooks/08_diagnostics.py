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
# # 08 · Diagnostics: a loss of `0.0000`
#
# **What you will learn.** How to tell a normal loss of 0 from a failure, on the step's own numbers; how to read
# every token of a step (its advantage, ratio, KL, gradient). Where the step's time goes is notebook 08b's
# (optional).
#
# **What you need first.** Notebooks 04 (zero-std groups), 05 (a loss of 0 with a gradient) and 06 (the update).
#
# A training log that reads `iter 1: loss 0.0000 ... time 103634 ms` asks two questions: is the loss a
# failure, and where does the time go? This notebook answers the first; 08b, the second.

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
import textwrap

from grpo_debug.show.diagnostics import triage_zero_loss

run = step.run(cfg, until="update")
print(textwrap.fill(triage_zero_loss(run), 110))

# %% [markdown]
# Now the real failure: every group gets the same reward (a constant reward function).

# %%
import dataclasses

import torch

from grpo_debug.advantages import summarize_advantages

broken = dataclasses.replace(run, advantages=summarize_advantages(torch.full((run.rollout.num_samples,), 0.5),
                                                                  cfg.num_generations))
print(textwrap.fill(triage_zero_loss(broken), 110))

# %% [markdown]
# ## Every token of the step
#
# The same step token by token: each completion's tokens coloured by the quantity the selector picks (the
# advantage, the ratio, the trainer/sampler ratio, the k3 KL to the reference, the entropy, d loss / d logp, the
# mask), every value on hover, each group's prompt above its completions with their rewards. A loss that reads
# about 0 still sends a non-zero d loss / d logp into the kept tokens of every sample whose advantage is not 0
# (under grpo at ratio 1, -A / (N |o_i|) plus the KL term's share); a zero-std group's tokens get none from the policy
# term. The selector recolours once you have run this cell yourself (JupyterLab runs no script in outputs it
# did not produce). Two groups here; `python -m grpo_debug step --html tokens.html` (or
# `replay CAPTURE --html tokens.html`) writes every group to one standalone page.

# %%
from grpo_debug.show.token_page import notebook_view, token_values

page = token_values(run, step.loaded.tokenizer, groups=2)
kept = {s.index: [abs(g) for g, m in zip(s.values["gradient"], s.values["mask"]) if m] for s in page.samples}
moved = [g for grads in kept.values() for g in grads if g > 0]
still = [s for s in page.samples if not any(kept[s.index])]  # no kept token gets a gradient
print(f"loss {run.loss.loss.item():.2e}; {len(moved)} kept tokens get |d loss / d logp| from {min(moved):.1e} to "
      f"{max(moved):.1e}; samples with none: {[s.index for s in still]}, advantages {[s.advantage for s in still]}")
notebook_view(page)

# %% [markdown]
# **What to notice.** A zero loss is a failure only when the advantages (or the mask, or the log-probs)
# are zero.

# %% [markdown]
# ## Summary
#
# - A loss of 0 is normal under grpo at ratio 1 while the gradient is not 0; it is a failure when every advantage is 0.
# - Every token's d loss / d logp shows where the gradient goes: none into a zero-std group's tokens.
# - Where the step's time and memory go, one `generate` call and `torch.compile`: notebook 08b (optional).

# %% [markdown]
# ## Checks
#
# *Maintainers' check, run by nbval in CI; a reader may skip it.* The claims the sentences above make, checked against the numbers the cells computed. nbval runs every
# notebook in CI, so a sentence that stops being true fails here instead of going stale. (An identity a cell
# demonstrates, such as "bit for bit", stays in that cell: it is part of the lesson.)

# %%
assert triage_zero_loss(broken).startswith("FAILURE") and triage_zero_loss(run).startswith("NORMAL")
assert all(abs(s.advantage) < 1e-6 for s in still)  # the tokens with no gradient are the zero-advantage samples
print("every claim above holds")
