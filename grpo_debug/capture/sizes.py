"""What opening a capture takes, from its files' headers alone (no tensor loaded): its size on disk, and the replay's
peak memory above the imports, part by part as the replay holds them. `replay` and `doctor` print it before they
load anything, so that a user knows whether this machine can open the capture.

    policy     the trained model as loaded (float32; a LoRA run: the base and its adapter)
    reference  TRL's reference: its own model where beta != 0, the policy's copy where beta = 0, none for LoRA (the
               policy with its adapters off)
    start      the trained weights before the step: read back from the capture's files (full), a copy (LoRA)
    gradients  one per trained weight
    optimizer  the trainer's AdamW state, as optimizer.safetensors holds it
    logits     one micro-batch's (rows x tokens x vocabulary) logits, their softmax and its gradient, in float32
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from .model_folder import weight_headers

LOADED_BYTES = 4  # weights are loaded in float32
DTYPE_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "U8": 1, "BOOL": 1}
MB = 2**20


def _elements(folder: Path) -> int:
    return sum(math.prod(shape) for shape, _, _ in weight_headers(folder).values())


def _stored_bytes(file: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as f:
        parts = [f.get_slice(k) for k in f.keys()]
        return sum(math.prod(part.get_shape()) * DTYPE_BYTES.get(part.get_dtype(), 4) for part in parts)


def replay_estimate(path: str | Path) -> dict | None:
    """{"capture_mb": on disk, "optimizer_mb", "replay_peak_mb": the sum of `parts` (MB each)}; None where the
    capture's files cannot be read this way (opening it then says why)."""
    path = Path(path)
    try:
        meta = json.loads((path / "capture.json").read_text())
        policy, g = meta["policy"], meta["grpo_config"]
        if policy.get("adapter"):
            base = Path(policy["base"]["folder"])
            trained = _elements(path / policy["folder"]) * LOADED_BYTES
            loaded = _elements(base) * LOADED_BYTES + trained
            reference, start, config = 0, trained, base / "config.json"
        else:
            loaded = trained = _elements(path / policy["folder"]) * LOADED_BYTES
            name = meta["reference"]["name_or_path"]
            reference = _elements(Path(name)) * LOADED_BYTES if name and Path(str(name)).is_dir() else loaded
            start, config = 0, path / policy["folder"] / "config.json"
        optimizer = _stored_bytes(path / "optimizer.safetensors") if (path / "optimizer.safetensors").is_file() else 0
        batch = torch.load(path / "batch.pt", weights_only=True, map_location="cpu", mmap=True)
        tokens = batch["prompt_ids"].shape[1] + batch["completion_ids"].shape[1]
        vocab = json.loads(config.read_text())["vocab_size"]
        rows = min(int(g.get("per_device_train_batch_size") or 1), batch["completion_ids"].shape[0])
    except Exception:  # an unreadable or unexpected file: `load_capture` names it
        return None
    parts = {
        "policy": loaded,
        "reference": reference,
        "start": start,
        "gradients": trained,
        "optimizer": optimizer,
        "logits": 3 * rows * tokens * vocab * 4,
    }
    on_disk = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return {
        "capture_mb": on_disk / MB,
        "optimizer_mb": optimizer / MB,
        "parts_mb": {k: v / MB for k, v in parts.items()},
        "replay_peak_mb": sum(parts.values()) / MB,
    }


def estimate_line(estimate: dict | None) -> str:
    """One line for the command's output: what the capture takes, or that it could not be estimated."""
    if estimate is None:
        return "capture size and memory: not estimated (its files are checked next)"
    return (
        f"capture {estimate['capture_mb']:.0f} MB on disk (optimizer state {estimate['optimizer_mb']:.0f} MB); "
        f"replaying it takes about {estimate['replay_peak_mb'] / 1024:.2f} GB of memory above the imports"
    )
