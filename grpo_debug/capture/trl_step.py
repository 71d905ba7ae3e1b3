"""One optimizer step as TRL 1.16's `GRPOTrainer` takes it, micro-batch by micro-batch: the replay of a capture.

The engine's update phase (`update.py`) trains on the whole generation batch, rows in order. A captured step is
one optimizer step of a run: GA micro-batches of rows that TRL shuffled, in pass `p` of `num_iterations`, at
the weights before that step, with pi_old from generation time. For each micro-batch, as TRL's
`_compute_loss` does it:

    logps, entropy = forward(prompt + completion of the rows)          # one forward, dropout as the trainer's
    loss_j        = sum_t per_token_loss * w_t                          # w: the loss type's normaliser (loss_weights)
    loss_j.backward()
then grad_norm = ||sum_j grad loss_j|| (before clipping), `loss` = sum_j loss_j, and every metric the mean
over the micro-batches (TRL's log with logging_steps=1). With dropout on, each forward starts from the random
state the trainer's forward started from (captured by a pre-hook), so the dropout masks are the trainer's.
Every number TRL logs for the step is known before the optimizer steps; given the trainer's optimizer
(`optimizer_state.trainer_optimizer`), it then steps as the trainer's did.

With P processes (a multi-process capture), each process r has its own micro-batches, random states and
widths (it pads its rows to its own longest prompt and completion, and a dropout mask is drawn for that shape):

    loss_rj = sum_t per_token_loss * w_t      # dapo/cispo/vespo: the batch's tokens over all processes / P
    (loss_rj / P).backward()                  # DDP all-reduces the mean of the processes' gradients
then grad_norm = ||(1/P) sum_r sum_j grad loss_rj||, `loss` = (1/P) sum_r sum_j loss_rj (each process's sum,
as the trainer returns it, averaged as TRL's log gathers it), and each metric at micro-batch position j is
taken over the rows of every process's j-th micro-batch (TRL reduces kl, entropy and the clip ratios over the
processes), then averaged over the positions.
"""

from __future__ import annotations

import dataclasses
import math
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ..logprobs import completion_mask
from ..loss import LossSpec, compute_loss
from ..rollout import Rollout
from ..scoring import Scoring, _mode, positions_from_mask, token_entropies, token_logps


@dataclass(frozen=True)
class TRLStep:
    loss: float  # the sum of the micro-batches' losses, the mean over processes of each one's sum (TRL: `loss`)
    grad_norm: float  # before clipping (TRL: `grad_norm`)
    metrics: dict[str, float]  # TRL's names, each the mean over the micro-batches
    logps: torch.Tensor  # (N, C) the log-probs the step's loss took, NaN on rows it did not train on
    micro_batches: tuple[tuple[int, ...], ...]  # every process's, in process order
    rank_losses: tuple[float, ...] = ()  # each process's sum of its micro-batches' losses
    tokens: dict[str, torch.Tensor] | None = None  # (N, C) each, the rows it trained on put back in place (0 or
    # False elsewhere): entropies, ratio, importance_weight ((N, 1) at sequence level), clipped, trained,
    # per_token_loss (as `update.Iteration` holds them)


@contextmanager
def as_trained(model, dropout: bool, checkpointing: dict | None):
    """The model as the trainer's loop holds it through every forward and its backward: in train mode where dropout
    is on (else eval), and with the run's activation checkpointing (TRL 1.16's default; `checkpointing`:
    `torch.utils.checkpoint`'s kwargs as the run set them, {} for transformers' defaults, None: off): each decoder
    layer's activations recomputed in the backward instead of kept, so that the replay holds what the trainer held,
    with the same numbers. transformers checkpoints a layer in train mode only: the layers alone are flagged so,
    their dropout left as `dropout` says."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = [m for m in base.modules() if isinstance(m, GradientCheckpointingLayer)]
    with _mode(model, dropout):
        if checkpointing is None or not layers or any(m.gradient_checkpointing for m in layers):
            yield  # off, nothing to checkpoint, or already on (the caller's model, left as it is)
            return
        base.activation_checkpointing_enable(activation_checkpointing_kwargs=checkpointing or None)
        for m in layers:
            m.training = True
        try:
            yield
        finally:
            base.activation_checkpointing_disable()  # the layers' modes come back with `_mode`'s


def checkpointing_of(grpo_config: dict) -> dict | None:
    """The kwargs the run checkpointed its activations with ({}: the defaults), or None where it did not."""
    for name in ("activation_checkpointing", "gradient_checkpointing"):  # transformers 5.24's name, then the old
        if grpo_config.get(name):
            return dict(grpo_config.get(f"{name}_kwargs") or {})
    return None


def trl_forward(model, rollout: Rollout, scoring: Scoring, fused: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, C) log-probs (differentiable) and entropies of a micro-batch, as TRL's loss forward takes them: one
    forward over prompt + completion, attending to the prompt mask and the completion mask (up to the first
    EOS), with position_ids from that mask only when `scoring.position_ids`. `fused`: through TRL's own fused
    LM head (`trl.trainer.utils.add_fused_lm_head`, already added to `model`), as the trainer computes them; the
    temperature is then the head's; else from the full logits (`token_logps`), which also takes the scoring
    toggles the head has none for (the temperature left out, the gather). The model in the mode `as_trained` set."""
    completion = completion_mask(rollout, "keep_first_eos").long()
    attention_mask = torch.cat([rollout.prompt_mask.long(), completion], dim=1)
    input_ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if scoring.position_ids:
        inputs["position_ids"] = positions_from_mask(attention_mask)
    P, C = rollout.prompt_ids.shape[1], rollout.completion_ids.shape[1]
    with torch.autocast(input_ids.device.type, dtype=torch.bfloat16, enabled=scoring.dtype == "bfloat16"):
        if fused:
            labels = input_ids.masked_fill(attention_mask == 0, -100)
            labels[:, :-C] = -100
            out = model(**inputs, labels=labels, fused_lm_head=True)
            return out.log_probs[:, -C:].float(), out.entropy[:, -C:].float().detach()
        logits = model(**inputs).logits[:, P - 1 : P + C - 1]
    return token_logps(logits, rollout.completion_ids, scoring), token_entropies(logits, scoring)


def mean_like_trl_log(values: list[float]) -> float | None:
    """A metric's value as TRL's `log` averages its list: NaN entries left out, None when none is left."""
    valid = [v for v in values if not math.isnan(v)]
    return sum(valid) / len(valid) if valid else None


def mean_metrics(parts: list[dict[str, float]]) -> dict[str, float]:
    """Each metric's mean over the micro-batches as TRL's `log` takes it (NaN where no entry is a number)."""
    out = {}
    for key in parts[0]:
        mean = mean_like_trl_log([p[key] for p in parts])
        out[key] = float("nan") if mean is None else mean
    return out


@dataclass(frozen=True)
class RankSchedule:
    """One process's share of the step: its micro-batches (rows of the generation batch, in its order), the
    random state each of its forwards started from (None: not recorded), and the widths of its own generation
    batch (None: the whole batch's; a process pads its rows to its own longest prompt and completion only, and
    a dropout mask is drawn for the shape it is given)."""

    micro_batches: tuple[tuple[int, ...], ...]
    rng_states: tuple[torch.Tensor, ...] | None = None
    prompt_width: int | None = None
    completion_width: int | None = None


def trl_step(
    model,
    rollout: Rollout,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    scoring: Scoring,
    loss: LossSpec,
    ranks: list[RankSchedule],
    *,
    old_logps: torch.Tensor | None = None,
    ref_logps: torch.Tensor | None = None,
    max_grad_norm: float = 1.0,
    fused: bool = False,
    optimizer: torch.optim.Optimizer | None = None,
    checkpointing: dict | None = None,
) -> TRLStep:
    """The optimizer step over each process's micro-batches (`ranks`, one per process, in process order). `mask`
    (N, C) is the loss mask, `advantages` (N,), `old_logps` (N, C) pi_old (None: each micro-batch's own,
    detached, as TRL without pi_old), `ref_logps` (N, C) when beta != 0, `fused`: score through TRL's fused LM
    head (`trl_forward`). As TRL with P processes: dapo's normaliser is the generation batch's tokens over all
    processes divided by P; each process backpropagates its own micro-batches; DDP averages the P gradients (so
    each loss is backpropagated / P) before grad_norm; the loss logged is the mean over processes of each one's
    sum, and each metric the mean over micro-batch positions of its value over all processes' rows there.
    `optimizer`: steps once on the clipped gradient, as the trainer's did (None: the weights stay). `checkpointing`:
    the run's activation checkpointing (`as_trained`; None: off)."""
    params = [p for p in model.parameters() if p.requires_grad]
    model.zero_grad(set_to_none=True)
    batch = _Batch(rollout, mask, advantages, old_logps, ref_logps, mask.sum() / len(ranks))
    logps, raw, entropies = (torch.full(mask.shape, float("nan"), device=mask.device) for _ in range(3))
    rank_losses, parts, tokens = [], [], {}
    with as_trained(model, scoring.dropout, checkpointing):  # every forward and backward, as the trainer's loop
        for rank in ranks:
            value, rank_parts = 0.0, []
            for j, rows in enumerate(rank.micro_batches):
                if rank.rng_states is not None and scoring.dropout:
                    torch.set_rng_state(rank.rng_states[j].clone())  # a view with an offset is read from its start
                part, lp, ent = _micro_batch_loss(model, batch, rows, rank, scoring, loss, fused)
                (part.loss / len(ranks)).backward()  # DDP: the mean of the processes' gradients
                value += part.loss.item()
                rank_parts.append(part.metrics)
                logps[list(rows)], raw[list(rows)], entropies[list(rows)] = lp * mask[list(rows)], lp, ent
                _put_back(tokens, part, list(rows), mask.shape)
            rank_losses.append(value)
            parts.append(rank_parts)
    max_norm = max_grad_norm if max_grad_norm > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm).item()
    if optimizer is not None:
        optimizer.step()
    model.zero_grad(set_to_none=True)
    metrics = parts[0] if len(ranks) == 1 else _pooled_metrics(batch, ranks, raw, entropies, loss)
    return TRLStep(
        loss=sum(rank_losses) / len(rank_losses),
        grad_norm=grad_norm,
        metrics=mean_metrics(metrics),
        logps=logps,
        micro_batches=tuple(mb for rank in ranks for mb in rank.micro_batches),
        rank_losses=tuple(rank_losses),
        tokens={"entropies": entropies.nan_to_num(0.0), **tokens},
    )


TOKEN_FIELDS = ("ratio", "importance_weight", "clipped", "trained", "per_token_loss")


def _put_back(tokens: dict, part, rows: list[int], shape: tuple[int, int]) -> None:
    """A micro-batch's per-token tensors (at its widths, `part`: its loss breakdown) into the step's (N, C) ones."""
    for name in TOKEN_FIELDS:
        value = getattr(part, name).detach()
        if name not in tokens:
            sequence_level = value.shape[1] == 1 and part.ratio.shape[1] != 1
            width = 1 if sequence_level else shape[1]
            tokens[name] = torch.zeros(shape[0], width, dtype=value.dtype, device=value.device)
        tokens[name][rows, : value.shape[1]] = value.to(tokens[name].dtype)


@dataclass(frozen=True)
class _Batch:
    """The generation batch a step trains on: (N, ...) tensors, and dapo's normaliser for one process."""

    rollout: Rollout
    mask: torch.Tensor
    advantages: torch.Tensor
    old_logps: torch.Tensor | None
    ref_logps: torch.Tensor | None
    num_items: torch.Tensor


def _micro_batch_loss(model, batch: _Batch, rows, rank: RankSchedule, scoring: Scoring, loss: LossSpec, fused: bool):
    """One micro-batch of one process, at that process's widths: its loss (`compute_loss`), and its (n, C)
    log-probs (detached) and entropies, zero past its completion width."""
    rows = list(rows)
    P, C = batch.rollout.prompt_ids.shape[1], batch.rollout.completion_ids.shape[1]
    p, c = rank.prompt_width or P, rank.completion_width or C
    lp, entropies = trl_forward(model, narrowed(batch.rollout.rows(rows), p, c), scoring, fused)
    part = compute_loss(  # normalised by `loss_weights` over the whole batch's tokens
        lp,
        None if batch.old_logps is None else batch.old_logps[rows, :c],
        None if batch.ref_logps is None or loss.beta == 0 else batch.ref_logps[rows, :c],
        batch.advantages[rows],
        batch.mask[rows, :c],
        entropies=entropies,
        num_items_in_batch=batch.num_items,
        entropy_tokens=batch.mask[rows].sum().clamp(min=1.0),
        **loss.kwargs(),
    )
    wide = torch.zeros(len(rows), C, device=lp.device)
    wide_entropies = torch.zeros(len(rows), C, device=lp.device)
    wide[:, :c], wide_entropies[:, :c] = lp.detach().float(), entropies.detach().float()
    return part, wide, wide_entropies


def narrowed(rollout: Rollout, prompt_width: int, completion_width: int) -> Rollout:
    """`rollout`'s rows at a process's own widths: the last `prompt_width` prompt columns (prompts are
    left-padded) and the first `completion_width` completion columns (right-padded)."""
    P, C = rollout.prompt_ids.shape[1], rollout.completion_ids.shape[1]
    if (prompt_width, completion_width) == (P, C):
        return rollout
    if not (0 < prompt_width <= P and 0 < completion_width <= C):
        raise ValueError(f"widths ({prompt_width}, {completion_width}) do not fit the batch's ({P}, {C})")
    completion = slice(0, completion_width)
    return dataclasses.replace(
        rollout,
        prompt_ids=rollout.prompt_ids[:, P - prompt_width :],
        prompt_mask=rollout.prompt_mask[:, P - prompt_width :],
        completion_ids=rollout.completion_ids[:, completion],
        sampler_logps=rollout.sampler_logps[:, completion],
        sampler_logps_temperature_only=rollout.sampler_logps_temperature_only[:, completion],
    )


def _pooled_metrics(batch: _Batch, ranks: list[RankSchedule], logps, entropies, loss: LossSpec) -> list[dict]:
    """Each micro-batch position's metrics as TRL logs them with several processes: over the rows every process
    trained on there (its masked means reduced over the processes, its min and max over their sequences).
    `logps`, `entropies` (N, C) as the processes' forwards took them."""
    if len({len(rank.micro_batches) for rank in ranks}) != 1:
        raise ValueError("the processes have different numbers of micro-batches: TRL trains them in lock step")
    out = []
    for position in zip(*(rank.micro_batches for rank in ranks)):
        rows = [r for mb in position for r in mb]
        part = compute_loss(
            logps[rows],
            None if batch.old_logps is None else batch.old_logps[rows],
            None if batch.ref_logps is None or loss.beta == 0 else batch.ref_logps[rows],
            batch.advantages[rows],
            batch.mask[rows],
            entropies=entropies[rows],
            num_items_in_batch=batch.num_items,
            **loss.kwargs(),
        )
        out.append(part.metrics)
    return out
