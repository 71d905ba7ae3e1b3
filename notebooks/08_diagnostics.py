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
# **What you will learn.** Telling a normal loss of 0 from a failure; where the gradient goes, token by token. A
# step's time: 08b (optional).
#
# **What you need first.** Notebooks 04, 05 and 06.

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

# %%
import dataclasses

from grpo_debug.advantages import summarize_advantages

constant = run.rewards.total.new_full((run.rollout.num_samples,), 0.5)  # the real failure: a constant reward
broken = dataclasses.replace(run, advantages=summarize_advantages(constant, cfg.num_generations))
print(textwrap.fill(triage_zero_loss(broken), 110))

# %% [markdown]
# ## Every token of the step
#
# Tokens coloured by the selected quantity. A loss near 0 still sends d loss / d logp (grpo, ratio 1:
# -A / (N |o_i|), plus the KL share) into every kept token of a sample with A not 0 (counted below), none
# into a zero-std group's.

# %%
from grpo_debug.show.token_page import notebook_view, token_values
from grpo_debug.ui.tables import gradient_reach

page = token_values(run, step.loaded.tokenizer, groups=2)  # the first two groups
print(reach := gradient_reach(page.samples))  # which kept tokens get a gradient, and which samples none
notebook_view(page)

# %% [markdown]
# ## Summary
#
# - A grpo loss of 0 at ratio 1: normal while the gradient is not 0 (none reaches a zero-std group), a failure when
#   every advantage is 0.

# %% [markdown]
# ## Checks
#
# *Maintainers' check, run by nbval in CI; a reader may skip it.* The claims the sentences above make, checked against the numbers the cells computed. nbval runs every
# notebook in CI, so a sentence that stops being true fails here instead of going stale. (An identity a cell
# demonstrates, such as "bit for bit", stays in that cell: it is part of the lesson.)

# %%
assert triage_zero_loss(broken).startswith("FAILURE") and triage_zero_loss(run).startswith("NORMAL"), "triage"
assert all(abs(a) < 1e-6 for a in reach.advantages), "a sample with no gradient has an advantage"
if CAPTURE is None:  # the bundled step (grpo, ratio 1): every kept token of a sample with A != 0 gets a gradient
    assert reach.tokens == reach.signal_tokens, f"{reach.tokens} tokens with a gradient, {reach.signal_tokens} kept"
print("every claim above holds")
