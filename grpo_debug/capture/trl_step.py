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
The optimizer step itself is not taken: every number TRL logs for the step is known before it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..logprobs import completion_mask
from ..loss import LossSpec, compute_loss
from ..rollout import Rollout
from ..scoring import Scoring, _mode, positions_from_mask, token_entropies, token_logps


@dataclass(frozen=True)
class TRLStep:
    loss: float  # the sum of the micro-batches' losses (TRL: `loss`)
    grad_norm: float  # before clipping (TRL: `grad_norm`)
    metrics: dict[str, float]  # TRL's names, each the mean over the micro-batches
    logps: torch.Tensor  # (N, C) the log-probs the step's loss took, NaN on rows it did not train on
    micro_batches: tuple[tuple[int, ...], ...]


def trl_forward(model, rollout: Rollout, scoring: Scoring, fused: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, C) log-probs (differentiable) and entropies of a micro-batch, as TRL's loss forward takes them: one
    forward over prompt + completion, attending to the prompt mask and the completion mask (up to the first
    EOS), with position_ids from that mask only when `scoring.position_ids`. `fused`: through TRL's own fused
    LM head (`trl.trainer.utils.add_fused_lm_head`, already added to `model`), as the trainer computes them; the
    temperature is then the head's; else from the full logits (`token_logps`), which also takes the scoring
    toggles the head has none for (the temperature left out, the gather)."""
    completion = completion_mask(rollout, "keep_first_eos").long()
    attention_mask = torch.cat([rollout.prompt_mask.long(), completion], dim=1)
    input_ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if scoring.position_ids:
        inputs["position_ids"] = positions_from_mask(attention_mask)
    P, C = rollout.prompt_ids.shape[1], rollout.completion_ids.shape[1]
    with (
        _mode(model, scoring.dropout),
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=scoring.dtype == "bfloat16"),
    ):
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


def trl_step(
    model,
    rollout: Rollout,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    scoring: Scoring,
    loss: LossSpec,
    micro_batches: list[list[int]],
    *,
    old_logps: torch.Tensor | None = None,
    ref_logps: torch.Tensor | None = None,
    rng_states: list[torch.Tensor] | None = None,
    max_grad_norm: float = 1.0,
    fused: bool = False,
) -> TRLStep:
    """The optimizer step over `micro_batches` (rows of the generation batch, in TRL's order). `mask` (N, C) is
    the loss mask, `advantages` (N,), `old_logps` (N, C) pi_old (None: each micro-batch's own, detached, as TRL
    without pi_old), `ref_logps` (N, C) when beta != 0, `rng_states` the random state of each forward (dropout),
    `fused`: score through TRL's fused LM head (`trl_forward`)."""
    params = [p for p in model.parameters() if p.requires_grad]
    model.zero_grad(set_to_none=True)
    num_items = mask.sum()  # tokens of the whole generation batch: dapo's normaliser
    logps = torch.full(mask.shape, float("nan"))
    value, parts = 0.0, []
    for j, rows in enumerate(micro_batches):
        if rng_states is not None and scoring.dropout:
            torch.set_rng_state(rng_states[j].clone())  # a view with an offset is read from its start
        lp, entropies = trl_forward(model, rollout.rows(rows), scoring, fused)
        part = compute_loss(  # normalised by `loss_weights` over the whole batch's tokens
            lp,
            None if old_logps is None else old_logps[rows],
            None if ref_logps is None or loss.beta == 0 else ref_logps[rows],
            advantages[rows],
            mask[rows],
            entropies=entropies,
            num_items_in_batch=num_items,
            entropy_tokens=mask[rows].sum().clamp(min=1.0),
            **loss.kwargs(),
        )
        part.loss.backward()
        value += part.loss.item()
        parts.append(part.metrics)
        logps[rows] = lp.detach().float() * mask[rows]
    max_norm = max_grad_norm if max_grad_norm > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm).item()
    model.zero_grad(set_to_none=True)
    return TRLStep(
        loss=value,
        grad_norm=grad_norm,
        metrics=mean_metrics(parts),
        logps=logps,
        micro_batches=tuple(tuple(r) for r in micro_batches),
    )
