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
# **What you will learn.** The GRPO objective written out: the clipped surrogate, the KL term and each normaliser
# (`loss_type`); why the clip exists; why a loss of 0 at ratio 1 still carries a gradient; the KL estimators k1,
# k2, k3 with their values and gradients; and one token of the bundled step computed by hand, every number checked
# against the engine.
#
# **What you need first.** Notebooks 02 (the ratio $\rho$ and $\pi_{\text{old}}$) and 04 (the advantages $A_i$).
#
# ## The objective
#
# Each scored token $t$ of completion $i$ contributes, with $\rho_{i,t} = \pi_\theta(o_{i,t} \mid \cdot) /
# \pi_{\text{old}}(o_{i,t} \mid \cdot)$ (notebook 02) and the advantage $A_i$ (notebook 04):
#
# $$\ell_{i,t}(\theta) = -\min\Big(\rho_{i,t} A_i,\ \operatorname{clip}\big(\rho_{i,t}, 1 - \epsilon_{\text{low}},
# 1 + \epsilon_{\text{high}}\big) A_i\Big) + \beta\, \mathrm{KL}_{i,t},$$
#
# the clipped surrogate of PPO plus $\beta$ times a per-token estimate of the KL divergence from the reference
# model (below). Minimising $-\rho A$ raises the probability of tokens with $A > 0$ and lowers it for $A < 0$. The
# loss sums the $\ell_{i,t}$ of the batch's $N = BG$ completions with the **normaliser** `loss_type` picks, $\lvert o_i \rvert$
# being completion $i$'s scored tokens, $L$ `max_completion_length` and $M$ the tokens of the whole generation batch:
#
# | `loss_type` | loss | each token's weight |
# |---|---|---|
# | grpo | $\frac{1}{N} \sum_i \frac{1}{\lvert o_i \rvert} \sum_t \ell_{i,t}$ | $1 / (N \lvert o_i \rvert)$: each completion counts alike |
# | bnpo | $\sum_i \sum_t \ell_{i,t} \,/\, \sum_i \lvert o_i \rvert$ (per micro-batch) | $1 / \sum_i \lvert o_i \rvert$: each token counts alike |
# | dr_grpo | $\sum_i \sum_t \ell_{i,t} \,/\, (N L)$ | $1 / (N L)$: a constant |
# | dapo | $\sum_i \sum_t \ell_{i,t} \,/\, M$ (TRL 1.16's default) | $1 / M$: bnpo's, with one micro-batch |
#
# Put together, under grpo (DeepSeekMath's objective, negated to be minimised):
#
# $$\mathcal{L}(\theta) = \frac{1}{N} \sum_{i=1}^{N} \frac{1}{\lvert o_i \rvert} \sum_{t=1}^{\lvert o_i \rvert} \Big[-\min\big(\rho_{i,t}
# A_i,\ \operatorname{clip}(\rho_{i,t}, 1 - \epsilon_{\text{low}}, 1 + \epsilon_{\text{high}}) A_i\big) + \beta\,
# \mathrm{KL}_{i,t}\Big].$$
#
# Sequence REINFORCE, $-A_i \sum_t \log \pi_\theta(o_{i,t} \mid \cdot)$ (or divided by $\lvert o_i \rvert$; `reinforce_sum`,
# `reinforce_mean`), is the other form in use: no ratio, no clip. In plain torch (the engine's `compute_loss` in
# `grpo_debug/loss.py` adds TRL's other loss types and masks).
#
# **Exercises 2 and 3: the per-token objective and one normaliser (about 10 minutes).** Write `per_token_loss` (the
# clipped surrogate and the k3 KL term, per token, to be minimised) and `normalised` (at least its `grpo` row: each
# completion's mean over its own tokens, then the mean over completions). The checkers after the cell try tokens on
# both sides of the clip for $A > 0$ and $A < 0$, $\beta = 0$ and $0.04$, and completions of other lengths with
# padding the mask must hide. The cell holds a solution; `make exercises` empties it in your copy.

# %%
import torch


# %% tags=["solution"]
def per_token_loss(logp, old, ref, A, beta, eps_low=0.2, eps_high=0.2):
    """l_{i,t} from (N, T) log-probs of pi_theta, pi_old and the reference, and (N, 1) advantages."""
    rho = torch.exp(logp - old)
    surrogate = torch.min(rho * A, torch.clamp(rho, 1 - eps_low, 1 + eps_high) * A)
    d = ref - logp
    return -surrogate + beta * (torch.exp(d) - d - 1)  # the KL term: k3 (below)


def normalised(per_token, mask, loss_type, max_completion_length):
    """The loss: the token terms summed with the normaliser's weights (dapo's M: this batch's tokens here)."""
    N, lengths = mask.shape[0], mask.sum(1, keepdim=True).clamp(min=1)  # |o_i|
    weight = {"grpo": mask / (N * lengths), "bnpo": mask / mask.sum(), "dr_grpo": mask / (N * max_completion_length),
              "dapo": mask / mask.sum()}[loss_type]
    return (per_token * weight).sum()


# %%
from grpo_debug.exercises import check_clipped_objective, check_normaliser

print(check_clipped_objective(lambda logp, old, A, ref, eps, beta: per_token_loss(logp, old, ref, A, beta, eps, eps)))
print(check_normaliser(lambda per_token, mask: normalised(per_token, mask, "grpo", mask.shape[1])))

# %% [markdown]
# ## A loss of 0 still has a gradient
#
# In this step every token is scored once, by the weights that sampled it: $\pi_\theta = \pi_{\text{old}}$, so
# $\rho = 1$ exactly and the clip is inactive. Since $\nabla_\theta \rho = \rho\, \nabla_\theta \log \pi_\theta$,
# each token's gradient is then
#
# $$\nabla_\theta \ell_{i,t} \big|_{\rho = 1} = -A_i\, \nabla_\theta \log \pi_\theta(o_{i,t} \mid q, o_{i,<t})
# + \beta\, \nabla_\theta \mathrm{KL}_{i,t},$$
#
# REINFORCE's with the group baseline, and the KL's gradient is 0 too while the policy is the reference. The loss's
# *value* is $-\sum_i A_i w_i$, with $w_i$ the total weight the normaliser gives completion $i$'s tokens: 0 for grpo
# ($w_i = 1/N$, and each group's advantages sum to 0), not 0 for the others where advantages correlate with
# lengths. Its gradient is not 0 for any of them. The table: the engine's loss, the same by hand, the gradient's
# norm, and $-\sum_i A_i w_i$ from the advantages and lengths alone.

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
lp, advantages = run.logprobs, run.advantages.values
print(f"this step: loss_type {cfg.loss_type}, beta {cfg.beta}, kl_estimator {cfg.kl_estimator}, clip range "
      f"[{1 - cfg.epsilon_low:g}, {1 + cfg.epsilon_high:g}], num_iterations {cfg.num_iterations}")

# %%
from grpo_debug.show.loss_gradients import gradient_of_loss_wrt_logps, loss_value_at_ratio_one
from grpo_debug.ui.tables import compare_variants

terms = per_token_loss(lp.policy, lp.policy, lp.reference, advantages[:, None], cfg.beta, cfg.epsilon_low,
                       cfg.epsilon_high)  # at step 0, pi_old's log-probs are the policy's
variants = {t: {"loss_type": t} for t in ["grpo", "bnpo", "dr_grpo", "dapo", "reinforce_sum", "reinforce_mean"]}
table = compare_variants(step, variants, until="loss", columns=["loss", "loss/policy"])
for name, changes in variants.items():
    variant = step.run(cfg.replace(**changes), until="loss", remember=False)  # on the same rollout and log-probs
    table.loc[name, "|d loss / d logp|"] = gradient_of_loss_wrt_logps(variant, variant.config).norm().item()
    if not name.startswith("reinforce"):
        table.loc[name, "by hand"] = normalised(terms * lp.mask, lp.mask, name, cfg.max_new_tokens).item()
        table.loc[name, "-sum A_i w_i"] = loss_value_at_ratio_one(variant)
table

# %%
for name in ["grpo", "bnpo", "dapo", "dr_grpo", "reinforce_sum"]:
    print(f"{name:>14}: loss {table.loc[name, 'loss']:+.2e}, |d loss / d logp| {table.loc[name, '|d loss / d logp|']:.3g}")

# %% [markdown]
# ## Why the clip
#
# With one pass per rollout the ratio is exactly 1 when the loss is taken, and the clip never acts. It acts when
# $\pi_\theta$ has moved away from $\pi_{\text{old}}$: on later passes over the same rollout (`num_iterations`
# $\mu > 1$, after the first optimizer step) or with samples from a lagging sampler (notebooks 05b, 05c). There
# the samples say less and less about $\pi_\theta$, and the clip removes the incentive to move further: once
# $\rho > 1 + \epsilon_{\text{high}}$ with $A > 0$ (or $\rho < 1 - \epsilon_{\text{low}}$ with $A < 0$), the
# minimum picks the clipped term, a constant, and the token's gradient is 0. A move in the other direction is never
# clipped. This is PPO's trust region around $\pi_{\text{old}}$. The gradient of $\ell$ with respect to
# $\log \pi_\theta$, case by case: $A > 0$ and $A < 0$, each at a ratio below the clip region, inside it and above
# it (with $\pi_{\text{old}}$'s log-prob at 0, $\epsilon = 0.2$, $\beta = 0$). Before you run the cell, predict the
# last column of each row: $-\rho A$ where the min takes $\rho A$, 0 where it takes the clipped constant.

# %%
import pandas as pd

cases = []
for A in (1.0, -1.0):
    for rho in (0.7, 1.0, 1.3):
        logp = torch.log(torch.tensor(rho)).requires_grad_(True)  # log pi_theta, with log pi_old = 0
        clipped = torch.clamp(torch.exp(logp), 0.8, 1.2)
        (-torch.min(torch.exp(logp) * A, clipped * A)).backward()
        side = "below 1 - eps" if rho < 0.8 else ("above 1 + eps" if rho > 1.2 else "inside")
        takes = "rho A" if rho * A <= clipped.item() * A else "clip(rho) A: a constant"
        cases.append({"A": A, "rho": rho, "rho is": side, "the min takes": takes, "d l / d log pi": logp.grad.item()})
clip_cases = pd.DataFrame(cases)
clip_cases.round(2)

# %% [markdown]
# **What to notice.** Two rows have a gradient of exactly 0: $A > 0$ with $\rho$ above $1 + \epsilon$, and $A < 0$
# with $\rho$ below $1 - \epsilon$. There the step has already moved the token as far as the trust region allows in the
# direction its advantage asks, and the clip stops the push. The other four rows keep $-\rho A$: inside the region,
# and every move back toward $\rho = 1$, which is never clipped.

# %% [markdown]
# ## KL estimators
#
# The KL term keeps the policy near the frozen reference. With the tokens sampled from $\pi_\theta$ and
# $d = \log \pi_{\text{ref}}(o_{i,t} \mid \cdot) - \log \pi_\theta(o_{i,t} \mid \cdot)$, TRL and this suite estimate
# $\mathrm{KL}(\pi_\theta \,\|\, \pi_{\text{ref}})$ per token with
#
# $$k_1 = -d, \qquad k_2 = \tfrac{1}{2} d^2, \qquad k_3 = e^{d} - d - 1, \qquad k_3^{\text{corrected}} = \rho\, k_3.$$
#
# $k_1$ and $k_3$ are unbiased for the value, $k_2$ is not, and $k_3 \ge 0$ for every token. Their gradients differ
# (Tang & Munos 2025): $k_1$'s is $\nabla_\theta \log \pi_\theta$, whose expectation is 0, so it does not pull
# towards the reference on average; $k_3$'s, $(1 - e^d) \nabla_\theta \log \pi_\theta$, has the expectation of the
# *forward* KL's gradient, $\nabla_\theta \mathrm{KL}(\pi_{\text{ref}} \,\|\, \pi_\theta)$; $k_2$'s and $\rho\, k_3$'s
# have the reverse KL's. `k3_corrected` is TRL's `use_bias_correction_kl=True`, its default with beta > 0 (TRL
# 1.16's default `beta` is 0: no KL term). Below, each on a categorical policy over 8 tokens, from 200,000 samples,
# against the exact KL and its exact gradient (the same as `grpo_debug.show.diagnostics.kl_estimator_check`):

# %%
import pandas as pd

from grpo_debug.show.diagnostics import kl_estimator_check

g = torch.Generator().manual_seed(0)
theta = torch.randn(8, generator=g).requires_grad_(True)  # the policy's logits
ref = torch.log_softmax(torch.randn(8, generator=g), 0)  # the reference's log-probs
exact = (torch.softmax(theta, 0) * (torch.log_softmax(theta, 0) - ref)).sum()  # KL(pi || ref)
(exact_grad,) = torch.autograd.grad(exact, theta)
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
                  "cosine to exact": torch.nn.functional.cosine_similarity(grad, exact_grad, 0).item()}
check = pd.DataFrame(rows).T
check["value biased"] = (check["value"] - check["exact KL"]).abs() > 0.02
check["gradient biased"] = check["gradient error"] > 0.1
reference_check = pd.DataFrame(kl_estimator_check()).T
assert ((check["value"] - reference_check["value"]).abs() < 1e-6).all(), "the plain-torch check is not the suite's"
check

# %% [markdown]
# k1's gradient is noise around 0: its norm is a small share of the exact gradient's (the table's fourth column),
# and its cosine is the direction of that noise. This step's estimator (printed at the top) is plain k3, the
# suite's default: an unbiased value with the forward KL's gradient. At step 0 that costs nothing, as the policy
# is the reference and every estimator's gradient is 0 there:

# %%
logp = lp.policy.clone().requires_grad_(True)
d = lp.reference - logp
(kl_grad,) = torch.autograd.grad((cfg.beta * (torch.exp(d) - d - 1) * lp.mask).sum(), logp)
at_reference = "the policy is the reference" if step.at_reference else "the policy has moved from the reference"
print(f"max |d (beta k3) / d logp| over the step's tokens: {kl_grad.abs().max():.1e} ({at_reference})")

# %% [markdown]
# ## Per-token KL on real tokens
#
# At step 0 policy and reference are the same weights, so every estimator is 0. Scoring the policy with
# dropout on (phase 2's pitfall) makes them differ, and the estimators disagree token by token.

# %%
from grpo_debug.loss import KL_ESTIMATORS
from grpo_debug.ui import plots

dropped = step.run(cfg.replace(dropout=True), until="loss", remember=False).logprobs
kl = plots.kl_by_estimator(dropped.policy, dropped.reference, dropped.mask)  # (estimator, token) on sample 0, as drawn
spread = kl.max(0).values - kl.min(0).values  # per token: how far apart the estimators are
t = int(spread.argmax())
title = (f"dropout on while scoring: the KL estimators disagree most at token {t}\n"
         + ", ".join(f"{e} {v:+.3g}" for e, v in zip(KL_ESTIMATORS, kl[:, t].tolist()))
         if spread.numel() and spread.max() > 0 else "dropout on while scoring: every KL estimator 0 on every token")
plots.kl_per_token(dropped.policy, dropped.reference, dropped.mask, title=title, chosen=cfg.kl_estimator)

# %% [markdown]
# ## One token, by hand
#
# One group of the step: its rewards, its advantages by hand (notebook 04's formula), and its sample with the
# largest $|A_i|$. Of that sample, one token: the one whose probability the first optimizer step raised most. Its
# log-probs, ratio, clipped term, KL term, $\ell_{i,t}$, its share of the loss under each normaliser, and the
# gradient the loss sends into its log-prob, in two columns: **pass 1** is this step as it runs (the loss the update
# backpropagates); **pass 2** is the same token re-scored after that update, as `num_iterations=2` would take it
# ($\pi_\theta$ has moved; $\pi_{\text{old}}$ and the reference have not). Every number is plain torch, and the cell
# asserts each against the engine's.

# %%
import dataclasses

from grpo_debug.loss import compute_loss, loss_weights
from grpo_debug.specs import loss_spec_of

B, G = len(run.rollout.prompts), cfg.num_generations
rewards = run.rewards.total.view(B, G)
group = next((b for b in range(B) if rewards[b].std() > 0), 0)  # the first group whose rewards differ
A_group = (rewards[group] - rewards[group].mean()) / (rewards[group].std() + 1e-4)  # notebook 04, by hand
i = group * G + int(A_group.abs().argmax())
A = A_group[i - group * G]
print(f"group {group}: rewards {' '.join(f'{v:+.3f}' for v in rewards[group].tolist())}\n"
      f"advantages by hand  {' '.join(f'{v:+.3f}' for v in A_group.tolist())}; sample {i}: A = {A:+.4f}")
second = step.run(cfg.replace(num_iterations=2), until="update", remember=False).update.iterations[1]  # pass 2
mask, old, ref_i = lp.mask, lp.policy[i], lp.reference[i]
t = int(torch.where(mask[i].bool(), second.logps[i] - old, -torch.inf).argmax())  # the token raised most
N, length, M, L = mask.shape[0], mask[i].sum(), mask.sum(), cfg.max_new_tokens  # length: |o_i|
weight = {"grpo": 1 / (N * length), "bnpo": 1 / M, "dr_grpo": 1 / (N * L), "dapo": 1 / M}
lt = cfg.loss_type if cfg.loss_type in weight else "grpo"  # the step's normaliser, or grpo's for another loss type
hand = {}
for name, logp_t in {"pass 1": old[t], "pass 2": second.logps[i, t]}.items():
    rho = torch.exp(logp_t - old[t])
    clipped = torch.clamp(rho, 1 - cfg.epsilon_low, 1 + cfg.epsilon_high)
    d = ref_i[t] - logp_t
    kl_term = cfg.beta * (torch.exp(d) - d - 1)
    loss_t = -torch.min(rho * A, clipped * A) + kl_term
    flows = rho * A <= clipped * A  # the min takes rho A: the policy term's gradient flows
    grad = weight[lt] * (-A * rho * flows + cfg.beta * (1 - torch.exp(d)))
    hand[name] = {"log pi_theta": logp_t, "log pi_old": old[t], "log pi_ref": ref_i[t], "rho": rho,
                  "clip(rho)": clipped, "min(rho A, clip(rho) A)": torch.min(rho * A, clipped * A),
                  "beta k3": kl_term, "l_it": loss_t, **{f"share, {k}": loss_t * w for k, w in weight.items()},
                  f"d loss / d logp ({lt})": grad}
pd.DataFrame({name: {k: f"{v.item():+.4g}" for k, v in values.items()} for name, values in hand.items()})

# %%
spec = dataclasses.replace(loss_spec_of(cfg), loss_type=lt, gradient_accumulation_steps=1, steps_per_generation=1)
engine = {}
for name, logps in {"pass 1": lp.policy, "pass 2": second.logps}.items():
    logps = logps.clone().requires_grad_(True)
    out = compute_loss(logps, lp.policy, lp.reference, advantages, mask, entropies=lp.entropies, **spec.kwargs())
    (grad,) = torch.autograd.grad(out.loss, logps)
    engine[name] = {"rho": out.ratio[i, t], "beta k3": cfg.beta * out.per_token_kl[i, t], "l_it": out.per_token_loss[i, t],
                    **{f"share, {k}": out.per_token_loss[i, t] * loss_weights(mask, k, L)[i, t] for k in weight},
                    f"d loss / d logp ({lt})": grad[i, t]}
if CAPTURE is None:  # the bundled step: grpo, k3, one micro-batch
    assert abs(A - advantages[i]) < 1e-5, f"the advantage by hand ({A:.6f}) is not the engine's ({advantages[i]:.6f})"
    assert torch.equal(second.ratio[i, t], engine["pass 2"]["rho"]), "the update's pass 2 ratio is not compute_loss's"
    for name in engine:
        for key, value in engine[name].items():
            assert abs(hand[name][key] - value) <= 1e-6 * max(1.0, abs(value)), \
                f"{name}: {key} by hand ({hand[name][key]:.6g}) is not the engine's ({value:.6g})"
print("every number above equals the engine's (compute_loss on the same log-probs, loss_weights for the shares)")

# %% [markdown]
# **What to notice.** Pass 1 is the step as it runs: $\rho = 1$ and the KL term 0 ($\pi_\theta$ is
# $\pi_{\text{old}}$ and $\pi_{\text{ref}}$), so $\ell_{i,t} = -A_i$ and the gradient is $-A_i$ times the token's
# weight: negative for $A_i > 0$, so gradient descent raises the token's log-prob, even though the grpo loss over the
# batch is about 0. In pass 2 the first update has raised this token past $1 + \epsilon$: the minimum takes the
# clipped constant, the policy term sends no gradient, and the KL term, no longer 0, pulls the token back towards the
# reference (a positive gradient). The shares differ only by the normaliser's weight. For the estimators: k1 does
# not pull on average, plain k3 pulls with the forward KL's gradient, k2 and the corrected k3 with the reverse KL's;
# the value you log and the gradient you apply are different questions.

# %% [markdown]
# ## Summary
#
# - $\ell_{i,t} = -\min(\rho A_i, \operatorname{clip}(\rho, 1-\epsilon, 1+\epsilon) A_i) + \beta\,\mathrm{KL}_{i,t}$,
#   summed with the normaliser's weights: grpo per completion, bnpo and dapo per token, dr_grpo a constant.
# - At $\rho = 1$ each token's gradient is $-A_i \nabla \log \pi_\theta$: a loss of 0 can carry a gradient.
# - The clip acts only once $\pi_\theta$ has left $\pi_{\text{old}}$: it stops the push past $1 \pm \epsilon$.
# - k1 does not pull in expectation; k3's gradient is the forward KL's; k2's and $\rho k_3$'s the reverse KL's.

# %% [markdown]
# ## Checks
#
# *Maintainers' check, run by nbval in CI; a reader may skip it.* The claims the sentences above make, checked
# against the numbers the cells computed. nbval runs every notebook in CI, so a sentence that stops being true fails
# here instead of going stale. (An identity a cell demonstrates, such as "bit for bit", stays in that cell: it is
# part of the lesson.)

# %%
assert torch.equal(run.loss.ratio, torch.ones_like(run.loss.ratio))  # "the ratio is exactly 1 at step 0"
token_level = table.drop(["reinforce_sum", "reinforce_mean"])
assert (token_level["loss/policy"] - token_level["-sum A_i w_i"]).abs().max() < 1e-6  # the last column
assert abs(table.loc["grpo", "loss/policy"]) < 1e-6
if CAPTURE is None:  # the bundled step's completions differ in length, so dapo's token mean moves off 0
    assert (token_level["loss"] - token_level["by hand"]).abs().max() < 1e-6  # the normalisers by hand
    assert (table["|d loss / d logp|"] > 1e-3).all()  # a loss of ~0, with a gradient
    assert abs(table.loc["dapo", "loss/policy"]) > 1e-4
    assert cfg.kl_estimator == "k3" and step.at_reference and kl_grad.abs().max() == 0  # "costs nothing at step 0"
    one, two = hand["pass 1"], hand["pass 2"]
    assert one["rho"] == 1 and one["beta k3"] == 0 and (one[f"d loss / d logp ({lt})"] < 0) == (A > 0)
    assert A > 0 and two["rho"] > 1 + cfg.epsilon_high and two["min(rho A, clip(rho) A)"] == two["clip(rho)"] * A
    assert two["beta k3"] > 0 and two[f"d loss / d logp ({lt})"] > 0  # clipped; the KL pulls back
grads = clip_cases.set_index(["A", "rho"])["d l / d log pi"]  # the clip's table: zero exactly where the min is clipped
assert grads[(1.0, 1.3)] == 0 and grads[(-1.0, 0.7)] == 0, "the clip stops the push past 1 +- eps"
assert grads[(1.0, 0.7)] < 0 < grads[(-1.0, 1.3)], "a move back toward 1 is never clipped"
assert list(check.index[check["gradient biased"]]) == ["k1", "k3"]  # the KL estimators' table
assert list(check.index[check["value biased"]]) == ["k2"]
assert check.loc["k1", "|gradient| / |exact|"] < 0.1 and check.loc["k2", "cosine to exact"] > 0.99  # k1: noise around 0
print("every claim above holds")
