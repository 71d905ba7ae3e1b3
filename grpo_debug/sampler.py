"""The sampler against the trainer: TRL's importance-sampling correction for a sampler other than the trained
model (`vllm_importance_sampling_correction`): the ratio pi_old / pi_sampler per token or per sequence,
truncated or masked, and the sampling/* metrics TRL logs about it."""

from __future__ import annotations

import math

import torch

from .choices import SAMPLER_CORRECTION_MODES


def sampler_importance_ratio(
    old_logps: torch.Tensor,
    sampler_logps: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "sequence_mask",
    clip_min: float | None = None,
    clip_max: float | None = 3.0,
) -> torch.Tensor:
    """pi_old / pi_sampler, per token ((N, T), token_* modes) or per sequence ((N, 1), the product over
    its tokens, sequence_* modes); *_truncate clamps it to [clip_min, clip_max], *_mask sets it to 0
    outside. Tokens the sampler could not score (NaN) count as ratio 1."""
    if mode not in SAMPLER_CORRECTION_MODES:
        raise ValueError(f"vllm_importance_sampling_mode must be one of {SAMPLER_CORRECTION_MODES}, got {mode!r}")
    diff = torch.nan_to_num((old_logps - sampler_logps) * mask, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


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
