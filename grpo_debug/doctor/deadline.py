"""The whole diagnosis's time: `--budget` seconds from the command's start, the model's loading included. The
phases that must run (the step, its detectors) always do; the flips, the probe and the horizon take what is left,
each cut before it would run past the end, and the report says what was cut (`Deadline.cut`)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
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


@dataclasses.dataclass
class Phases:
    """The diagnosis's phases as they go: the seconds each took, what was cut for the budget, and (`progress`) a
    line on stderr as each starts, with the time spent and left."""

    deadline: Deadline
    progress: bool = False
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    cut: list[str] = dataclasses.field(default_factory=list)

    def say(self, line: str) -> None:
        if self.progress:
            d = self.deadline
            left = "" if d.budget is None else f"; {max(d.left(), 0):.0f} s left of {d.budget:g}"
            print(f"doctor: {line} ({d.spent():.1f} s{left})", file=sys.stderr)

    @contextlib.contextmanager
    def timed(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def said(self) -> dict:
        """The report's record of the budget: its seconds, the seconds each phase took, what was cut for it."""
        seconds = {k: round(v, 3) for k, v in self.seconds.items()}
        return {"seconds": self.deadline.budget, "phases": seconds, "cut": list(self.cut)}
