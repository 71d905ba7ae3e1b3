"""Phase 6, update: backward, gradient norms (total and per sample), clipping, one AdamW step.

The readable path: the batch loss's backward a few rows at a time (the gradients add up), then, if asked,
each sample's gradient norm from one more backward of that sample's share alone. The fast path
(`fast=True`) gets every per-sample norm from the same backward through layer hooks
(`per_sample.PerSampleGradients`), with the Conv1D weights' batch gradient summed from their per-sample
gradients; tested equal to the readable path in `tests/test_fast_paths.py`.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch

from .fast.backward import conv1d_weights, no_autograd_for, norms_and_batch_gradient
from .logprobs import Scoring, TokenLogProbs, score_rows
from .loss import LossSpec, compute_loss, loss_weights
from .rollout import Rollout, row_chunks
from .tracin.per_sample import PerSampleGradients

DROPOUT_SEED = 0  # the update's dropout masks, when dropout is on


@dataclass(frozen=True)
class Optimization:
    learning_rate: float = 1e-4
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0  # 0: no clipping


@dataclass(frozen=True)
class StepResult:
    loss: float  # the value backpropagated (TRL: `loss`)
    grad_norm: float  # total gradient norm before clipping (TRL: `grad_norm`)
    clipped: bool
    per_sample_grad_norms: torch.Tensor  # (N,) norm of each sample's gradient of its share of the loss
    update_norm: float  # ||theta_after - theta_before||
    seconds: float


def chunk_loss(model, rollout: Rollout, logprobs: TokenLogProbs, advantages: torch.Tensor, scoring: Scoring,
               loss: LossSpec, rows: list[int], weights: torch.Tensor, fast: bool = True) -> torch.Tensor:
    """These rows' share of the batch loss (the batch's normalisation `weights`, (N, C)), gradients flowing."""
    logps = score_rows(model, rollout.rows(rows), scoring, fast)
    per_token = compute_loss(logps, logprobs.policy[rows], logprobs.reference[rows], advantages[rows],
                             logprobs.mask[rows], **loss.kwargs()).per_token_loss
    return (per_token * weights[rows]).sum()


def per_sample_norms(model, rollout, logprobs, advantages, scoring, loss, weights) -> torch.Tensor:
    """(N,) each sample's gradient norm of its share of the loss: one backward per sample (readable, slow)."""
    params = [p for p in model.parameters() if p.requires_grad]
    norms = []
    for i in range(rollout.num_samples):
        torch.manual_seed(DROPOUT_SEED + i)
        grads = torch.autograd.grad(chunk_loss(model, rollout, logprobs, advantages, scoring, loss, [i], weights,
                                               fast=False), params, allow_unused=True)
        norms.append(torch.sqrt(sum((g.double() ** 2).sum() for g in grads if g is not None)))
    return torch.stack(norms).float()


def backward(model, rollout, logprobs, advantages, scoring, loss, weights, norms: bool, fast: bool):
    """Accumulate the batch loss's gradient in `.grad`; returns its value and the (N,) per-sample norms
    (empty when not asked for)."""
    value, per_sample = 0.0, []
    hooked = norms and fast
    built = conv1d_weights(model) if hooked else []
    torch.manual_seed(DROPOUT_SEED)
    for rows in row_chunks(rollout.num_samples):
        hooks = PerSampleGradients(model)
        with hooks.capture() if hooked else contextlib.nullcontext(), no_autograd_for(built):
            share = chunk_loss(model, rollout, logprobs, advantages, scoring, loss, rows, weights, fast)
            share.backward()
        value += share.item()
        if hooked:
            per_sample.append(norms_and_batch_gradient(hooks, built))
    if norms and not fast:
        per_sample.append(per_sample_norms(model, rollout, logprobs, advantages, scoring, loss, weights))
    return value, torch.cat(per_sample) if per_sample else torch.tensor([])


def update(model, rollout: Rollout, logprobs: TokenLogProbs, advantages: torch.Tensor, scoring: Scoring,
           loss: LossSpec, optimization: Optimization, *, per_sample_grad_norms: bool = True,
           fast: bool = True) -> StepResult:
    """One AdamW step on the batch loss; `advantages` is (N,), the log-probs (N, C)."""
    start = time.perf_counter()
    params = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    optimizer = torch.optim.AdamW(params, lr=optimization.learning_rate, weight_decay=optimization.weight_decay)
    optimizer.zero_grad(set_to_none=True)
    weights = loss_weights(logprobs.mask, loss.loss_type, loss.max_completion_length)
    value, norms = backward(model, rollout, logprobs, advantages, scoring, loss, weights, per_sample_grad_norms, fast)
    max_norm = optimization.max_grad_norm if optimization.max_grad_norm > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm).item()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    update_norm = torch.sqrt(sum(((p.detach() - b) ** 2).sum() for p, b in zip(params, before))).item()
    return StepResult(loss=value, grad_norm=grad_norm, clipped=grad_norm > max_norm,
                      per_sample_grad_norms=norms, update_norm=update_norm, seconds=time.perf_counter() - start)
