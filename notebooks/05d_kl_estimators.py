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
# # 05d · KL estimators, by Monte Carlo and on real tokens
#
# **What you will learn.** TRL's four KL estimators (k1, k2, notebook 05's k3, k3_corrected) written out in plain
# torch and checked against the exact KL and its exact gradient on a small categorical policy; and how they
# disagree token by token on real completions once the policy and the reference differ.
#
# **What you need first.** Notebook 05 (the loss, and its KL term $\beta k_3$).

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
print(f"this step: kl_estimator {cfg.kl_estimator}, beta {cfg.beta}")

# %% [markdown]
# ## The four estimators
#
# The KL term keeps the policy near the frozen reference. With the tokens sampled from $\pi_\theta$ and
# $d = \log \pi_{\text{ref}}(o_{i,t} \mid \cdot) - \log \pi_\theta(o_{i,t} \mid \cdot)$, TRL and this suite estimate
# $\mathrm{KL}(\pi_\theta \,\|\, \pi_{\text{ref}})$ per token with
#
# $$k_1 = -d, \qquad k_2 = \tfrac{1}{2} d^2, \qquad k_3 = e^{d} - d - 1, \qquad k_3^{\text{corrected}} = \rho\, k_3.$$
#
# $k_1$ and $k_3$ are unbiased for the value, $k_2$ is not, and $k_3 \ge 0$ on every token. Their gradients differ
# (Tang & Munos 2025): $k_1$'s has expectation 0; $k_3$'s, $(1 - e^d) \nabla_\theta \log \pi_\theta$, has the
# expectation of the *forward* KL's gradient, $\nabla_\theta \mathrm{KL}(\pi_{\text{ref}} \,\|\, \pi_\theta)$;
# $k_2$'s and $\rho\, k_3$'s have the reverse KL's. `k3_corrected` is TRL's `use_bias_correction_kl=True`; this
# step's estimator is printed above (plain k3 is the suite's default).
#
# ## The estimators against the exact KL, in plain torch
#
# A categorical policy over 8 tokens, $\pi_\theta = \operatorname{softmax}(\theta)$, a fixed reference, and
# 200,000 tokens sampled from $\pi_\theta$. Each estimator's loss is its sample mean over the tokens; its autograd
# gradient is compared with the exact gradient of $\mathrm{KL}(\pi_\theta \,\|\, \pi_{\text{ref}})$ and with that
# of the forward $\mathrm{KL}(\pi_{\text{ref}} \,\|\, \pi_\theta)$. `k3_corrected` multiplies by
# $\rho = \pi_\theta / \pi_{\text{old}}$, which is 1 in value ($\pi_{\text{old}}$ is $\pi_\theta$ detached) and not in
# gradient. This is the computation of `grpo_debug.show.diagnostics.kl_estimator_check`; the cell asserts that the
# two agree.

# %%
import pandas as pd
import torch

from grpo_debug.show.diagnostics import kl_estimator_check

g = torch.Generator().manual_seed(0)
theta = torch.randn(8, generator=g).requires_grad_(True)  # the policy's logits
ref = torch.log_softmax(torch.randn(8, generator=g), 0)  # the reference's log-probs
exact = (torch.softmax(theta, 0) * (torch.log_softmax(theta, 0) - ref)).sum()  # KL(pi || ref)
(exact_grad,) = torch.autograd.grad(exact, theta)
forward = (ref.exp() * (ref - torch.log_softmax(theta, 0))).sum()  # KL(ref || pi)
(forward_grad,) = torch.autograd.grad(forward, theta)
x = torch.multinomial(torch.softmax(theta, 0).detach(), 200_000, replacement=True, generator=g)  # tokens from pi


def estimates(logp, d):
    """Each estimator per token, from the policy's log-probs and d = log pi_ref - log pi."""
    k3 = torch.exp(d) - d - 1
    return {"k1": -d, "k2": 0.5 * d**2, "k3": k3, "k3_corrected": k3 * torch.exp(logp - logp.detach())}


rows = {}
for name in ["k1", "k2", "k3", "k3_corrected"]:
    logp = torch.log_softmax(theta, 0)[x]
    k = estimates(logp, ref[x] - logp)[name].mean()
    (grad,) = torch.autograd.grad(k, theta)
    rows[name] = {"value": k.item(), "exact KL": exact.item(), "gradient error": ((grad - exact_grad).norm()
                  / exact_grad.norm()).item(), "|gradient| / |exact|": (grad.norm() / exact_grad.norm()).item(),
                  "cosine to exact": torch.nn.functional.cosine_similarity(grad, exact_grad, 0).item(),
                  "error to forward KL's": ((grad - forward_grad).norm() / forward_grad.norm()).item()}
check = pd.DataFrame(rows).T
check["value biased"] = (check["value"] - check["exact KL"]).abs() > 0.02
check["gradient biased"] = check["gradient error"] > 0.1
suite = pd.DataFrame(kl_estimator_check(vocab=8, num_samples=200_000, seed=0)).T
assert ((check["value"] - suite["value"]).abs() < 1e-6).all(), "the plain-torch values are not the suite's"
assert ((check["error to forward KL's"] - suite["forward_grad_rel_error"]).abs() < 1e-4).all(), \
    "the plain-torch gradients are not the suite's"
check

# %% [markdown]
# **What to notice.** k1's gradient is noise around 0: its error is about 1 because its norm is a small share of
# the exact gradient's (`|gradient| / |exact|`), and its cosine is the direction of that noise. k3's value is
# unbiased, but its gradient is the forward KL's (`error to forward KL's`), not this one; k2's value is biased and
# its gradient right; `k3_corrected` gets both.

# %% [markdown]
# ## Per-token KL on real tokens
#
# At step 0 policy and reference are the same weights, so every estimator is 0 on every token. Scoring the policy
# with dropout on (phase 2's pitfall) makes them differ, and the estimators disagree token by token.

# %%
from grpo_debug.loss import KL_ESTIMATORS
from grpo_debug.ui import plots

dropped = step.run(cfg.replace(dropout=True), until="logprobs", remember=False).logprobs
kl = plots.kl_by_estimator(dropped.policy, dropped.reference, dropped.mask)  # (estimator, token) on sample 0, as drawn
spread = kl.max(0).values - kl.min(0).values  # per token: how far apart the estimators are
t = int(spread.argmax())
title = (f"dropout on while scoring: the KL estimators disagree most at token {t}\n"
         + ", ".join(f"{e} {v:+.3g}" for e, v in zip(KL_ESTIMATORS, kl[:, t].tolist()))
         if spread.numel() and spread.max() > 0 else "dropout on while scoring: every KL estimator 0 on every token")
plots.kl_per_token(dropped.policy, dropped.reference, dropped.mask, title=title, chosen=cfg.kl_estimator)

# %% [markdown]
# ## Summary
#
# - Each estimator is a few lines of torch; 200,000 samples put its value and gradient beside the exact ones.
# - k1 and k3 estimate the value without bias, k2 does not; the gradients of k2 and `k3_corrected` are the
#   reverse KL's, k3's the forward KL's, and k1's is noise around 0.
# - On real tokens, once the policy and the reference differ (dropout here), the estimators disagree token by token.

# %% [markdown]
# ## Checks
#
# *Maintainers' check, run by nbval in CI; a reader may skip it.* The claims the sentences above make, checked
# against the numbers the cells computed.

# %%
assert list(check.index[check["gradient biased"]]) == ["k1", "k3"], "the gradients' biases differ from the text"
assert list(check.index[check["value biased"]]) == ["k2"], "the values' biases differ from the text"
assert abs(check.loc["k1", "gradient error"] - 1) < 0.1, "k1's gradient error is not about 1"
assert check.loc["k1", "|gradient| / |exact|"] < 0.1, "k1's gradient is not small beside the exact one"
assert check.loc["k3", "error to forward KL's"] < 0.1, "k3's gradient is not the forward KL's"
assert check.loc["k2", "cosine to exact"] > 0.99 and check.loc["k3_corrected", "cosine to exact"] > 0.99, \
    "k2's and k3_corrected's gradients do not point along the exact one"
if CAPTURE is None:  # the bundled step: at the reference, and dropout moves the policy's log-probs off it
    assert step.at_reference, "the bundled step's policy is not its reference"
    assert spread.max() > 0, "with dropout on, the estimators agree on every token"
print("every claim above holds")
