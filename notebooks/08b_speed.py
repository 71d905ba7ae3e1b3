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
# # 08b · Where a step's time goes: phases, one `generate` call, `torch.compile`
#
# **What you will learn.** Where one GRPO step's seconds and memory go, phase by phase; what sampling a group with
# one `generate` call saves against one call per prompt; and what `torch.compile` does to the scoring forward.
#
# **What you need first.** Notebook 00 (the step's phases) and 01 (sampling). Every timing here is this machine's
# and varies from run to run; what is asserted is that compiled and eager scoring agree.

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
run = step.run(cfg, until="update")

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
# **What to notice.** Sampling and the update (a forward and a backward with gradients) take most of a step; the
# log-prob phase is a forward without gradients. `benchmarks/step.py` prints the full timing and memory table,
# including a 124M GPT-2 shape and a TRL step on the same configuration (benchmarks/README.md).

# %% [markdown]
# ## Summary
#
# - Time and memory per phase, one `generate` call against one per prompt, and `torch.compile`: measured above (they
#   vary from run to run; the compiled forward's agreement with the eager one is asserted).

# %% [markdown]
# ## Checks
#
# *Maintainers' check, run by nbval in CI; a reader may skip it.* The compiled forward's agreement is asserted in
# its cell; here, that every phase was timed.

# %%
assert set(run.timings) >= {"rollout", "logprobs", "rewards", "advantages", "loss", "update"}, sorted(run.timings)
print("every claim above holds")
