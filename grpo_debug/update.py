"""Phase 6, update: backward, gradient norms (total and per sample), clipping, one AdamW step."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch

from .config import StepConfig
from .logprobs import TokenLogProbs, per_token_logps, scoring_kwargs
from .loss import compute_loss, loss_kwargs, loss_weights
from .per_sample import PerSampleGradients, conv1d_weights, no_autograd_for, norms_and_batch_gradient
from .rollout import Rollout, row_chunks


@dataclass
class StepResult:
    loss: float  # the value backpropagated (TRL: `loss`)
    grad_norm: float  # total gradient norm before clipping (TRL: `grad_norm`)
    clipped: bool
    per_sample_grad_norms: torch.Tensor  # (N,) norm of each sample's gradient of its share of the loss
    update_norm: float  # ||theta_after - theta_before||
    seconds: float


def chunk_loss(model, rollout: Rollout, logprobs: TokenLogProbs, advantages: torch.Tensor, cfg: StepConfig,
               rows: list[int], weights: torch.Tensor) -> torch.Tensor:
    """These rows' share of the batch loss (the batch's normalisation `weights`), gradients flowing."""
    logps = per_token_logps(model, rollout.rows(rows), **scoring_kwargs(cfg))
    per_token = compute_loss(logps, logprobs.policy[rows], logprobs.reference[rows], advantages[rows],
                             logprobs.mask[rows], **loss_kwargs(cfg)).per_token_loss
    return (per_token * weights[rows]).sum()


def update(model, rollout: Rollout, logprobs: TokenLogProbs, advantages: torch.Tensor, cfg: StepConfig) -> StepResult:
    """Backward (8 rows at a time) gives the total gradient and, through layer hooks, every sample's gradient
    norm; with norms on, the Conv1D weights' batch gradient is the sum of their per-sample gradients."""
    start = time.perf_counter()
    params = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    optimizer.zero_grad(set_to_none=True)
    torch.manual_seed(0)  # dropout masks, when dropout is on
    weights = loss_weights(logprobs.mask, cfg.loss_type, cfg.max_new_tokens)
    loss, norms = 0.0, []
    built = conv1d_weights(model) if cfg.per_sample_grad_norms else []
    for rows in row_chunks(rollout.num_samples):  # gradients accumulate over the chunks
        hooks = PerSampleGradients(model)
        with hooks.capture() if cfg.per_sample_grad_norms else contextlib.nullcontext(), no_autograd_for(built):
            share = chunk_loss(model, rollout, logprobs, advantages, cfg, rows, weights)
            share.backward()
        loss += share.item()
        if cfg.per_sample_grad_norms:
            norms.append(norms_and_batch_gradient(hooks, built))
    norms = torch.cat(norms) if norms else torch.tensor([])
    max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm).item()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    update_norm = torch.sqrt(sum(((p.detach() - b) ** 2).sum() for p, b in zip(params, before))).item()
    return StepResult(loss=loss, grad_norm=grad_norm, clipped=grad_norm > max_norm,
                      per_sample_grad_norms=norms, update_norm=update_norm,
                      seconds=time.perf_counter() - start)
