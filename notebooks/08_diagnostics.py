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
# # 08 · Diagnostics: a loss of `0.0000`, and where the time goes
#
# **What you will learn.** How to tell a normal loss of 0 from a failure, on the step's own numbers; how to read
# every token of a step (its advantage, ratio, KL, gradient); where a step's time and memory go, and what one
# `generate` call for the batch and `torch.compile` change.
#
# **What you need first.** Notebooks 04 (zero-std groups), 05 (a loss of 0 with a gradient) and 06 (the update).
#
# A training log that reads `iter 1: loss 0.0000 ... time 103634 ms` asks two questions: is the loss a
# failure, and where does the time go?

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
# ## Time and memory per phase
#
# Seconds per phase, and the process's peak resident memory after it (it only grows; a jump marks the phase
# that needed the memory). Both vary from run to run.

# %% tags=["nbval-ignore-output"]
import pandas as pd

from grpo_debug.ui import plots

print(pd.DataFrame({"seconds": {k: round(v.seconds, 2) for k, v in run.timings.items()},
                    "peak RSS after (MB)": {k: round(v.peak_rss_mb) for k, v in run.timings.items()}}))
plots.time_per_phase({k: v.seconds for k, v in run.timings.items()})

# %% tags=["nbval-ignore-output"]
from grpo_debug.rollout import rollout
from grpo_debug.specs import sampling_of
from grpo_debug.speed import kernels

sampled = {generation: rollout(step.policy, step.loaded.tokenizer, step.result.rollout.prompts,  # sampled anew
                               sampling_of(cfg.replace(generation=generation)), kernels(cfg.fast).generate).seconds
           for generation in ("batched", "loop")}
batched, loop = sampled["batched"], sampled["loop"]
print(f"one generate call: {batched:.2f} s; one call per prompt: {loop:.2f} s; ratio {loop / batched:.2f}")

# %% [markdown]
# ## torch.compile on and off
#
# The scoring forward (8 rows) eager and compiled: the first compiled call pays the compilation; the
# numbers must agree. The speed-up is the eager call's time over the compiled call's, both after their first call.
# Timings vary from run to run; the agreement is asserted. By default the forward is
# compiled with the `aot_eager` backend (traced, checked, in seconds); `INDUCTOR = True` compiles it with
# inductor's generated C++ kernels, what a training run gets (`tests/test_diagnostics.py` runs that one on
# every test run).

# %% tags=["nbval-ignore-output"]
from grpo_debug.show.diagnostics import compile_comparison

INDUCTOR = False
compiled = compile_comparison(step, rows=8, backend="inductor" if INDUCTOR else "aot_eager")
print(compiled.error or f"{compiled.rows} rows scored, after the first call: eager {compiled.eager_seconds:.3f} s, compiled "
      f"({compiled.backend}) {compiled.compiled_seconds:.3f} s: a speed-up of {compiled.speedup:.2f}x (eager / compiled)\n"
      f"the compiled first call {compiled.compiled_first_seconds:.1f} s (compilation); max |eager - compiled| log-prob "
      f"{compiled.max_abs_diff:.1e}")
assert compiled.error == ""
if step.cfg.dtype == "float32":  # bfloat16 autocast rounds differently once compiled kernels fuse ops
    assert compiled.max_abs_diff < 1e-4

# %% [markdown]
# **What to notice.** A zero loss is a failure only when the advantages (or the mask, or the log-probs)
# are zero. `benchmarks/step.py` prints the full timing and memory table, including a 124M GPT-2 shape
# and a TRL step on the same configuration.

# %% [markdown]
# ## Summary
#
# - A loss of 0 is normal under grpo at ratio 1 while the gradient is not 0; it is a failure when every advantage is 0.
# - Every token's d loss / d logp shows where the gradient goes: none into a zero-std group's tokens.
# - Time and memory per phase, one `generate` call against one per prompt, and `torch.compile`: measured above (they
#   vary from run to run).

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
