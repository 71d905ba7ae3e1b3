"""The update's optimizer passes re-read under another loss config, without a model call: what lets the panel
show the clip range or delta acting on pass 2 at the cost of a loss evaluation. Exact only where every pass but
the last sends the same token gradients under both configs (checked, else None: the panel re-runs the update)."""

from __future__ import annotations

import dataclasses

import torch

from ..config import StepConfig
from ..loss import Batch, LossSpec, batch_of
from ..specs import loss_spec_of, sampler_correction_of
from ..step import StepRun
from ..update import Iteration, StepResult, iteration_record, micro_batch_losses


def token_gradients(it: Iteration, batch: Batch, loss: LossSpec) -> tuple[torch.Tensor, ...]:
    """(N, C) d loss / d logp and d loss / d entropy of each token in one pass: all the model's backward
    receives, so two specs with equal token gradients take the same optimizer step."""
    logps, entropies = it.logps.clone().requires_grad_(True), it.entropies.clone().requires_grad_(True)
    total = sum(p.loss for p in micro_batch_losses(logps, entropies, batch, loss))
    return tuple(
        torch.zeros_like(x) if g is None else g
        for x, g in zip((logps, entropies), torch.autograd.grad(total, (logps, entropies), allow_unused=True))
    )


def reevaluate_passes(
    result: StepResult, before: tuple[LossSpec, Batch], after: tuple[LossSpec, Batch]
) -> tuple[Iteration, ...] | None:
    """The passes of `result` (taken under the loss spec and batch `before`) recomputed under `after`
    from the log-probs each pass scored, without running the model; None where that is not exact.
    Pass k+1 scores the weights the first k passes left, which are the same when every earlier pass sends
    the same token gradients under both specs (e.g. a clip range changed while every earlier ratio was 1).
    The last pass's step is not re-taken: its grad_norms are NaN, its losses recomputed."""
    for it in result.iterations[:-1]:
        old, new = (token_gradients(it, batch, spec) for spec, batch in (before, after))
        if not all(torch.equal(a, b) for a, b in zip(old, new)):
            return None
    spec, batch = after
    GA, passes = spec.gradient_accumulation_steps, []
    for k, it in enumerate(result.iterations):
        values = [p.loss.item() for p in micro_batch_losses(it.logps, it.entropies, batch, spec)]
        losses = [sum(values[w : w + GA]) for w in range(0, len(values), GA)]
        last = k == len(result.iterations) - 1
        grad_norms = [float("nan")] * len(losses) if last else list(it.grad_norms)
        passes.append(iteration_record(it.logps, it.entropies, losses, grad_norms, batch, spec))
    return tuple(passes)


def passes_under(run: StepRun, cfg: StepConfig) -> tuple[Iteration, ...] | None:
    """The optimizer passes of `run.update` as they would read under `cfg`, recomputed from the log-probs
    each pass scored (no model call), where `cfg` changes loss-phase fields only and that is exact
    (`update.reevaluate_passes`: every pass but the last sends the same token gradients under both); else None.
    At mu = 2 with pass 1 on-policy, the clip range and delta qualify; beta or the loss type do not."""
    changed = [f.name for f in dataclasses.fields(StepConfig) if getattr(cfg, f.name) != getattr(run.config, f.name)]
    if run.update is None or not all(StepConfig.phase_of(f) == "loss" for f in changed):
        return None
    sides = [
        (
            loss_spec_of(c),
            batch_of(
                run.rollout,
                run.logprobs,
                run.advantages.values,
                loss_spec_of(c),
                sampler_correction_of(c),
                c.num_iterations,
            ),
        )
        for c in (run.config, cfg)
    ]
    return reevaluate_passes(run.update, *sides)
