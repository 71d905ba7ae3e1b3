"""A captured TRL step (`grpo_debug.capture`) read from disk: the folder a `CaptureCallback` wrote, as a `Capture`.

A capture is a file from outside: `load_capture` verifies the SHA-256 of every file it wrote (`checksums.json`)
before parsing any, reads capture.json within a bound and batch.pt's tensors with `weights_only=True`, then checks
every piece (`checking.py`: files, JSON, tensor names, shapes, masks, NaN, the schedule, the random states, the
policy folder and the optimizer's state, before any model is built); a problem names the file.

What a capture is opened as lives beside it: the `StepConfig` it implies (`captured_config.py`), its rewards as a
task (`captured_task.py`), its batch as the step's rollout and its models (`captured_inputs.py`).
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import torch

from ..checksums import checksum_problem
from ..files import MAX_READ_BYTES, read_bounded
from . import optimizer_state
from .captured import Capture, CaptureError
from .checking import check_capture, need


def load_capture(path: str | Path) -> Capture:
    path = Path(path)
    if not path.is_dir():
        raise CaptureError(f"{path} is not a capture: no such folder (CaptureCallback writes step-<k>/ folders)")
    for name in ("capture.json", "batch.pt"):
        if not (path / name).is_file():
            raise CaptureError(f"{path} is not a capture: no {name} (CaptureCallback writes step-<k>/ folders)")
    problem = checksum_problem(path)  # before any file is parsed: what the capture wrote, unchanged
    if problem:
        raise CaptureError(problem)
    try:
        meta = json.loads(read_bounded(path / "capture.json", MAX_READ_BYTES))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CaptureError(f"{path / 'capture.json'} is not valid JSON: {e}") from None
    except ValueError as e:  # past its bound
        raise CaptureError(str(e)) from None
    try:
        with zipfile.ZipFile(path / "batch.pt") as archive:  # torch.save's format: the CRCs catch a corrupted byte
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError) as e:
        raise CaptureError(f"{path / 'batch.pt'} is not a torch.save archive ({e})") from None
    if bad is not None:
        raise CaptureError(f"{path / 'batch.pt'} is corrupted: {bad} fails its checksum")
    try:
        batch = torch.load(path / "batch.pt", weights_only=True, map_location="cpu")
    except Exception as e:  # a truncated or edited file fails in many ways inside torch
        raise CaptureError(f"{path / 'batch.pt'} cannot be read as tensors ({type(e).__name__}: {e})") from None
    capture = Capture(path, meta, batch, _optimizer_file(path, meta))
    check_capture(capture)
    return capture


def _optimizer_file(path: Path, meta) -> Path | None:
    """optimizer.safetensors, where capture.json has an `optimizer` entry (its tensors are checked with the rest)."""
    if not isinstance(meta, dict) or meta.get("optimizer") is None:
        return None
    entry = meta["optimizer"]
    name = entry.get("file") if isinstance(entry, dict) else None
    need(
        name == optimizer_state.FILE, path / "capture.json", f"optimizer.file = {name!r}, not {optimizer_state.FILE!r}"
    )
    need((path / name).is_file(), path / name, "missing (capture.json has an 'optimizer' entry)")
    return path / name
