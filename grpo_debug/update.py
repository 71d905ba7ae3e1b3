"""Phase 6, update: num_iterations passes over the rollout, each split into micro-batches, AdamW steps.

TRL 1.16's loop over one generation batch of N = B*G samples: they are split into S micro-batches
(`steps_per_generation`; TRL shuffles the rows first, here they stay in order, so that the tables line up);
every GA micro-batches (`gradient_accumulation_steps`) the summed gradient is clipped and one AdamW step
is taken; and the whole is repeated mu times (`num_iterations`), each pass re-scoring the same completions
with the weights as they are by then. From the second optimizer step on, pi (the policy being trained)
differs from pi_old (the weights that scored the rollout), the ratio leaves 1 and clipping bites.

`old_logps` is what TRL computes once at generation time when some optimizer step of this batch is not
the first (GA % (S * mu) != 0) or when it corrects for the sampler; otherwise None, and each micro-batch's
own log-probs, detached, stand in (the ratio is then exactly 1, whatever dropout does).

`backward` backpropagates a micro-batch a few rows at a time (the gradients add up), then, if asked, each
sample's gradient norm from one more backward of that sample's share alone. Its fast twin
(`fast.backward.backward_hooked`, chosen by `speed.kernels`) gets every per-sample norm from the same backward
through layer hooks; tested equal in `tests/test_fast_paths.py`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .logprobs import TokenLogProbs
from .loss import LossBreakdown, LossSpec, compute_loss, loss_weights
from .rollout import Rollout, row_chunks
from .sampler import SamplerCorrection, sampler_correction
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


def new_optimizer(model, optimization: Optimization) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=optimization.learning_rate,
        weight_decay=optimization.weight_decay,
    )


def needs_old_logps(loss: LossSpec, num_iterations: int, correction: SamplerCorrection | None) -> bool:
    """TRL computes pi_old's log-probs at generation time when some optimizer step on this batch is not the
    first (gradient_accumulation_steps % (steps_per_generation * num_iterations) != 0), or to correct for
    the sampler; otherwise every micro-batch's own detached log-probs stand in and the ratio is exactly 1."""
    first_only = loss.gradient_accumulation_steps % (loss.steps_per_generation * num_iterations) == 0
    return not first_only or correction is not None


def off_policy_inputs(
    loss: LossSpec, correction: SamplerCorrection | None, num_iterations: int, lp: TokenLogProbs, sampler_logps
) -> dict:
    """`update`'s old_logps (pi_old's, or None: each pass's own, detached), sampler_ratio and sampler_logps."""
    return dict(
        old_logps=lp.policy if needs_old_logps(loss, num_iterations, correction) else None,
        sampler_ratio=sampler_correction(correction, lp.policy, sampler_logps, lp.mask)[0],
        sampler_logps=sampler_logps if correction else None,
    )


def micro_batches(num_samples: int, steps_per_generation: int) -> list[list[int]]:
    """S lists of rows, in order: equal when S divides the samples (TRL's case), else within one row of each
    other (a TracIn-selected subset); none empty."""
    parts = torch.arange(num_samples).tensor_split(steps_per_generation)
    return [part.tolist() for part in parts if len(part)]


def chunk_share(
    model,
    rollout: Rollout,
    logprobs: TokenLogProbs,
    advantages: torch.Tensor,
    scoring: Scoring,
    loss: LossSpec,
    rows: list[int],
    weights: torch.Tensor,
    score,
    old_logps,
    sampler_ratio,
    entropy_tokens,
    sampler_logps=None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """These rows' share of their micro-batch's loss (its normalisation `weights`, (N, C)), gradients
    flowing, and their (rows, C) log-probs and entropies. `score`: how rows are scored
    (`scoring.per_token_logps_and_entropies` or its fast twin)."""
    logps, entropies = score(model, rollout.rows(rows), scoring, entropy_grad=loss.entropy_coef != 0)
    part = compute_loss(
        logps,
        None if old_logps is None else old_logps[rows],
        logprobs.reference[rows],
        advantages[rows],
        logprobs.mask[rows],
        entropies=entropies,
        sampler_ratio=None if sampler_ratio is None else sampler_ratio[rows],
        sampler_logps=None if sampler_logps is None else sampler_logps[rows],
        weights=weights[rows],
        entropy_tokens=entropy_tokens,
        **loss.kwargs(),
    )
    return part.loss, logps.detach(), entropies.detach()


def chunk_loss(
    model,
    rollout: Rollout,
    logprobs: TokenLogProbs,
    advantages: torch.Tensor,
    scoring: Scoring,
    loss: LossSpec,
    rows: list[int],
    weights: torch.Tensor,
    score=per_token_logps_and_entropies,
    *,
    old_logps: torch.Tensor | None = None,
    sampler_ratio: torch.Tensor | None = None,
    entropy_tokens: float | None = None,
    sampler_logps: torch.Tensor | None = None,
) -> torch.Tensor:
    """These rows' share of the loss whose normalisation is `weights` (N, C), gradients flowing."""
    return chunk_share(
        model,
        rollout,
        logprobs,
        advantages,
        scoring,
        loss,
        rows,
        weights,
        score,
        old_logps,
        sampler_ratio,
        entropy_tokens,
        sampler_logps,
    )[0]


def per_sample_norms(
    model, rollout, logprobs, advantages, scoring, loss, weights, rows=None, **context
) -> torch.Tensor:
    """(len(rows),) each sample's gradient norm of its share of the loss: one backward per sample (readable, slow)."""
    params = [p for p in model.parameters() if p.requires_grad]
    norms = []
    for i in range(rollout.num_samples) if rows is None else rows:
        torch.manual_seed(DROPOUT_SEED + i)
        grads = torch.autograd.grad(
            chunk_loss(model, rollout, logprobs, advantages, scoring, loss, [i], weights, **context),
            params,
            allow_unused=True,
        )
        norms.append(torch.sqrt(sum((g.double() ** 2).sum() for g in grads if g is not None)))
    return torch.stack(norms).float()


@dataclass(frozen=True)
class MicroBatch:
    rows: list[int]
    value: float  # its backpropagated loss
    logps: torch.Tensor  # (rows, C)
    entropies: torch.Tensor  # (rows, C)
    per_sample_grad_norms: torch.Tensor  # (rows,), empty when not asked for


def micro_batch_loss_inputs(logprobs: TokenLogProbs, loss: LossSpec, rows: list[int], num_items, **tensors):
    """(N, C) each token's weight in this micro-batch's loss (its normalisation; 0 outside `rows`), and the
    keyword arguments `chunk_share` takes with them: `tensors` (old_logps, sampler_ratio, sampler_logps) and
    the token count of the entropy mask, which is the micro-batch's."""
    weights = torch.zeros_like(logprobs.mask)
    weights[rows] = loss_weights(
        logprobs.mask[rows],
        loss.loss_type,
        loss.max_completion_length,
        num_items_in_batch=num_items,
        gradient_accumulation_steps=loss.gradient_accumulation_steps,
        steps_per_generation=loss.steps_per_generation,
    )
    entropy_tokens = None if loss.top_entropy_quantile < 1 else logprobs.mask[rows].sum().clamp(min=1.0)
    return weights, {**tensors, "entropy_tokens": entropy_tokens}


def pieces_of(rows: list[int], loss: LossSpec) -> list[list[int]]:
    """A micro-batch's rows a few at a time (the gradients add up); all at once under top_entropy_quantile < 1,
    whose entropy quantile is over the micro-batch."""
    return [rows] if loss.top_entropy_quantile < 1 else [[rows[i] for i in c] for c in row_chunks(len(rows))]


def backward(
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
    """Accumulate one micro-batch's loss gradient in `.grad`, a few rows at a time; with `norms`, each sample's
    gradient norm from one more backward of its share alone (`per_sample_norms`). The fast twin:
    `fast.backward.backward_hooked`."""
    tensors = dict(old_logps=old_logps, sampler_ratio=sampler_ratio, sampler_logps=sampler_logps)
    weights, context = micro_batch_loss_inputs(logprobs, loss, rows, num_items_in_batch, **tensors)
    value, logps, entropies = 0.0, [], []
    for piece in pieces_of(rows, loss):
        share, lp, ent = chunk_share(
            model, rollout, logprobs, advantages, scoring, loss, piece, weights, score, **context
        )
        share.backward()
        value += share.item()
        logps.append(lp)
        entropies.append(ent)
    per_sample = (
        per_sample_norms(model, rollout, logprobs, advantages, scoring, loss, weights, rows, **context)
        if norms
        else torch.tensor([])
    )
    return MicroBatch(rows, value, torch.cat(logps), torch.cat(entropies), per_sample)


def micro_batch_losses(
    logps: torch.Tensor,
    entropies: torch.Tensor,
    logprobs: TokenLogProbs,
    advantages: torch.Tensor,
    loss: LossSpec,
    *,
    old_logps=None,
    sampler_ratio=None,
    sampler_logps=None,
    num_items_in_batch=None,
) -> list[LossBreakdown]:
    """Each micro-batch's loss as `backward` takes it (its normalisation, its entropy quantile), from a
    pass's (N, C) log-probs and entropies, which may require grad; the model is not run."""
    mask, pick = logprobs.mask, lambda t, rows: None if t is None else t[rows]
    parts = []
    for rows in micro_batches(len(mask), loss.steps_per_generation):
        weights = loss_weights(
            mask[rows],
            loss.loss_type,
            loss.max_completion_length,
            num_items_in_batch=num_items_in_batch,
            gradient_accumulation_steps=loss.gradient_accumulation_steps,
            steps_per_generation=loss.steps_per_generation,
        )
        parts.append(
            compute_loss(
                logps[rows],
                pick(old_logps, rows),
                logprobs.reference[rows],
                advantages[rows],
                mask[rows],
                entropies=entropies[rows],
                sampler_ratio=pick(sampler_ratio, rows),
                sampler_logps=pick(sampler_logps, rows),
                weights=weights,
                entropy_tokens=None if loss.top_entropy_quantile < 1 else mask[rows].sum().clamp(min=1.0),
                **loss.kwargs(),
            )
        )
    return parts


def iteration_record(
    logps: torch.Tensor,
    entropies: torch.Tensor,
    losses: list[float],
    grad_norms: list[float],
    logprobs,
    advantages,
    loss: LossSpec,
    **context,
) -> Iteration:
    """What one pass did, recomputed from its detached (N, C) log-probs, micro-batch by micro-batch as TRL logs it."""
    parts = micro_batch_losses(logps, entropies, logprobs, advantages, loss, **context)
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
    rollout: Rollout,
    logprobs: TokenLogProbs,
    advantages: torch.Tensor,
    scoring: Scoring,
    loss: LossSpec,
    optimization: Optimization,
    *,
    old_logps: torch.Tensor | None = None,
    sampler_ratio: torch.Tensor | None = None,
    sampler_logps: torch.Tensor | None = None,
    num_iterations: int = 1,
    per_sample_grad_norms: bool = True,
    optimizer: torch.optim.Optimizer | None = None,
    score=per_token_logps_and_entropies,
    backward=backward,
) -> StepResult:
    """mu x S / GA AdamW steps on the rollout; `advantages` is (N,), the log-probs (N, C), `old_logps`
    (N, C) or None (on-policy); `sampler_ratio` ((N, C) or (N, 1)) and `sampler_logps` (N, C) when the
    sampler correction is on. `optimizer`: an AdamW over the model's parameters carried from earlier
    steps (training); None: a fresh one (`new_optimizer`). `score` and `backward`: the readable functions,
    or their fast twins (`speed.kernels`)."""
    start = time.perf_counter()
    params = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    optimizer = optimizer or new_optimizer(model, optimization)
    max_norm = optimization.max_grad_norm if optimization.max_grad_norm > 0 else float("inf")
    S, GA = loss.steps_per_generation, loss.gradient_accumulation_steps
    batches = micro_batches(rollout.num_samples, S)
    num_items = logprobs.mask.sum()
    context = dict(
        old_logps=old_logps, sampler_ratio=sampler_ratio, sampler_logps=sampler_logps, num_items_in_batch=num_items
    )
    torch.manual_seed(DROPOUT_SEED)
    iterations, norms = [], torch.tensor([])
    for it in range(num_iterations):
        passes, losses, grad_norms = [], [], []
        for window in range(0, S, GA):
            optimizer.zero_grad(set_to_none=True)
            done = [
                backward(
                    model,
                    rollout,
                    logprobs,
                    advantages,
                    scoring,
                    loss,
                    rows,
                    norms=per_sample_grad_norms and it == 0,
                    score=score,
                    **context,
                )
                for rows in batches[window : window + GA]
            ]
            grad_norms.append(torch.nn.utils.clip_grad_norm_(params, max_norm).item())
            optimizer.step()
            passes += done
            losses.append(sum(mb.value for mb in done))
        if it == 0 and per_sample_grad_norms:
            norms = torch.cat([mb.per_sample_grad_norms for mb in passes])
        iterations.append(
            iteration_record(
                torch.cat([mb.logps for mb in passes]),
                torch.cat([mb.entropies for mb in passes]),
                losses,
                grad_norms,
                logprobs,
                advantages,
                loss,
                **context,
            )
        )
    optimizer.zero_grad(set_to_none=True)
    update_norm = torch.sqrt(sum(((p.detach() - b) ** 2).sum() for p, b in zip(params, before))).item()
    first = iterations[0]
    return StepResult(
        loss=first.losses[0],
        grad_norm=first.grad_norms[0],
        clipped=first.grad_norms[0] > max_norm,
        per_sample_grad_norms=norms,
        update_norm=update_norm,
        seconds=time.perf_counter() - start,
        iterations=tuple(iterations),
        optimizer_steps=num_iterations * (S // GA),
    )
