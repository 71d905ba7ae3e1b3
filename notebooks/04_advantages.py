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
# # 04 · Advantages: group-relative, and where they go wrong
#
# **What you will learn.** Why each part of the advantage is there: the group mean is a REINFORCE baseline, the
# std removes the reward's units (a clean +-1 group gets 0.866, not 1); why zero-std groups still shape the loss;
# how a tiny std makes phantom advantages.
#
# **What you need first.** Notebooks 01 (the groups) and 03 (the rewards); REINFORCE's gradient.
#
# ## The formula
#
# Within each group of $G$ completions of one prompt, with rewards $r_1, \dots, r_G$:
#
# $$A_i = \frac{r_i - \operatorname{mean}(r)}{\operatorname{std}(r) + \delta}, \qquad
# \operatorname{std}(r) = \sqrt{\frac{1}{G-1} \sum_{j=1}^{G} \big(r_j - \operatorname{mean}(r)\big)^2}, \qquad
# \delta = 10^{-4},$$
#
# as TRL 1.16 computes it (`scale_rewards="group"`; `"batch"` divides by the batch's std, `"none"` does not
# divide). Every token of completion $i$ gets $A_i$.

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

# %% [markdown]
# **Exercise 1: the group advantage (about 5 minutes).** Write `group_advantages(rewards, G)`: a flat tensor of
# B x G rewards (sample $i$ in group $i // G$) to the advantages above, the std torch's default. The checker names
# the mistake. `make exercises` writes your copy with the solution emptied.

# %% tags=["solution"]
def group_advantages(rewards, G):
    """(B*G,) rewards, sample i in group i // G -> (B*G,) advantages, as TRL's scale_rewards="group"."""
    grouped = rewards.view(-1, G)
    mean, std = grouped.mean(1, keepdim=True), grouped.std(1, keepdim=True)
    return ((grouped - mean) / (std + 1e-4)).flatten()


# %%
from grpo_debug.exercises import check_advantages

print(check_advantages(group_advantages))

# %%
run = step.run(cfg, until="advantages")
G, adv = cfg.num_generations, run.advantages  # the advantages with their groups' stds, and TRL's metrics
by_hand_gap = (group_advantages(run.rewards.total, G) - adv.values).abs().max().item()
print(f"yours on the step's {len(run.rewards.total)} rewards: max |yours - engine| {by_hand_gap:.1e}")

# %% [markdown]
# ## The group mean is a baseline
#
# REINFORCE's gradient is $\nabla_\theta J = \mathbb{E}_{o \sim \pi_\theta}\big[r(o)\, \nabla_\theta \log
# \pi_\theta(o \mid q)\big]$. The score has mean zero, $\mathbb{E}_{o \sim \pi_\theta}[\nabla_\theta \log
# \pi_\theta(o \mid q)] = \sum_o \nabla_\theta \pi_\theta(o \mid q) = \nabla_\theta 1 = 0$, so subtracting any
# baseline $b$ that does not depend on $o$ leaves the expected gradient as it was, while a $b$ near
# $\mathbb{E}[r \mid q]$ makes every term smaller: the estimate varies less. PPO learns $b$ with a value network;
# GRPO takes the group's mean. (It includes $r_i$ itself, which scales the expected gradient by $1 - 1/G$: the
# same direction.) Below, four completions whose rewards share an offset, the gradient estimated from groups of 8:

# %%
import torch

torch.manual_seed(0)
pi = torch.softmax(torch.tensor([0.5, 0.2, -0.1, -0.6]), 0)  # a policy over 4 completions (its logits' softmax)
reward = torch.tensor([1.0, 0.8, 0.7, 0.4])  # every reward positive: a common offset
score = torch.eye(4) - pi  # row o: grad of log pi(o) w.r.t. the logits
exact = (pi[:, None] * reward[:, None] * score).sum(0)  # sum_o pi(o) r(o) grad log pi(o)
size = 8  # the group size of this example
o = torch.multinomial(pi, 4000 * size, replacement=True).view(4000, size)  # 4000 groups of 8 samples
variance, multiple = {}, {}
for name, b in {"no baseline": 0.0, "group mean": reward[o].mean(1, keepdim=True)}.items():
    estimate = ((reward[o] - b)[..., None] * score[o]).mean(1)  # (groups, 4): each group's gradient estimate
    multiple[name] = (estimate.mean(0) @ exact / exact.norm() ** 2).item()  # its mean, a multiple of the exact one
    variance[name] = (estimate - estimate.mean(0)).pow(2).sum(1).mean().item()
    print(f"{name:>12}: mean estimate {multiple[name]:.3f} x the exact gradient, variance {variance[name]:.4f}")
print(f"1 - 1/G = {1 - 1 / size:.3f}; the group mean cuts the variance {variance['no baseline'] / variance['group mean']:.0f}-fold")

# %% [markdown]
# ## Dividing by the std
#
# The std removes the reward's units and offset: rewards times 100 plus 5 give the same $A_i$, up to the share
# $\delta / \operatorname{std}$. One learning rate serves any reward scale, but rewards that barely differ get
# full-size advantages (phantoms: red in the figure). `scale_rewards="none"` (Dr. GRPO) keeps the scale. The std
# is **unbiased** (divided by $G - 1$): a clean group $(+1, -1, +1, -1)$ gets $A_i = \pm\sqrt{3/4}$, not $\pm 1$;
# in general $\pm\sqrt{(G-1)/G}$.

# %%
from grpo_debug.advantages import compute_advantages

change = (compute_advantages(100 * run.rewards.total + 5, G) - adv.values).abs().view(-1, G).amax(1)
spread = adv.group_std > 1e-2  # the groups whose std is far above delta (the zero-std groups are not)
print(f"rewards x 100 + 5: max |change in A_i| {(change * spread).max():.1e} over the {int(spread.sum())} groups "
      "with std > 1e-2")
clean = torch.tensor([1.0, -1.0, 1.0, -1.0])
print(f"clean group {clean.tolist()}: unbiased std {clean.std():.4f}, A_i {compute_advantages(clean, 4)[0]:.4f}")

# %%
from grpo_debug.ui import plots

plots.advantages_bars(adv, G, title=plots.advantages_takeaway(adv, G))

# %% [markdown]
# A phantom on purpose, a floor that stops it, and TRL's `frac_reward_zero_std` under batch scaling: `04b_std_traps`.

# %% [markdown]
# ## Zero-std groups still shape the loss
#
# A group with advantage 0 sends no gradient of its own but counts in the loss's normaliser (05): sequences for
# grpo and dr_grpo, tokens for bnpo and dapo. So it shrinks every other sample's weight: below, one sample's
# weight with the zero-std groups in, over without.

# %%
from grpo_debug.loss import loss_weights

keep = torch.tensor([g not in adv.zero_std_groups for g in range(len(adv.group_std))]).repeat_interleave(G)
sample = int(torch.nonzero(keep & (adv.values != 0))[0])  # a sample with a non-zero advantage
weight = lambda t, kept: loss_weights(run.logprobs.mask[kept], t, cfg.max_new_tokens)[int(kept[:sample].sum())].sum()
dilution = {t: (weight(t, torch.ones_like(keep)) / weight(t, keep)).item() for t in ["grpo", "bnpo", "dr_grpo", "dapo"]}
print(f"{len(adv.zero_std_groups)} zero-std groups; sample {sample}'s weight with them over its weight without: "
      + ", ".join(f"{t} {ratio:.3g}" for t, ratio in dilution.items()))

# %% [markdown]
# ## Summary
#
# - $A_i = (r_i - \operatorname{mean}(r)) / (\operatorname{std}(r) + \delta)$ per group, the std unbiased.
# - The group mean is a REINFORCE baseline: the same direction, far less variance.
# - The std removes the units; a clean +-1 group gets $\pm\sqrt{(G-1)/G}$ (0.866 for G = 4).
# - A zero-std group sends no gradient but dilutes every other sample's weight.
# - A tiny std divides into full-size advantages (phantoms, 04b).

# %% [markdown]
# ## Checks
#
# *Maintainers' check, run by nbval in CI; a reader may skip it.* The claims the sentences above make, checked against the numbers the cells computed. nbval runs every
# notebook in CI, so a sentence that stops being true fails here instead of going stale. (An identity a cell
# demonstrates, such as "bit for bit", stays in that cell: it is part of the lesson.)

# %%
if CAPTURE is None:  # the bundled step: scale_rewards="group", no std floor, no NaN reward
    assert by_hand_gap < 1e-5, "the advantages by hand are not the engine's"
assert abs(multiple["no baseline"] - 1) < 0.05, "without a baseline the mean estimate is not the exact gradient"
assert abs(multiple["group mean"] - (1 - 1 / size)) < 0.05, "the group mean does not scale it by 1 - 1/G"
assert variance["no baseline"] > 5 * variance["group mean"], "the group mean does not cut the variance"
assert abs(compute_advantages(clean, 4)[0] - (3 / 4) ** 0.5) < 1e-3, "the clean group's A_i is not 0.866"
assert not spread.any() or change[spread].max() < 1e-2, "A_i is not unit-free where the std is large against delta"
assert len(adv.zero_std_groups) == 0 or all(r < 1 for r in dilution.values()), "a zero-std group did not dilute"
if CAPTURE is None:  # the bundled step has a phantom group (red in the figure)
    assert adv.phantom_groups, "the bundled step has no phantom group"
    phantom_max = adv.values.view(-1, G)[adv.phantom_groups].abs().max()
    assert phantom_max > 0.5, "the phantom group's advantages are not full-size"
print("every claim above holds")
