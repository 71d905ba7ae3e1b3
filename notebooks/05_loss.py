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
# # 05 · Loss and KL
#
# Token-level GRPO (TRL): ratio = exp(logp - old_logp), clipped, times the advantage, plus beta times a KL
# estimate; `grpo`, `bnpo`, `dr_grpo`, `dapo` normalise differently (`dapo` is TRL 1.16's default).
# Sequence REINFORCE, `-A * sum(logp)` (or divided by the length), is the other form in use. At step 0,
# logp == old_logp: the ratio is exactly 1, so the value of the token-level loss depends on the advantages
# and the lengths only, while its gradient does not vanish.

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
run = step.run(cfg, until="loss")

# %% [markdown]
# The loss is one function of per-token tensors: the policy's log-probs (here also pi_old's: at step 0 they
# are the same numbers), the reference's, the (B*G,) advantages and the mask; the settings are TRL's
# `GRPOConfig` names (`LossSpec`). Its source, then the call on the step's own tensors, the whole batch as
# one micro-batch:

# %%
import dataclasses
import textwrap

import torch

from grpo_debug.loss import compute_loss
from grpo_debug.specs import loss_spec_of
from grpo_debug.ui.notebook import show_source

show_source(compute_loss)
lp, advantages = run.logprobs, run.advantages.values
spec = dataclasses.replace(loss_spec_of(cfg), gradient_accumulation_steps=1, steps_per_generation=1)
print(textwrap.fill(repr(spec), 110, subsequent_indent="    "))
loss = compute_loss(lp.policy, lp.policy, lp.reference, advantages, lp.mask, entropies=lp.entropies, **spec.kwargs())
print(f"{cfg.loss_type} loss {loss.loss.item():.2e}; the ratio is exactly 1 at step 0")
if not cfg.vllm_importance_sampling_correction:  # (with it, the step also passes the sampler's log-probs)
    assert torch.equal(loss.loss, run.loss.loss)  # what the step computed, bit for bit

# %%
from grpo_debug.show.loss_gradients import gradient_of_loss_wrt_logps, loss_value_at_ratio_one
from grpo_debug.ui.tables import compare_variants

variants = {t: {"loss_type": t} for t in ["grpo", "bnpo", "dr_grpo", "dapo", "reinforce_sum", "reinforce_mean"]}
table = compare_variants(step, variants, until="loss", columns=["loss", "loss/policy", "loss/kl"])
for name, changes in variants.items():
    run = step.run(cfg.replace(**changes), until="loss", remember=False)  # on the same rollout and log-probs
    table.loc[name, "|d loss / d logp|"] = gradient_of_loss_wrt_logps(run, run.config).norm().item()
    if not name.startswith("reinforce"):
        table.loc[name, "-sum A_i w_i"] = loss_value_at_ratio_one(run)
table

# %% [markdown]
# At ratio 1 each token-level loss's policy term is -sum_i A_i w_i, where w_i is the total weight its
# normalisation gives sample i's tokens: 1/N for grpo, so group-centred advantages cancel; T_i / (tokens in
# the batch) for bnpo and dapo and T_i / (N x max_completion_length) for dr_grpo, so what remains is how
# advantages correlate with lengths. The last column computes that from the advantages and lengths alone.

# %%
for name in ["grpo", "bnpo", "dapo", "dr_grpo", "reinforce_sum"]:
    print(f"{name:>14}: loss {table.loc[name, 'loss']:+.2e}, |d loss / d logp| {table.loc[name, '|d loss / d logp|']:.3g}")

# %% [markdown]
# ## KL estimators
#
# With d = ref_logp - logp: k1 = -d, k2 = d^2/2, k3 = exp(d) - d - 1, and k3 times the ratio pi/pi_old
# (`k3_corrected`, TRL's `use_bias_correction_kl=True`, its default). TRL 1.16's default `beta` is 0, so its
# default step has no KL term at all; with beta > 0 it uses k3_corrected. The estimators' values AND their
# gradients differ (Tang & Munos 2025). Below: each estimator's sample-mean value and autograd gradient
# against the exact reverse KL of a categorical policy.

# %%
import pandas as pd

from grpo_debug.show.diagnostics import kl_estimator_check

check = pd.DataFrame(kl_estimator_check()).T
check["value biased"] = (check["value"] - check["exact_kl"]).abs() > 0.02
check["gradient biased"] = check["grad_rel_error"] > 0.1
check

# %% [markdown]
# ## Per-token KL on real tokens
#
# At step 0 policy and reference are the same weights, so every estimator is 0. Scoring the policy with
# dropout on (phase 2's pitfall) makes them differ, and the estimators disagree token by token.

# %%
from grpo_debug.loss import KL_ESTIMATORS
from grpo_debug.ui import plots

run = step.run(cfg.replace(dropout=True), until="loss", remember=False)
scored = run.logprobs
kl = plots.kl_by_estimator(scored.policy, scored.reference, scored.mask)  # (estimator, token) on sample 0, as drawn
spread = kl.max(0).values - kl.min(0).values  # per token: how far apart the estimators are
t = int(spread.argmax())
title = (f"dropout on while scoring: the KL estimators disagree most at token {t}\n"
         + ", ".join(f"{e} {v:+.3g}" for e, v in zip(KL_ESTIMATORS, kl[:, t].tolist()))
         if spread.numel() and spread.max() > 0 else "dropout on while scoring: every KL estimator 0 on every token")
plots.kl_per_token(scored.policy, scored.reference, scored.mask, title=title, chosen=cfg.kl_estimator)

# %% [markdown]
# **What to notice.** k1's gradient is zero in expectation (it pulls nowhere); plain k3 has an unbiased
# value but the gradient of the *forward* KL; k2 and k3 times the ratio (TRL's default form) have the
# reverse-KL gradient, as the check table shows. The value you log and the gradient you apply are different
# questions.

# %% [markdown]
# ## Checks
#
# The claims the sentences above make, checked against the numbers the cells computed. nbval runs every
# notebook in CI, so a sentence that stops being true fails here instead of going stale. (An identity a cell
# demonstrates, such as "bit for bit", stays in that cell: it is part of the lesson.)

# %%
assert torch.equal(loss.ratio, torch.ones_like(loss.ratio))  # "the ratio is exactly 1 at step 0"
token_level = table.drop(["reinforce_sum", "reinforce_mean"])
assert (token_level["loss/policy"] - token_level["-sum A_i w_i"]).abs().max() < 1e-6  # the last column
assert abs(table.loc["grpo", "loss/policy"]) < 1e-6
if CAPTURE is None:  # the bundled step's completions differ in length, so dapo's token mean moves off 0
    assert abs(table.loc["dapo", "loss/policy"]) > 1e-4
assert list(check.index[check["gradient biased"]]) == ["k1", "k3"]  # the KL estimators' table
assert list(check.index[check["value biased"]]) == ["k2"]
print("every claim above holds")
