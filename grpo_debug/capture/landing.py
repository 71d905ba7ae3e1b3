"""Where the replayed update of a captured step k lands, against the weights the trainer captured at step k+1.

    out = landing(open_capture("captures/step-2", task), "captures/step-3")
    out["cosine"], out["norm_ratio"], out["bit_equal"]

Step k replayed with the trainer's optimizer (`replay.trainer_update`: its micro-batches, dropout masks, clipping
and AdamW state as captured) moves theta_k by delta_ours; the trainer moved it by delta_trainer = theta_{k+1} -
theta_k, both read from the two captures' policy folders (a LoRA capture: its adapter). The figures are
cos(delta_ours, delta_trainer), ||delta_ours|| / ||delta_trainer||, and max |theta_ours - theta_{k+1}|.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from .replay import trainer_update
from .saved_weights import stored_key

ADAM_REACH = 100  # an AdamW step moves no weight by more than a few times its rate (+ the decay): this many is
# another run's weights, or weights changed after their capture


def stored_weights(capture: str | Path) -> dict[str, torch.Tensor]:
    """The trained weights a capture's policy folder holds (a full model's, or a LoRA adapter's), by file key;
    ValueError naming the file where one cannot be read as tensors."""
    from safetensors.torch import load_file

    out = {}
    for f in sorted((Path(capture) / "policy").glob("*.safetensors")):
        try:
            out.update(load_file(str(f)))
        except Exception as e:  # safetensors refuses a damaged or truncated file in several ways
            raise ValueError(f"{f} cannot be read as tensors ({type(e).__name__}: {e})") from None
    return out


def next_weights(first, next_capture: str | Path, before: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Step k+1's captured weights, checked as step k's were before anything is compared: its files' checksums
    and every stored value finite (`load_capture`), the same weights by name and shape as step k's, its scheduler one step on
    from step k's, and under AdamW every weight within ADAM_REACH x the step's rate of step k's. ValueError in one
    line naming the folder and what is wrong. `first`: step k's Capture, `before` its stored weights."""
    from .reading import load_capture

    nxt = load_capture(next_capture)  # CaptureError (a ValueError) names the file that changed or is missing
    after = stored_weights(next_capture)
    if sorted(after) != sorted(before):
        differ = sorted(set(after) ^ set(before))
        raise ValueError(f"{next_capture} holds other weights than {first.path}: {differ[:3]} ...")
    for key, value in after.items():
        if value.shape != before[key].shape:
            raise ValueError(f"{next_capture}: {key} is {tuple(value.shape)}, {tuple(before[key].shape)} at step k")
    a, b = (_scheduled_steps(c.meta) for c in (first, nxt))
    if a is not None and b is not None and b != a + 1:
        raise ValueError(f"{first.path} and {next_capture} are not consecutive steps of one run: their "
                         f"schedulers stand at {a} and {b}")  # fmt: skip
    optimizer = first.meta.get("optimizer") or {}
    rates = optimizer.get("learning_rate") or []
    if optimizer.get("class") in ("AdamW", "Adam") and rates:
        decay = float((first.meta.get("grpo_config") or {}).get("weight_decay") or 0)
        reach = ADAM_REACH * max(rates) * (1 + decay * _largest(before))
        moved = max(((after[k].double() - before[k].double()).abs().max().item() for k in after), default=0.0)
        if moved > reach:
            raise ValueError(f"{next_capture}'s weights are not one AdamW step from {first.path}'s: a weight "
                             f"moved by {moved:.3g}, over {ADAM_REACH} x the step's rate ({max(rates):.3g}): another "
                             "run's weights, or weights changed after their capture")  # fmt: skip
    return after


def _scheduled_steps(meta: dict) -> int | None:
    scheduler = (meta.get("optimizer") or {}).get("scheduler") or {}
    last = scheduler.get("last_epoch")
    return last if type(last) is int else None


def _largest(weights: dict[str, torch.Tensor]) -> float:
    return max((w.abs().max().item() for w in weights.values() if w.numel()), default=0.0)


def landing(step, next_capture: str | Path) -> dict:
    """`step` (an opened capture of step k) replayed with the trainer's optimizer, against the trainer's own move
    to `next_capture` (step k+1 of the same run): {"cosine", "norm_ratio" (ours / the trainer's; NaN where either
    did not move), "max_abs_difference" of the weights after, "bit_equal", "trainer_norm", "exact" (the trainer's
    optimizer was rebuilt), "optimizer" (what stepped, in words), "learning_rate" (the largest group's rate as it
    stepped)}. The policy is left where the step was."""
    before = stored_weights(step.capture.path)
    after = next_weights(step.capture, next_capture, before)
    update = trainer_update(step, step.run(until="advantages"))
    dot = ours_sq = theirs_sq = 0.0
    worst, equal = 0.0, True
    for name, param in step.policy.named_parameters():
        if not param.requires_grad:
            continue
        key = stored_key(name, after)
        theirs = after[key].double() - before[key].double()
        ours = update.delta[name].double()
        dot += float((theirs * ours).sum())
        ours_sq, theirs_sq = ours_sq + float((ours**2).sum()), theirs_sq + float((theirs**2).sum())
        worst = max(worst, float((param.detach().double() - after[key].double()).abs().max()))
        equal = equal and torch.equal(param.detach(), after[key].to(param.dtype))
    step.restore_policy()
    moved = ours_sq > 0 and theirs_sq > 0
    return {
        "cosine": dot / math.sqrt(ours_sq * theirs_sq) if moved else math.nan,
        "norm_ratio": math.sqrt(ours_sq / theirs_sq) if moved else math.nan,
        "max_abs_difference": worst,
        "bit_equal": equal,
        "trainer_norm": math.sqrt(theirs_sq),
        "exact": update.exact,
        "optimizer": update.optimizer,
        "learning_rate": max(update.learning_rate, default=math.nan),
    }
