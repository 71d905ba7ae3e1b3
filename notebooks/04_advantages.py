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
#     display_name: Python 3
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
from grpo_debug.notebook import setup
setup()  # one torch thread: the same numbers on every run

# The model by name: None is the bundled model; "jrahn/RookWorld-LM-124M" works where the hub is reachable.
MODEL = None

# %%
from grpo_debug.config import StepConfig
from grpo_debug.paths import DEFAULT_MODEL
from grpo_debug.step import GRPOStep

cfg = StepConfig(model=MODEL or DEFAULT_MODEL)
step = GRPOStep(cfg)
run = step.run(cfg, until="advantages")
adv = run.advantages
print(f"reward {adv.reward:.4f}, reward_std {adv.reward_std:.4f}, frac_reward_zero_std {adv.frac_reward_zero_std:.3f}")
sums = adv.values.view(-1, cfg.num_generations).sum(1)
print("advantages summed per group:", [round(s, 6) for s in sums.tolist()])
assert sums.abs().max() < 1e-4

# %%
from grpo_debug import plots
plots.advantages_bars(adv, cfg.num_generations)

# %%
from grpo_debug.tables import compare_variants
compare_variants(step, {"group (TRL default)": {}, "batch": {"scale_rewards": "batch"},
                        "none": {"scale_rewards": "none"}, "group + std_floor 0.1": {"std_floor": 0.1}},
                 until="advantages", columns=["reward_std", "frac_reward_zero_std", "advantages/max_abs",
                                              "advantages/phantom_groups"])

# %% [markdown]
# ## Phantom advantages, on purpose
#
# Two groups: one whose rewards differ only by 1e-4 (noise), one with a real win/loss split.

# %%
import pandas as pd
import torch
from grpo_debug.advantages import compute_advantages

rewards = torch.tensor([0.3, 0.3, 0.3001, 0.3, 1.0, -1.0, 1.0, -1.0])
pd.DataFrame({"reward": rewards, "TRL (group)": compute_advantages(rewards, 4),
              "std_floor=0.1": compute_advantages(rewards, 4, std_floor=0.1)})

# %% [markdown]
# **What to notice.** A 1e-4 difference becomes an advantage of 0.5, the same order as a real win/loss;
# the floor removes it and leaves the real group untouched. Zero-std groups contribute nothing to the
# gradient, whatever the loss type.
