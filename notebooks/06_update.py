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
# # 06 · Update and post-update evaluation
#
# Backward, gradient norms (total and per sample, from one backward with layer hooks), clipping, one
# AdamW step; then the same held-out test prompts are sampled with the same seeds before and after, and the
# paired difference gets a bootstrap confidence interval.

# %% [markdown]
# The update, readable path: the batch loss's backward a few rows at a time, then one backward per sample
# for the per-sample gradient norms (`StepConfig.fast` gets them from layer hooks in the same backward).

# %%
from grpo_debug.ui.notebook import show_source
from grpo_debug.update import backward, per_sample_norms, update

show_source(update)

# %%
show_source(backward, per_sample_norms)

# %%
import torch

from grpo_debug.ui.notebook import open_step

# The model by name: None is the bundled model; "jrahn/RookWorld-LM-124M" works where the hub is reachable.
MODEL = None
# Or a step captured from your own TRL run (`grpo_debug.capture`, notebook 10): its batch, under its config.
CAPTURE = None
# With CAPTURE, your registered task (the run's reward functions): needed only where new completions are sampled.
TASK = None
# setup() first: one torch thread, the same numbers on every run
cfg, step = open_step(MODEL, CAPTURE, TASK, per_sample_grad_norms=True)
run = step.run(cfg, until="update")
u = run.update
weight_norm = torch.cat([v.flatten() for v in step.initial_state.values()]).norm().item()  # the trained weights'
print(f"loss {u.loss:.2e}  but grad_norm {u.grad_norm:.4f} (clipped: {u.clipped})")
print(f"update norm {u.update_norm:.4f}: {u.update_norm / weight_norm:.3%} of the weights' norm {weight_norm:.1f}")
print("(the doctor's update_size reads this share, and the KL the update makes on the step's own completions)")

# %%
from grpo_debug.ui import plots

plots.per_sample_grad_norms(u.per_sample_grad_norms, run.advantages.values)

# %% [markdown]
# A loss that prints `0.0000` with a non-zero gradient is the normal state of a grpo step at ratio 1. Samples
# with advantage 0 (zero-std groups) get no gradient at step 0: their policy term is 0, and the KL term's
# gradient is 0 too while the policy still equals the reference.

# %%
zero = run.advantages.values == 0
norms = u.per_sample_grad_norms
if zero.any() and (~zero).any():
    in_flat_groups = len(run.advantages.zero_std_groups) * cfg.num_generations  # notebook 04's zero-std groups
    print(f"{int(zero.sum())} samples with advantage 0 ({in_flat_groups} in groups whose rewards are all equal, "
          f"{int(zero.sum()) - in_flat_groups} with a reward exactly at their group's mean): max gradient norm "
          f"{norms[zero].max():.2g}; the others: median {norms[~zero].median():.3g}")

# %%
ev = step.run(cfg).evaluation  # samples anew on the test prompts: under CAPTURE, needs TASK
print(f"reward on the test prompts before {ev.before.reward:.4f} after {ev.after.reward:.4f}: "
      f"delta {ev.delta:+.4f}, 95% CI [{ev.ci_low:+.4f}, {ev.ci_high:+.4f}]")
plots.eval_before_after(ev)

# %%
import pandas as pd

pd.DataFrame({"before": ev.before.components, "after": ev.after.components,
              "delta": ev.component_deltas})

# %% [markdown]
# **What to notice.** One step moves the reward on the test prompts by the delta printed above; the interval
# says whether that is more than sampling noise. Expect it not to be: one update at a learning rate that keeps
# training stable moves the policy by a fraction of a percent of its weights (the share printed above), and what
# a fix does to learning shows over many steps and seeds (notebook 06b; the doctor's `--horizon`), not in one.
# Try a smaller `learning_rate` or `beta`, or a pitfall from notebook 02, and re-run: the evaluation uses the same
# seeds, so the comparison is paired.

# %% [markdown]
# ## Checks
#
# The claims the sentences above make, checked against the numbers the cells computed. nbval runs every
# notebook in CI, so a sentence that stops being true fails here instead of going stale. (An identity a cell
# demonstrates, such as "bit for bit", stays in that cell: it is part of the lesson.)

# %%
if CAPTURE is None:  # the bundled step: grpo at ratio 1 with the policy at the reference
    assert abs(u.loss) < 1e-5 and u.grad_norm > 1e-3  # a loss of ~0, yet a gradient
    assert norms[zero].max() < 1e-3 * norms[~zero].median()  # zero-advantage samples send no gradient
    assert u.update_norm / weight_norm < 0.01  # "a fraction of a percent of its weights"
print("every claim above holds")
