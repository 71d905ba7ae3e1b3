"""The largest `--horizon` (steps) and `--horizon-seeds` the doctor's `--budget` can hold, torch-free: the command
line refuses more in one line before any model loads, and `diagnose` refuses it where a budget is given.

The horizon's plan is at least 2 arms (the run and one cause's fix) x 2 seeds x 2 steps, and `fit` cuts steps and
seeds down to that floor until the plan fits the budget at the continuation step's measured speed. A step cannot
take less than `FASTEST_STEP` seconds (a tenth of the smallest bundled step measured on a CPU here: 0.22 s for 1
prompt x 2 completions x 2 new tokens; the tenth leaves room for a GPU), so the budget holds at most
budget / (2 x 2 x FASTEST_STEP) steps (and as many seeds): `fit` would cut anything above that, after counting
down to it one by one (a horizon of 999999999 spent minutes there before its first step). `MAX_BUDGET`, a day,
keeps the bound itself finite: a longer run than that is a training run (`python -m grpo_debug train`).
"""

from __future__ import annotations

import math

FASTEST_STEP = 0.022  # seconds a continuation step takes at the least (see above)
SMALLEST_PLAN = 2 * 2  # 2 arms x 2 seeds (for steps), or 2 arms x 2 steps (for seeds)
MAX_BUDGET = 86400.0  # seconds: a day


def most(budget: float) -> int:
    """The most steps (or seeds) of the horizon that `budget` seconds can hold."""
    return max(2, math.floor(budget / (SMALLEST_PLAN * FASTEST_STEP)))


def horizon_problem(steps: int, seeds: int, budget: float | None, said: str | None = None) -> str | None:
    """Why `steps` and `seeds` are past what `budget` can hold (one line), or None; no budget: no bound. `said`:
    how the budget was set (default "a budget of B s")."""
    if budget is None:
        return None
    if not (math.isfinite(budget) and 0 < budget <= MAX_BUDGET):
        return f"--budget {budget:g}: a number of seconds above 0 and at most {MAX_BUDGET:g} (a day)"
    limit = most(budget)
    for flag, value, unit in (("--horizon", steps, "steps"), ("--horizon-seeds", seeds, "seeds")):
        if value > limit:
            return (
                f"{flag} {value}: at most {limit} {unit} within {said or f'a budget of {budget:g} s'}: the smallest "
                "plan (2 arms x 2 "
                f"{'seeds' if unit == 'steps' else 'steps'}) at {FASTEST_STEP:g} s a continuation step, the fastest "
                "one could be, fills it by then, and the budget would cut any more; raise --budget for more"
            )
    return None
