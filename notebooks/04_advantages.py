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
# advantage = (reward - mean of its group) / (std + 1e-4), exactly as TRL 1.16 (`scale_rewards="group"`);
# `"batch"` divides by the batch std, `"none"` does not divide. A group with identical rewards has
# advantage 0 everywhere (`frac_reward_zero_std`); a group whose std is tiny but not zero turns noise into
# full-size advantages (phantom advantages): `std_floor` clamps the std from below.

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
# The whole computation is one function of the rewards, here on the step's own (B*G,) rewards:

# %%
import torch

from grpo_debug.advantages import compute_advantages
from grpo_debug.ui.notebook import show_source

show_source(compute_advantages)
run = step.run(cfg, until="advantages")
advantages = compute_advantages(run.rewards.total, cfg.num_generations, cfg.scale_rewards, cfg.std_floor)
assert torch.equal(advantages, run.advantages.values)  # what the step computed, bit for bit

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
scales["groups with all advantages 0"] = len(adv.zero_std_groups) / len(adv.group_std)
scales

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
# A group with advantage 0 sends no gradient of its own. It still counts in the loss's normaliser: the
# number of sequences for grpo and dr_grpo, the number of tokens for bnpo and dapo. So adding such groups
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
# Two groups: one whose rewards differ only by 1e-4 (noise), one with a real win/loss split.

# %%
rewards = torch.tensor([0.3, 0.3, 0.3001, 0.3, 1.0, -1.0, 1.0, -1.0])
phantom = pd.DataFrame({"reward": rewards, "TRL (group)": compute_advantages(rewards, 4),
                        "std_floor=0.1": compute_advantages(rewards, 4, std_floor=0.1)})
noise, real = phantom["TRL (group)"][2], phantom["TRL (group)"][4]
print(f"a reward 1e-4 above its group gets advantage {noise:.2f}; a real win gets {real:.2f}; "
      f"with std_floor=0.1 the noise gets {phantom['std_floor=0.1'][2]:.4f}")
phantom

# %% [markdown]
# **What to notice.** A difference of 1e-4 becomes an advantage of the same order as a real win or loss
# (printed above); the floor removes it and leaves the real group untouched. Groups with identical rewards
# send no gradient, but they are not free: every loss type counts them in its normaliser.

# %% [markdown]
# ## Checks
#
# The claims the sentences above make, checked against the numbers the cells computed. nbval runs every
# notebook in CI, so a sentence that stops being true fails here instead of going stale. (An identity a cell
# demonstrates, such as "bit for bit", stays in that cell: it is part of the lesson.)

# %%
assert sums.abs().max() < 1e-4  # each group's advantages sum to 0
assert scales.loc["batch", "frac_reward_zero_std"] == 0.0 or len(adv.zero_std_groups) == 0
assert len(adv.zero_std_groups) == 0 or (dilution["ratio"] < 1).all()  # zero-std groups dilute every weight
assert noise > 0.5 * real and abs(phantom["std_floor=0.1"][2]) < 0.01  # noise amplified; the floor stops it
print("every claim above holds")
