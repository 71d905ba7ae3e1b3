"""Phase 5, loss: TRL 1.16's `_compute_loss` (every `loss_type`), plus beta times a KL estimate.

With pi = exp(logps) the policy being trained, pi_old = exp(old_logps) the policy that scored the rollout
(the same weights as pi until an optimizer step has been taken on this batch) and A the advantage:

  importance weight  w = pi / pi_old per token (importance_sampling_level="token"), or
                     w = exp(mean_t log(pi / pi_old)) per sequence ("sequence", GSPO)
  grpo, bnpo, dr_grpo, dapo, luspo   -min(w A, clip(w, 1 - epsilon_low, 1 + epsilon_high) A)
                     with `delta` (two-sided, INTELLECT-2): w first capped at delta
  cispo              -min(w, epsilon_high).detach() A logp       (clips the weight, not the objective)
  sapo               -sigmoid(tau (w - 1)) 4 / tau A              (tau: sapo_temperature_pos if A > 0, else _neg)
  vespo              -phi(W) A logp, phi(W) = exp(lambda + k log W - lambda W), W = prod_t w (detached)
Then, in TRL's order: times the off-policy sequence mask (off_policy_mask_threshold), times the top-entropy
token mask (top_entropy_quantile), times the sampler's importance-sampling ratio (the vLLM correction;
vespo folds it into W instead), plus beta * KL. Normalisation per micro-batch (GA: gradient accumulation
steps, S: steps_per_generation, M: tokens in the whole generation batch, TRL's num_items_in_batch):
  grpo, sapo         mean over each sequence's tokens, mean over sequences, / GA
  bnpo               sum over the micro-batch's tokens / its token count / GA
  dr_grpo            sum / (rows * max_completion_length) / GA
  dapo, cispo, vespo sum / (M * GA / S)     (TRL PR #6024: one accumulation window's share of M)
  luspo              sum over tokens, mean over sequences, / GA
With one micro-batch (GA = S = 1) bnpo and dapo are the same number; with GA = S = 4 bnpo weighs each
micro-batch's tokens by its own count and dapo by the generation batch's.
Minus entropy_coef times the mean entropy of the trained tokens, / GA.

Sequence REINFORCE of the manual-step analysis's script (no weight, no clipping):
  reinforce_sum   -A sum_t logp + beta mean_t kl, mean over sequences
  reinforce_mean  -A sum_t logp / T + beta mean_t kl
KL estimators, with d = ref_logp - logp (samples come from the policy):
  k1  -d                          unbiased value, its gradient is 0 in expectation: no pull towards ref
  k2  d^2 / 2                     biased value; its gradient is the gradient of the true reverse KL
  k3  exp(d) - d - 1              unbiased value (Schulman); its gradient is that of the forward KL
  k3_corrected  k3 * w            TRL's `use_bias_correction_kl` (default True in 1.16): the reverse-KL gradient
At ratio 1 (logp == old_logp) the grpo loss value is ~0 (group-centred advantages, each sequence weighted
1/N), the token-weighted ones (bnpo, dapo, dr_grpo) are -sum_i A_i w_i, not 0 when advantages correlate
with lengths; every gradient is non-zero. Judge a step by its gradient.

The update takes this loss over a generation batch (`Batch`: its inputs; `batch_of` decides where pi_old's
log-probs are kept, `needs_old_logps`) micro-batch by micro-batch: `normalisation` is a micro-batch's loss
weights (TRL's num_items_in_batch), `rows_loss` some of its rows' share.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from .choices import (  # noqa: F401
    CLIPPED_LOSS_TYPES,
    IMPORTANCE_SAMPLING_LEVELS,
    KL_ESTIMATORS,
    LOSS_TYPES,
    SAMPLER_CORRECTION_MODES,
    TRL_LOSS_TYPES,
)
from .logprobs import TokenLogProbs
from .rollout import Rollout
from .sampler import SamplerCorrection, sampler_correction


@dataclass(frozen=True)
class LossBreakdown:
    loss: torch.Tensor  # scalar to backpropagate
    policy_loss: torch.Tensor  # scalar, the loss with beta = 0 and no entropy bonus, same normalisation
    kl_loss: torch.Tensor  # scalar, beta * normalised KL
    per_token_loss: torch.Tensor  # (N, T) TRL's per_token_loss (every mask and weight applied), times the mask
    per_token_kl: torch.Tensor  # (N, T), masked
    per_sample_loss: torch.Tensor  # (N,) each sequence's contribution; sums to `loss`
    ratio: torch.Tensor  # (N, T) per-token pi / pi_old, whatever the importance-sampling level
    importance_weight: torch.Tensor  # (N, T) token level, (N, 1) sequence level: the weight the loss used
    clipped: torch.Tensor  # (N, T) bool: the token's gradient is cut by clipping (TRL's is_region_clipped)
    trained: torch.Tensor  # (N, T) float: mask x off-policy mask x top-entropy mask (tokens with a gradient)
    metrics: dict[str, float]  # TRL names: kl, entropy, clip_ratio/low_mean, ...
    sampler_ratio: torch.Tensor | None = None  # (N, T) or (N, 1): the sampler correction the loss applied


@dataclass(frozen=True)
class LossSpec:
    """`compute_loss`'s settings, TRL's `GRPOConfig` names: `compute_loss(..., **spec.kwargs())`."""

    loss_type: str = "grpo"
    beta: float = 0.04
    kl_estimator: str = "k3"
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    delta: float | None = None
    importance_sampling_level: str = "token"
    max_completion_length: int | None = None
    top_entropy_quantile: float = 1.0
    off_policy_mask_threshold: float | None = None
    entropy_coef: float = 0.0
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0
    gradient_accumulation_steps: int = 1
    steps_per_generation: int = 1

    def kwargs(self) -> dict:
        return dataclasses.asdict(self)


def batch_loss(
    spec: LossSpec,
    correction: SamplerCorrection | None,
    lp: TokenLogProbs,
    advantages: torch.Tensor,
    sampler_logps: torch.Tensor | None,
    logps: torch.Tensor | None = None,
) -> LossBreakdown:
    """The loss phase: the whole batch's loss at the weights that scored it (no accumulation: the first
    micro-batch's view when S = 1), the sampler correction applied and its sampling/* metrics added.
    `logps`: the (N, C) log-probs to differentiate it against (default `lp.policy`: the same values)."""
    ratio, sampling = sampler_correction(correction, lp.policy, sampler_logps, lp.mask)
    breakdown = compute_loss(
        lp.policy if logps is None else logps,
        lp.policy,
        lp.reference,
        advantages,
        lp.mask,
        entropies=lp.entropies,
        sampler_logps=sampler_logps if correction else None,
        sampler_ratio=ratio,
        **dataclasses.replace(spec, gradient_accumulation_steps=1, steps_per_generation=1).kwargs(),
    )
    return dataclasses.replace(breakdown, metrics={**breakdown.metrics, **sampling}, sampler_ratio=ratio)


# ---- the loss over a generation batch, as the update takes it micro-batch by micro-batch


def needs_old_logps(loss: LossSpec, num_iterations: int, correction: SamplerCorrection | None) -> bool:
    """TRL computes pi_old's log-probs at generation time when some optimizer step on this batch is not the
    first (gradient_accumulation_steps % (steps_per_generation * num_iterations) != 0), or to correct for
    the sampler; otherwise every micro-batch's own detached log-probs stand in and the ratio is exactly 1."""
    first_only = loss.gradient_accumulation_steps % (loss.steps_per_generation * num_iterations) == 0
    return not first_only or correction is not None


@dataclass(frozen=True)
class Batch:
    """The generation batch an update trains on: all a micro-batch's loss reads besides the model."""

    rollout: Rollout
    logprobs: TokenLogProbs  # (N, C) the scoring's log-probs, the reference's, the mask
    advantages: torch.Tensor  # (N,)
    old_logps: torch.Tensor | None = None  # (N, C) pi_old's, or None: each pass's own, detached (ratio 1)
    sampler_ratio: torch.Tensor | None = None  # (N, C) or (N, 1): the sampler correction, when on
    sampler_logps: torch.Tensor | None = None  # (N, C), when the correction is on


def batch_of(
    rollout: Rollout,
    lp: TokenLogProbs,
    advantages: torch.Tensor,
    loss: LossSpec,
    correction: SamplerCorrection | None,
    num_iterations: int,
) -> Batch:
    """The update's batch: pi_old's log-probs where TRL keeps them (`needs_old_logps`), the sampler's with
    their correction where it is on."""
    return Batch(
        rollout,
        lp,
        advantages,
        old_logps=lp.policy if needs_old_logps(loss, num_iterations, correction) else None,
        sampler_ratio=sampler_correction(correction, lp.policy, rollout.sampler_logps, lp.mask)[0],
        sampler_logps=rollout.sampler_logps if correction else None,
    )


@dataclass(frozen=True)
class Normalisation:
    """How one micro-batch's loss is normalised, computed once for it."""

    weights: torch.Tensor  # (N, C) each token's weight in the micro-batch's loss; 0 outside its rows
    entropy_tokens: torch.Tensor | None = None  # its token count, where the entropy bonus needs it


def normalisation(batch: Batch, loss: LossSpec, rows: list[int]) -> Normalisation:
    """The micro-batch `rows`' normalisation: `loss.loss_weights` over the batch (TRL's num_items_in_batch is
    the whole batch's token count), and the micro-batch's token count unless top_entropy_quantile < 1."""
    mask = batch.logprobs.mask
    weights = torch.zeros_like(mask)
    weights[rows] = spec_weights(mask[rows], loss, num_items_in_batch=mask.sum())
    entropy_tokens = None if loss.top_entropy_quantile < 1 else mask[rows].sum().clamp(min=1.0)
    return Normalisation(weights, entropy_tokens)


def rows_loss(
    batch: Batch,
    loss: LossSpec,
    norm: Normalisation,
    rows: list[int],
    logps: torch.Tensor,
    entropies: torch.Tensor,
) -> LossBreakdown:
    """These rows' share of their micro-batch's loss from their (rows, C) log-probs and entropies, which may
    carry gradients: the one place the update calls `compute_loss`."""
    pick = lambda t: None if t is None else t[rows]
    return compute_loss(
        logps,
        pick(batch.old_logps),
        batch.logprobs.reference[rows],
        batch.advantages[rows],
        batch.logprobs.mask[rows],
        entropies=entropies,
        sampler_ratio=pick(batch.sampler_ratio),
        sampler_logps=pick(batch.sampler_logps),
        weights=norm.weights[rows],
        entropy_tokens=norm.entropy_tokens,
        **loss.kwargs(),
    )


# ---- the pieces, in the order `compute_loss` uses them


def importance_weight(logps: torch.Tensor, old_logps: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """w = pi / pi_old: (N, T) per token, or (N, 1) exp of the mean log-ratio over each sequence (GSPO)."""
    log_ratio = logps - old_logps
    if level == "token":
        return torch.exp(log_ratio)
    if level == "sequence":
        return torch.exp(((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1))
    raise ValueError(f"importance_sampling_level must be one of {IMPORTANCE_SAMPLING_LEVELS}, got {level!r}")


def per_token_kl(
    logps: torch.Tensor, ref_logps: torch.Tensor, weight: torch.Tensor | None = None, estimator: str = "k3"
) -> torch.Tensor:
    """(N, T) KL(pi || ref) estimate per token; `weight` (the importance weight, carrying its gradient)
    multiplies k3 for k3_corrected; None: on-policy, exp(logps - logps.detach())."""
    d = ref_logps - logps
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d**2
    if estimator in ("k3", "k3_corrected"):
        k3 = torch.exp(d) - d - 1
        if estimator == "k3":
            return k3
        return k3 * (torch.exp(logps - logps.detach()) if weight is None else weight)
    raise ValueError(f"kl_estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")


def vespo_weight(
    advantages: torch.Tensor,
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    sampler_ratio: torch.Tensor | None,
    k_pos: float,
    lambda_pos: float,
    k_neg: float,
    lambda_neg: float,
) -> torch.Tensor:
    """(N, 1) phi(W) = exp(lambda + k log W - lambda W), W the sequence's product of ratios (times the
    sampler's per-token ratios, if any), clamped to [1e-8, e^20] in log space; no gradient."""
    with torch.no_grad():
        floor = math.log(1e-8)
        log_w = (torch.clamp(log_ratio, -20.0, 20.0) * mask).sum(-1, keepdim=True)
        if sampler_ratio is not None:
            log_w = log_w + torch.clamp(torch.log(sampler_ratio), floor, 20.0).sum(-1, keepdim=True)
        log_w = torch.clamp(log_w, floor, 20.0)
        positive = advantages >= 0
        k = torch.where(positive, k_pos, k_neg)
        lam = torch.where(positive, lambda_pos, lambda_neg).clamp(min=1e-4)
        return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def policy_term(
    loss_type: str,
    logps: torch.Tensor,
    weight: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    log_ratio: torch.Tensor,
    sampler_ratio: torch.Tensor | None,
    s: LossSpec,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The policy-gradient term per token ((N, T) or (N, 1)), the weight the clip metrics read (after delta),
    and vespo's phi (else None). `advantages` is (N, 1)."""
    if loss_type == "cispo":
        return -torch.clamp(weight, max=s.epsilon_high).detach() * advantages * logps, weight, None
    if loss_type in CLIPPED_LOSS_TYPES:
        clipped = torch.clamp(weight, 1 - s.epsilon_low, 1 + s.epsilon_high)
        if s.delta is not None:
            weight = torch.clamp(weight, max=s.delta)
        return -torch.min(weight * advantages, clipped * advantages), weight, None
    if loss_type == "sapo":
        tau = torch.where(advantages > 0, s.sapo_temperature_pos, s.sapo_temperature_neg)
        return -torch.sigmoid(tau * (weight - 1)) * 4 / tau * advantages, weight, None
    if loss_type == "vespo":
        phi = vespo_weight(
            advantages,
            log_ratio,
            mask,
            sampler_ratio,
            s.vespo_k_pos,
            s.vespo_lambda_pos,
            s.vespo_k_neg,
            s.vespo_lambda_neg,
        )
        return -phi * advantages * logps, weight, phi
    if loss_type in ("reinforce_sum", "reinforce_mean"):
        seq_logp = (logps * mask).sum(-1, keepdim=True)
        if loss_type == "reinforce_mean":
            seq_logp = seq_logp / mask.sum(-1, keepdim=True).clamp(min=1)
        # spread the sequence term over its tokens so the per-sequence mean recovers it exactly
        return (-advantages * seq_logp) * mask, weight, None
    raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")


def off_policy_mask(
    advantages: torch.Tensor, logps: torch.Tensor, sampler_logps: torch.Tensor, mask: torch.Tensor, threshold: float
) -> torch.Tensor:
    """(N, 1) DeepSeek-V3.2's off-policy sequence mask: drop a sequence with A < 0 whose mean
    log(pi_sampler / pi) over its tokens is above `threshold`."""
    kl = torch.nan_to_num(sampler_logps - logps.detach(), nan=0.0)
    mean_kl = (kl * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1.0)
    return ((advantages >= 0) | (mean_kl <= threshold)).to(mask.dtype)


def high_entropy_mask(entropies: torch.Tensor, mask: torch.Tensor, top_entropy_quantile: float) -> torch.Tensor:
    """(N, T) bool: the masked tokens whose entropy is at or above the (1 - top_entropy_quantile) quantile
    of the masked tokens' entropies (the top-rho tokens of "Beyond the 80/20 rule")."""
    scored = entropies[mask.bool()].float()
    if scored.numel() == 0:
        return torch.zeros_like(entropies, dtype=torch.bool)
    threshold = torch.quantile(scored, 1 - top_entropy_quantile)
    return ((entropies * mask.float()) >= threshold) & mask.bool()


def loss_weights(
    mask: torch.Tensor,
    loss_type: str,
    max_completion_length: int | None = None,
    *,
    num_items_in_batch: torch.Tensor | float | None = None,
    gradient_accumulation_steps: int = 1,
    steps_per_generation: int = 1,
) -> torch.Tensor:
    """(N, T) weights such that the micro-batch's loss = sum(per_token_loss * weights): the loss type's
    normalisation. `num_items_in_batch`: tokens in the whole generation batch (default: this batch's)."""
    N, GA = mask.shape[0], gradient_accumulation_steps
    if loss_type in ("grpo", "sapo", "reinforce_sum", "reinforce_mean"):
        return mask / mask.sum(-1, keepdim=True).clamp(min=1) / N / GA
    if loss_type == "bnpo":
        return mask / mask.sum().clamp(min=1) / GA
    if loss_type == "dr_grpo":
        if max_completion_length is None:
            raise ValueError("dr_grpo normalises by max_completion_length: pass it")
        return mask / (N * max_completion_length) / GA
    if loss_type == "luspo":
        return mask / N / GA
    if loss_type in ("dapo", "cispo", "vespo"):
        items = (
            mask.sum()
            if num_items_in_batch is None
            else torch.as_tensor(num_items_in_batch, dtype=mask.dtype, device=mask.device)
        )
        return mask / (items.clamp(min=1.0) * GA / steps_per_generation)
    raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")


# ---- the loss


def compute_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor | None,
    ref_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    entropies: torch.Tensor | None = None,
    sampler_logps: torch.Tensor | None = None,
    sampler_ratio: torch.Tensor | None = None,
    num_items_in_batch: torch.Tensor | float | None = None,
    weights: torch.Tensor | None = None,
    entropy_tokens: float | None = None,
    **spec,
) -> LossBreakdown:
    """TRL 1.16's `_compute_loss` on given log-probs. Tensors are (N, T); `advantages` is (N,).

    old_logps=None: on-policy (logps detached, ratio exactly 1). ref_logps: needed when beta != 0.
    entropies: per-token entropies of the policy (the `entropy` metric, top_entropy_quantile, entropy_coef).
    sampler_logps: the sampler's log-probs (the off-policy mask reads them instead of old_logps).
    sampler_ratio: the sampler importance-sampling ratio ((N, T) or (N, 1), `sampler_importance_ratio`).
    weights, entropy_tokens: the normalisation of a larger micro-batch these rows belong to (the update
    backpropagates a micro-batch a few rows at a time); default: these rows are it. `spec`: LossSpec's fields.
    """
    s = LossSpec(**spec)
    check_loss_inputs(logps, mask, advantages, ref_logps, entropies, s)
    mask, A = mask.float(), advantages.unsqueeze(1)
    old = logps.detach() if old_logps is None else old_logps
    weight = importance_weight(logps, old, mask, s.importance_sampling_level)
    kl = torch.zeros_like(logps) if ref_logps is None else per_token_kl(logps, ref_logps, weight, s.kl_estimator)
    pg, clip_weight, phi = policy_term(s.loss_type, logps, weight, A, mask, logps - old, sampler_ratio, s)
    trained = mask
    off_policy_kept, entropy_kept = token_masks(A, logps, old, sampler_logps, mask, entropies, s)
    for keep in (off_policy_kept, entropy_kept):  # in TRL's order; None: that mask is off
        if keep is not None:
            pg, trained = pg * keep, trained * keep
    if sampler_ratio is not None and s.loss_type != "vespo":
        pg = pg * sampler_ratio
    per_token = (pg + s.beta * kl) * mask
    weights = spec_weights(mask, s, num_items_in_batch) if weights is None else weights
    per_sample = (per_token * weights).sum(-1)
    if s.entropy_coef != 0:
        per_sample = per_sample - entropy_bonus(entropies, mask, entropy_kept, entropy_tokens, s)
    low, high = clip_regions(clip_weight, A, s)
    clipped = (low | high) & mask.bool() if s.loss_type in CLIPPED_LOSS_TYPES else torch.zeros_like(mask).bool()
    metrics = loss_metrics(s, mask, kl if ref_logps is not None else None, entropies, clip_weight, A, phi, low, high)
    return LossBreakdown(
        loss=per_sample.sum(),
        policy_loss=(pg * mask * weights).sum(),
        kl_loss=(s.beta * kl * mask * weights).sum(),
        per_token_loss=per_token,
        per_token_kl=kl * mask,
        per_sample_loss=per_sample,
        ratio=torch.exp(logps - old),
        importance_weight=weight,
        clipped=clipped.expand_as(mask),
        trained=trained.expand_as(mask),
        metrics=metrics,
        sampler_ratio=sampler_ratio,
    )


def check_loss_inputs(logps, mask, advantages, ref_logps, entropies, s: LossSpec) -> None:
    """One line naming what `compute_loss` cannot take: shapes that disagree, beta without the reference's
    log-probs, an entropy setting without entropies."""
    if logps.shape != mask.shape or advantages.shape != logps.shape[:1]:
        raise ValueError(
            f"shapes: logps {tuple(logps.shape)}, mask {tuple(mask.shape)}, "
            f"advantages {tuple(advantages.shape)}; expected (N, T), (N, T), (N,)"
        )
    if s.beta != 0 and ref_logps is None:
        raise ValueError("beta != 0 needs ref_logps")
    if (s.top_entropy_quantile < 1 or s.entropy_coef != 0) and entropies is None:
        raise ValueError("top_entropy_quantile < 1 and entropy_coef != 0 need the per-token entropies")


def token_masks(A, logps, old_logps, sampler_logps, mask, entropies, s: LossSpec) -> tuple:
    """In TRL's order: the off-policy sequence mask ((N, 1); None where off_policy_mask_threshold is None), which
    compares with the sampler's log-probs where given, else pi_old's, and the top-entropy token mask ((N, T)
    float; None where top_entropy_quantile = 1)."""
    off_policy = entropy_kept = None
    if s.off_policy_mask_threshold is not None:
        behaviour = old_logps if sampler_logps is None else sampler_logps
        off_policy = off_policy_mask(A, logps, behaviour, mask, s.off_policy_mask_threshold)
    if s.top_entropy_quantile < 1.0:
        entropy_kept = high_entropy_mask(entropies, mask, s.top_entropy_quantile).float()
    return off_policy, entropy_kept


def spec_weights(mask: torch.Tensor, s: LossSpec, num_items_in_batch) -> torch.Tensor:
    """`loss_weights` under the spec's loss type, max_completion_length, GA and S: these rows as the micro-batch."""
    return loss_weights(
        mask,
        s.loss_type,
        s.max_completion_length,
        num_items_in_batch=num_items_in_batch,
        gradient_accumulation_steps=s.gradient_accumulation_steps,
        steps_per_generation=s.steps_per_generation,
    )


def entropy_bonus(entropies, mask, entropy_kept, entropy_tokens, s: LossSpec) -> torch.Tensor:
    """(N,) entropy_coef times each sequence's entropy over the acting tokens (the mask, times the top-entropy
    mask where on), normalised by the micro-batch's token count (`entropy_tokens`; default: these rows'), / GA:
    what the loss subtracts."""
    acting = mask if entropy_kept is None else mask * entropy_kept
    tokens = acting.sum().clamp(min=1.0) if entropy_tokens is None else entropy_tokens
    return s.entropy_coef * (entropies * acting).sum(-1) / tokens / s.gradient_accumulation_steps


def clip_regions(weight: torch.Tensor, advantages: torch.Tensor, s: LossSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the clipped objective has no gradient: w < 1 - eps_low with A < 0, w > 1 + eps_high with A > 0."""
    return ((weight < 1 - s.epsilon_low) & (advantages < 0)), ((weight > 1 + s.epsilon_high) & (advantages > 0))


def _global_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    """TRL's global_masked_mean: over masked tokens, or over sequences for (N, 1) tensors."""
    if x.shape[1] == 1:
        return x.float().mean().item()
    return ((x * mask).sum() / mask.sum().clamp(min=1.0)).item()


def _sequence_means(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return x.squeeze(1) if x.shape[1] == 1 else (x * mask).sum(-1) / mask.sum(-1)


def loss_metrics(
    s: LossSpec,
    mask: torch.Tensor,
    kl: torch.Tensor | None,
    entropies: torch.Tensor | None,
    clip_weight: torch.Tensor,
    A: torch.Tensor,
    phi: torch.Tensor | None,
    low: torch.Tensor,
    high: torch.Tensor,
) -> dict[str, float]:
    """The numbers TRL's `_compute_loss` logs, under its names (kl is logged here whatever beta); `low` and
    `high` are `clip_regions` of `clip_weight`."""
    out = {}
    if kl is not None:
        out["kl"] = _global_mean(kl.detach(), mask)
    if entropies is not None:
        out["entropy"] = _global_mean(entropies.detach(), mask)
    weight = clip_weight.detach()
    if s.loss_type in CLIPPED_LOSS_TYPES:
        low, high = low.float(), high.float()
        out.update(
            {
                "clip_ratio/low_mean": _global_mean(low, mask),
                "clip_ratio/high_mean": _global_mean(high, mask),
                "clip_ratio/region_mean": _global_mean(torch.maximum(low, high), mask),
                "clip_ratio/low_min": torch.nan_to_num(_sequence_means(low, mask), nan=math.inf).min().item(),
                "clip_ratio/high_max": torch.nan_to_num(_sequence_means(high, mask), nan=-math.inf).max().item(),
            }
        )
    elif s.loss_type == "cispo":
        out["cispo_clip_ratio"] = _global_mean(((weight > s.epsilon_high) & (A > 0)).float(), mask)
    elif s.loss_type == "vespo":
        out["vespo/phi_seq_mean"] = _global_mean(phi, mask)
    if s.entropy_coef != 0:
        out["entropy_coef"] = s.entropy_coef
    return out
