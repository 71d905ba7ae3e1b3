"""Training results read back: the held-out reward and step metrics per arm, with intervals for seeds crossed
with test prompts (`grpo_debug.stats`), each family of verdicts corrected for multiplicity; `reanalyze`
recomputes every verdict of a committed result from its records."""

from __future__ import annotations

import math
import re

import torch

from .. import stats
from ..config import StepConfig

COMPARED = ("kl", "entropy", "completions/mean_length")  # step metrics compared with the first arm's at the end


def eval_table(records: list[dict], arm: str, seeds: int, step: int) -> torch.Tensor | None:
    """(seeds, prompts) the held-out reward per test prompt at `step`, rows in seed order."""
    rows = {
        r["seed"]: r["eval"]["per_prompt"] for r in records if "eval" in r and r["arm"] == arm and r["step"] == step
    }
    return torch.tensor([rows[s] for s in sorted(rows)], dtype=torch.float64) if len(rows) == seeds else None


def last_steps_mean(records: list[dict], arm: str, seeds: int, key: str, first: int, last: int) -> torch.Tensor | None:
    """(seeds,) each seed's mean of a step metric over steps first..last."""
    ids = sorted({r["seed"] for r in records if r["arm"] == arm})
    if len(ids) != seeds:
        return None
    rows = [
        [
            r[key]
            for r in records
            if r["arm"] == arm
            and r["seed"] == s
            and first <= r["step"] <= last
            and "eval" not in r
            and r.get(key) is not None
        ]
        for s in ids
    ]
    return torch.tensor([sum(v) / len(v) for v in rows], dtype=torch.float64) if all(rows) else None


HEAVY_TAILED = ("kl",)  # compared as log ratios per seed (stats.log_ratio_interval)


def last_quarter(steps: int) -> tuple[int, int]:
    """The steps a step metric is compared over: the last quarter of the run (at least its last step)."""
    return steps - max(1, steps // 4) + 1, steps


def as_log_ratio(key: str, mine: torch.Tensor, theirs: torch.Tensor) -> bool:
    """Whether two arms' step metric `key` is compared as a log ratio: heavy-tailed and positive in every seed."""
    return key in HEAVY_TAILED and bool((mine > 0).all()) and bool((theirs > 0).all())


def detected(entry: dict) -> bool:
    """Whether a summary entry (an interval with its family's Holm p) is detected (`stats.is_detected`)."""
    return stats.is_detected(entry["ci_low"], entry["ci_high"], entry.get("holm_p"))


def metric_difference(mine: torch.Tensor, theirs: torch.Tensor, key: str, level: float = stats.LEVEL) -> stats.Interval:
    """A step metric of two arms, paired by seed: a log ratio for a heavy-tailed positive metric, else the
    difference, Student's t over seeds."""
    if as_log_ratio(key, mine, theirs):
        return stats.log_ratio_interval(mine, theirs, level)
    return stats.seed_interval(mine - theirs, level)


def family(intervals: dict[str, stats.Interval], what: str, others: dict[str, str] | None = None) -> dict[str, dict]:
    """A family of verdicts: Holm's adjusted p-values across it, and each verdict in words. The intervals
    are computed at `stats.bonferroni_level` of the family's size by the caller, so a verdict never
    contradicts its interval. `others` names, per member, what it is compared with (a claim's other arm)."""
    adjusted = stats.holm([i.p_value for i in intervals.values()])
    return {
        name: {
            **i.as_dict(),
            "holm_p": p,
            "family": what,
            "family_size": len(intervals),
            **({"other": others[name]} if others else {}),
            "verdict": stats.verdict(i, what if not others else f"{what}, {name}", p),
        }
        for (name, i), p in zip(intervals.items(), adjusted)
    }


Claim = tuple[str, str, str]  # (what it says, arm, other): the held-out reward of arm minus other after K steps


def summarize(
    records: list[dict],
    arms: list[str],
    seeds: int,
    steps: int,
    claims: list[Claim] | None = None,
    borrowed: tuple[str, ...] = (),
) -> dict:
    """Per arm: the held-out reward at the start and after `steps` (`stats.crossed_interval`: seeds crossed with
    test prompts; a deterministic arm counts once), its change from the start, and the held-out `claims`
    (default: every arm minus the first, paired by seed and prompt), each under its arm as "minus_<other>"; the
    step metrics of `COMPARED` over the last quarter of the steps against the first arm's
    (`metric_difference`). Each kind of comparison is one family: its intervals are shown at the Bonferroni
    level (95% when the family has one member) and its verdicts carry Holm's p. `borrowed` arms are references
    taken from another comparison: their own change is that comparison's verdict, not one of this family's."""
    ref, others = arms[0], arms[1:]
    tables = {arm: (eval_table(records, arm, seeds, 0), eval_table(records, arm, seeds, steps)) for arm in arms}
    done = [a for a in arms if tables[a][1] is not None]
    window = last_quarter(steps)
    out = {
        arm: {
            "reward_start": stats.crossed_interval(tables[arm][0]).mean if tables[arm][0] is not None else None,
            "reward_final": stats.crossed_interval(tables[arm][1]).as_dict(),
        }
        for arm in done
    }
    with_start = [a for a in done if tables[a][0] is not None and a not in borrowed]
    level = stats.bonferroni_level(len(with_start))
    changes = family(
        {a: stats.crossed_interval(tables[a][1] - tables[a][0], level) for a in with_start},
        "change of the held-out reward from step 0",
    )
    claims = [(f"{a} - {ref}", a, ref) for a in others] if claims is None else claims
    claims = [(text, a, b) for text, a, b in claims if a in done and b in done]
    level = stats.bonferroni_level(len(claims))
    differences = family(
        {f"{a} - {b}": stats.crossed_interval(tables[a][1] - tables[b][1], level) for _, a, b in claims},
        "held-out reward difference",
        {f"{a} - {b}": b for _, a, b in claims},
    )
    compared = [a for a in others if a in done and tables[ref][1] is not None]
    metrics = {key: metric_family(records, key, compared, ref, seeds, window) for key in COMPARED}
    for text, a, b in claims:
        out[a][f"minus_{b}"] = {**differences[f"{a} - {b}"], "claim": text}
    for arm in done:
        row = out[arm]
        if arm in changes:
            row["change_from_start"] = changes[arm]
        if f"minus_{ref}" in row:
            row["verdict"] = row[f"minus_{ref}"]["verdict"]
        for key in COMPARED:
            if arm in metrics[key]:
                row[f"{key} minus_{ref}"] = metrics[key][arm]
        selected = last_steps_mean(records, arm, seeds, "selected_fraction", 1, steps)
        if selected is not None:
            row["selected_fraction"] = stats.seed_interval(selected).as_dict()
    return out


def metric_family(
    records: list[dict], key: str, arms: list[str], ref: str, seeds: int, window: tuple[int, int]
) -> dict[str, dict]:
    """One family: each arm's step metric `key` over the steps in `window` against `ref`'s, paired by seed."""
    pairs = {a: [last_steps_mean(records, x, seeds, key, *window) for x in (a, ref)] for a in arms}
    pairs = {a: p for a, p in pairs.items() if p[0] is not None and p[1] is not None}
    level = stats.bonferroni_level(len(pairs))
    what = f"{key} {'log ratio to' if key in HEAVY_TAILED else 'minus'} {ref}, last quarter"
    return family({a: metric_difference(m, t, key, level) for a, (m, t) in pairs.items()}, what)


def metric_curve(results: dict, arm: str, key: str) -> list[dict]:
    """Per step: the mean over seeds of `key` ("eval/reward": the held-out reward) with its 95% interval
    (the held-out reward: `stats.crossed_interval`; a step metric: Student's t over seeds, none for one
    seed); `seeds` counts the distinct seeds behind it."""
    by_step: dict[int, list] = {}
    for r in results["records"]:
        if r["arm"] != arm:
            continue
        if key == "eval/reward" and "eval" in r:
            by_step.setdefault(r["step"], []).append(r["eval"]["per_prompt"])
        elif r.get(key) is not None:
            by_step.setdefault(r["step"], []).append(r[key])
    rows = []
    for step, values in sorted(by_step.items()):
        x = torch.tensor(values, dtype=torch.float64)
        i = stats.crossed_interval(x) if key == "eval/reward" else stats.seed_interval(x)
        rows.append({"arm": arm, "step": step, "mean": i.mean, "low": i.ci_low, "high": i.ci_high, "seeds": i.n_seeds})
    return rows


def per_seed(results: dict, arm: str, key: str) -> torch.Tensor | None:
    """(seeds,) each seed's own value of the summary entry `key` of `arm`: "change_from_start", "minus_<other>"
    (the held-out reward, mean over test prompts) or "<metric> minus_<ref>" (the step metric over the last
    quarter; a log ratio for a heavy-tailed one). None where a seed lacks it."""
    records, seeds, steps = results["records"], results["seeds"], results["steps"]
    if key == "change_from_start" or key.startswith("minus_"):
        other = None if key == "change_from_start" else key.removeprefix("minus_")
        final = eval_table(records, arm, seeds, steps)
        base = eval_table(records, arm, seeds, 0) if other is None else eval_table(records, other, seeds, steps)
        return None if final is None or base is None else (final - base).mean(1)
    metric, _, ref = key.rpartition(" minus_")
    mine, theirs = (last_steps_mean(records, a, seeds, metric, *last_quarter(steps)) for a in (arm, ref))
    if mine is None or theirs is None:
        return None
    if as_log_ratio(metric, mine, theirs):
        return torch.log(mine) - torch.log(theirs)
    return mine - theirs


def paired_difference(
    results: dict, arm: str, other: str, step: int | None = None, level: float = stats.LEVEL
) -> stats.Interval:
    """The held-out reward of `arm` minus `other` at `step` (default: the last), paired by seed and test
    prompt, with its interval (`stats.crossed_interval`)."""
    step = results["steps"] if step is None else step
    a, b = (eval_table(results["records"], name, results["seeds"], step) for name in (arm, other))
    if a is None or b is None:
        raise ValueError(f"no held-out reward of {arm!r} and {other!r} at step {step} for every seed")
    return stats.crossed_interval(a - b, level)


def difference_curve(results: dict, arm: str, other: str) -> list[dict]:
    """`paired_difference` at every evaluation step, as `metric_curve` rows (arm, step, mean, low, high)."""
    rows = []
    for step in sorted({r["step"] for r in results["records"] if "eval" in r and r["arm"] == arm}):
        d = paired_difference(results, arm, other, step)
        rows.append({"arm": arm, "step": step, "mean": d.mean, "low": d.ci_low, "high": d.ci_high})
    return rows


def reanalyze(results: dict) -> dict:
    """`results` with its summary recomputed from its records by this module's statistics."""
    arms = list(results["arms"])
    return {**results, "summary": summarize(results["records"], arms, results["seeds"], results["steps"])}


def strict_json(value):
    """`value` with every non-finite float as None: strict JSON (RFC 8259) has no NaN."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def non_finite_paths(value, at: str = "") -> list[str]:
    """The paths ("a.b[2]") of every non-finite float in `value`, which `strict_json` writes as null."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [at or "."]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in non_finite_paths(v, f"{at}.{k}" if at else str(k))]
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in non_finite_paths(v, f"{at}[{i}]")]
    return []


NUMBER = re.compile(r"[-+]?\d+(\.\d+)?(e[-+]?\d+)?")


def record_differences(mine: list[dict], stored: list[dict], rel: float = 1e-4, abs_: float = 1e-4) -> list[str]:
    """Where two lists of logged records part, one line each ([] when they agree): the same keys and texts, and
    each number within `rel` of the larger or `abs_` (float32 matmuls round differently from one CPU's kernels
    to another's: about 1e-5 relative after two steps, and noise-level values near 0 differ outright). Texts are
    compared with their numbers taken out (a verdict's wording, not its digits)."""
    if len(mine) != len(stored):
        return [f"{len(mine)} records against {len(stored)}"]
    out = []
    for i, (a, b) in enumerate(zip(mine, stored)):
        if set(a) != set(b):
            out.append(f"record {i}: keys {sorted(set(a) ^ set(b))} in one only")
            continue
        for key in a:
            x, y = a[key], b[key]
            if isinstance(x, float) or isinstance(y, float):
                if not (isinstance(x, (int, float)) and isinstance(y, (int, float))) or not (
                    x == y or abs(x - y) <= max(rel * max(abs(x), abs(y)), abs_)
                ):
                    out.append(f"record {i} ({a.get('arm')}, step {a.get('step')}): {key} {x!r} against {y!r}")
            elif isinstance(x, str) and isinstance(y, str):
                if NUMBER.sub("#", x) != NUMBER.sub("#", y):
                    out.append(f"record {i} ({a.get('arm')}, step {a.get('step')}): {key} reads otherwise")
            elif x != y:
                out.append(f"record {i} ({a.get('arm')}, step {a.get('step')}): {key} {x!r} against {y!r}")
    return out


def base_config(results: dict) -> StepConfig:
    """The StepConfig every arm of `results` started from (the header stores its non-default fields)."""
    return StepConfig(**results["base"])


def select_arms(results: dict, arms: list[str]) -> dict:
    """`results` with only `arms` (in that order; the first is the reference of the summary), e.g. to pair
    the fixed arm of one comparison with another comparison's arms through `merge_results`."""
    missing = [a for a in arms if a not in results["arms"]]
    if missing:
        raise ValueError(f"no arm {missing} in these results (arms: {list(results['arms'])})")
    records = [r for r in results["records"] if r["arm"] in arms]
    return {
        **results,
        "arms": {a: results["arms"][a] for a in arms},
        "records": records,
        "summary": summarize(records, arms, results["seeds"], results["steps"]),
    }


def merge_results(first: dict, second: dict) -> dict:
    """Two comparisons run apart (to share a machine) as one, their arms paired: they must have the same
    base config, steps, seeds and evaluation, and their shared arms must have logged the same numbers."""
    same = (
        "base",
        "steps",
        "seeds",
        "eval_every",
        "eval_prompts",
        "eval_set",
        "train_prompts",
        "seed_stride",
        "first_seed",
    )
    if any(first.get(k) != second.get(k) for k in same):
        raise ValueError(f"the two runs differ in {[k for k in same if first.get(k) != second.get(k)]}: not paired")
    strip = lambda rs, arm: [{k: v for k, v in r.items() if k != "seconds"} for r in rs if r["arm"] == arm]
    shared = [a for a in second["arms"] if a in first["arms"]]
    for arm in shared:
        if strip(first["records"], arm) != strip(second["records"], arm):
            raise ValueError(f"arm {arm!r} logged other numbers in the two runs: not the same arm")
    arms = {**first["arms"], **{a: d for a, d in second["arms"].items() if a not in shared}}
    records = first["records"] + [r for r in second["records"] if r["arm"] not in shared]
    return {
        **first,
        "arms": arms,
        "records": records,
        "command": [first.get("command"), second.get("command")],
        "summary": summarize(records, list(arms), first["seeds"], first["steps"]),
    }
