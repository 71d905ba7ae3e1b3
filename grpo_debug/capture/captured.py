"""A capture once read: its folder, capture.json (`meta`), batch.pt (`batch`) and the optimizer's state file, with
what a reader asks of them (`Capture`); and `CaptureError`, the one-line refusal of a capture that cannot be
opened, naming the file and the problem. Reading (`reading.py`) and checking (`checking.py`) build on it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from . import optimizer_state


class CaptureError(ValueError):
    """A capture folder that cannot be opened: the message names the file and the problem."""


@dataclass(frozen=True)
class Capture:
    path: Path
    meta: dict  # capture.json
    batch: dict[str, torch.Tensor]  # batch.pt
    optimizer_file: Path | None = None  # optimizer.safetensors (`optimizer_state`), if written

    @property
    def optimizer_tensors(self) -> dict[str, torch.Tensor] | None:
        """The trainer's optimizer state, read from its file at each call (checked when the capture was read):
        a fresh copy the caller owns, and no copy held between updates."""
        if self.optimizer_file is None:
            return None
        try:
            return optimizer_state.read(self.path, self.meta["optimizer"])
        except Exception as e:  # safetensors refuses a damaged header in several ways
            raise CaptureError(f"{self.optimizer_file} cannot be read as tensors ({type(e).__name__}: {e})") from None

    @property
    def num_samples(self) -> int:
        return len(self.batch["completion_ids"])

    @property
    def schedule(self) -> dict | None:
        """The captured optimizer step's micro-batches (rows of the generation batch) and pass: `micro_batches`
        in a one-process capture; `ranks`, each process's own (its micro-batches, losses and widths), in a
        multi-process one. None for a capture written before format 2, or a multi-process capture written
        before each process's schedule was recorded."""
        return self.meta.get("schedule")

    @property
    def step_metrics(self) -> dict:
        """The step's own numbers from the trainer (format 2), else what TRL logged at the step."""
        return self.meta.get("step_metrics") or self.meta.get("logged") or {}

    @property
    def logged_kl(self) -> list[tuple[int, float]]:
        """[(step, kl)] as TRL logged them up to the captured step (the last 50; empty before this was recorded,
        or where beta = 0)."""
        return [(int(step), float(kl)) for step, kl in self.meta.get("logged_kl", [])]

    @property
    def logged_history(self) -> list[dict]:
        """[{"step": k, "kl": ..., "completions/clipped_ratio": ...}] as TRL logged them up to the captured step
        (`trainer_state.HISTORY_KEYS`; empty in a capture recorded before this was kept)."""
        return [dict(h) for h in self.meta.get("logged_history", [])]

    @property
    def step_metrics_source(self) -> str:
        """What `step_metrics` are: the trainer's own numbers for this one step, or what TRL logged (an
        average over its logging window, `logging_steps` defaults to 10)."""
        if self.meta.get("step_metrics"):
            return "trainer's step metrics"
        return "TRL logged" if self.meta.get("logged") else "nothing recorded"

    @property
    def conversational(self) -> bool:
        return bool(self.meta["prompts"]) and isinstance(self.meta["prompts"][0], list)
