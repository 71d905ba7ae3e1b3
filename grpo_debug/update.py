"""Phase 6, update: backward, gradient norms (total and per sample), clipping, one AdamW step."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .config import StepConfig
from .logprobs import TokenLogProbs, per_token_logps, scoring_kwargs
from .loss import LossBreakdown, compute_loss, loss_weights
from .rollout import Rollout


@dataclass
class StepResult:
    loss: float  # the value backpropagated (TRL: `loss`)
    grad_norm: float  # total gradient norm before clipping (TRL: `grad_norm`)
    clipped: bool
    per_sample_grad_norms: torch.Tensor  # (N,) norm of each sample's gradient of its share of the loss
    update_norm: float  # ||theta_after - theta_before||
    max_abs_logp_change: float  # on the step's own tokens, after vs before
    seconds: float


def loss_for(model, rollout: Rollout, logprobs: TokenLogProbs, advantages: torch.Tensor,
             cfg: StepConfig) -> LossBreakdown:
    """The step's loss with gradients flowing into `model`."""
    logps = per_token_logps(model, rollout, **scoring_kwargs(cfg))
    return compute_loss(logps, logprobs.policy, logprobs.reference, advantages, logprobs.mask,
                        loss_type=cfg.loss_type, beta=cfg.beta, kl_estimator=cfg.kl_estimator,
                        epsilon_low=cfg.epsilon_low, epsilon_high=cfg.epsilon_high,
                        max_completion_length=cfg.max_new_tokens)


def _grad_norm(params: list[torch.nn.Parameter]) -> float:
    return torch.sqrt(sum((p.grad.float() ** 2).sum() for p in params if p.grad is not None)).item()


def per_sample_grad_norms(model, rollout: Rollout, logprobs: TokenLogProbs, advantages: torch.Tensor,
                          cfg: StepConfig) -> torch.Tensor:
    """Exact: sample i's share of the batch loss, backpropagated through a forward of its row alone."""
    params = [p for p in model.parameters() if p.requires_grad]
    weights = loss_weights(logprobs.mask, cfg.loss_type, cfg.max_new_tokens)
    norms = []
    for i in range(rollout.num_samples):
        row = [i]
        model.zero_grad(set_to_none=True)
        torch.manual_seed(i)
        logps = per_token_logps(model, rollout.rows(row), **scoring_kwargs(cfg))
        per_token = compute_loss(logps, logprobs.policy[row], logprobs.reference[row], advantages[row],
                                 logprobs.mask[row], loss_type=cfg.loss_type, beta=cfg.beta,
                                 kl_estimator=cfg.kl_estimator, epsilon_low=cfg.epsilon_low,
                                 epsilon_high=cfg.epsilon_high, max_completion_length=cfg.max_new_tokens).per_token_loss
        (per_token * weights[row]).sum().backward()
        norms.append(_grad_norm(params))
    model.zero_grad(set_to_none=True)
    return torch.tensor(norms)


def update(model, rollout: Rollout, logprobs: TokenLogProbs, advantages: torch.Tensor, cfg: StepConfig,
           sample_norms: bool = True) -> StepResult:
    start = time.perf_counter()
    params = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    norms = per_sample_grad_norms(model, rollout, logprobs, advantages, cfg) if sample_norms else torch.tensor([])
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    torch.manual_seed(0)
    breakdown = loss_for(model, rollout, logprobs, advantages, cfg)
    optimizer.zero_grad(set_to_none=True)
    breakdown.loss.backward()
    max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm).item()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    update_norm = torch.sqrt(sum(((p.detach() - b) ** 2).sum() for p, b in zip(params, before))).item()
    with torch.no_grad():
        after = per_token_logps(model, rollout, **{**scoring_kwargs(cfg), "dropout": False})
    change = ((after - logprobs.policy).abs() * logprobs.mask).max().item()
    return StepResult(loss=breakdown.loss.item(), grad_norm=grad_norm, clipped=grad_norm > max_norm,
                      per_sample_grad_norms=norms, update_norm=update_norm, max_abs_logp_change=change,
                      seconds=time.perf_counter() - start)
