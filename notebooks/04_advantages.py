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
# **What you will learn.** The advantage formula and why each part is there: the group mean is a REINFORCE
# baseline (the same expected gradient, less variance), the std makes the step's size independent of the reward's
# units; why a clean +-1 group gets advantages of 0.866 and not 1; why groups with identical rewards send no gradient
# yet still shape the loss; how a tiny std turns a meaningless difference into a full-size advantage.
#
# **What you need first.** Notebooks 01 (the groups) and 03 (the rewards); REINFORCE's gradient.
#
# ## The formula
#
# Within each group of $G$ completions of one prompt, with rewards $r_1, \dots, r_G$:
#
# $$A_i = \frac{r_i - \operatorname{mean}(r)}{\operatorname{std}(r) + \delta}, \qquad
# \operatorname{mean}(r) = \frac{1}{G} \sum_{j=1}^{G} r_j, \qquad
# \operatorname{std}(r) = \sqrt{\frac{1}{G-1} \sum_{j=1}^{G} \big(r_j - \operatorname{mean}(r)\big)^2}, \qquad
# \delta = 10^{-4},$$
#
# exactly as TRL 1.16 computes it (`scale_rewards="group"`; `"batch"` divides by the whole batch's std, `"none"`
# does not divide). Every token of completion $i$ gets the same $A_i$. In plain torch, on the step's own rewards:

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

# %%
import torch

run = step.run(cfg, until="advantages")
G = cfg.num_generations
r = run.rewards.total.view(-1, G)  # (B, G): one row per group
mean, std = r.mean(1, keepdim=True), r.std(1, keepdim=True)  # torch's std divides by G - 1
by_hand = ((r - mean) / (std + 1e-4)).flatten()
by_hand_gap = (by_hand - run.advantages.values).abs().max().item()
print(f"group 0: rewards {' '.join(f'{v:+.3f}' for v in r[0].tolist())}\n"
      f"         A_i     {' '.join(f'{v:+.3f}' for v in by_hand[:G].tolist())}\n"
      f"max |by hand - engine| over the batch: {by_hand_gap:.1e}")

# %% [markdown]
# **Exercise 1: the group advantage (about 5 minutes).** Write `group_advantages(rewards, G)` for a flat tensor of
# B x G rewards, sample $i$ in group $i // G$: $A_i = (r_i - \mathrm{mean}_{\text{group}}) / (\mathrm{std}_{\text{group}} +
# 10^{-4})$, the std torch's default (divided by $G - 1$), as TRL computes it. The checker below calls it on a group
# of equal rewards, random groups, a clean $\pm 1$ group and $G = 2$, and says in a sentence what is wrong. The
# cell holds a solution; `make exercises` writes your copy of this notebook with it emptied.

# %% tags=["solution"]
def group_advantages(rewards, G):
    """(B*G,) rewards, sample i in group i // G -> (B*G,) advantages, as TRL's scale_rewards="group"."""
    grouped = rewards.view(-1, G)
    mean, std = grouped.mean(1, keepdim=True), grouped.std(1, keepdim=True)
    return ((grouped - mean) / (std + 1e-4)).flatten()


# %%
from grpo_debug.exercises import check_advantages

print(check_advantages(group_advantages))

# %% [markdown]
# ## The group mean is a baseline
#
# REINFORCE's gradient is $\nabla_\theta J = \mathbb{E}_{o \sim \pi_\theta}\big[r(o)\, \nabla_\theta \log
# \pi_\theta(o \mid q)\big]$. The score has mean zero, $\mathbb{E}_{o \sim \pi_\theta}[\nabla_\theta \log
# \pi_\theta(o \mid q)] = \sum_o \nabla_\theta \pi_\theta(o \mid q) = \nabla_\theta 1 = 0$, so subtracting any
# baseline $b$ that does not depend on $o$ leaves the expected gradient as it was:
#
# $$\mathbb{E}\big[(r(o) - b)\, \nabla_\theta \log \pi_\theta(o \mid q)\big] = \nabla_\theta J,$$
#
# while a $b$ near $\mathbb{E}[r \mid q]$ makes every term smaller, so the estimate varies less. PPO learns $b$ with a
# value network; GRPO takes the group's mean, a sample estimate of the prompt's own expected reward. (The mean
# includes $r_i$ itself, which scales the expected gradient by $1 - 1/G$: the same direction.) Below, a policy over
# four completions whose rewards share a large offset, its gradient estimated from groups of 8 samples, with and
# without the group mean subtracted:

# %%
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
    print(f"{name:>12}: mean estimate {multiple[name]:.3f} x the exact gradient (1 - 1/G = {1 - 1 / size:.3f}), "
          f"variance {variance[name]:.4f}")
print(f"the group mean divides the variance by {variance['no baseline'] / variance['group mean']:.0f}")

# %% [markdown]
# ## Dividing by the std
#
# Dividing by the group's std makes the advantages independent of the reward's units and offset: rewards times 100
# plus 5 give the same $A_i$, up to the share $\delta / \operatorname{std}$ that the $\delta$ takes
# (printed below), so one learning rate serves any reward scale, and every group with any spread gets advantages
# of about the same size, whether its rewards differ by a hundredth or by 2. That is also its weakness (phantom
# advantages, below); `scale_rewards="none"` (Dr. GRPO's choice) keeps the reward's scale.
#
# TRL's std is the **unbiased** one, dividing by $G - 1$. A clean group $(+1, -1, +1, -1)$ has mean 0 and
# $\sum_j (r_j - \operatorname{mean})^2 = 4$, so $\operatorname{std} = \sqrt{4/3}$ and $A_i = \pm\sqrt{3/4}$, not
# $\pm 1$ (which dividing by $G$ would give): in general $\pm\sqrt{(G-1)/G}$.

# %%
from grpo_debug.advantages import compute_advantages

change = (compute_advantages(100 * run.rewards.total + 5, G) - run.advantages.values).abs().view(-1, G).amax(1)
spread = run.advantages.group_std > 1e-2  # groups whose std is far above delta
largest = lambda groups: f"{change[groups].max():.1e}" if groups.any() else "none"
print(f"rewards x 100 + 5: max |change in A_i| {largest(spread)} in the {int(spread.sum())} groups with "
      f"std > 1e-2; {largest(~spread)} in the others (their std is near delta)")
clean = torch.tensor([1.0, -1.0, 1.0, -1.0])
print(f"clean group {clean.tolist()}: unbiased std {clean.std():.4f}, dividing by G {clean.std(correction=0):.4f}; "
      f"A_i {compute_advantages(clean, 4)[0]:.4f}; sqrt(3/4) = {(3 / 4) ** 0.5:.4f} (the divisor's + 1e-4 aside)")

# %%
adv = run.advantages  # the advantages and their summary: group means and stds, TRL's metrics
print(f"reward {adv.reward:.4f}, reward_std {adv.reward_std:.4f}, frac_reward_zero_std {adv.frac_reward_zero_std:.3f}")
sums = adv.values.view(-1, cfg.num_generations).sum(1)
print("advantages summed per group:", [round(s, 6) for s in sums.tolist()])

# %%
from grpo_debug.ui import plots

red = adv.phantom_groups  # a reward std under advantages.PHANTOM_STD, divided into full-size advantages
note = (f"phantom groups {red} (red): reward std <= {adv.group_std[red].max():.2g}, yet |advantage| up to "
        f"{adv.values.view(-1, cfg.num_generations)[red].abs().max():.2g}" if red else "no phantom group (red)")
plots.advantages_bars(adv, cfg.num_generations, title=f"{len(adv.zero_std_groups)} of {len(adv.group_std)} groups: "
                      f"reward std 0, every advantage 0 (shaded)\n{note}")

# %%
from grpo_debug.ui.tables import compare_variants

scales = compare_variants(step, {"group (TRL default)": {}, "batch": {"scale_rewards": "batch"},
                                 "none": {"scale_rewards": "none"}, "group + std_floor 0.1": {"std_floor": 0.1}},
                          until="advantages", columns=["reward_std", "frac_reward_zero_std", "advantages/max_abs",
                                                       "advantages/phantom_groups"])
scales["share of groups with every advantage 0"] = len(adv.zero_std_groups) / len(adv.group_std)
scales.rename(columns={"advantages/phantom_groups": "phantom groups (a count)"})

# %% [markdown]
# `frac_reward_zero_std` is TRL's metric, and TRL reads it from the std it divides by: under
# `scale_rewards="batch"` that is the batch's std, so the metric says 0 while the groups whose rewards are all
# equal still have advantage 0 (their rewards minus their own mean). The cell below counts those groups.

# %%
print(f"batch scaling: frac_reward_zero_std = {scales.loc['batch', 'frac_reward_zero_std']:.3f}, "
      f"yet {len(adv.zero_std_groups)} of {len(adv.group_std)} groups have every advantage 0")

# %% [markdown]
# ## Zero-std groups still shape the loss
#
# A group with advantage 0 sends no gradient of its own. It still counts in the loss's normaliser (the loss
# divides its summed token terms by it; notebook 05 writes each as a formula): the number of sequences for grpo and
# dr_grpo, the number of tokens for bnpo and dapo. So adding such groups
# shrinks every other sample's weight. Below: the weight one sample with a non-zero advantage gets, with the
# zero-std groups in the batch and with them dropped.

# %%
import pandas as pd

from grpo_debug.loss import loss_weights

lp_mask = step.run(cfg, until="logprobs").logprobs.mask
step.run(cfg, until="advantages")
keep = torch.tensor([g not in adv.zero_std_groups for g in range(len(adv.group_std))]).repeat_interleave(cfg.num_generations)
sample = int(torch.nonzero(keep & (adv.values != 0))[0])
dilution = {}
for loss_type in ["grpo", "bnpo", "dr_grpo", "dapo"]:
    with_all = loss_weights(lp_mask, loss_type, cfg.max_new_tokens)[sample].sum().item()
    without = loss_weights(lp_mask[keep], loss_type, cfg.max_new_tokens)[int(keep[:sample].sum())].sum().item()
    dilution[loss_type] = {"weight, zero-std groups in": with_all, "weight, zero-std groups out": without,
                           "ratio": with_all / without}
dilution = pd.DataFrame(dilution).T
print(f"{len(adv.zero_std_groups)} zero-std groups; sample {sample}'s weight shrinks to "
      f"{dilution['ratio'].min():.2f} to {dilution['ratio'].max():.2f} of its weight without them")
dilution

# %% [markdown]
# ## Phantom advantages, on purpose
#
# Two groups: one whose rewards differ only by 1e-4, a difference too small to mean that one completion is better
# than another (the bundled reward is deterministic: such a difference is an artefact of its arithmetic, not noise),
# and one with a real win/loss split.

# %%
rewards = torch.tensor([0.3, 0.3, 0.3001, 0.3, 1.0, -1.0, 1.0, -1.0])
phantom = pd.DataFrame({"reward": rewards, "TRL (group)": compute_advantages(rewards, 4),
                        "std_floor=0.1": compute_advantages(rewards, 4, std_floor=0.1)})
noise, real = phantom["TRL (group)"][2], phantom["TRL (group)"][4]
print(f"a reward 1e-4 above its group gets advantage {noise:.2f}; a real win gets {real:.3f}; "
      f"with std_floor=0.1 the 1e-4 difference gets {phantom['std_floor=0.1'][2]:.4f}")
phantom

# %% [markdown]
# **What to notice.** A difference of 1e-4 becomes an advantage of the same order as a real win or loss
# (printed above); the floor removes it and leaves the real group untouched. Groups with identical rewards
# send no gradient, but they are not free: every loss type counts them in its normaliser.

# %% [markdown]
# ## Summary
#
# - $A_i = (r_i - \operatorname{mean}(r)) / (\operatorname{std}(r) + \delta)$ in each group, the std unbiased.
# - The group mean is a REINFORCE baseline: the same direction of expected gradient, far less variance.
# - The std makes the advantages unit-free; a clean +-1 group gets $\pm\sqrt{(G-1)/G}$ (0.866 for G = 4).
# - A zero-std group sends no gradient but dilutes every other sample's weight; a tiny std makes phantom advantages.

# %% [markdown]
# ## Checks
#
# *Maintainers' check, run by nbval in CI; a reader may skip it.* The claims the sentences above make, checked against the numbers the cells computed. nbval runs every
# notebook in CI, so a sentence that stops being true fails here instead of going stale. (An identity a cell
# demonstrates, such as "bit for bit", stays in that cell: it is part of the lesson.)

# %%
if CAPTURE is None:  # the bundled step: scale_rewards="group", no std floor, no NaN reward
    assert by_hand_gap < 1e-5, "the advantages by hand are not the engine's"
assert abs(multiple["no baseline"] - 1) < 0.05 and abs(multiple["group mean"] - (1 - 1 / size)) < 0.05  # the direction
assert variance["no baseline"] > 5 * variance["group mean"]  # "less variance"
assert abs(compute_advantages(clean, 4)[0] - (3 / 4) ** 0.5) < 1e-3  # the clean group's 0.866
assert not spread.any() or change[spread].max() < 1e-2  # unit-free where the std is large against delta
assert sums.abs().max() < 1e-4  # each group's advantages sum to 0
assert scales.loc["batch", "frac_reward_zero_std"] == 0.0 or len(adv.zero_std_groups) == 0
assert len(adv.zero_std_groups) == 0 or (dilution["ratio"] < 1).all()  # zero-std groups dilute every weight
assert noise > 0.5 * real and abs(phantom["std_floor=0.1"][2]) < 0.01  # noise amplified; the floor stops it
print("every claim above holds")
