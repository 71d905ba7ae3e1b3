"""The run page: `python -m grpo_debug timeline RUN_DIR --html run.html` draws what `FlightRecorder` wrote in
RUN_DIR (`health.jsonl`, `captures.json`, the `step-<k>/` captures) as one standalone HTML page: each health
signal over the steps with the doctor's thresholds drawn, the captured steps marked, each linked to its capture
and to the doctor's report on it (`RUN_DIR/reports/step-<k>.html`, which `timeline --doctor` writes with
`python -m grpo_debug doctor`'s own page). Inline SVG, no script, nothing fetched: the page opens from disk.

Torch-free: reading a run and drawing it loads no model.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from ..files import MAX_READ_BYTES, read_bounded
from .text import page_text as _h

HEALTH_FILE = "health.jsonl"  # as grpo_debug.capture.flight writes them (not imported: that module loads torch)
INDEX_FILE = "captures.json"
REPORTS = "reports"
ORDER = (  # the signals in the order a reader checks them: the rewards, the rollout, the loss, the update, the run
    "zero_std_groups",
    "constant_reward",
    "length_reward",
    "truncation",
    "sampler_mismatch",
    "entropy_collapse",
    "clip_saturated",
    "kl_blowup",
    "update_size",
    "grad_norm_spike",
    "reward_collapse",
)
COLOURS = {"ok": "#5b7fa6", "warning": "#ef6c00", "problem": "#c62828"}
SEVERITY_NAMES = tuple(COLOURS)  # as grpo_debug.capture.health writes them


@dataclass
class Run:
    folder: Path
    lines: list[dict]
    captures: dict[int, dict] = field(default_factory=dict)  # step -> {"folder", "trigger"}, each on disk
    not_captured: dict[int, str] = field(default_factory=dict)
    unfinished: bool = False  # a line was cut (the run was killed, or its disk full, while writing it): left out
    unopenable: dict[int, dict] = field(default_factory=dict)  # step -> {"folder", "trigger", "problem"}: listed,
    # but the capture cannot be opened (missing, or its checksums do not hold): no command is offered for it
    notes: list[str] = field(default_factory=list)  # what was read past, and why


def read_run(folder: str | Path) -> Run:
    """What FlightRecorder wrote in `folder`; ValueError, one line naming the file, for anything else."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder}: no such folder (FlightRecorder's out_dir holds {HEALTH_FILE})")
    path = folder / HEALTH_FILE
    if not path.is_file():
        raise ValueError(f"{folder} holds no {HEALTH_FILE}: not a FlightRecorder folder, or no step finished")
    lines, unfinished = read_health(path)
    run = Run(folder, lines, unfinished=unfinished)
    index = _read_index(folder, run.notes)
    captured, not_captured = index.get("captured", {}), index.get("not_captured", {})
    if not isinstance(captured, dict) or not isinstance(not_captured, dict):
        raise ValueError(f"{folder / INDEX_FILE}: 'captured' and 'not_captured' are not JSON objects")
    for key, entry in captured.items():
        step, name = step_number(key), entry.get("folder") if isinstance(entry, dict) else None
        if step is None or name != f"step-{step}":  # step-<k> inside the run, nothing else
            raise ValueError(f"{folder / INDEX_FILE}: captured step {key!r} is not step-<k> inside the run: {entry!r}")
        if not _inside(folder / name, folder):
            raise ValueError(f"{folder / INDEX_FILE}: captured step {key!r}: {folder / name} leads outside the run")
        trigger = _trigger(folder, key, entry.get("trigger"))
        problem = capture_problem(folder / name)
        if problem:
            run.unopenable[step] = {"folder": folder / name, "trigger": trigger, "problem": problem}
        else:
            run.captures[step] = {"folder": folder / name, "trigger": trigger}
    for key, reason in not_captured.items():
        step = step_number(key)
        if step is None:
            raise ValueError(f"{folder / INDEX_FILE}: not_captured step {key!r} is not a step number (ASCII digits)")
        run.not_captured[step] = str(reason)
    return run


def step_number(key) -> int | None:
    """A step number written in ASCII digits (int() would also read '²' or '١'), else None."""
    return int(key) if isinstance(key, str) and re.fullmatch(r"[0-9]+", key) else None


def _inside(path: Path, folder: Path) -> bool:
    """`path`, its links followed, lies inside `folder` (a step-<k> that is a link elsewhere does not)."""
    return path.resolve().is_relative_to(folder.resolve()) and path.resolve() != folder.resolve()


HASHED_ON_THE_PAGE = 16 * 2**20  # larger files (weights, the batch) are checked to be there; the doctor hashes them


def capture_problem(capture: Path) -> str | None:
    """Why a listed capture cannot be opened, where a glance tells (the doctor verifies every byte): its folder is
    missing, or its checksums do not hold (a file missing or added, a small file changed)."""
    from ..checksums import checksum_problem  # torch-free

    if not capture.is_dir():
        return f"{capture} is missing (listed in {INDEX_FILE})"
    return checksum_problem(capture, hash_up_to=HASHED_ON_THE_PAGE)


def _trigger(folder: Path, key, trigger) -> list[dict]:
    """A captured step's reasons, each {id, severity, ...} with a known severity; None: none recorded."""
    trigger = trigger or []
    ok = isinstance(trigger, list) and all(
        isinstance(r, dict) and isinstance(r.get("id"), str) and r.get("severity") in SEVERITY_NAMES for r in trigger
    )
    if not ok:
        raise ValueError(f"{folder / INDEX_FILE}: step {key}'s trigger is not a list of {{id, severity}}: {trigger!r}")
    return trigger


def read_health(path: Path) -> tuple[list[dict], bool]:
    """Every line of health.jsonl, checked; a line begun as a record ('{') that does not parse is one the run was
    killed (or its disk filled) while writing: left out, and said (True); any other line that is no record is
    refused, naming it."""
    try:
        text = read_bounded(path, MAX_FILE_BYTES)
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot be read ({e})") from None
    raw = text.split("\n")
    if raw and raw[-1] == "":
        raw.pop()  # the newline that ends the last finished line
    kept = [line for line in raw if not line.strip().startswith("{") or _parses(line)]
    unfinished = len(kept) < len(raw)  # a line begun and not finished (a kill, a full disk): left out, and said
    raw = kept
    if not raw:
        raise ValueError(f"{path} is empty: no step finished" + (" (its only line was cut)" if unfinished else ""))
    records = [_record(path, i, line) for i, line in enumerate(raw, start=1)]
    for i, (a, b) in enumerate(zip(records, records[1:]), start=2):
        if b["step"] <= a["step"]:
            raise ValueError(
                f"{path} line {i} goes from step {a['step']} back to step {b['step']}: two runs wrote this log "
                "(a FlightRecorder writes one run per folder)"
            )
    return records, unfinished


MAX_FILE_BYTES = MAX_READ_BYTES  # a health log or captures index larger than this is not one FlightRecorder wrote


def _parses(line: str) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def _record(path: Path, number: int, line: str) -> dict:
    if not line.strip():
        raise ValueError(f"{path} line {number} is empty: not a health record")
    try:
        record = json.loads(line)
    except ValueError as e:
        raise ValueError(f"{path} line {number} is not JSON ({e})") from None
    ok = (
        isinstance(record, dict)
        and type(record.get("step")) is int  # not a bool
        and isinstance(record.get("findings"), dict)
        and isinstance(record.get("metrics"), dict)
    )
    if not ok:
        raise ValueError(f"{path} line {number} is not a health record (it needs step, metrics and findings)")
    bad = [
        k for k, v in record["findings"].items() if not isinstance(v, dict) or v.get("severity") not in SEVERITY_NAMES
    ]
    if bad:
        raise ValueError(f"{path} line {number}: findings {bad} are not {{severity: ok, warning or problem, ...}}")
    return record


def _read_index(folder: Path, notes: list[str]) -> dict:
    """captures.json, refused in one line where it is damaged or too large; where it is missing (a run killed
    before it was written), the step-<k> folders that hold a capture, each other folder named in `notes`."""
    path = folder / INDEX_FILE
    if not path.exists():
        found = [p for p in sorted(folder.glob("step-*")) if (p / "capture.json").is_file()]
        notes += [
            f"{p.name} is not step-<k> in ASCII digits: left out" for p in found if step_number(p.name[5:]) is None
        ]
        return {"captured": {p.name[5:]: {"folder": p.name} for p in found if step_number(p.name[5:]) is not None}}
    try:
        index = json.loads(read_bounded(path, MAX_FILE_BYTES))
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot be read ({e})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e}): not as FlightRecorder wrote it") from None
    if not isinstance(index, dict):
        raise ValueError(f"{path} is not a JSON object: not as FlightRecorder wrote it")
    return index


def report_path(run: Run, step: int) -> Path:
    return run.folder / REPORTS / f"step-{step}.html"


# ---- drawing


@dataclass(frozen=True)
class Series:
    id: str
    title: str
    points: list[tuple[int, float, str]]  # (step, value, severity), each drawn
    warning_at: float | None = None
    problem_at: float | None = None
    gaps: tuple[int, ...] = ()  # the run's steps with no point drawn, in order: the line breaks there
    not_drawn: tuple[tuple[int, str], ...] = ()  # (step, the value as written) of a value no chart can place


def series_of(run: Run) -> list[Series]:
    """One series per signal the lines hold (ORDER first), then TRL's reward, each reward function's mean and
    grad_norm, without thresholds."""
    ids = [i for i in ORDER if any(i in r["findings"] for r in run.lines)]
    ids += sorted({i for r in run.lines for i in r["findings"]} - set(ids))
    out = []
    for i in ids:
        held = [(r["step"], r["findings"][i]) for r in run.lines if i in r["findings"]]
        values = [(r["step"], r["findings"][i].get("value"), r["findings"][i].get("severity", "ok"))
                  if i in r["findings"] else (r["step"], None, "ok") for r in run.lines]  # fmt: skip
        k, last = held[-1]
        warning_at, problem_at = last.get("warning_at"), last.get("problem_at")
        if warning_at == problem_at:  # one threshold only (one reward function: one constant is all of them)
            warning_at = None
        out.append(_series(i, f"{i}: at step {k}, {last.get('summary', '')}", values, warning_at, problem_at))
    names = ["reward"] + sorted({k for r in run.lines for k in r["metrics"] if k.endswith("/mean")}) + ["grad_norm"]
    for name in names:
        values = [(r["step"], r["metrics"].get(name), "ok") for r in run.lines]
        if any(_drawable(v) for _, v, _ in values):
            out.append(_series(name, f"{name} (TRL's metric)", values))
    return out


def _series(id: str, title: str, values: list[tuple[int, object, str]], *thresholds) -> Series:
    """A series from each step's value as written: a number a chart can place is a point; anything else a gap,
    and a value written that is not one (NaN, infinite, huge, not a number) is named in `not_drawn`."""
    points = [(k, v, severity) for k, v, severity in values if _drawable(v)]
    gaps = tuple(k for k, v, _ in values if not _drawable(v))
    not_drawn = tuple((k, _shown(v)) for k, v, _ in values if v is not None and not _drawable(v))
    return Series(id, title, points, *thresholds, gaps=gaps, not_drawn=not_drawn)


DRAWABLE = sys.float_info.max / 4  # beyond this, a chart's range (a difference of two values) overflows


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _drawable(value) -> bool:
    return _finite(value) and abs(value) <= DRAWABLE


def _shown(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else repr(value)[:40]


W, H, LEFT, RIGHT, TOP, BOTTOM = 760, 170, 56, 12, 14, 24


def chart(s: Series, steps: tuple[int, int], marks: dict[int, str | None], dropped: set[int]) -> str:
    """One series as inline SVG: its points coloured by severity, its thresholds dashed, a purple line at each
    captured step (a link to its report, or its capture, in `marks`), a grey one at each triggered step not kept."""
    lo, hi = steps
    values = [v for _, v, _ in s.points] + [t for t in (s.warning_at, s.problem_at) if _drawable(t)]
    y0, y1 = (min(values), max(values)) if values else (0.0, 1.0)
    if y1 - y0 < 1e-12 * max(1.0, abs(y0)):
        pad = max(0.5, abs(y0) / 2)  # a flat series, drawn mid-height whatever its size
        y0, y1 = y0 - pad, y1 + pad
    x = lambda k: LEFT + (W - LEFT - RIGHT) * ((k - lo) / (hi - lo) if hi > lo else 0.5)
    y = lambda v: TOP + (H - TOP - BOTTOM) * (1 - (v - y0) / (y1 - y0))
    parts = [
        f"<svg class='series' data-id='{_h(s.id)}' width='{W}' height='{H}' viewBox='0 0 {W} {H}' "
        "xmlns='http://www.w3.org/2000/svg' role='img'>",
        f"<rect x='{LEFT}' y='{TOP}' width='{W - LEFT - RIGHT}' height='{H - TOP - BOTTOM}' fill='#fcfcfc' "
        "stroke='#ddd'/>",
        _label(LEFT - 4, y(y1) + 4, f"{y1:.3g}", "end"),
        _label(LEFT - 4, y(y0) + 4, f"{y0:.3g}", "end"),
        _label(LEFT, H - 6, f"step {lo}", "start"),
        _label(W - RIGHT, H - 6, f"step {hi}", "end"),
    ]
    for k in sorted(dropped):
        parts.append(f"<line class='dropped' x1='{x(k):.1f}' x2='{x(k):.1f}' y1='{TOP}' y2='{H - BOTTOM}' "
                     "stroke='#aaa' stroke-dasharray='2,3'/>")  # fmt: skip
    for k, href in sorted(marks.items()):
        line = (f"<line class='captured' x1='{x(k):.1f}' x2='{x(k):.1f}' y1='{TOP}' y2='{H - BOTTOM}' "
                f"stroke='#7b1fa2' stroke-width='2'><title>step {k} captured</title></line>")  # fmt: skip
        parts.append(f"<a href='{_h(href)}'>{line}</a>" if href else line)
    for name, t in (("warning", s.warning_at), ("problem", s.problem_at)):
        if _drawable(t):
            parts.append(f"<line class='threshold {name}' x1='{LEFT}' x2='{W - RIGHT}' y1='{y(t):.1f}' "
                         f"y2='{y(t):.1f}' stroke='{COLOURS[name]}' stroke-dasharray='6,4'/>")  # fmt: skip
            parts.append(_label(W - RIGHT - 2, y(t) - 3, f"{name} {t:.3g}", "end", COLOURS[name]))
    for segment in segments(s.points, s.gaps):
        if len(segment) > 1:
            path = " ".join(f"{x(k):.1f},{y(v):.1f}" for k, v, _ in segment)
            parts.append(f"<polyline points='{path}' fill='none' stroke='#90a4ae' stroke-width='1.2'/>")
    for k, v, severity in s.points:
        parts.append(f"<circle class='{severity}' cx='{x(k):.1f}' cy='{y(v):.1f}' r='3' fill='{COLOURS[severity]}'>"
                     f"<title>step {k}: {v:.4g} ({severity})</title></circle>")  # fmt: skip
    parts.append("</svg>")
    return "".join(parts)


def segments(points: list[tuple], gaps: tuple[int, ...]) -> list[list[tuple]]:
    """The points in runs that no gap step falls between: each run is one line, a gap breaks it."""
    out: list[list[tuple]] = []
    for point in points:
        if out and bisect_right(gaps, out[-1][-1][0]) == bisect_right(gaps, point[0]):
            out[-1].append(point)
        else:
            out.append([point])
    return out


def not_drawn_note(s: Series, shown: int = 8) -> str:
    """The note under a chart whose line has gaps for values written that are no number it can place."""
    if not s.not_drawn:
        return ""
    named = ", ".join(f"step {k} ({v})" for k, v in s.not_drawn[:shown])
    more = f" and {len(s.not_drawn) - shown} more" if len(s.not_drawn) > shown else ""
    return (f"<p class='note'>Not drawn, a gap in the line: {_h(named)}{more}: not a finite number within "
            f"±{DRAWABLE:.2g}.</p>")  # fmt: skip


def _label(x: float, y: float, text: str, anchor: str, colour: str = "#555") -> str:
    return f"<text x='{x:.1f}' y='{y:.1f}' font-size='11' text-anchor='{anchor}' fill='{colour}'>{_h(text)}</text>"


def href(target: Path, page: Path) -> str:
    """`target` as a link from a page written at `page` (relative, so the folder can move together)."""
    try:
        relative = os.path.relpath(target.resolve(), page.resolve().parent)
    except ValueError:  # another drive
        return target.resolve().as_uri()
    return quote(Path(relative).as_posix())


STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 62em; color: #222; overflow-wrap: anywhere; }
h2 { font-size: 15px; margin: 1.2em 0 .2em; } table { border-collapse: collapse; }
td, th { border-bottom: 1px solid #ddd; padding: .3em .6em; text-align: left; vertical-align: top; }
.problem { color: #c62828; } .warning { color: #ef6c00; } code { background: #eee; padding: 0 .2em; }
.note { background: #fff8e1; padding: .4em .8em; }
"""


def page(run: Run, page_path: Path) -> str:
    """The whole run on one standalone page, to be written at `page_path` (its links are relative to it)."""
    steps = [r["step"] for r in run.lines]
    bounds = (min(steps), max(steps))
    links = {k: _report_or_capture(run, k, page_path) for k in run.captures}
    dropped = (set(run.not_captured) | set(run.unopenable)) - set(run.captures)
    title = f"grpo-debug run: {run.folder}"
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{_h(title)}</title>",
        f"<style>{STYLE}</style></head><body><h1>{_h(title)}</h1>",
        f"<p>{len(steps)} optimizer steps ({bounds[0]} to {bounds[1]}), {len(run.captures)} captured "
        f"(purple lines; a grey dashed line: triggered, not kept). Points: "
        + ", ".join(f"<span class='{k}'>{k}</span>" for k in COLOURS)
        + "; dashed: the doctor's thresholds.</p>",
    ]
    if run.unfinished:
        parts.append("<p class='note'>A line of health.jsonl was cut (the run was killed, or its disk full, while "
                     "writing it): it is left out.</p>")  # fmt: skip
    failed = [(r["step"], r["failed"]) for r in run.lines if isinstance(r.get("failed"), str)]
    for k, why in failed:
        parts.append(f"<p class='note failed'>The recorder failed on step {k} (the run went on): {_h(why)}</p>")
    for note in run.notes:
        parts.append(f"<p class='note'>{_h(note)}</p>")
    parts.append(_captures_table(run, page_path))
    for s in series_of(run):
        parts.append(f"<h2>{_h(s.title)}</h2>{chart(s, bounds, links, dropped)}{not_drawn_note(s)}")
    parts.append("</body></html>")
    return "\n".join(parts)


def _report_or_capture(run: Run, step: int, page_path: Path) -> str:
    report = report_path(run, step)
    return href(report if report.is_file() else run.captures[step]["folder"] / "README.md", page_path)


def _reasons(trigger: list[dict]) -> str:
    return "<br>".join(
        f"<span class='{_h(str(r.get('severity')))}'>{_h(str(r.get('id')))}</span>: {_h(str(r.get('summary')))}"
        for r in trigger
    )


def _captures_table(run: Run, page_path: Path) -> str:
    """Each triggered step: why, and its capture and report, or why it was not kept."""
    rows = []
    for k in sorted(set(run.captures) | set(run.not_captured) | set(run.unopenable)):
        if k in run.unopenable:
            c = run.unopenable[k]
            rows.append(f"<tr><td>{k}</td><td>{_reasons(c['trigger'])}</td><td>{_h(c['folder'].name)} cannot be "
                        f"opened: {_h(c['problem'])}</td></tr>")  # fmt: skip
        elif k in run.captures:
            c = run.captures[k]
            why = _reasons(c["trigger"])
            report = report_path(run, k)
            doctor = (
                f"<a class='report' href='{_h(href(report, page_path))}'>the doctor's report</a>"
                if report.is_file()
                else "no report yet: <code>python -m grpo_debug timeline "
                f"{_h(str(run.folder))} --doctor --html ...</code> writes it"
            )
            capture = f"<a class='capture' href='{_h(href(c['folder'] / 'README.md', page_path))}'>"
            rows.append(f"<tr><td>{k}</td><td>{why}</td><td>{capture}{_h(c['folder'].name)}</a>"
                        f"<br>{doctor}</td></tr>")  # fmt: skip
        else:
            rows.append(f"<tr><td>{k}</td><td colspan='2'>not captured: {_h(run.not_captured[k])}</td></tr>")
    if not rows:
        return "<p id='captures'>No step triggered: nothing was captured.</p>"
    return "<table id='captures'><tr><th>step</th><th>why</th><th>capture</th></tr>" + "".join(rows) + "</table>"
