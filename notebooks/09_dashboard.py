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
# # 09 · Dashboard: every toggle in one panel
#
# Each control is a `StepConfig` field; a change re-runs only the phases after the one it belongs to, on
# the same cached rollout, and redraws. Below the panel, the same comparisons as static tables.
#
# The panel also holds TRL 1.16's off-policy controls: `num_iterations` (mu, optimizer passes over one
# rollout), the clip range `epsilon_low`/`epsilon_high`, `delta` ("off" is None), the
# `importance_sampling_level`, the sampler correction (`vllm_importance_sampling_correction` and its mode)
# and `top_entropy_quantile`. With `num_iterations` at 2 or more the panel runs the update too, and its
# status line shows each pass's `clip_ratio/region_mean` and `entropy` (TRL's names); at 1 the only pass is
# on-policy (ratio exactly 1, every clip ratio 0), so the panel stops at the loss. A change of the clip range
# or `delta` then re-reads the passes' cached log-probs instead of re-running them: the first pass is
# on-policy, so they cannot change the weights the second pass scores (checked per change:
# `grpo_debug.ui.passes.passes_under` re-reads only where every earlier pass's token gradients are unchanged).

# %%
from grpo_debug.ui.notebook import open_step

# The model by name: None is the bundled model; "jrahn/RookWorld-LM-124M" works where the hub is reachable.
MODEL = None
# Or a step captured from your own TRL run (`grpo_debug.capture`, notebook 10): the panel then acts on it.
CAPTURE = None
# With CAPTURE, your registered task (the run's reward functions): needed only where new completions are sampled.
TASK = None
# setup() first: one torch thread, the same numbers on every run. Per-sample gradient norms are notebook 06's
cfg, step = open_step(MODEL, CAPTURE, TASK, num_prompts=4, num_generations=4, per_sample_grad_norms=False)

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
import math

from grpo_debug.config import StepConfig
from grpo_debug.digits import significant
from grpo_debug.ui.tables import compare_variants

base = "every fix on" if CAPTURE is None else "as captured"  # a capture's step is the run's own config
table = compare_variants(step, {base: {}, "T not applied": {"logprob_temperature": False},
                                "dropout": {"dropout": True}, "EOS dropped": {"mask": "drop_eos_and_pad"},
                                "k1": {"kl_estimator": "k1"}, "batch scale": {"scale_rewards": "batch"},
                                "dr_grpo": {"loss_type": "dr_grpo"}, "TRL 1.16 as shipped": StepConfig.preset_fields("trl")},
                         base=cfg, until="loss",
                         columns=["logps/max_sampler_gap", "logps/eos_kept", "frac_reward_zero_std", "kl", "loss"])
moved = table.index[(table["loss"] - table.loc[base, "loss"]).abs() > 1e-6].tolist()
print(f"rows whose loss differs from {base}:", ", ".join(moved))
gap, kl = table.loc["dropout", "logps/max_sampler_gap"], table.loc["dropout", "kl"]
print(f"dropout: kl {significant(kl)} nats per token ({cfg.kl_estimator}), largest per-token log-prob gap {gap:.3g} nats")
if cfg.kl_estimator.startswith("k3"):
    print(f"  (k3 = exp(d) - d - 1 per token: that one token alone adds up to exp({gap:.3g}) = {math.exp(gap):.3g} "
          "to the sum over tokens)")
table

# %% [markdown]
# **What to notice.** Only the rows with a log-prob pitfall move the sampler gap. The loss moves only in the
# rows printed above: with dropout on, the policy (scored with dropout) no longer equals the reference, so
# beta times a large KL enters the loss. The KL is in nats per token, and its size comes from a few tokens:
# under k3 a token whose log-prob dropped by d nats adds exp(d) - d - 1, so a gap of the size printed above
# outweighs every other token. Each dropout draw drops its own units and moves its own tokens, so the value
# swings from draw to draw by orders of magnitude (notebook 02 prints another draw's, for the same toggle). TRL's preset has the same dropout but beta 0, so its loss stays
# near 0. Another loss type changes the value at step 0 only by -sum_i A_i w_i (notebook 05), which is
# near 0 in this small batch.

# %% [markdown]
# ## The off-policy controls, pass by pass
#
# With one pass the policy that is trained is the one that scored the rollout: the ratio is 1 and the clip
# range, `delta` and the importance-sampling level change nothing. With `num_iterations=2` the second pass
# re-scores the rollout with the weights the first optimizer step left, and they act. A change of
# `num_iterations` re-runs the update alone; a change of a loss-side field re-runs the loss and the update.

# %%
from grpo_debug.ui.widgets import summary

step.run(cfg.replace(num_iterations=1), until="update")  # one pass first (a capture may have run more)
result = apply_change(step, "num_iterations", 2, until="update")
print("num_iterations=2 re-ran:", result.rerun)
assert result.rerun == ["update"]
result = apply_change(step, "epsilon_high", 0.28, until="update")
print("epsilon_high=0.28 re-ran:", result.rerun)
assert result.rerun == ["loss", "update"] and result.run.logprobs is step.result.logprobs
shown = summary(result.run)
print({k: round(v, 4) for k, v in shown.items() if k == "entropy" or k.startswith("iteration_")})
result = apply_change(step, "epsilon_high", cfg.epsilon_high, until="update")

# %%
mu2 = cfg.replace(num_iterations=2)
columns = ["iteration_1/clip_ratio/region_mean", "iteration_2/clip_ratio/low_mean", "iteration_2/clip_ratio/high_mean",
           "iteration_2/clip_ratio/region_mean", "iteration_2/entropy", "iteration_1/grad_norm", "iteration_2/grad_norm"]
passes = compare_variants(step, {"mu=2": {}, "epsilon_high 0.28": {"epsilon_high": 0.28},
                                 "epsilon 0.1": {"epsilon_low": 0.1, "epsilon_high": 0.1},
                                 "delta 1.5": {"delta": 1.5}, "sequence-level ratio": {"importance_sampling_level": "sequence"},
                                 "top 20% entropy": {"top_entropy_quantile": 0.2},
                                 "sampler correction": {"vllm_importance_sampling_correction": True}},
                          base=mu2, until="update", columns=columns)
step.run(cfg, until="update")  # the panel above goes on from the notebook's config (mu = 1), not from mu2
passes.round(4)

# %% [markdown]
# **What to notice.** Where the step's weights scored the completions (the bundled step; a capture's first
# optimizer step of a generation, dropout off), the first pass clips nothing in every row: it is on-policy
# (the checks below say which this step is). In the second, a wider
# `epsilon_high` clips fewer tokens above the range and a narrower range clips more. The sequence-level
# ratio (GSPO) averages the log-ratios over each completion, and a sequence's mean moves less than its
# tokens do, so it clips no more than the token-level ratio. Training on the top 20% of tokens by entropy
# changes the first pass's gradient, but hardly which tokens the second pass clips: AdamW's first step
# moves every weight by about the learning rate, whatever the gradient's size. The sampler correction changes
# little here, since the sampler's log-probs and the recomputed ones agree (the gap printed in the panel).

# %% [markdown]
# ## Checks
#
# The claims the sentences above make, checked against the numbers the cells computed. nbval runs every
# notebook in CI, so a sentence that stops being true fails here instead of going stale. (An identity a cell
# demonstrates, such as "bit for bit", stays in that cell: it is part of the lesson.)

# %%
if CAPTURE is None:  # the bundled step, from the fixed preset
    assert "dropout" in moved and "TRL 1.16 as shipped" not in moved, f"the rows whose loss moves: {moved}"
# at mu = 2, pass 1 is on-policy where every ratio is 1: not on a later optimizer step of a captured generation,
# nor with dropout on (pi_old was scored with other dropout masks); then pass 1 clips, and its update depends
# on the clip range (at mu = 1 the ratio is 1 by construction: TRL takes pi_old = pi.detach())
from grpo_debug.show.diagnostics import ON_POLICY, first_pass_ratio_gap

pass_1_gap = first_pass_ratio_gap(step.run(mu2, until="update", remember=False))
pass_1_on_policy = pass_1_gap < ON_POLICY  # 1 up to the fast path's float rounding
passes_2 = "iteration_2/clip_ratio/region_mean"
if pass_1_on_policy:
    assert shown["iteration_1/clip_ratio/region_mean"] == 0.0, "pass 1 is on-policy, yet the panel shows clipping"
    first = passes["iteration_1/clip_ratio/region_mean"]
    assert (first == 0).all(), f"pass 1 is on-policy, yet these rows clipped in it: {first[first != 0].to_dict()}"
    narrow, wide = passes.loc["epsilon 0.1", passes_2], passes.loc["mu=2", passes_2]
    assert narrow >= wide, f"a narrower clip range clipped less in pass 2 ({narrow:.3g} < {wide:.3g})"
else:
    print(f"pass 1 of mu = 2 is not on-policy on this step (|ratio - 1| up to {pass_1_gap:.2g} "
          "before any update): it clips too, and the rows' second passes start from different updates")
if CAPTURE is None:  # the bundled step, with epsilon_high 0.2
    high = "iteration_2/clip_ratio/high_mean"
    assert passes.loc["epsilon_high 0.28", high] <= passes.loc["mu=2", high], "a wider epsilon_high clipped more"
    assert passes.loc["sequence-level ratio", passes_2] <= passes.loc["mu=2", passes_2], "GSPO clipped more"
top, every = passes.loc["top 20% entropy", "iteration_1/grad_norm"], passes.loc["mu=2", "iteration_1/grad_norm"]
assert top != every, f"training on the top 20% of tokens by entropy left pass 1's grad_norm at {every:.4g}"
print("every claim above holds")
