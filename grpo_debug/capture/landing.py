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


def stored_weights(capture: str | Path) -> dict[str, torch.Tensor]:
    """The trained weights a capture's policy folder holds (a full model's, or a LoRA adapter's), by file key."""
    from safetensors.torch import load_file

    out = {}
    for f in sorted((Path(capture) / "policy").glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def landing(step, next_capture: str | Path) -> dict:
    """`step` (an opened capture of step k) replayed with the trainer's optimizer, against the trainer's own move
    to `next_capture` (step k+1 of the same run): {"cosine", "norm_ratio" (ours / the trainer's; NaN where either
    did not move), "max_abs_difference" of the weights after, "bit_equal", "trainer_norm", "exact" (the trainer's
    optimizer was rebuilt), "optimizer" (what stepped, in words), "learning_rate" (the largest group's rate as it
    stepped)}. The policy is left where the step was."""
    before, after = stored_weights(step.capture.path), stored_weights(next_capture)
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
