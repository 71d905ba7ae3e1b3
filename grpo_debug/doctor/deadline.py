"""The whole diagnosis's time: `--budget` seconds from the command's start, the model's loading included. The
phases that must run (the step, its detectors) always do; the flips, the probe and the horizon take what is left,
each cut before it would run past the end, and the report says what was cut (`Deadline.cut`)."""

from __future__ import annotations

import dataclasses
import math
import time

RESERVE = 0.05  # of the budget, kept for ranking, the report and its page after the last phase


@dataclasses.dataclass(frozen=True)
class Deadline:
    """`budget` seconds (None: no bound) from `started` (time.perf_counter()'s clock)."""

    budget: float | None
    started: float

    def left(self) -> float:
        """Seconds left before the end, the reserve kept back (inf without a budget)."""
        if self.budget is None:
            return math.inf
        return self.budget * (1 - RESERVE) - (time.perf_counter() - self.started)

    def holds(self, seconds: float) -> bool:
        """Whether a phase of about `seconds` ends before the end."""
        return seconds <= self.left()

    def for_phase(self) -> float | None:
        """What is left for a phase that fits itself to a budget (the probe, the horizon): None without a bound."""
        return None if self.budget is None else max(self.left(), 0.0)

    def spent(self) -> float:
        return time.perf_counter() - self.started


def budget_said(deadline: Deadline, cut: list[str], phases: dict[str, float]) -> dict:
    """The report's record of the budget: its seconds, the seconds each phase took, what was cut for it."""
    return {"seconds": deadline.budget, "phases": {k: round(v, 3) for k, v in phases.items()}, "cut": list(cut)}
