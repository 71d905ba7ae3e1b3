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
# **What you will learn.** The GRPO objective and its normalisers (`loss_type`); why a loss of 0 still has a
# gradient; why the clip exists; the KL term; one token of the bundled step by hand.
#
# **What you need first.** Notebooks 02 (the ratio $\rho$ and $\pi_{\text{old}}$) and 04 (the advantages $A_i$).
#
# ## The objective
#
# Each scored token $t$ of completion $i$, with $\rho_{i,t} = \pi_\theta(o_{i,t} \mid \cdot) /
# \pi_{\text{old}}(o_{i,t} \mid \cdot)$, contributes
#
# $$\ell_{i,t}(\theta) = -\min\Big(\rho_{i,t} A_i,\ \operatorname{clip}\big(\rho_{i,t}, 1 - \epsilon_{\text{low}},
# 1 + \epsilon_{\text{high}}\big) A_i\Big) + \beta\, k_3, \qquad k_3 = e^{d} - d - 1,$$
#
# with $d = \log \pi_{\text{ref}}(o_{i,t} \mid \cdot) - \log \pi_\theta(o_{i,t} \mid \cdot)$. That is PPO's clipped
# surrogate plus $\beta$ times a per-token estimate of the KL from the frozen reference model. Minimising $-\rho A$
# raises the probability of tokens with $A > 0$ and lowers it for $A < 0$. The loss is
# $\sum_{i,t} w_{i,t}\, \ell_{i,t}$ over the $N$ completions, weighted as `loss_type` picks ($\lvert o_i \rvert$:
# completion $i$'s scored tokens; $L$: `max_completion_length`; $M$: the generation batch's tokens):
#
# | `loss_type` | each token's weight $w_{i,t}$ |
# |---|---|
# | grpo (DeepSeekMath's) | $1 / (N \lvert o_i \rvert)$: each completion counts alike |
# | bnpo | $1 / \sum_i \lvert o_i \rvert$ per micro-batch: each token counts alike |
# | dr_grpo | $1 / (N L)$: a constant |
# | dapo (TRL 1.16's default) | $1 / M$: bnpo's with one micro-batch |
#
# Sequence REINFORCE (`reinforce_sum`, `reinforce_mean`: $-A_i \sum_t \log \pi_\theta(o_{i,t} \mid \cdot)$) has
# no ratio or clip.
#
# **Exercises 2 and 3 (about 10 minutes).** Write `per_token_loss` ($\ell_{i,t}$ from (N, C) log-probs) and
# `normalised` (the table's four rows, grpo's first). The checkers try both sides of the clip, both signs of $A$,
# $\beta = 0$ and $0.04$, and padding. The cell holds a solution; `make exercises` empties it in your copy.

# %%
import torch


# %% tags=["solution"]
def per_token_loss(logp, old, ref, A, beta, eps_low=0.2, eps_high=0.2):
    """l_{i,t} from (N, C) log-probs of pi_theta, pi_old and the reference, and (N, 1) advantages."""
    rho = torch.exp(logp - old)
    surrogate = torch.min(rho * A, torch.clamp(rho, 1 - eps_low, 1 + eps_high) * A)
    d = ref - logp
    return -surrogate + beta * (torch.exp(d) - d - 1)  # the KL term: k3


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
# At step 0 $\pi_\theta = \pi_{\text{old}}$: $\rho = 1$ and the clip is inactive. As
# $\nabla_\theta \rho = \rho\, \nabla_\theta \log \pi_\theta$, each token's gradient is REINFORCE's with the group
# baseline (the KL's is 0 while the policy is the reference):
#
# $$\nabla_\theta \ell_{i,t} \big|_{\rho = 1} = -A_i\, \nabla_\theta \log \pi_\theta(o_{i,t} \mid q, o_{i,<t}).$$
#
# The loss's *value* is $-\sum_i A_i w_i$, $w_i$ the total weight of completion $i$'s tokens: 0 for grpo
# ($w_i = 1/N$, and each group's advantages sum to 0), not 0 for the others when advantages correlate with
# lengths. Per loss type: the engine's loss, your `normalised` (NaN where not written), the gradient's norm
# (never 0), and $-\sum_i A_i w_i$.

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
print(f"{cfg.loss_type=}, {cfg.beta=}, {cfg.kl_estimator=}, {cfg.epsilon_low=}, {cfg.epsilon_high=}")

# %%
from grpo_debug.show.loss_gradients import loss_types_at_ratio_one

terms = per_token_loss(lp.policy, lp.policy, lp.reference, advantages[:, None], cfg.beta, cfg.epsilon_low,
                       cfg.epsilon_high)  # at step 0, pi_old's log-probs are the policy's
table = loss_types_at_ratio_one(step, cfg, by_hand=lambda lt: normalised(terms * lp.mask, lp.mask, lt, cfg.max_new_tokens).item())
table

# %% [markdown]
# ## Why the clip
#
# The clip acts only once $\pi_\theta$ has moved from $\pi_{\text{old}}$: on later passes over a rollout
# (`num_iterations` $\mu > 1$) or with a lagging sampler (notebooks 05b, 05c). Past the clip region in the direction
# $A$ asks, the min takes the clipped constant and the token's gradient is 0: no incentive to move further from the
# policy that sampled it (PPO's trust region).
#
# Below, your `per_token_loss` on one token with $A = \pm 1$ at three ratios ($\log \pi_{\text{old}} = 0$,
# $\epsilon = 0.2$, $\beta = 0$). Predict the last column before you run the cell: $-\rho A$ where the min takes
# $\rho A$, 0 where it takes the constant.

# %%
from grpo_debug.show.loss_gradients import clip_cases

cases = clip_cases(per_token_loss, epsilon=0.2)  # d l / d log pi_theta by autograd, one row per (A, rho)
cases.round(2)

# %% [markdown]
# **What to notice.** The gradient is 0 in two rows only, $A > 0$ above $1 + \epsilon$ and $A < 0$ below
# $1 - \epsilon$; the other four keep $-\rho A$, moves back toward $\rho = 1$ included.
#
# ## KL estimators
#
# The KL term keeps the policy near the reference; TRL 1.16's default $\beta = 0$ drops it. Why $k_3$:
# $\mathbb{E}_{\pi_\theta}[e^{d}] = \sum \pi_{\text{ref}} = 1$, so on tokens sampled from $\pi_\theta$ it has
# $k_1 = -d$'s expectation, $\mathrm{KL}(\pi_\theta \,\|\, \pi_{\text{ref}})$, but is never negative. The other
# estimators and their gradients: optional notebook 05d.

# %% [markdown]
# ## One token, by hand
#
# The sample with the largest $|A_i|$ and its token the first optimizer step raised most: each term of
# $\ell_{i,t}$, its share of the loss, and the gradient into its log-prob. **Pass 1** is this step; **pass 2**
# re-scores the token after that update, as `num_iterations=2` would ($\pi_\theta$ has moved; $\pi_{\text{old}}$
# and the reference have not). Plain torch, checked against the engine next.

# %%
import pandas as pd

i = int(advantages.abs().argmax())  # the sample with the largest |A_i|
A, mask, old, ref_i = advantages[i], lp.mask, lp.policy[i], lp.reference[i]
second = step.run(cfg.replace(num_iterations=2), until="update", remember=False).update.iterations[1]  # pass 2
t = int(torch.where(mask[i].bool(), second.logps[i] - old, -torch.inf).argmax())  # the token raised most
N, length, M, L = mask.shape[0], mask[i].sum(), mask.sum(), cfg.max_new_tokens  # length: |o_i|
weight = {"grpo": 1 / (N * length), "bnpo": 1 / M, "dr_grpo": 1 / (N * L), "dapo": 1 / M}
lt = cfg.loss_type if cfg.loss_type in weight else "grpo"  # the step's normaliser, or grpo's for another loss type
hand = {}
for name, logp_t in {"pass 1": old[t], "pass 2": second.logps[i, t]}.items():
    rho, d = torch.exp(logp_t - old[t]), ref_i[t] - logp_t
    clipped = torch.clamp(rho, 1 - cfg.epsilon_low, 1 + cfg.epsilon_high)
    kl_term = cfg.beta * (torch.exp(d) - d - 1)
    loss_t = -torch.min(rho * A, clipped * A) + kl_term
    flows = rho * A <= clipped * A  # the min takes rho A: the policy term's gradient flows; k3's is 1 - e^d
    grad = weight[lt] * (-A * rho * flows + cfg.beta * (1 - torch.exp(d)))
    hand[name] = {"log pi_theta": logp_t, "log pi_old": old[t], "log pi_ref": ref_i[t], "rho": rho,
                  "clip(rho)": clipped, "min(rho A, clip(rho) A)": torch.min(rho * A, clipped * A),
                  "beta k3": kl_term, "l_it": loss_t, f"share ({lt})": loss_t * weight[lt],
                  f"d loss / d logp ({lt})": grad}
pd.DataFrame({name: {k: f"{v.item():+.4g}" for k, v in values.items()} for name, values in hand.items()})

# %%
from grpo_debug.show.loss_gradients import one_token_from_engine

engine = one_token_from_engine(cfg, lp, advantages, {"pass 1": lp.policy, "pass 2": second.logps}, lt, i, t)
gaps = {(name, k): (abs(hand[name][k] - v) / max(1.0, abs(v))).item()  # relative
        for name in engine for k, v in engine[name].items()}
assert CAPTURE is not None or max(gaps.values()) <= 1e-6, f"by hand is not the engine's (relative gaps): {gaps}"
print("every number above equals the engine's (compute_loss on the same log-probs, loss_weights for the share)")

# %% [markdown]
# **What to notice.** Pass 1: $\rho = 1$ and the KL term 0, so $\ell_{i,t} = -A_i$ and its gradient is $-A_i$ times
# the token's weight: negative for $A_i > 0$, so descent raises the token's log-prob. Pass 2: the update
# has pushed $\rho$ past $1 + \epsilon$; the min takes the clipped constant, the policy term sends no gradient, and
# the KL term, no longer 0, pulls the token back toward the reference (a positive gradient).

# %% [markdown]
# ## Summary
#
# - $\ell_{i,t} = -\min(\rho A_i, \operatorname{clip}(\rho, 1-\epsilon, 1+\epsilon) A_i) + \beta k_3$, summed with the
#   normaliser's weights: grpo per completion, bnpo and dapo per token, dr_grpo a constant.
# - At $\rho = 1$ each token's gradient is $-A_i \nabla \log \pi_\theta$: a loss of 0 can carry a gradient.
# - The clip acts only once $\pi_\theta$ has left $\pi_{\text{old}}$, to stop the push past $1 \pm \epsilon$.
# - $k_3 = e^d - d - 1$ estimates the KL's value, never negative; the other estimators and the gradients: 05d.

# %% [markdown]
# ## Checks
#
# *Maintainers' check, run by nbval in CI; a reader may skip it.* The claims the sentences above make, checked
# against the numbers the cells computed. nbval runs every notebook in CI, so a sentence that stops being true fails
# here instead of going stale. (An identity a cell demonstrates, such as "bit for bit", stays in that cell: it is
# part of the lesson.)

# %%
assert torch.equal(run.loss.ratio, torch.ones_like(run.loss.ratio)), "the ratio is not exactly 1 at step 0"
token_level = table.drop(["reinforce_sum", "reinforce_mean"])
assert (token_level["loss/policy"] - token_level["-sum A_i w_i"]).abs().max() < 1e-6, "the value is not -sum A_i w_i"
assert abs(table.loc["grpo", "loss/policy"]) < 1e-6, "grpo's loss at ratio 1 is not ~0"
logp = lp.policy.clone().requires_grad_(True)
d = lp.reference - logp
(kl_grad,) = torch.autograd.grad((cfg.beta * (torch.exp(d) - d - 1) * lp.mask).sum(), logp)
if CAPTURE is None:  # the bundled step's completions differ in length, so dapo's token mean moves off 0
    written = token_level.dropna(subset=["by hand"])  # the rows your normalised handles; grpo's always
    assert "grpo" in written.index, "your normalised gives no grpo row"
    assert (written["loss"] - written["by hand"]).abs().max() < 1e-6, "a normaliser by hand is not the engine's"
    assert (table["|d loss / d logp|"] > 1e-3).all(), "a loss type at ratio 1 has no gradient"
    assert abs(table.loc["dapo", "loss/policy"]) > 1e-4, "dapo's loss at ratio 1 is ~0"
    assert cfg.kl_estimator == "k3" and step.at_reference and kl_grad.abs().max() == 0, "the KL has a gradient at step 0"
    assert torch.equal(second.ratio[i, t], engine["pass 2"]["rho"]), "the update's pass 2 ratio is not compute_loss's"
    one, two = hand["pass 1"], hand["pass 2"]
    assert one["rho"] == 1 and one["beta k3"] == 0 and (one[f"d loss / d logp ({lt})"] < 0) == (A > 0), "pass 1"
    assert A > 0 and two["rho"] > 1 + cfg.epsilon_high and two["min(rho A, clip(rho) A)"] == two["clip(rho)"] * A, \
        "pass 2 is not clipped"
    assert two["beta k3"] > 0 and two[f"d loss / d logp ({lt})"] > 0, "pass 2: the KL does not pull back"
grads = cases.set_index(["A", "rho"])["d l / d log pi"]  # the clip's table: zero exactly where the min is clipped
assert grads[(1.0, 1.3)] == 0 and grads[(-1.0, 0.7)] == 0, "the clip does not stop the push past 1 +- eps"
assert grads[(1.0, 0.7)] < 0 < grads[(-1.0, 1.3)], "a move back toward 1 is clipped"
keep = cases[cases["d l / d log pi"] != 0]  # the other four rows: -rho A
assert len(keep) == 4 and ((keep["d l / d log pi"] + keep["rho"] * keep["A"]).abs() < 1e-6).all(), "-rho A"
print("every claim above holds")
