"""The update's fast backward: every sample's gradient norm from the one batch backward.

`no_autograd_for` turns autograd's weight gradient off for every Conv1D weight and
`norms_and_batch_gradient` builds those weights' per-sample gradients from the layer hooks
(`per_sample`) instead, takes their norms and adds their sum to `.grad` ("book-keeping"): building
them costs what autograd's batch weight gradient would have, so the transformer blocks' per-sample norms
come almost free. `HookedNorms` is the strategy `update.backward` takes them with; its readable twin is
`update.OneBackwardPerSample` (one backward per sample).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers.pytorch_utils import Conv1D

from .per_sample import PerSampleGradients, SampleGradients, materialize


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


class HookedNorms:
    """The fast strategy for `update.backward`: each sample's gradient norm from layer hooks in the same backward."""

    @contextmanager
    def during(self, model) -> Iterator:
        hooks, built = PerSampleGradients(model), conv1d_weights(model)
        with hooks.capture(), no_autograd_for(built):
            yield lambda: norms_and_batch_gradient(hooks, built)

    def after(self, model, batch, scoring, loss, norm, rows, measured, score) -> torch.Tensor:
        return torch.cat(measured)
