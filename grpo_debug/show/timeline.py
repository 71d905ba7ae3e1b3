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
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

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
    unfinished: bool = False  # the last line was cut (the run was killed while writing it): left out


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
    index = _read_index(folder)
    captured, not_captured = index.get("captured", {}), index.get("not_captured", {})
    if not isinstance(captured, dict) or not isinstance(not_captured, dict):
        raise ValueError(f"{folder / INDEX_FILE}: 'captured' and 'not_captured' are not JSON objects")
    for key, entry in captured.items():
        name = entry.get("folder") if isinstance(entry, dict) else None
        if not (str(key).isdigit() and name == f"step-{int(key)}"):  # step-<k> inside the run, nothing else
            raise ValueError(f"{folder / INDEX_FILE}: captured step {key!r} is not step-<k> inside the run: {entry!r}")
        if (folder / name).is_dir():
            run.captures[int(key)] = {"folder": folder / name, "trigger": _trigger(folder, key, entry.get("trigger"))}
    run.not_captured = {int(k): str(v) for k, v in not_captured.items() if str(k).isdigit()}
    return run


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
    """Every line of health.jsonl, checked; a last line without its newline that does not parse is a line the
    run was killed while writing: left out, and said (True)."""
    _bounded(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot be read ({e})") from None
    raw = text.split("\n")
    unfinished = False
    if raw and raw[-1] == "":
        raw.pop()  # the newline that ends the last finished line
    elif raw and not _parses(raw[-1]):
        raw.pop()
        unfinished = True
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


MAX_FILE_BYTES = 256 * 2**20  # a health log or captures index larger than this is not one FlightRecorder wrote


def _bounded(path: Path) -> None:
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise ValueError(f"{path} is {size / 2**20:.0f} MB: over the {MAX_FILE_BYTES // 2**20} MB this reads")


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
        and isinstance(record.get("step"), int)
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


def _read_index(folder: Path) -> dict:
    """captures.json; where it is missing or damaged, the step-<k> folders that hold a capture."""
    try:
        _bounded(folder / INDEX_FILE)
        index = json.loads((folder / INDEX_FILE).read_text())
        if isinstance(index, dict):
            return index
    except (OSError, ValueError):
        pass
    found = [p for p in folder.glob("step-*") if (p / "capture.json").is_file() and p.name[5:].isdigit()]
    return {"captured": {p.name[5:]: {"folder": p.name} for p in found}}


def report_path(run: Run, step: int) -> Path:
    return run.folder / REPORTS / f"step-{step}.html"


# ---- drawing


@dataclass(frozen=True)
class Series:
    id: str
    title: str
    points: list[tuple[int, float, str]]  # (step, value, severity)
    warning_at: float | None = None
    problem_at: float | None = None


def series_of(run: Run) -> list[Series]:
    """One series per signal the lines hold (ORDER first), then TRL's reward, each reward function's mean and
    grad_norm, without thresholds."""
    ids = [i for i in ORDER if any(i in r["findings"] for r in run.lines)]
    ids += sorted({i for r in run.lines for i in r["findings"]} - set(ids))
    out = []
    for i in ids:
        held = [(r["step"], r["findings"][i]) for r in run.lines if i in r["findings"]]
        points = [(k, f.get("value"), f.get("severity", "ok")) for k, f in held if _finite(f.get("value"))]
        k, last = held[-1]
        warning_at, problem_at = last.get("warning_at"), last.get("problem_at")
        if warning_at == problem_at:  # one threshold only (one reward function: one constant is all of them)
            warning_at = None
        out.append(Series(i, f"{i}: at step {k}, {last.get('summary', '')}", points, warning_at, problem_at))
    names = ["reward"] + sorted({k for r in run.lines for k in r["metrics"] if k.endswith("/mean")}) + ["grad_norm"]
    for name in names:
        points = [(r["step"], r["metrics"][name], "ok") for r in run.lines if _finite(r["metrics"].get(name))]
        if points:
            out.append(Series(name, f"{name} (TRL's metric)", points))
    return out


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


W, H, LEFT, RIGHT, TOP, BOTTOM = 760, 170, 56, 12, 14, 24


def chart(s: Series, steps: tuple[int, int], marks: dict[int, str | None], dropped: set[int]) -> str:
    """One series as inline SVG: its points coloured by severity, its thresholds dashed, a purple line at each
    captured step (a link to its report, or its capture, in `marks`), a grey one at each triggered step not kept."""
    lo, hi = steps
    values = [v for _, v, _ in s.points] + [t for t in (s.warning_at, s.problem_at) if _finite(t)]
    y0, y1 = (min(values), max(values)) if values else (0.0, 1.0)
    if y1 - y0 < 1e-12:
        y0, y1 = y0 - 0.5, y1 + 0.5
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
        if _finite(t):
            parts.append(f"<line class='threshold {name}' x1='{LEFT}' x2='{W - RIGHT}' y1='{y(t):.1f}' "
                         f"y2='{y(t):.1f}' stroke='{COLOURS[name]}' stroke-dasharray='6,4'/>")  # fmt: skip
            parts.append(_label(W - RIGHT - 2, y(t) - 3, f"{name} {t:.3g}", "end", COLOURS[name]))
    if len(s.points) > 1:
        path = " ".join(f"{x(k):.1f},{y(v):.1f}" for k, v, _ in s.points)
        parts.append(f"<polyline points='{path}' fill='none' stroke='#90a4ae' stroke-width='1.2'/>")
    for k, v, severity in s.points:
        parts.append(f"<circle class='{severity}' cx='{x(k):.1f}' cy='{y(v):.1f}' r='3' fill='{COLOURS[severity]}'>"
                     f"<title>step {k}: {v:.4g} ({severity})</title></circle>")  # fmt: skip
    parts.append("</svg>")
    return "".join(parts)


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
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 62em; color: #222; }
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
    dropped = set(run.not_captured) - set(run.captures)
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
        parts.append("<p class='note'>The last line of health.jsonl was cut (the run was killed while writing it): "
                     "it is left out.</p>")  # fmt: skip
    parts.append(_captures_table(run, page_path))
    for s in series_of(run):
        parts.append(f"<h2>{_h(s.title)}</h2>{chart(s, bounds, links, dropped)}")
    parts.append("</body></html>")
    return "\n".join(parts)


def _report_or_capture(run: Run, step: int, page_path: Path) -> str:
    report = report_path(run, step)
    return href(report if report.is_file() else run.captures[step]["folder"] / "README.md", page_path)


def _captures_table(run: Run, page_path: Path) -> str:
    """Each triggered step: why, and its capture and report, or why it was not kept."""
    rows = []
    for k in sorted(set(run.captures) | set(run.not_captured)):
        if k in run.captures:
            c = run.captures[k]
            why = "<br>".join(
                f"<span class='{_h(str(r.get('severity')))}'>{_h(str(r.get('id')))}</span>: {_h(str(r.get('summary')))}"
                for r in c["trigger"]
            )
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
