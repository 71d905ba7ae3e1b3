"""Phase 6, update: num_iterations passes over the rollout, each split into micro-batches, AdamW steps.

TRL 1.16's loop over one generation batch of N = B*G samples: they are split into S micro-batches
(`steps_per_generation`; TRL shuffles the rows first, here they stay in order, so that the tables line up);
every GA micro-batches (`gradient_accumulation_steps`) the summed gradient is clipped and one AdamW step
is taken; and the whole is repeated mu times (`num_iterations`), each pass re-scoring the same completions
with the weights as they are by then. From the second optimizer step on, pi (the policy being trained)
differs from pi_old (the weights that scored the rollout), the ratio leaves 1 and clipping bites.

`old_logps` (`loss.needs_old_logps`) is what TRL computes once at generation time when some optimizer step of this batch is not
the first (GA % (S * mu) != 0) or when it corrects for the sampler; otherwise None, and each micro-batch's
own log-probs, detached, stand in (the ratio is then exactly 1, whatever dropout does).

`backward` backpropagates a micro-batch a few rows at a time (the gradients add up); each sample's gradient
norm, when asked for, is taken the way a `SampleNorms` strategy says: `OneBackwardPerSample` (readable: one
more backward of each sample's share alone) or its fast twin `fast.backward.HookedNorms` (layer hooks in the
same backward), chosen by `speed.kernels`; tested equal in `tests/test_fast_paths.py`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Protocol

import torch

from .loss import Batch, LossBreakdown, LossSpec, Normalisation, normalisation, rows_loss
from .rollout import row_chunks
from .scoring import Scoring, per_token_logps_and_entropies

DROPOUT_SEED = 0  # the update's dropout masks, when dropout is on


@dataclass(frozen=True)
class Optimization:
    learning_rate: float = 1e-4
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0  # 0: no clipping


@dataclass(frozen=True)
class Iteration:
    """One pass of the optimizer over the rollout (one of TRL's num_iterations)."""

    logps: torch.Tensor  # (N, C) the log-probs this pass took its loss on, detached
    entropies: torch.Tensor  # (N, C)
    ratio: torch.Tensor  # (N, C) per-token pi / pi_old
    importance_weight: torch.Tensor  # (N, C) token level, (N, 1) sequence level
    clipped: torch.Tensor  # (N, C) bool: tokens whose gradient clipping cut
    trained: torch.Tensor  # (N, C) tokens with a gradient (mask x off-policy mask x entropy mask)
    per_token_loss: torch.Tensor  # (N, C)
    losses: tuple[float, ...]  # the backpropagated value of each optimizer step
    grad_norms: tuple[float, ...]  # one per optimizer step, before clipping
    metrics: dict[str, float]  # TRL names, mean over the micro-batches (as TRL's log averages them)


@dataclass(frozen=True)
class StepResult:
    loss: float  # the first optimizer step's backpropagated value (TRL: `loss`)
    grad_norm: float  # its total gradient norm before clipping (TRL: `grad_norm`)
    clipped: bool
    per_sample_grad_norms: torch.Tensor  # (N,) first pass: each sample's gradient norm of its share of the loss
    update_norm: float  # ||theta_after - theta_before|| over every optimizer step
    seconds: float
    iterations: tuple[Iteration, ...] = ()
    optimizer_steps: int = 1
    learning_rates: tuple[float, ...] = ()  # each parameter group's rate at the first optimizer step, as applied
    optimizer: str = "AdamW"  # what stepped, in words (a capture's update phase: the trainer's, restored)


def new_optimizer(model, optimization: Optimization) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=optimization.learning_rate,
        weight_decay=optimization.weight_decay,
    )


def micro_batches(num_samples: int, steps_per_generation: int) -> list[list[int]]:
    """S lists of rows, in order: equal when S divides the samples (TRL's case), else within one row of each
    other (a TracIn-selected subset); none empty."""
    parts = torch.arange(num_samples).tensor_split(steps_per_generation)
    return [part.tolist() for part in parts if len(part)]


def scored_rows_loss(
    model, batch: Batch, scoring: Scoring, loss: LossSpec, norm: Normalisation, rows: list[int], score=None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """These rows scored by the model (`score`: `scoring.per_token_logps_and_entropies` or its fast twin), and
    their share of the loss, gradients flowing; with their detached (rows, C) log-probs and entropies."""
    score = score or per_token_logps_and_entropies
    logps, entropies = score(model, batch.rollout.rows(rows), scoring, entropy_grad=loss.entropy_coef != 0)
    return rows_loss(batch, loss, norm, rows, logps, entropies).loss, logps.detach(), entropies.detach()


def pieces_of(rows: list[int], loss: LossSpec) -> list[list[int]]:
    """A micro-batch's rows a few at a time (the gradients add up); all at once under top_entropy_quantile < 1,
    whose entropy quantile is over the micro-batch."""
    return [rows] if loss.top_entropy_quantile < 1 else [[rows[i] for i in c] for c in row_chunks(len(rows))]


class SampleNorms(Protocol):
    """How each sample's gradient norm is taken: `during` wraps each piece's backward and yields a function
    giving that piece's norms (or None), `after` returns the micro-batch's norms once its backward is done."""

    def during(self, model): ...

    def after(self, model, batch, scoring, loss, norm, rows, measured: list[torch.Tensor], score) -> torch.Tensor: ...


def per_sample_norms(
    model, batch: Batch, scoring: Scoring, loss: LossSpec, norm: Normalisation, rows: list[int], score=None
) -> torch.Tensor:
    """(len(rows),) each sample's gradient norm of its share of the loss: one backward per sample (readable, slow)."""
    params = [p for p in model.parameters() if p.requires_grad]
    norms = []
    for i in rows:
        torch.manual_seed(DROPOUT_SEED + i)
        share = scored_rows_loss(model, batch, scoring, loss, norm, [i], score)[0]
        grads = torch.autograd.grad(share, params, allow_unused=True)
        norms.append(torch.sqrt(sum((g.double() ** 2).sum() for g in grads if g is not None)))
    return torch.stack(norms).float()


class OneBackwardPerSample:
    """The readable strategy: after the micro-batch's backward, one more backward per sample."""

    @contextmanager
    def during(self, model):
        yield None

    def after(self, model, batch, scoring, loss, norm, rows, measured, score) -> torch.Tensor:
        return per_sample_norms(model, batch, scoring, loss, norm, rows, score)


@dataclass(frozen=True)
class MicroBatch:
    rows: list[int]
    value: float  # its backpropagated loss
    logps: torch.Tensor  # (rows, C)
    entropies: torch.Tensor  # (rows, C)
    per_sample_grad_norms: torch.Tensor  # (rows,), empty when not asked for
    norm: Normalisation  # its loss weights, computed once: its backward and its record both take them


def backward(
    model,
    batch: Batch,
    scoring: Scoring,
    loss: LossSpec,
    rows: list[int],
    norms: SampleNorms | None = None,
    score=None,
) -> MicroBatch:
    """Accumulate one micro-batch's loss gradient in `.grad`, a few rows at a time; with `norms`, each sample's
    gradient norm the way that strategy takes it."""
    norm = normalisation(batch, loss, rows)
    value, logps, entropies, measured = 0.0, [], [], []
    for piece in pieces_of(rows, loss):
        with norms.during(model) if norms else nullcontext() as measure:
            share, lp, ent = scored_rows_loss(model, batch, scoring, loss, norm, piece, score)
            share.backward()
        value += share.item()
        logps.append(lp)
        entropies.append(ent)
        if measure is not None:
            measured.append(measure())
    per_sample = norms.after(model, batch, scoring, loss, norm, rows, measured, score) if norms else torch.tensor([])
    return MicroBatch(rows, value, torch.cat(logps), torch.cat(entropies), per_sample, norm)


def micro_batch_losses(
    logps: torch.Tensor,
    entropies: torch.Tensor,
    batch: Batch,
    loss: LossSpec,
    norms: list[Normalisation] | None = None,
) -> list[LossBreakdown]:
    """Each micro-batch's loss as `backward` takes it (its normalisation, its entropy quantile), from a
    pass's (N, C) log-probs and entropies, which may require grad; the model is not run. `norms`: each
    micro-batch's normalisation as its backward took it (None: computed here)."""
    rows_of = micro_batches(len(batch.advantages), loss.steps_per_generation)
    norms = norms or [normalisation(batch, loss, rows) for rows in rows_of]
    return [rows_loss(batch, loss, norm, rows, logps[rows], entropies[rows]) for rows, norm in zip(rows_of, norms)]


def iteration_record(
    logps: torch.Tensor,
    entropies: torch.Tensor,
    losses: list[float],
    grad_norms: list[float],
    batch: Batch,
    loss: LossSpec,
    norms: list[Normalisation] | None = None,
) -> Iteration:
    """What one pass did, recomputed from its detached (N, C) log-probs, micro-batch by micro-batch as TRL logs it
    (`norms`: each micro-batch's normalisation as its backward took it)."""
    parts = micro_batch_losses(logps, entropies, batch, loss, norms)
    cat = lambda name: torch.cat([getattr(p, name).detach() for p in parts])
    keys = parts[0].metrics.keys()
    return Iteration(
        logps=logps,
        entropies=entropies,
        ratio=cat("ratio"),
        importance_weight=cat("importance_weight"),
        clipped=cat("clipped"),
        trained=cat("trained"),
        per_token_loss=cat("per_token_loss"),
        losses=tuple(losses),
        grad_norms=tuple(grad_norms),
        metrics={k: sum(p.metrics[k] for p in parts) / len(parts) for k in keys},
    )


def update(
    model,
    batch: Batch,
    scoring: Scoring,
    loss: LossSpec,
    optimization: Optimization,
    *,
    num_iterations: int = 1,
    per_sample_grad_norms: bool = True,
    optimizer: torch.optim.Optimizer | None = None,
    start: Iterable[torch.Tensor] | None = None,
    score=None,
    norms: SampleNorms | None = None,
) -> StepResult:
    """mu x S / GA AdamW steps on `batch`. `optimizer`: an AdamW over the model's parameters carried from
    earlier steps (training); None: a fresh one (`new_optimizer`). `start`: the trained parameters' values now,
    where the caller keeps a copy (the update's norm is measured from it); None: copied here. `score` and
    `norms`: the readable scoring and per-sample norms, or their fast twins (`speed.kernels`)."""
    began = time.perf_counter()
    params = [p for p in model.parameters() if p.requires_grad]
    before = start if start is not None else [p.detach().clone() for p in params]
    optimizer = optimizer or new_optimizer(model, optimization)
    learning_rates = tuple(float(g["lr"]) for g in optimizer.param_groups)
    max_norm = optimization.max_grad_norm if optimization.max_grad_norm > 0 else float("inf")
    S, GA = loss.steps_per_generation, loss.gradient_accumulation_steps
    batches = micro_batches(batch.rollout.num_samples, S)
    norms = norms or OneBackwardPerSample()
    torch.manual_seed(DROPOUT_SEED)
    iterations = []
    for it in range(num_iterations):
        done, losses, grad_norms = [], [], []
        for window in range(0, S, GA):
            optimizer.zero_grad(set_to_none=True)
            strategy = norms if per_sample_grad_norms and it == 0 else None
            steps = [
                backward(model, batch, scoring, loss, rows, strategy, score) for rows in batches[window : window + GA]
            ]
            grad_norms.append(torch.nn.utils.clip_grad_norm_(params, max_norm).item())
            optimizer.step()
            done += steps
            losses.append(sum(mb.value for mb in steps))
        logps, entropies = torch.cat([mb.logps for mb in done]), torch.cat([mb.entropies for mb in done])
        iterations.append(iteration_record(logps, entropies, losses, grad_norms, batch, loss, [mb.norm for mb in done]))
        if it == 0:
            first_norms = torch.cat([mb.per_sample_grad_norms for mb in done])
    optimizer.zero_grad(set_to_none=True)
    first = iterations[0]
    return StepResult(
        loss=first.losses[0],
        grad_norm=first.grad_norms[0],
        clipped=first.grad_norms[0] > max_norm,
        per_sample_grad_norms=first_norms if per_sample_grad_norms else torch.tensor([]),
        update_norm=torch.sqrt(sum(((p.detach() - b) ** 2).sum() for p, b in zip(params, before))).item(),
        seconds=time.perf_counter() - began,
        iterations=tuple(iterations),
        optimizer_steps=num_iterations * (S // GA),
        learning_rates=learning_rates,
    )
