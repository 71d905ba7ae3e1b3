"""The sampler against the trainer: TRL's importance-sampling correction for a sampler other than the trained
model (`vllm_importance_sampling_correction`): the ratio pi_old / pi_sampler per token or per sequence,
truncated or masked, and the sampling/* metrics TRL logs about it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .choices import SAMPLER_CORRECTION_MODES


@dataclass(frozen=True)
class SamplerCorrection:
    """TRL's vLLM importance-sampling correction (`vllm_importance_sampling_*`): pi_old / pi_sampler per token
    or per sequence, zeroed (*_mask) or clamped (*_truncate) outside [clip_min, clip_max]. None: off."""

    mode: str
    aggregation: str  # sequence_* modes: "mean" or "sum" of the tokens' log-ratios
    clip_min: float | None
    clip_max: float | None


def sampler_correction(
    correction: SamplerCorrection | None, old_logps: torch.Tensor, sampler_logps: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """TRL's importance-sampling ratio pi_old / pi_sampler ((N, C) or (N, 1)) and its sampling/* metrics, the
    rollout's own sampler log-probs (temperature and top_p applied, as vLLM's processed log-probs) standing in
    for vLLM's; (None, {}) when the correction is off."""
    if correction is None:
        return None, {}
    ratio = sampler_importance_ratio(
        old_logps,
        sampler_logps,
        mask,
        correction.mode,
        correction.clip_min,
        correction.clip_max,
        correction.aggregation,
    )
    return ratio, sampler_metrics(old_logps, sampler_logps, mask, ratio)


def outside_clip(ratio: torch.Tensor, clip_min: float | None, clip_max: float | None) -> torch.Tensor:
    """bool, the shape of `ratio`: where it leaves [clip_min, clip_max] (None: no bound on that side), what
    the *_mask modes zero and the *_truncate modes clamp."""
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return (ratio < low) | (ratio > high)


def sampler_importance_ratio(
    old_logps: torch.Tensor,
    sampler_logps: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "sequence_mask",
    clip_min: float | None = None,
    clip_max: float | None = 3.0,
    aggregation: str = "sum",
) -> torch.Tensor:
    """pi_old / pi_sampler, per token ((N, T), token_* modes) or per sequence ((N, 1), sequence_* modes: exp of
    the sum of its tokens' log-ratios, the product of their ratios, as TRL 1.16; or of their mean, the geometric
    mean, as GSPO and TRL issue #5814's fix); *_truncate clamps it to [clip_min, clip_max], *_mask sets it to 0
    outside. Tokens the sampler could not score (NaN) count as ratio 1."""
    if mode not in SAMPLER_CORRECTION_MODES:
        raise ValueError(f"vllm_importance_sampling_mode must be one of {SAMPLER_CORRECTION_MODES}, got {mode!r}")
    if aggregation not in ("mean", "sum"):
        raise ValueError(f"the sequence ratio's aggregation must be 'mean' or 'sum', got {aggregation!r}")
    diff = torch.nan_to_num((old_logps - sampler_logps) * mask, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True)
        if aggregation == "mean":
            diff = diff / mask.sum(-1, keepdim=True).clamp(min=1)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return ratio if clip_min is None and clip_max is None else torch.clamp(ratio, min=clip_min, max=clip_max)
    return ratio.masked_fill(outside_clip(ratio, clip_min, clip_max), 0.0)


def sampler_metrics(
    old_logps: torch.Tensor, sampler_logps: torch.Tensor, mask: torch.Tensor, ratio: torch.Tensor
) -> dict[str, float]:
    """TRL's sampling/sampling_logp_difference/* and sampling/importance_sampling_ratio/*."""
    scored = mask.bool()
    gap = (old_logps - sampler_logps).abs()
    gap = gap[scored & ~torch.isnan(gap)]
    flat = ratio.flatten() if ratio.shape[1] == 1 else ratio[scored]
    stat = lambda x, f: f(x).item() if x.numel() else 0.0
    return {
        "sampling/sampling_logp_difference/mean": stat(gap, torch.mean),
        "sampling/sampling_logp_difference/max": stat(gap, torch.max),
        "sampling/importance_sampling_ratio/min": stat(flat, torch.min),
        "sampling/importance_sampling_ratio/mean": stat(flat, torch.mean),
        "sampling/importance_sampling_ratio/max": stat(flat, torch.max),
    }


# ---- sampler vs trainer health, as verl measures it (verl/trainer/ppo/rollout_corr_helper.py, its
# `rollout_corr/` metrics and the health check of docs/algo/rollout_corr.md). rho = pi_trainer / pi_sampler.

IS_THRESHOLD = 2.0  # verl's default rollout_is_threshold; the lower one is its reciprocal
SAFETY_BOUND = 20.0  # verl clamps log-ratios to +-20 before exponentiating


def _masked_mean(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def is_weight_metrics(
    log_ratio: torch.Tensor, mask: torch.Tensor, level: str = "token", threshold: float = IS_THRESHOLD
) -> dict[str, float]:
    """verl's `rollout_is_*` statistics of the IS weights rho before truncation, per token ((N, T) log-ratios;
    verl's numbers), or per sequence (exp of each row's summed log-ratio), each sequence counted once: verl
    broadcasts a sequence's weight to its tokens and averages over tokens, weighing each sequence by its length,
    so its per-sequence numbers differ where lengths do. `eff_sample_size` is 1 / E[(w / E[w])^2] in (0, 1]
    with w the weights clamped to [1/threshold, threshold] (verl's)."""
    lower = 1.0 / threshold
    if level == "sequence":
        log_w = (log_ratio * mask).sum(-1, keepdim=True).clamp(-SAFETY_BOUND, SAFETY_BOUND)
        keep = (mask.sum(-1, keepdim=True) > 0).float()
    else:
        log_w, keep = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND), mask
    w = torch.exp(log_w)
    scored = keep.bool().expand_as(w)
    clamped = w.clamp(lower, threshold)
    mean_clamped = _masked_mean(clamped, keep)
    std = torch.sqrt((_masked_mean(clamped.square(), keep) - mean_clamped.square()).clamp(min=0))
    return {
        "rollout_is_mean": _masked_mean(w, keep).item(),
        "rollout_is_max": w[scored].max().item(),
        "rollout_is_min": w[scored].min().item(),
        "rollout_is_std": std.item(),
        "rollout_is_eff_sample_size": 1.0 / _masked_mean((clamped / mean_clamped).square(), keep).item(),
        "rollout_is_ratio_fraction_high": _masked_mean((w > threshold).float(), keep).item(),
        "rollout_is_ratio_fraction_low": _masked_mean((w < lower).float(), keep).item(),
    }


def mismatch_metrics(
    trainer_logps: torch.Tensor,
    sampler_logps: torch.Tensor,
    mask: torch.Tensor,
    clip_min: float | None = None,
    clip_max: float | None = 3.0,
) -> dict[str, float]:
    """Sampler against trainer on the same tokens ((N, T) log-probs and mask), under verl's names
    (`rollout_corr/`): the KL of the sampler from the trainer (direct `kl` = E[log pi_sampler - log pi_trainer],
    `k3_kl` = E[rho - log rho - 1]), each policy's perplexity and their log difference per sequence,
    chi-square per token (E[rho^2] - 1) and per sequence (E[(prod rho)^2] - 1), and the IS weights'
    statistics per token. Ours, beside them: `rollout_corr/sequence/*`, the same statistics of the sequence
    weights prod rho (each sequence counted once), and the share of tokens (`token/`) and of sequences
    (`sequence/`) whose ratio leaves [clip_min, clip_max], TRL's vllm_importance_sampling_clip_*: what its
    token_* and sequence_* modes truncate or mask."""
    mask = mask.float()
    log_ratio = torch.nan_to_num(trainer_logps - sampler_logps) * mask
    trainer_mean = _masked_mean(torch.nan_to_num(trainer_logps) * mask, mask, -1)
    sampler_mean = _masked_mean(torch.nan_to_num(sampler_logps) * mask, mask, -1)
    log_ppl_diff = sampler_mean - trainer_mean
    rows = mask.sum(-1) > 0
    rho = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    seq_log = log_ratio.sum(-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    out = {
        "kl": _masked_mean(-log_ratio, mask).item(),
        "k3_kl": _masked_mean(torch.exp(log_ratio) - log_ratio - 1, mask).item(),
        "training_ppl": torch.exp(-trainer_mean[rows]).mean().item(),
        "training_log_ppl": (-trainer_mean[rows]).mean().item(),
        "rollout_ppl": torch.exp(-sampler_mean[rows]).mean().item(),
        "rollout_log_ppl": (-sampler_mean[rows]).mean().item(),
        "log_ppl_diff": log_ppl_diff[rows].mean().item(),
        "log_ppl_abs_diff": log_ppl_diff[rows].abs().mean().item(),
        "log_ppl_diff_max": log_ppl_diff[rows].max().item(),
        "log_ppl_diff_min": log_ppl_diff[rows].min().item(),
        "ppl_ratio": torch.exp(log_ppl_diff[rows]).mean().item(),
        "chi2_token": (_masked_mean(rho.square(), mask) - 1).item(),
        "chi2_seq": (torch.exp(2 * seq_log[rows]).mean() - 1).item(),
        **is_weight_metrics(log_ratio, mask, "token"),
        **{f"sequence/{k}": v for k, v in is_weight_metrics(log_ratio, mask, "sequence").items()},
    }
    outside = lambda ratio: outside_clip(ratio, clip_min, clip_max).float()
    out["token/fraction_outside_clip"] = _masked_mean(outside(torch.exp(log_ratio)), mask).item()
    out["sequence/fraction_outside_clip"] = outside(torch.exp(log_ratio.sum(-1)))[rows].mean().item()
    return {f"rollout_corr/{k}": v for k, v in out.items()}


def kept_mass(rollout) -> torch.Tensor:
    """(N, C) the probability mass top_k/top_p/min_p kept at each sampled position, in closed form: the sampler
    renormalises over what it keeps, so pi_sampler = pi / mass and mass = pi / pi_sampler. A trainer that
    scores the full vocabulary at the sampler's temperature sees rho = pi_trainer / pi_sampler = this mass
    (below 1), a sequence the product of its tokens' (TRL PR #7269's bias)."""
    return torch.exp(rollout.sampler_logps_temperature_only - rollout.sampler_logps)


def sampler_reach(kept: torch.Tensor, mask: torch.Tensor) -> float:
    """The share of the policy's completions (by probability) the truncating sampler can produce at all, from the
    (N, C) mass it kept at each sampled token and the (N, C) mask of scored tokens: the mean over completions of
    the product of their tokens' kept mass. Unbiased: a completion q samples has q = pi / prod(kept), so
    E_q[prod(kept)] = sum over q's support of pi = P_pi(a completion stays inside the support). What lies outside is
    never sampled: no step can raise or lower it."""
    rows = mask.bool().any(1)
    if not bool(rows.any()):
        return 1.0
    log_kept = (torch.log(kept.clamp(min=1e-30)) * mask).sum(1)
    return torch.exp(log_kept[rows]).mean().item()


# verl's health check (docs/algo/rollout_corr.md): a warning when a metric leaves its range
HEALTH = {
    "rollout_corr/rollout_is_mean": ("outside [0.5, 2]", lambda v: not 0.5 <= v <= 2.0),
    "rollout_corr/rollout_is_eff_sample_size": ("< 0.3", lambda v: v < 0.3),
    "rollout_corr/rollout_is_std": ("> 1", lambda v: v > 1.0),
    "rollout_corr/kl": ("|kl| > 0.1", lambda v: abs(v) > 0.1),
    "rollout_corr/chi2_token": ("> 1", lambda v: v > 1.0),
}


def health_line(metrics: dict[str, float]) -> str:
    """'healthy' or each metric outside verl's range, with its value. Every metric verl checks is per token: a
    step whose sequence weights fall far from 1 (top_p's kept mass multiplies along a completion) can be healthy
    here; the line says so."""
    bad = [
        f"{k.split('/')[-1]} {metrics[k]:.3g} ({rule})"
        for k, (rule, off) in HEALTH.items()
        if k in metrics and off(metrics[k])
    ]
    verdict = "healthy (verl's per-token thresholds)" if not bad else "WARNING " + "; ".join(bad)
    return "sampler vs trainer: " + verdict


# ---- length times drift (TRL issue #4772): a sequence's ratio is the product of its tokens' ratios, so a small
# per-token drift d grows as exp(d x length) and crosses the sequence modes' cap on the longest completions


@dataclass(frozen=True)
class SequenceRatios:
    """Each completion's importance ratio against its length: what the sequence_* correction modes weigh by."""

    lengths: torch.Tensor  # (N,) scored tokens of each completion
    log_ratio: torch.Tensor  # (N,) log prod_t rho_t = sum_t (log pi_trainer - log pi_sampler) over its scored tokens
    token_drift: float  # mean log rho over every scored token: nats per token
    token_spread: float  # standard deviation of log rho over every scored token (nats)


def sequence_ratios(trainer_logps: torch.Tensor, sampler_logps: torch.Tensor, mask: torch.Tensor) -> SequenceRatios:
    """The sequence ratio prod rho of each row of (N, T) log-probs under its (N, T) mask, as
    `sampler_importance_ratio`'s sequence_* modes compute it before truncation (a NaN token counts as ratio 1),
    with its length and the per-token drift and spread behind it."""
    scored = mask.bool()
    log_rho = torch.nan_to_num((trainer_logps - sampler_logps) * mask, nan=0.0)
    tokens = log_rho[scored]
    spread = tokens.std().item() if tokens.numel() > 1 else 0.0
    return SequenceRatios(scored.sum(-1), log_rho.sum(-1), tokens.mean().item() if tokens.numel() else 0.0, spread)


def outside_cap(ratios: SequenceRatios, clip_min: float | None = None, clip_max: float | None = 3.0) -> torch.Tensor:
    """(N,) bool: sequences whose ratio leaves [clip_min, clip_max], which sequence_mask zeroes and
    sequence_truncate clamps (TRL's vllm_importance_sampling_clip_*)."""
    return outside_clip(torch.exp(ratios.log_ratio), clip_min, clip_max)


def length_at_cap(drift: float, cap: float) -> float:
    """The completion length at which a steady drift of `drift` nats per token takes the sequence ratio
    exp(drift x length) to `cap`: ln(cap) / drift (infinite when the drift never gets there)."""
    target = math.log(cap)
    return target / drift if drift != 0 and target / drift > 0 else math.inf
