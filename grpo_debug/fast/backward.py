"""The update's fast backward: every sample's gradient norm from the one batch backward.

`no_autograd_for` turns autograd's weight gradient off for every Conv1D weight and
`norms_and_batch_gradient` builds those weights' per-sample gradients from the layer hooks
(`per_sample`) instead, takes their norms and adds their sum to `.grad` ("book-keeping"): building
them costs what autograd's batch weight gradient would have, so the transformer blocks' per-sample norms
come almost free. Readable twin: `update.backward` with `update.per_sample_norms` (one backward per sample).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers.pytorch_utils import Conv1D

from ..per_sample import PerSampleGradients, SampleGradients, materialize
from ..scoring import per_token_logps_and_entropies
from ..update import MicroBatch, backward, chunk_share, micro_batch_loss_inputs, pieces_of


def conv1d_weights(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [m.weight for m in model.modules() if isinstance(m, Conv1D) and m.weight.requires_grad]


@contextmanager
def no_autograd_for(weights: list[torch.nn.Parameter]) -> Iterator[list[torch.nn.Parameter]]:
    """Autograd skips these weights' gradients (inputs' gradients still flow through their layers)."""
    for w in weights:
        w.requires_grad_(False)
    try:
        yield weights
    finally:
        for w in weights:
            w.requires_grad_(True)


def norms_and_batch_gradient(hooks: PerSampleGradients, built: list[torch.nn.Parameter]) -> torch.Tensor:
    """(N,) per-sample gradient norms after a backward under `no_autograd_for(built)`: each built weight's
    per-sample gradients are materialised once, squared and summed into `.grad`; every other
    parameter's norm comes from its factors (ghost or built, whichever is cheaper)."""
    factors = hooks.factors()
    squared = SampleGradients([{p: cs for p, cs in factors.items() if all(p is not w for w in built)}]).squared_norms()
    for weight in built:
        (per_sample,) = [materialize(c) for c in factors[weight]]  # a Conv1D weight has one use
        squared = squared + per_sample.flatten(1).pow(2).sum(1).double()  # torch's cascade sum: ~1e-7 relative
        total = per_sample.sum(0)
        weight.grad = total if weight.grad is None else weight.grad + total
    return squared.clamp(min=0).sqrt().float()


def backward_hooked(
    model,
    rollout,
    logprobs,
    advantages,
    scoring,
    loss,
    rows: list[int],
    *,
    old_logps=None,
    sampler_ratio=None,
    sampler_logps=None,
    num_items_in_batch=None,
    norms: bool = False,
    score=per_token_logps_and_entropies,
) -> MicroBatch:
    """`update.backward`, with each sample's gradient norm from layer hooks in the same backward."""
    tensors = dict(old_logps=old_logps, sampler_ratio=sampler_ratio, sampler_logps=sampler_logps)
    if not norms:
        return backward(
            model,
            rollout,
            logprobs,
            advantages,
            scoring,
            loss,
            rows,
            num_items_in_batch=num_items_in_batch,
            score=score,
            **tensors,
        )
    weights, context = micro_batch_loss_inputs(logprobs, loss, rows, num_items_in_batch, **tensors)
    built = conv1d_weights(model)
    value, logps, entropies, per_sample = 0.0, [], [], []
    for piece in pieces_of(rows, loss):
        hooks = PerSampleGradients(model)
        with hooks.capture(), no_autograd_for(built):
            share, lp, ent = chunk_share(
                model, rollout, logprobs, advantages, scoring, loss, piece, weights, score, **context
            )
            share.backward()
        value += share.item()
        logps.append(lp)
        entropies.append(ent)
        per_sample.append(norms_and_batch_gradient(hooks, built))
    return MicroBatch(rows, value, torch.cat(logps), torch.cat(entropies), torch.cat(per_sample))
