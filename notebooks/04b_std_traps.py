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
# # 04b · The std's traps: phantom advantages, and a metric that reads 0
#
# **What you will learn.** How dividing by a tiny group std turns a reward difference that means nothing into an
# advantage as large as a real win's, and how a floor under the std (`std_floor`, not in TRL) stops it, on a
# made-up pair of groups and on the step's own phantom groups; why TRL's `frac_reward_zero_std` reads 0 under
# `scale_rewards="batch"` while groups of equal rewards still get advantage 0.
#
# **What you need first.** Notebook 04 (the group advantage, $\delta$, the phantom groups of its figure).

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
# ## Phantom advantages, on purpose
#
# Two groups: one whose rewards differ only by 1e-4, a difference that means nothing (the bundled reward is
# deterministic: it is an artefact of its arithmetic), and a real win/loss split. `std_floor` divides by
# $\max(\operatorname{std}(r), \text{std\_floor}) + \delta$ instead.

# %%
import torch

from grpo_debug.advantages import compute_advantages

rewards = torch.tensor([0.3, 0.3, 0.3001, 0.3, 1.0, -1.0, 1.0, -1.0])
trl, floored = compute_advantages(rewards, 4), compute_advantages(rewards, 4, std_floor=0.1)
noise, real = trl[2].item(), trl[4].item()
print(f"TRL:           the reward 1e-4 above its group gets advantage {noise:.2f}; a real win gets {real:.3f}\n"
      f"std_floor=0.1: the 1e-4 difference gets {floored[2]:.4f}; the real win {floored[4]:.3f}")

# %% [markdown]
# ## On the step
#
# The phantom groups of 04's figure (a reward std above 0 yet under `advantages.PHANTOM_STD`), as TRL computes
# them and with `std_floor=0.1`; a group whose std is at least the floor keeps its advantages.

# %%
run = step.run(cfg, until="advantages")
G, adv = cfg.num_generations, run.advantages
trl_step = compute_advantages(run.rewards.total, G).view(-1, G)
floored_step = compute_advantages(run.rewards.total, G, std_floor=0.1).view(-1, G)
for g in adv.phantom_groups:
    print(f"group {g}: reward std {adv.group_std[g]:.2g}; max |advantage| {trl_step[g].abs().max():.2g} as TRL, "
          f"{floored_step[g].abs().max():.2g} with std_floor=0.1")
wide = adv.group_std >= 0.1  # the groups the floor does not touch
print(f"the {int(wide.sum())} groups with std >= 0.1: max |change| {(floored_step - trl_step)[wide].abs().max():.1e}"
      if wide.any() else "no group with std >= 0.1")

# %% [markdown]
# ## `frac_reward_zero_std` under batch scaling
#
# `frac_reward_zero_std`, TRL's metric, reads the std TRL divides by: under `scale_rewards="batch"` the batch's,
# so it says 0 while the groups of equal rewards still get advantage 0:

# %%
batch = step.run(cfg.replace(scale_rewards="batch"), until="advantages", remember=False).advantages
equal = batch.values.view(-1, G)[adv.zero_std_groups]  # the groups whose rewards are all equal
print(f'scale_rewards="batch": frac_reward_zero_std {batch.frac_reward_zero_std:.3f}, yet the '
      f"{len(adv.zero_std_groups)} groups of equal rewards have |advantage| at most {equal.abs().max() if len(equal) else 0:.1g}")

# %% [markdown]
# ## Summary
#
# - TRL divides by the group's std plus $\delta$: a 1e-4 difference gets an advantage of a real win's order.
# - `std_floor` divides by at least the floor: the phantoms shrink, a real split keeps its advantages.
# - Under `scale_rewards="batch"`, `frac_reward_zero_std` reads the batch's std: it says 0 while groups of equal
#   rewards still get advantage 0.

# %% [markdown]
# ## Checks
#
# *Maintainers' check, run by nbval in CI; a reader may skip it.* The claims the sentences above make, checked
# against the numbers the cells computed.

# %%
assert noise > 0.5 * real, "the 1e-4 difference is not amplified to the order of a real win"
assert abs(floored[2]) < 0.01 and abs(floored[4] - real) < 1e-4, "the floor did not stop the noise alone"
for g in adv.phantom_groups:
    assert floored_step[g].abs().max() < trl_step[g].abs().max(), f"std_floor did not shrink phantom group {g}"
assert not wide.any() or (floored_step - trl_step)[wide].abs().max() == 0, "the floor moved a group with std >= 0.1"
if CAPTURE is None:  # the bundled step has a phantom group, and groups of equal rewards
    assert adv.phantom_groups, "the bundled step has no phantom group"
    assert adv.zero_std_groups, "the bundled step has no group of equal rewards"
if adv.zero_std_groups:  # "the metric says 0 while the groups whose rewards are all equal still get advantage 0"
    assert batch.frac_reward_zero_std == 0.0, "batch scaling: frac_reward_zero_std is not 0"
    assert equal.abs().max() < 1e-6, "batch scaling: a group of equal rewards gets a non-zero advantage"
print("every claim above holds")
