"""Phase 5, loss: the policy-gradient term plus beta times a KL estimate, per token and per sample.

Token-level losses (TRL 1.16, `_compute_loss`): ratio = exp(logp - old_logp), clipped PPO-style,
  per_token = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A) + beta * kl
and normalised by the loss type:
  grpo     mean over each sequence's tokens, then over sequences
  bnpo     mean over all tokens of the batch
  dr_grpo  sum over tokens / (batch size * max_completion_length)
  dapo     sum over tokens / tokens in the whole generation batch (TRL's num_items_in_batch); equals
           bnpo here, where one optimizer step takes one micro-batch on one process; with gradient
           accumulation bnpo normalises each micro-batch by its own tokens and dapo by the whole batch's
Sequence REINFORCE of the seed-003 script (no ratio, no clipping):
  reinforce_sum   -A * sum(logp) + beta * mean(kl), averaged over sequences
  reinforce_mean  -A * sum(logp) / T_gen + beta * mean(kl)
KL estimators, with d = ref_logp - logp (samples come from the policy):
  k1  -d                          unbiased value, its gradient is 0 in expectation: no pull towards ref
  k2  d^2 / 2                     biased value; its gradient is the gradient of the true reverse KL
  k3  exp(d) - d - 1              unbiased value (Schulman); its gradient is that of the forward KL
  k3_corrected  k3 * ratio        TRL's `use_bias_correction_kl` (default True in 1.16): the reverse-KL gradient
At step 0 (logp == old_logp) the ratio is exactly 1: the grpo loss value is ~0 (group-centred advantages,
each sequence weighted 1/N), the token-weighted ones (bnpo, dapo, dr_grpo) are -sum_i A_i w_i, which is
not 0 when advantages correlate with lengths; every gradient is non-zero. Judge a step by its gradient.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "reinforce_sum", "reinforce_mean")
KL_ESTIMATORS = ("k1", "k2", "k3", "k3_corrected")


@dataclass(frozen=True)
class LossBreakdown:
    loss: torch.Tensor  # scalar to backpropagate
    policy_loss: torch.Tensor  # scalar, the loss with beta = 0 under the same normalisation
    kl_loss: torch.Tensor  # scalar, beta * normalised KL
    per_token_loss: torch.Tensor  # (N, T), masked
    per_token_kl: torch.Tensor  # (N, T), masked
    per_sample_loss: torch.Tensor  # (N,) each sequence's contribution; sums to `loss`
    ratio: torch.Tensor  # (N, T)
    metrics: dict[str, float]  # TRL names: kl, clip_ratio/low_mean, ...


def per_token_kl(logps: torch.Tensor, ref_logps: torch.Tensor, old_logps: torch.Tensor | None = None,
                 estimator: str = "k3") -> torch.Tensor:
    d = ref_logps - logps
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d ** 2
    if estimator in ("k3", "k3_corrected"):
        k3 = torch.exp(d) - d - 1
        if estimator == "k3":
            return k3
        old = logps.detach() if old_logps is None else old_logps
        return k3 * torch.exp(logps - old)
    raise ValueError(f"kl_estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")


@dataclass(frozen=True)
class LossSpec:
    """`compute_loss`'s settings: `compute_loss(..., **spec.kwargs())`."""
    loss_type: str = "grpo"
    beta: float = 0.0
    kl_estimator: str = "k3"
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    max_completion_length: int | None = None

    def kwargs(self) -> dict:
        return dataclasses.asdict(self)


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return ((x * mask).sum() / mask.sum().clamp(min=1)).item()


def loss_weights(mask: torch.Tensor, loss_type: str, max_completion_length: int | None) -> torch.Tensor:
    """(N, T) weights such that loss = sum(per_token * weights): the loss type's normalisation."""
    N = mask.shape[0]
    if loss_type in ("grpo", "reinforce_sum", "reinforce_mean"):
        return mask / mask.sum(-1, keepdim=True).clamp(min=1) / N
    if loss_type in ("bnpo", "dapo"):
        return mask / mask.sum().clamp(min=1)
    if loss_type == "dr_grpo":
        if max_completion_length is None:
            raise ValueError("dr_grpo normalises by max_completion_length: pass it")
        return mask / (N * max_completion_length)
    raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")


def compute_loss(logps: torch.Tensor, old_logps: torch.Tensor | None, ref_logps: torch.Tensor | None,
                 advantages: torch.Tensor, mask: torch.Tensor, *, loss_type: str = "grpo", beta: float = 0.0,
                 kl_estimator: str = "k3", epsilon_low: float = 0.2, epsilon_high: float = 0.2,
                 max_completion_length: int | None = None) -> LossBreakdown:
    """Tensors are (batch, tokens); `advantages` is (batch,). `old_logps=None` means on-policy (detached logps)."""
    if logps.shape != mask.shape or advantages.shape != logps.shape[:1]:
        raise ValueError(f"shapes: logps {tuple(logps.shape)}, mask {tuple(mask.shape)}, "
                         f"advantages {tuple(advantages.shape)}; expected (N, T), (N, T), (N,)")
    mask = mask.float()
    old = logps.detach() if old_logps is None else old_logps
    ratio = torch.exp(logps - old)
    A = advantages.unsqueeze(1)
    if loss_type.startswith("reinforce"):
        seq_logp = (logps * mask).sum(-1, keepdim=True)
        if loss_type == "reinforce_mean":
            seq_logp = seq_logp / mask.sum(-1, keepdim=True).clamp(min=1)
        # spread the sequence term over its tokens so the grpo-style per-sequence mean recovers it exactly
        pg = (-A * seq_logp) * mask
    else:
        clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
        pg = -torch.min(ratio * A, clipped * A)
    kl = torch.zeros_like(logps) if ref_logps is None else per_token_kl(logps, ref_logps, old_logps, kl_estimator)
    if beta != 0 and ref_logps is None:
        raise ValueError("beta != 0 needs ref_logps")
    per_token = pg + beta * kl
    weights = loss_weights(mask, loss_type, max_completion_length)
    per_sample = (per_token * weights).sum(-1)
    policy_loss = (pg * weights).sum()
    kl_loss = (beta * kl * weights).sum()
    low = ((ratio < 1 - epsilon_low) & (A < 0)).float()
    high = ((ratio > 1 + epsilon_high) & (A > 0)).float()
    seq_mean = lambda x: (x * mask).sum(-1) / mask.sum(-1)
    metrics = {"kl": _masked_mean(kl.detach(), mask),
               "clip_ratio/low_mean": _masked_mean(low, mask), "clip_ratio/high_mean": _masked_mean(high, mask),
               "clip_ratio/region_mean": _masked_mean(torch.maximum(low, high), mask),
               "clip_ratio/low_min": torch.nan_to_num(seq_mean(low), nan=float("inf")).min().item(),
               "clip_ratio/high_max": torch.nan_to_num(seq_mean(high), nan=float("-inf")).max().item()}
    return LossBreakdown(loss=per_sample.sum(), policy_loss=policy_loss, kl_loss=kl_loss,
                         per_token_loss=per_token * mask, per_token_kl=kl * mask, per_sample_loss=per_sample,
                         ratio=ratio, metrics=metrics)


def kl_estimator_check(vocab: int = 8, num_samples: int = 200_000, seed: int = 0) -> dict[str, dict[str, float]]:
    """Each estimator's value and autograd gradient against the exact reverse KL(pi || ref) and its gradient.

    A categorical policy pi = softmax(theta) and a fixed reference; samples come from pi (on-policy,
    old = pi detached). The estimator's loss is the sample mean of its per-token KL; its gradient is
    compared with the exact gradient of KL(pi || ref). Relative errors well above the Monte-Carlo noise
    mark a biased gradient: k1 (expected gradient 0) and k3 (the gradient of KL(ref || pi)).
    """
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(vocab, generator=g).requires_grad_(True)
    ref_logp = torch.log_softmax(torch.randn(vocab, generator=g), 0)
    logp_all = torch.log_softmax(theta, 0)
    exact_kl = (logp_all.exp() * (logp_all - ref_logp)).sum()
    (exact_grad,) = torch.autograd.grad(exact_kl, theta)
    samples = torch.multinomial(logp_all.detach().exp(), num_samples, replacement=True, generator=g)
    out = {}
    for estimator in KL_ESTIMATORS:
        logp = torch.log_softmax(theta, 0)[samples]
        value = per_token_kl(logp, ref_logp[samples], None, estimator).mean()
        (grad,) = torch.autograd.grad(value, theta)
        out[estimator] = {"value": value.item(), "exact_kl": exact_kl.item(),
                          "grad_rel_error": ((grad - exact_grad).norm() / exact_grad.norm()).item(),
                          "grad_cosine": torch.nn.functional.cosine_similarity(grad, exact_grad, 0).item()}
    return out
