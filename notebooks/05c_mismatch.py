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
# # 05c · The sampler against the trainer
#
# The sampler (vLLM in a real run, `generate` here) and the trainer score the same tokens, and their
# log-probs differ: other kernels, another precision, and, whenever `top_p`, `top_k` or `min_p` truncate the
# sampling distribution, another distribution altogether. The ratio rho = pi_trainer / pi_sampler of each
# token is what TRL's importance-sampling correction multiplies in. This notebook measures the gap as verl
# does (its `rollout_corr/` metrics and health thresholds), then the bias truncation puts into every ratio,
# in closed form, and TRL pull request #7269's fix: the trainer's log-probs renormalised over the tokens the
# sampler kept (`logprob_support="sampler_support"`).

# %%
from grpo_debug.notebook import open_step

# The model by name: None is the bundled model; "jrahn/RookWorld-LM-124M" works where the hub is reachable.
MODEL = None
# Or a step captured from your own TRL run (`grpo_debug.capture`, notebook 10): its batch, under its config.
CAPTURE = None
# With CAPTURE, your registered task (the run's reward functions): needed only where new completions are sampled.
TASK = None
# setup() first: one torch thread, the same numbers on every run
cfg, step = open_step(MODEL, CAPTURE, TASK, num_prompts=4, num_generations=8)

# %% [markdown]
# ## 1. The gap, as verl measures it
#
# On the scored tokens: `kl` = E[log pi_sampler - log pi_trainer], `k3_kl` = E[rho - log rho - 1], the
# chi-square of the weights per token (E[rho^2] - 1) and per sequence (E[(prod rho)^2] - 1), the weights'
# mean, spread and effective sample size (ESS, in (0, 1]: 1 when every weight is equal) per token and per
# sequence, and the share of tokens and sequences whose ratio leaves TRL's clip of 3. verl warns when the
# mean weight leaves [0.5, 2], the ESS drops below 0.3, the weights' std exceeds 1, |kl| exceeds 0.1 or the
# token chi-square exceeds 1. Below: the step with every fix on, and scored as TRL 1.16 scores it.

# %%
import pandas as pd

from grpo_debug.metrics import metrics
from grpo_debug.sampler import HEALTH, health_line

print("verl's warnings:", "; ".join(f"{name.split('/')[-1]} {rule}" for name, (rule, _) in HEALTH.items()))

runs = {"as configured": step.run(cfg, until="logprobs"),
        "trl preset's scoring": step.run(cfg.with_preset("trl"), until="logprobs", remember=False)}
shown = ["kl", "k3_kl", "chi2_token", "chi2_seq", "rollout_is_mean", "rollout_is_std", "rollout_is_eff_sample_size",
         "sequence/rollout_is_mean", "sequence/rollout_is_ratio_fraction_low", "sequence/rollout_is_eff_sample_size"]
gap = pd.DataFrame({name: {k: metrics(run)[f"rollout_corr/{k}"] for k in shown} for name, run in runs.items()}).T
for name, run in runs.items():
    print(f"{name}: {health_line(metrics(run))}")
gap

# %% [markdown]
# With every fix on the two agree to float rounding. The `trl` preset scores with dropout on and without
# position_ids (notebook 02), and the gap shows in every column. Read the effective sample size with care:
# verl computes it on weights clamped to [0.5, 2], so once every sequence weight falls outside that window
# they are all clamped to one value and the ESS reads 1, a perfect score for the worst case. The share of
# sequence weights below 0.5 (printed) is the number to read there.

# %%
as_configured, trl = (metrics(run) for run in runs.values())
print(f"trl preset's scoring: {trl['rollout_corr/sequence/rollout_is_ratio_fraction_low']:.0%} of the sequence "
      f"weights below 0.5 (mean {trl['rollout_corr/sequence/rollout_is_mean']:.3g}), sequence ESS "
      f"{trl['rollout_corr/sequence/rollout_is_eff_sample_size']:.3f}; token ESS "
      f"{trl['rollout_corr/rollout_is_eff_sample_size']:.3f}")
if CAPTURE is None:  # the bundled step, every fix on
    assert abs(as_configured["rollout_corr/kl"]) < 1e-4 and "healthy" in health_line(as_configured)
    assert trl["rollout_corr/sequence/rollout_is_ratio_fraction_low"] == 1.0
    assert trl["rollout_corr/sequence/rollout_is_eff_sample_size"] > 0.999 and "WARNING" in health_line(trl)

# %% [markdown]
# ## 2. Truncated sampling: a bias in every ratio, in closed form
#
# `top_p`, `top_k` and `min_p` drop tokens and renormalise over the rest, so the sampler's probability of a
# sampled token is pi / m, with m the probability mass kept at that position. A trainer that scores the full
# vocabulary (TRL, and the `trl` and `fixed` presets) sees rho = m < 1 on every token even with identical
# weights: a bias of the kept mass per token and of the product of the masses per sequence, which the
# sequence-level correction modes then clip or mask. Renormalising the trainer's log-probs over the tokens
# the sampler kept removes it. The table has #7269's shape: mean ratio and share of tokens outside
# [0.9, 1.1], full vocabulary against renormalised, beside the closed-form mean kept mass; one sampled
# rollout per truncation, scored both ways.

# %%
import torch

from grpo_debug.logprobs import completion_mask
from grpo_debug.sampler import kept_mass

truncations = {"control (no truncation)": {"top_p": 1.0}, "top_p 0.8": {"top_p": 0.8}, "top_k 20": {"top_k": 20}}
bias = {}
if CAPTURE is None:  # each truncation samples anew: a capture's rollout is the trainer's own
    for name, change in truncations.items():
        for support in ("full_vocabulary", "sampler_support"):
            run = step.run(cfg.replace(**change, logprob_support=support), until="logprobs", remember=False)
            sampled = completion_mask(run.rollout, "keep_first_eos").bool()
            rho = torch.exp(run.logprobs.policy - run.rollout.sampler_logps)[sampled]
            bias[(name, support)] = {"mean ratio": rho.mean().item(),
                                     "outside [0.9, 1.1]": ((rho < 0.9) | (rho > 1.1)).float().mean().item(),
                                     "kept mass, closed form": kept_mass(run.rollout)[sampled].mean().item()}
    bias = pd.DataFrame(bias).T
    full = bias.xs("full_vocabulary", level=1)
    renormalised = bias.xs("sampler_support", level=1)
    print(f"top_p 0.8: mean ratio {full.loc['top_p 0.8', 'mean ratio']:.3f} over the full vocabulary, closed form "
          f"{full.loc['top_p 0.8', 'kept mass, closed form']:.3f}, {renormalised.loc['top_p 0.8', 'mean ratio']:.3f} "
          "renormalised")
    assert ((full["mean ratio"] - full["kept mass, closed form"]).abs() < 0.01 * full["kept mass, closed form"]).all()
    assert ((renormalised["mean ratio"] - 1).abs() < 0.01).all()
else:
    print("a capture's rollout is fixed: this section samples the bundled task anew")
bias

# %% [markdown]
# **What to notice.** The full-vocabulary ratio is the kept mass, token by token, as the closed form says;
# on a truncated sampler no correction mode can tell that bias from a real drift of the weights, and the
# sequence modes multiply it over every token of a completion. Renormalised over the sampler's support, the
# ratio is back at 1 and what is left of the gap is the drift itself.
