"""Where the replayed update of a captured step k lands, against the weights the trainer captured at step k+1."""

import math
from pathlib import Path

import torch
from safetensors.torch import load_file

from grpo_debug.capture import open_capture
from grpo_debug.capture.replay import trainer_update


def stored_weights(capture: Path) -> dict[str, torch.Tensor]:
    """The trained weights a capture's policy folder holds (a full model's, or a LoRA adapter's), by file key."""
    out = {}
    for f in sorted((capture / "policy").glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def stored_key(name: str, stored: dict) -> str:
    """A trained parameter's name as its capture stores it (peft drops the adapter's name, `default`)."""
    for key in (name, name.replace(".default.", "."), name.replace("base_model.model.", "", 1)):
        if key in stored:
            return key
    raise KeyError(f"{name} is not in the captured weights ({sorted(stored)[:3]} ...)")


def landing(step_k: Path, step_next: Path, task=None) -> dict:
    """Step k replayed with the trainer's optimizer (`trainer_update`) against the trainer's own move from step k's
    weights to step k+1's: {"cosine", "norm_ratio" (ours / the trainer's), "max_abs_difference" of the weights
    after, "bit_equal", "trainer_norm", "exact" (the trainer's optimizer was rebuilt), "optimizer"}."""
    step = open_capture(step_k, task=task)
    update = trainer_update(step, step.run(until="advantages"))
    before, after = stored_weights(step_k), stored_weights(step_next)
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
    moved = ours_sq > 0 and theirs_sq > 0
    return {
        "cosine": dot / math.sqrt(ours_sq * theirs_sq) if moved else math.nan,
        "norm_ratio": math.sqrt(ours_sq / theirs_sq) if moved else math.nan,
        "max_abs_difference": worst,
        "bit_equal": equal,
        "trainer_norm": math.sqrt(theirs_sq),
        "exact": update.exact,
        "optimizer": update.optimizer,
    }
