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
# **What you will learn.** The AdamW step, and why the size of one step is set by the learning rate, not by the
# gradient's norm; each sample's gradient norm (the samples with advantage 0 send none); how to read one step's
# change on held-out prompts, and why one step cannot show learning; and GRPO learning over 24 steps, from the
# committed runs of the positive control.
#
# **What you need first.** Notebook 05 (the loss and its gradient).
#
# ## The AdamW step
#
# The update backpropagates the loss, clips the gradient $g = \nabla_\theta \mathcal{L}$ to norm `max_grad_norm`
# if it is longer, and takes one AdamW step. For each weight, with step count $k$, learning rate $\eta$, weight
# decay $\lambda$ and torch's defaults $\beta_1 = 0.9$, $\beta_2 = 0.999$, $\epsilon = 10^{-8}$:
#
# $$m \leftarrow \beta_1 m + (1 - \beta_1)\, g, \qquad v \leftarrow \beta_2 v + (1 - \beta_2)\, g^2, \qquad
# \theta \leftarrow \theta - \eta \Big(\frac{m / (1 - \beta_1^k)}{\sqrt{v / (1 - \beta_2^k)} + \epsilon}
# + \lambda\, \theta\Big).$$
#
# On the first step ($k = 1$, $m = v = 0$ before it) the bias corrections give back $g$ and $g^2$, so
#
# $$\Delta\theta = -\eta\, \frac{g}{|g| + \epsilon} \approx -\eta\, \operatorname{sign}(g):$$
#
# every weight whose gradient is well above $\epsilon$ moves by $\eta$, whatever the gradient's size. Scaling the
# loss by 100, or clipping its gradient to norm 1, changes nothing, and the step's norm is about
# $\eta \sqrt{\text{number of weights with a gradient}}$. In plain torch, against `torch.optim.AdamW`:

# %%
import torch

g = torch.tensor([3.0, -0.02, 1e-6, 0.0])  # one gradient per weight: large, small, tiny, none
steps = {}
for scale in (1.0, 100.0):
    w = torch.zeros(4, requires_grad=True)
    w.grad = scale * g
    adamw = torch.optim.AdamW([w], lr=1e-4, weight_decay=0.0)
    adamw.step()
    steps[scale] = w.detach()
    print(f"gradient x {scale:<3g}: AdamW's step {' '.join(f'{v:+.2e}' for v in steps[scale].tolist())}")
by_hand = -1e-4 * g / (g.abs() + 1e-8) + 0.0  # (+ 0.0: no -0)
print(f"-lr g / (|g| + eps): by hand     {' '.join(f'{v:+.2e}' for v in by_hand.tolist())}")
print(f"(torch's AdamW defaults: betas {adamw.defaults['betas']}, eps {adamw.defaults['eps']:g})")

# %%
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
after = dict(step.policy.named_parameters())
delta = torch.cat([(after[name].detach().to(before.device) - before).flatten() for name, before in step.initial_state.items()])
weight_norm = torch.cat([v.flatten() for v in step.initial_state.values()]).norm().item()  # the trained weights'
moved = int((delta != 0).sum())
print(f"loss {u.loss:.2e}  but grad_norm {u.grad_norm:.4f} (clipped: {u.clipped}); learning rate {cfg.learning_rate:g}")
print(f"{moved / delta.numel():.2%} of the {delta.numel()} weights moved; max |delta| {delta.abs().max():.3e}; "
      f"{(delta.abs() > 0.99 * cfg.learning_rate).sum() / max(moved, 1):.1%} of them by at least 0.99 lr")
print(f"update norm {u.update_norm:.4f}; lr x sqrt(weights moved) = {cfg.learning_rate * moved ** 0.5:.4f}; "
      f"{u.update_norm / weight_norm:.3%} of the weights' norm {weight_norm:.1f}")

# %% [markdown]
# Each sample's gradient norm, from one backward with layer hooks (`per_sample_grad_norms`). A loss that prints
# `0.0000` with a non-zero gradient is the normal state of a grpo step at ratio 1 (notebook 05). Samples with
# advantage 0 (zero-std groups) get no gradient at step 0: their policy term is 0, and the KL term's gradient is 0
# too while the policy still equals the reference.

# %%
from grpo_debug.ui import plots

plots.per_sample_grad_norms(u.per_sample_grad_norms, run.advantages.values)

# %%
zero = run.advantages.values == 0
norms = u.per_sample_grad_norms
if zero.any() and (~zero).any():
    in_flat_groups = len(run.advantages.zero_std_groups) * cfg.num_generations  # notebook 04's zero-std groups
    print(f"{int(zero.sum())} samples with advantage 0 ({in_flat_groups} in groups whose rewards are all equal, "
          f"{int(zero.sum()) - in_flat_groups} with a reward exactly at their group's mean): max gradient norm "
          f"{norms[zero].max():.2g}; the others: median {norms[~zero].median():.3g}")

# %% [markdown]
# ## One step on held-out prompts
#
# The same held-out test prompts are sampled with the same seeds before and after the update, so each prompt's
# change is paired, and the mean change gets a 95% bootstrap interval over prompts.

# %%
ev = step.run(cfg).evaluation  # samples anew on the test prompts: under CAPTURE, needs TASK
apart = "told apart from 0" if ev.ci_low > 0 or ev.ci_high < 0 else "not told apart from 0: the interval holds 0"
print(f"reward on the test prompts before {ev.before.reward:.4f} after {ev.after.reward:.4f}: "
      f"delta {ev.delta:+.4f}, 95% CI [{ev.ci_low:+.4f}, {ev.ci_high:+.4f}], {apart}")
plots.eval_before_after(ev)

# %%
import pandas as pd

pd.DataFrame({"before": ev.before.components, "after": ev.after.components,
              "delta": ev.component_deltas})

# %% [markdown]
# **What to notice.** One step moves the reward on the test prompts by the delta printed above, and the interval
# says whether that is more than sampling noise (printed). Expect it not to be: one AdamW step moves each weight by
# about the learning rate, a fraction of a percent of the weights' norm (printed above), and what a step does to
# learning shows over many steps and seeds, not in one. To see the pairing at work, change one setting (a pitfall
# from notebook 02, `learning_rate`, `beta`) and re-run: the evaluation samples with the same seeds.

# %% [markdown]
# ## GRPO learning, over 24 steps
#
# One step cannot show learning; 24 can. Notebook 06b's positive control, planned before its runs
# (`data/experiments/control_plan.json`), trained the fixed configuration (every fix of this path on) and TRL 1.16
# as shipped for 24 steps on 8 seeds each, the same prompts and sampling seeds in both arms, and sampled 128
# held-out test prompts at the start and at the end. The committed results are loaded here, nothing is trained.
# The figure draws each seed's held-out reward at the start and the end, and each arm's change from its start with
# its interval, paired by seed and test prompt, at the corrected level of its family of four claims (06b says how).

# %%
import textwrap

from grpo_debug.files import DATA_DIR
from grpo_debug.runs.control import headline, positive_control
from grpo_debug.runs.results import detected, eval_table, per_seed

control = positive_control(DATA_DIR / "experiments")
K, seeds = control["steps"], control["seeds"]
held_out = {arm: tuple(eval_table(control["records"], arm, seeds, k).mean(1) for k in (0, K)) for arm in ("fixed", "trl")}
changes = {arm: control["summary"][arm]["change_from_start"] for arm in held_out}
rose = per_seed(control, "fixed", "change_from_start")
interval = lambda d: f"{d['mean']:+.4f} [{d['ci_low']:+.4f}, {d['ci_high']:+.4f}]"
verdict = lambda d: "detected" if detected(d) else "not detected"
print(textwrap.fill("positive control: " + headline(control), 110))
trl = control["summary"]["trl"]
print(f"fixed: {int((rose > 0).sum())} of {len(rose)} seeds rose. TRL as shipped: change from its start "
      f"{interval(changes['trl'])} ({verdict(changes['trl'])}); minus fixed at the end "
      f"{interval(trl['minus_fixed'])} ({verdict(trl['minus_fixed'])})")
plots.held_out_by_seed(held_out, changes, K, title=f"{K} steps on {seeds} seeds: " + ", ".join(
    f"{arm} {d['mean']:+.3f} from its start ({verdict(d)})" for arm, d in changes.items()))

# %% [markdown]
# ## Summary
#
# - A fresh AdamW's first step moves every weight with a gradient by about the learning rate, whatever $|g|$.
# - Samples with advantage 0 send no gradient; the loss's value says nothing about the step's size.
# - One step's held-out change is not told apart from noise here; learning shows over steps and seeds.
# - Over 24 steps the fixed configuration's held-out reward rises, detected; TRL as shipped ends below it.

# %% [markdown]
# ## Checks
#
# *Maintainers' check, run by nbval in CI; a reader may skip it.* The claims the sentences above make, checked
# against the numbers the cells computed. nbval runs every notebook in CI, so a sentence that stops being true fails
# here instead of going stale. (An identity a cell demonstrates, such as "bit for bit", stays in that cell: it is
# part of the lesson.)

# %%
assert torch.allclose(steps[1.0], by_hand, rtol=1e-4, atol=1e-12), "AdamW's first step is not -lr g / (|g| + eps)"
assert torch.allclose(steps[1.0][:2], steps[100.0][:2]) and torch.allclose(steps[1.0][0], -steps[1.0][1])
if CAPTURE is None:  # the bundled step: grpo at ratio 1 with the policy at the reference, a fresh AdamW
    assert abs(u.loss) < 1e-5 and u.grad_norm > 1e-3  # a loss of ~0, yet a gradient
    assert norms[zero].max() < 1e-3 * norms[~zero].median()  # zero-advantage samples send no gradient
    assert u.update_norm / weight_norm < 0.01  # "a fraction of a percent of its weights"
    assert abs(delta.abs().max() - cfg.learning_rate) < 0.01 * cfg.learning_rate  # each weight moves by about lr
    assert abs(u.update_norm / (cfg.learning_rate * moved**0.5) - 1) < 0.05  # the norm: lr x sqrt(weights moved)
    assert ev.ci_low < 0 < ev.ci_high  # one step: not told apart from 0
assert detected(control["summary"]["fixed"]["change_from_start"]) and (rose > 0).all(), "the fixed step no longer learns"
assert not detected(trl["change_from_start"]) and detected(trl["minus_fixed"]) and trl["minus_fixed"]["mean"] < 0
print("every claim above holds")
