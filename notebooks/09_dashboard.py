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
# # 09 · Dashboard: every toggle in one panel
#
# Each control is a `StepConfig` field; a change re-runs only the phases after the one it belongs to, on
# the same cached rollout, and redraws. Below the panel, the same comparisons as static tables.

# %%
from grpo_debug.notebook import setup
setup()  # one torch thread: the same numbers on every run

# The model by name: None is the bundled model; "jrahn/RookWorld-LM-124M" works where the hub is reachable.
MODEL = None

# %%
from grpo_debug.config import StepConfig
from grpo_debug.paths import DEFAULT_MODEL
from grpo_debug.step import GRPOStep

cfg = StepConfig(model=MODEL or DEFAULT_MODEL, num_prompts=4, num_generations=4)
step = GRPOStep(cfg)

# %% tags=["nbval-ignore-output"]
from grpo_debug.ui.widgets import StepPanel
panel = StepPanel(step)
panel.widget()

# %%
from grpo_debug.ui.widgets import apply_change
result = apply_change(step, "kl_estimator", "k2")
print("re-ran:", result.rerun)
assert result.rerun == ["loss"]
result = apply_change(step, "mask", "drop_eos_and_pad")
print("re-ran:", result.rerun)
assert result.rerun[0] == "logprobs" and result.run.rollout is step.result.rollout
print("the dashboard's step now:", step.cfg.mask, step.cfg.kl_estimator)

# %%
from grpo_debug.ui.tables import compare_variants
from grpo_debug.config import PRESETS
table = compare_variants(step, {"every fix on": {}, "T not applied": {"logprob_temperature": False},
                                "dropout": {"dropout": True}, "EOS dropped": {"mask": "drop_eos_and_pad"},
                                "k1": {"kl_estimator": "k1"}, "batch scale": {"scale_rewards": "batch"},
                                "dr_grpo": {"loss_type": "dr_grpo"}, "TRL 1.16 as shipped": PRESETS["trl"]},
                         base=cfg, until="loss",
                         columns=["logps/max_sampler_gap", "logps/eos_kept", "frac_reward_zero_std", "kl", "loss"])
moved = table.index[(table["loss"] - table.loc["every fix on", "loss"]).abs() > 1e-6].tolist()
print("rows whose loss differs from every fix on:", ", ".join(moved))
assert "dropout" in moved and "TRL 1.16 as shipped" not in moved
table

# %% [markdown]
# **What to notice.** Only the rows with a log-prob pitfall move the sampler gap. The loss moves only in the
# rows printed above: with dropout on, the policy (scored with dropout) no longer equals the reference, so
# beta times a large KL enters the loss. TRL's preset has the same dropout but beta 0, so its loss stays
# near 0. Another loss type changes the value at step 0 only by -sum_i A_i w_i (notebook 05), which is
# near 0 in this small batch.
