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
# **What you will learn.** How far the sampler's log-probs are from the trainer's and how to measure it
# (verl's metrics and thresholds); why truncated sampling (`top_p`, `top_k`, `min_p`) biases every ratio and
# how renormalising removes it; what precision does; why the gap grows with completion length under TRL's
# sequence correction; and whether less mismatch trained better in a short planned experiment.
#
# **What you need first.** Notebooks 01 (sampling) and 02 (log-probs), and 05b's section on the sampler
# against the trainer (TRL's importance-sampling correction and its modes). Section 5 reads its intervals as
# notebook 06b explains them.
#
# The sampler (vLLM in a real run, `generate` here) and the trainer score the same tokens, and their
# log-probs differ: other kernels, another precision, and, whenever `top_p`, `top_k` or `min_p` truncate the
# sampling distribution, another distribution altogether. The ratio rho = pi_trainer / pi_sampler of each
# token is what TRL's importance-sampling correction multiplies in. This notebook measures the gap as verl
# does (its `rollout_corr/` metrics and health thresholds), then the bias truncation puts into every ratio,
# in closed form, and TRL pull request #7269's fix: the trainer's log-probs renormalised over the tokens the
# sampler kept (`logprob_support="sampler_support"`).

# %%
from grpo_debug.ui.notebook import open_step

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
# Two plain ideas first. Weights that spread far from 1 make a weighted average noisy: how far they spread,
# measured as E[rho^2] - 1 (0 when every weight is 1), is the weights' *chi-square*. And with unequal
# weights a few samples carry the average: the share of the samples it effectively rests on is the
# *effective sample size* (ESS, in (0, 1]: 1 when every weight is equal).
#
# On the scored tokens: `kl` = E[log pi_sampler - log pi_trainer], `k3_kl` = E[rho - log rho - 1], the
# chi-square of the weights per token (E[rho^2] - 1) and per sequence (E[(prod rho)^2] - 1), the weights'
# mean, spread and ESS per token and per sequence, and the share of tokens and sequences whose ratio leaves TRL's clip of 3. The per-token numbers
# are verl's; the per-sequence ones count each sequence once, where verl broadcasts a sequence's weight to
# its tokens and so weighs each sequence by its length (its per-sequence mean and ESS differ from these
# whenever lengths differ). verl warns when the
# mean weight leaves [0.5, 2], the ESS drops below 0.3, the weights' std exceeds 1, |kl| exceeds 0.1 or the
# token chi-square exceeds 1. Below: the step with every fix on, and scored as TRL 1.16 scores it.

# %%
import pandas as pd

from grpo_debug.sampler import HEALTH, health_line
from grpo_debug.show.metrics import metrics

print("verl's warnings:", "; ".join(f"{name.split('/')[-1]} {rule}" for name, (rule, _) in HEALTH.items()))

runs = {"as configured": step.run(cfg, until="logprobs"),
        "trl preset's scoring": step.run(cfg.with_preset("trl"), until="logprobs", remember=False)}
shown = ["kl", "k3_kl", "chi2_token", "chi2_seq", "rollout_is_mean", "rollout_is_std", "rollout_is_eff_sample_size",
         "sequence/rollout_is_mean", "sequence/rollout_is_ratio_fraction_low", "sequence/rollout_is_eff_sample_size"]
gap = pd.DataFrame({name: {k: metrics(run)[f"rollout_corr/{k}"] for k in shown} for name, run in runs.items()})
for name, run in runs.items():
    print(f"{name}: {health_line(metrics(run))}")
gap

# %% [markdown]
# With every fix on the two agree to float rounding. The `trl` preset scores with dropout on and without
# position_ids (notebook 02), and the gap shows in every row. Read the effective sample size with care:
# verl computes it on weights clamped to [0.5, 2], so once every sequence weight falls on one side of that
# window (all below 0.5, or all above 2) they are all clamped to the same bound and the ESS reads 1, a perfect
# score for the worst case. (Weights on both sides clamp to two values, and the ESS drops again.) The share of
# sequence weights below 0.5 (printed) is the number to read there.

# %%
as_configured, trl = (metrics(run) for run in runs.values())
print(f"trl preset's scoring: {trl['rollout_corr/sequence/rollout_is_ratio_fraction_low']:.0%} of the sequence "
      f"weights below 0.5 (mean {trl['rollout_corr/sequence/rollout_is_mean']:.3g}), sequence ESS "
      f"{trl['rollout_corr/sequence/rollout_is_eff_sample_size']:.3f}; token ESS "
      f"{trl['rollout_corr/rollout_is_eff_sample_size']:.3f}")

# %% [markdown]
# ## 2. Truncated sampling: a bias in every ratio, in closed form
#
# `top_p`, `top_k` and `min_p` drop tokens and renormalise over the rest, so the sampler's probability of a
# sampled token is pi / m, with m the probability mass kept at that position. A trainer that scores the full
# vocabulary (TRL, and the `trl` and `fixed` presets) sees rho = m < 1 on every token even with identical
# weights. An error that has the same direction on every token does not average away: it is a *bias*, here
# a bias of the kept mass per token and of the product of the masses per sequence, which the
# sequence-level correction modes then clip or mask. Renormalising the trainer's log-probs over the tokens
# the sampler kept removes it. The table has #7269's shape: mean ratio and share of tokens outside
# [0.9, 1.1], full vocabulary against renormalised, beside the closed-form mean kept mass; one sampled
# rollout per truncation, scored both ways.

# %%
import torch

from grpo_debug.logprobs import completion_mask
from grpo_debug.sampler import kept_mass

truncations = {"control (no truncation)": {"top_p": 1.0}, "top_p 0.8": {"top_p": 0.8}, "top_k 20": {"top_k": 20}}
bias, truncated_runs = {}, {}
if CAPTURE is None:  # each truncation samples anew: a capture's rollout is the trainer's own
    for name, change in truncations.items():
        for support in ("full_vocabulary", "sampler_support"):
            run = step.run(cfg.replace(**change, logprob_support=support), until="logprobs", remember=False)
            truncated_runs[(name, support)] = run
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
else:
    print("a capture's rollout is fixed: this section samples the bundled task anew")
bias

# %% [markdown]
# **What to notice.** The full-vocabulary ratio is the kept mass, token by token, as the closed form says;
# on a truncated sampler no correction mode can tell that bias from a real drift of the weights, and the
# sequence modes multiply it over every token of a completion. Renormalised over the sampler's support, the
# ratio is back at 1 and what is left of the gap is the drift itself.

# %% [markdown]
# ## 3. The sampler and the trainer at different precisions
#
# `sampler_dtype` runs generation under CPU autocast (bfloat16 or float16), so the tokens drawn and the
# sampler's stored log-probs carry that precision's rounding, as a vLLM serving bf16 weights does; `dtype`
# stays the trainer's scoring precision (`float32` or `bfloat16`, TRL's `bf16` switch). The table crosses the
# two on the bundled step: one rollout per sampler precision, scored by the trainer at each of its
# precisions, with verl's metrics and health verdict, and the per-token log-ratio's mean (the drift) and
# spread behind them. On this CPU (AVX2, no native bf16 or fp16 matmuls) a low-precision rollout is several
# times slower than float32 (the seconds are printed first; they vary with the machine).

# %% tags=["nbval-ignore-output"]
from grpo_debug.choices import DTYPES, SAMPLER_DTYPES
from grpo_debug.digits import order_of, significant
from grpo_debug.sampler import sequence_ratios

precision_runs, rollout_seconds = {}, {}
if CAPTURE is None:  # each sampler precision samples anew: a capture's rollout is the trainer's own
    for sampler in SAMPLER_DTYPES:
        sampled = step.run(cfg.replace(sampler_dtype=sampler), until="logprobs", remember=False)
        rollout_seconds[sampler] = sampled.rollout.seconds
        for trainer in DTYPES:
            precision_runs[(sampler, trainer)] = step.run(
                cfg.replace(sampler_dtype=sampler, dtype=trainer), until="logprobs", base=sampled, remember=False)
    print("time to sample the step:", ", ".join(f"{k} {v:.1f} s" for k, v in rollout_seconds.items()))

# %%
def precision_row(run):
    m = metrics(run)
    ratios = sequence_ratios(run.logprobs.policy, run.rollout.sampler_logps, completion_mask(run.rollout))
    return {"mean ratio": m["rollout_corr/rollout_is_mean"], "k3 KL": m["rollout_corr/k3_kl"],
            "chi2 token": m["rollout_corr/chi2_token"], "ESS": m["rollout_corr/rollout_is_eff_sample_size"],
            "sequence ESS": m["rollout_corr/sequence/rollout_is_eff_sample_size"],
            "drift (nats/token)": ratios.token_drift, "spread (nats/token)": ratios.token_spread,
            "largest sequence ratio": ratios.log_ratio.exp().max().item(),
            "verdict": health_line(m).removeprefix("sampler vs trainer: ")}


# a sampler's bfloat16 noise is float32's rounding rounded again, and its statistics move by 10-20% from one CPU's
# matmul kernels to another's, across 1e-4 for the smallest: the table (next cell) is this CPU's; the verdicts and
# the comparisons below are what every CPU shows
precision = pd.DataFrame({pair: precision_row(run) for pair, run in precision_runs.items()}).T
if CAPTURE is None:
    precision.index.names = ["sampler", "trainer"]
    print(f"verdicts: {sorted(set(precision['verdict']))}")

# %% tags=["nbval-ignore-output"]
# this CPU's numbers, at one significant digit: nbval does not compare this cell's output (the checks cell asserts
# the claims)
if CAPTURE is None:
    with pd.option_context("display.float_format", lambda x: significant(x, 1)):
        print(precision.drop(columns="verdict").to_string())

# %%
if CAPTURE is None:
    spread = precision["spread (nats/token)"]
    k3 = precision["k3 KL"]
    bf16, fp16, both = ("bfloat16", "float32"), ("float16", "float32"), ("bfloat16", "bfloat16")
    print(f"float16's spread under a third of bfloat16's: {bool(spread[fp16] < spread[bf16] / 3)}; its k3 KL under a tenth: "
          f"{bool(k3[fp16] < k3[bf16] / 10)}; both in bfloat16 spread most: "
          f"{bool(spread[both] > max(spread[bf16], spread[('float32', 'bfloat16')]))}")
    print(f"(measured on this CPU: sampler bfloat16, trainer float32: spread {significant(spread[bf16], 1)} nats per token, "
          f"k3 KL {k3[bf16]:.1g}; sampler float16: spread {significant(spread[fp16], 1)}, k3 KL {k3[fp16]:.1g}; both in "
          f"bfloat16: spread {significant(spread[both], 1)}, k3 KL {k3[both]:.1g})")

# %% [markdown]
# **What to notice.** On this small model every pair is healthy by verl's thresholds: the rounding of a
# low-precision sampler is a few thousandths of a nat per token (printed), and the mean ratio stays at 1
# to three digits. The float16 sampler sits much closer to the float32 trainer than the bfloat16 one (ten
# mantissa bits against seven; the ratio of their k3 KL is printed), which is the direction of the 2025
# study's finding that FP16 removes most of the mismatch. Both sides in bfloat16 is not "the same
# numbers": `generate` computes each token in its own small forward over a cache and the trainer in one
# forward over the whole row, each rounding its own way, so the pair drifts more than either mixed pair.

# %% [markdown]
# ## 4. Length times drift
#
# TRL 1.16's sequence modes of the correction weigh a completion by the product of its tokens' ratios, so its
# log is the sum of the per-token log-ratios (section 6 flips it to their mean): a steady drift of d nats per
# token grows as d x length. Noise that goes up and down from token to token partly cancels in the sum, which
# then grows only with the square root of the length: noise of spread s per token makes a *random walk*,
# about s x sqrt(length). TRL issue #4772 reports 0.012
# nats per token, which crosses TRL's cap of 3 (`vllm_importance_sampling_clip_max`) after ln 3 / 0.012
# tokens; past it `sequence_mask` zeroes the completion's gradient and `sequence_truncate` clamps its weight.
# Below: each completion's sequence ratio against its length, the cap drawn, on the bundled step (the
# bfloat16 sampler against the float32 trainer: a random walk; `top_p` 0.8 scored over the full vocabulary:
# a steady drift, the log of the kept mass on every token) and on a captured TRL step re-scored in bfloat16.

# %%
import math

from grpo_debug.sampler import length_at_cap, outside_cap
from grpo_debug.ui.mismatch_plots import TRL_4772_DRIFT, sequence_ratio_vs_length

cap = cfg.vllm_importance_sampling_clip_max or 3.0  # TRL's default where a config has no upper bound
print(f"TRL #4772: {TRL_4772_DRIFT} nats per token reaches the cap of {cap:g} after "
      f"{length_at_cap(TRL_4772_DRIFT, cap):.1f} tokens (a sequence ratio of {math.exp(100 * TRL_4772_DRIFT):.2f} "
      "at 100 tokens)")


def describe(name, r):
    """A panel's lengths and how many of its sequence ratios pass the cap (what every CPU shows), then the drift and
    spread behind them: statistics of rounding noise where the two sides differ only in precision, this CPU's."""
    walk = (math.log(cap) / (2 * r.token_spread)) ** 2 if r.token_spread else math.inf
    at_cap = length_at_cap(r.token_drift, cap)
    print(f"{name}:\n  lengths {r.lengths.min().item()} to {r.lengths.max().item()}: "
          f"{outside_cap(r, None, cap).float().mean().item():.0%} of the sequence ratios above {cap:g} (masked under "
          f"TRL's defaults), {outside_cap(r, 1 / cap, None).float().mean().item():.0%} below 1/{cap:g}\n"
          f"  (measured on this CPU: drift {r.token_drift:+.2g} nats per token, the cap after {at_cap:.3g} tokens at it; "
          f"spread {r.token_spread:.2g},\n   a random walk's 2 spreads reach ln {cap:g} after about {order_of(walk)} tokens; "
          f"sequence ratios {r.log_ratio.exp().min().item():.3g} to {r.log_ratio.exp().max().item():.3g})")


panels = {}
if CAPTURE is None:
    for name, run in {"bundled: sampler bfloat16, trainer float32": precision_runs[("bfloat16", "float32")],
                      "bundled: top_p 0.8, full vocabulary": truncated_runs[("top_p 0.8", "full_vocabulary")]}.items():
        panels[name] = sequence_ratios(run.logprobs.policy, run.rollout.sampler_logps, completion_mask(run.rollout))
        describe(name, panels[name])

# %% tags=["nbval-ignore-output"]
import tempfile
import warnings
from pathlib import Path

from grpo_debug.capture import CaptureCallback
from grpo_debug.capture.trl_bridge import trl_trainer
from grpo_debug.config import StepConfig
from grpo_debug.ui.tables import trained_log

trl_log = None
if CAPTURE is None:  # a one-step TRL run of the bundled model (TRL's beta 0), captured as notebook 10 captures yours
    out = Path(tempfile.mkdtemp(prefix="grpo_debug_05c_"))
    demo = StepConfig(num_prompts=2, num_generations=4, beta=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers' renamed arguments, not ours
        trainer = trl_trainer(demo, str(out), max_steps=1, disable_dropout=True)
        trainer.add_callback(CaptureCallback(out / "captures", steps=[1]))
        # TRL's own log of the step, the numbers read below: the lengths of the completions it sampled
        trl_log = trained_log(trainer, ["completions/min_length", "completions/mean_length",
                                        "completions/max_length", "loss", "grad_norm"])
    captured_cfg, captured = open_step(MODEL, out / "captures" / "step-1", TASK)
else:  # your capture is the notebook's step
    captured_cfg, captured = cfg, step
trl_log

# %%
other = "bfloat16" if captured_cfg.dtype == "float32" else "float32"
for name, change in {f"capture: as scored ({captured_cfg.dtype})": {},
                     f"capture: trainer re-scored in {other}": {"dtype": other}}.items():
    run = captured.run(captured_cfg.replace(**change), until="logprobs", remember=False)
    panels[name] = sequence_ratios(run.logprobs.policy, run.rollout.sampler_logps, completion_mask(run.rollout))
    describe(name, panels[name])
sequence_ratio_vs_length(panels, clip_max=cap, clip_min=1 / cap, up_to=cfg.max_new_tokens)

# %% [markdown]
# **What to notice.** The bfloat16 sampler's gap is noise with no direction: its sequence ratios stay near 1
# at every length this model writes, and a random walk of that spread would need thousands of tokens
# (printed) to reach the cap, so none is masked. #4772's drift is a bias, the same sign on every token,
# and the dashed line shows how it turns into masked sequences: the ratio crosses the cap before the
# completion budget, and every longer completion is zeroed (`sequence_mask`) or clamped
# (`sequence_truncate`). `top_p` 0.8 scored over the full vocabulary is such a bias, downwards (the log of
# the kept mass on every token): TRL's default has no lower bound (`vllm_importance_sampling_clip_min` is
# none) and masks none of them, while a lower bound of 1/3 (drawn) masks the red ones. Here the short P:
# completions fall further than the long A: ones: the drift is per uncertain token, and an A: completion
# copies a board almost deterministically, keeping nearly all the mass. On the capture, our replay
# reproduces the trainer's own log-probs (ratio 1), and re-scoring it in the other precision gives the same
# kind of random walk as the bundled step; its completions' lengths are the ones TRL logged for the step
# (`completions/min_length` to `completions/max_length`, the table above the panels).

# %% [markdown]
# ## 5. Does the arm with the least mismatch learn best?
#
# A short training run asks it: three arms that differ only in `sampler_dtype` (float32, the `fixed` arm;
# bfloat16; float16), the trainer in float32 and TRL's correction on in each
# (`vllm_importance_sampling_correction`, sequence_mask, cap 3), K steps on 8 seeds, the held-out reward of
# each low-precision arm minus `fixed` after K steps, paired by seed and test prompt (seeds crossed with
# prompts; two comparisons tested at once, each corrected for the other by Holm's method, notebook 06b). Its claim, arms, K, seeds and analysis were committed in
# `data/experiments/precision_plan.json` before it ran (`bash data/experiments/run.sh precision`); the
# results are loaded from `data/experiments/precision.json`.

# %%
import json
import textwrap

from grpo_debug.files import DATA_DIR

plan = json.loads((DATA_DIR / "experiments" / "precision_plan.json").read_text())
result = json.loads((DATA_DIR / "experiments" / "precision.json").read_text())
assert result["command"] == plan["commands"][0] and result["steps"] == plan["steps"]
print(textwrap.fill(f"claim: {plan['claim']}", 110))
print(f"K = {result['steps']} steps, {result['seeds']} seeds, {result['eval_prompts']} test prompts")
gaps = pd.DataFrame(result["records"]).dropna(subset=["logps/max_sampler_gap"]).groupby("arm")["logps/max_sampler_gap"]
summary = result["summary"]
for arm, s in summary.items():
    print(f"{arm:13s} held-out reward {s['reward_start']:.4f} at step 0, {s['reward_final']['mean']:.4f} after K; "
          f"largest |sampler - trainer| log-prob of a step, mean over steps and seeds {gaps.mean()[arm]:.2g}")
for arm in ("sampler_bf16", "sampler_fp16"):
    print(summary[arm]["minus_fixed"]["verdict"],
          f"({summary[arm]['minus_fixed']['level']:.1%} interval, Holm p {summary[arm]['minus_fixed']['holm_p']:.2f})")
worst_gap = gaps.mean()

# %% [markdown]
# **What to notice.** The arms' mismatch is in the planned order, from the training's own logs: the
# largest sampler-trainer gap of a step is float rounding for the float32 sampler, larger for float16 and
# largest for bfloat16 (printed). The held-out reward is not: no difference from `fixed` is detected, each
# interval (printed, 97.5%: Bonferroni over the two) holds 0, so the claim that the least mismatch learns
# best is not supported here. It is no detectable effect, not proof of none: the intervals bound how large
# an effect could have gone unseen in 12 steps on 8 seeds. The result fits section 4, which measured one step:
# there a bfloat16 sampler's drift is a random walk that stays inside the cap, so the correction masks no
# sequence of that step (asserted). The training records log each step's largest per-token gap (printed), not
# how many sequences the correction masked, so that it masks little at every step of these runs is not
# measured here. A larger model, longer completions or a biased drift (#4772) is where the mismatch starts to
# mask sequences, and where this question should be asked again.

# %% [markdown]
# ## 6. The sequence ratio: a sum or a mean
#
# Section 4's sum is TRL 1.16's: its sequence modes exponentiate the sum of the tokens' log-ratios. GSPO's
# sequence ratio, and TRL's own policy ratio at `importance_sampling_level="sequence"`, take their mean
# (1/|y|), which stays near 1 at any length when the tokens agree on average. TRL issue #5814 measured the
# correction's mean weight well below 1 with the sum and near 1 with the mean on one real run (PR #5815
# proposes the mean). The toggle `vllm_importance_sampling_aggregation` (the `trl` preset's "sum", `fixed`'s "mean") is
# flipped below on one step with the correction on (sequence_mask, bounds [1/3, 3]): on the bundled task
# sampled with top_p 0.8 and scored over the full vocabulary (section 4's downward drift), or on your
# capture re-scored in the other precision. The doctor names it `sequence_ratio_sum` where the sum alone
# masks sequences, and flips it on your step.

# %%
flip_cfg = (cfg.replace(top_p=0.8) if CAPTURE is None else captured_cfg.replace(dtype=other)).replace(
    vllm_importance_sampling_correction=True, vllm_importance_sampling_mode="sequence_mask",
    vllm_importance_sampling_clip_min=1 / cap, vllm_importance_sampling_clip_max=cap,
)
flipped = {}
for aggregation in ("sum", "mean"):
    run = (step if CAPTURE is None else captured).run(
        flip_cfg.replace(vllm_importance_sampling_aggregation=aggregation), until="loss", remember=False)
    flipped[aggregation] = {
        "sampling/importance_sampling_ratio/mean": run.loss.metrics["sampling/importance_sampling_ratio/mean"],
        "sequences masked": (run.loss.sampler_ratio == 0).float().mean().item(),
        "loss": run.loss.loss.item(),
    }
flipped = pd.DataFrame(flipped).T
print(f"sum: {flipped.loc['sum', 'sequences masked']:.0%} of sequences masked, mean weight "
      f"{flipped.loc['sum', 'sampling/importance_sampling_ratio/mean']:.3f}; mean: "
      f"{flipped.loc['mean', 'sequences masked']:.0%} masked, mean weight "
      f"{flipped.loc['mean', 'sampling/importance_sampling_ratio/mean']:.3f}")
flipped

# %% [markdown]
# **What to notice.** The same tokens, the same per-token log-ratios: only how a sequence's are combined
# differs. Where the drift has a direction, the sum pushes the longer completions past the bound and masks
# them (their gradient is gone), and pulls the weight of the rest away from 1; the mean keeps every sequence
# and a weight near 1 (printed; asserted below on the bundled step).

# %% [markdown]
# ## Summary
#
# - The sampler's and the trainer's log-probs differ; verl's metrics and thresholds say by how much.
# - Truncated sampling scored over the full vocabulary biases every ratio by the kept mass; renormalising removes it.
# - Under TRL's sequence correction a drift grows with length and masks long completions; noise grows far slower.
# - Summing a sequence's log-ratios masks where their mean does not (section 6).
# - In the planned experiment, the arm with the least mismatch did not learn detectably better.

# %% [markdown]
# ## Checks
#
# *Maintainers' live check, run by nbval in CI; a reader may skip it.* The claims the sentences above make, checked against the numbers the cells computed. nbval runs every
# notebook in CI, so a sentence that stops being true fails here instead of going stale. (An identity a cell
# demonstrates, such as "bit for bit", stays in that cell: it is part of the lesson.)

# %%
if CAPTURE is None:  # measured on the bundled step
    # section 1: every fix on is healthy; the trl preset's scoring drives every sequence weight below 0.5
    assert abs(as_configured["rollout_corr/kl"]) < 1e-4 and "healthy" in health_line(as_configured)
    assert trl["rollout_corr/sequence/rollout_is_ratio_fraction_low"] == 1.0
    assert trl["rollout_corr/sequence/rollout_is_eff_sample_size"] > 0.999 and "WARNING" in health_line(trl)
    # section 2: the mean ratio is the kept mass within 1%, and 1 within 1% once renormalised
    assert ((full["mean ratio"] - full["kept mass, closed form"]).abs() < 0.01 * full["kept mass, closed form"]).all()
    assert ((renormalised["mean ratio"] - 1).abs() < 0.01).all()
    # section 3: every pair healthy; float16 drifts less than bfloat16; both in bfloat16 most
    assert precision["verdict"].str.startswith("healthy").all()
    assert spread[fp16] < spread[bf16] / 3 and k3[fp16] < k3[bf16] / 10
    assert spread[both] > max(spread[bf16], spread[("float32", "bfloat16")])
    # section 4: #4772's drift crosses the cap within the budget; a bfloat16 sampler's random walk does not
    walk, truncated = panels["bundled: sampler bfloat16, trainer float32"], panels["bundled: top_p 0.8, full vocabulary"]
    assert length_at_cap(TRL_4772_DRIFT, cap) < cfg.max_new_tokens
    assert not outside_cap(walk, 1 / cap, cap).any() and (math.log(cap) / (2 * walk.token_spread)) ** 2 > 1000
    assert not outside_cap(truncated, None, cap).any() and outside_cap(truncated, 1 / cap, None).any()
    short = truncated.lengths < truncated.lengths.float().mean()
    assert truncated.log_ratio[short].mean() < truncated.log_ratio[~short].mean()
    as_scored, rescored = (panels[name] for name in list(panels)[2:])
    assert as_scored.log_ratio.abs().max() < 1e-4 and not outside_cap(rescored, 1 / cap, cap).any()
    assert abs(rescored.token_drift) < rescored.token_spread / 10
    # section 6: the sum masks sequences the mean keeps, and moves the weight further from 1
    assert flipped.loc["sum", "sequences masked"] > flipped.loc["mean", "sequences masked"] == 0.0
    weight = flipped["sampling/importance_sampling_ratio/mean"]
    assert abs(weight["sum"] - 1) > abs(weight["mean"] - 1)
# section 5: the arms' mismatch in order, and no detectable effect on the held-out reward
assert worst_gap["fixed"] < worst_gap["sampler_fp16"] < worst_gap["sampler_bf16"]
assert all(summary[arm]["minus_fixed"]["holm_p"] >= 0.05 for arm in ("sampler_bf16", "sampler_fp16"))
assert all(summary[a]["minus_fixed"]["ci_low"] < 0 < summary[a]["minus_fixed"]["ci_high"] for a in ("sampler_bf16", "sampler_fp16"))
print("every claim above holds")
