"""The doctor's report as one standalone HTML page, read top to bottom: the verdict in one sentence, the causal chain
as a small picture, one card per cause (its evidence as a figure, its flip as a before/after table, its horizon as
a plot), the findings worth knowing one line each, and the checks that found nothing collapsed. Every figure is
inline SVG (`report_figures`, the same functions `doctor --png` and notebook 10_doctor draw with); no script, no
outside resource; every text of the run escaped (`show.text.page_text`).

    html = page(report, "grpo-debug doctor: captures/step-2")
    write_pngs(report, "figures/")
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import matplotlib.pyplot as plt

from ..detectors.findings import Finding
from ..doctor.present import budget_line, flip_name, flip_verdict, horizon_line, probe_line
from ..doctor.report import Report, config_fix, fix_of
from ..pitfalls import PITFALLS
from ..show.text import page_text as _h
from .report_figures import carded, evidence_figure, fix_words, horizon_arms

COLOURS = {"problem": "#c62828", "warning": "#ef6c00", "info": "#1565c0", "absent": "#9e9e9e"}

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.2em auto; max-width: 62em; padding: 0 1em; color: #222; overflow-wrap: anywhere; }
h1 { font-size: 20px; margin: 0 0 .2em; overflow-wrap: anywhere; } h2 { font-size: 16px; margin: .2em 0; }
.verdict { font-size: 16px; background: #fff8e1; border-left: 6px solid #ef6c00; padding: .5em .8em; }
.verdict.quiet { background: #e8f5e9; border-color: #2e7d32; }
.meta { color: #666; font-size: 12px; }
.card { border-left: 6px solid #999; padding: .4em .8em; margin: .8em 0; background: #fafafa; }
.problem { border-color: #c62828; } .warning { border-color: #ef6c00; } .info { border-color: #1565c0; }
.sev { font-weight: bold; text-transform: uppercase; font-size: 12px; }
svg.figure, svg.chain { width: 100%; height: auto; display: block; }
table.flip { border-collapse: collapse; font-size: 13px; margin: .3em 0; }
table.flip td, table.flip th { border-bottom: 1px solid #ddd; padding: 2px 10px; text-align: right; }
table.flip th:first-child { text-align: left; } table.flip caption { text-align: left; font-size: 13px; }
code { background: #eee; padding: 0 .2em; overflow-wrap: anywhere; }
p, li, summary, caption { overflow-wrap: anywhere; }
table.signal { border-collapse: collapse; font-size: 13px; margin: .3em 0 .8em; }
table.signal td, table.signal th { border-bottom: 1px solid #ddd; padding: 2px 10px; text-align: left; }
table.signal tr.lost { background: #fff3e0; font-weight: bold; }
table.signal td:first-child, table.signal th { white-space: nowrap; }
ul.worth { padding-left: 1.2em; margin: .3em 0; } details { margin: .3em 0; }
"""


def svg_of(fig, salt: str) -> str:
    """A figure as inline SVG: its text as text (searchable, labelled), ids salted so that several figures on one
    page never share one, no XML prolog, no metadata, scaled to the column."""
    buffer = io.StringIO()
    with plt.rc_context({"svg.fonttype": "none", "svg.hashsalt": salt}):
        fig.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buffer.getvalue()
    text = re.sub(r"<metadata>.*?</metadata>", "", text[text.index("<svg") :], flags=re.S)
    return re.sub(r'<svg([^>]*?) width="[^"]*" height="[^"]*"', r'<svg\1 class="figure" role="img"', text, count=1)


def did(f: Finding) -> str:
    """What a cause's fix did: over the horizon where it was followed, else its flip on this step."""
    if f.learning:
        e = f.learning
        return f"followed {e['steps']} steps x {len(e['seeds'])} seeds, {e['verdict']}"
    e = f.effect
    if not e:
        return "not flipped on this step (no switch of the step removes it)"
    if "error" in e:
        return f"its flip {flip_name(e)} is not possible here ({e['error']})"
    held = e.get("held_out_reward")
    said = f"flipped on this step ({flip_name(e)}) it {flip_verdict(e)} (update cosine {e['update_cosine']:+.2f})"
    return said + (f"; {held['verdict']}" if held else "")


def verdict(report: Report) -> str:
    """The report in one sentence: the first cause, its fix (in the run's GRPOConfig where the doctor applied one
    there, `config_fix`) and what the fix did; or that no cause was found."""
    causes = report.causes("warning")
    if not causes:
        worth = sum(not f.symptom_of for f in report.present("info"))
        absent = sum(f.severity == "absent" for f in report.findings)
        return (
            f"No cause at warning or above on this step: {worth} findings worth knowing, {absent} checks found nothing."
        )
    f = causes[0]
    more = f" ({len(causes) - 1} more cause{'s' if len(causes) > 2 else ''} below)" if len(causes) > 1 else ""
    fix = config_fix(f, report.uses_vllm) or fix_of(f, report.uses_vllm) or "no fix of its own"
    return f"First cause: {f.id} ({f.severity}), {PITFALLS[f.id].title}. Fix: {fix}. What the fix did: {did(f)}.{more}"


def chain_svg(report: Report) -> str:
    """The causal chain as a small picture: each cause (left) with an arrow to each symptom its fix clears (right);
    without a loud cause, the findings worth knowing, unlinked."""
    causes = report.causes("warning") or [f for f in report.present("info") if not f.symptom_of]
    symptoms = [f for f in report.present("info") if f.symptom_of]
    rows = max(len(causes), len(symptoms), 1)
    width, height, box_w, box_h, top = 720, 34 * rows + 30, 250, 24, 26
    y = lambda k: top + 34 * k
    parts = [
        f"<svg class='chain' viewBox='0 0 {width} {height}' xmlns='http://www.w3.org/2000/svg' role='img'>",
        f"<text x='0' y='14' font-size='12' fill='#555'>{'causes' if report.causes('warning') else 'no cause: worth knowing'}"
        "</text><text x='470' y='14' font-size='12' fill='#555'>the symptoms each fix clears</text>",
    ]
    at = {}
    for column, x, found in ((0, 0, causes), (1, 470, symptoms)):
        for k, f in enumerate(found):
            at[(column, f.id)] = y(k)
            parts.append(
                f"<rect x='{x}' y='{y(k)}' width='{box_w}' height='{box_h}' rx='4' fill='#fff' "
                f"stroke='{COLOURS[f.severity]}' stroke-width='2'/><text x='{x + 8}' y='{y(k) + 16}' font-size='12'>"
                f"{_h(f.id)} ({f.severity})</text>"
            )
    if not symptoms:
        parts.append(f"<text x='470' y='{top + 16}' font-size='12' fill='#777'>none: no fix cleared another</text>")
    for s in symptoms:
        for c in s.symptom_of:
            if (0, c) in at:
                y0, y1 = at[(0, c)] + box_h / 2, at[(1, s.id)] + box_h / 2
                parts.append(f"<line x1='{box_w}' y1='{y0}' x2='466' y2='{y1}' stroke='#555' stroke-width='1.2'/>"
                             f"<polygon points='466,{y1} 458,{y1 - 4} 458,{y1 + 4}' fill='#555'/>")  # fmt: skip
    return "\n".join(parts) + "</svg>"


def _g(value) -> str:
    return "-" if value is None else f"{value:.3g}"


def _ratio(pair) -> str:
    before, after = pair
    return f"x{after / before:.3g}" if before and after is not None else ""


def flip_table(e: dict) -> str:
    """A flip as a before/after table: grad_norm, update norm, update cosine, moved KL, held-out reward."""
    if "error" in e:
        return f"<p>flip <code>{_h(flip_name(e))}</code>: not possible here ({_h(e['error'])})</p>"
    rows = [("grad_norm", e["grad_norm"])]
    rows += [("update norm", e["update_norm"])] if "update_norm" in e else []
    rows += [("moved KL (nats/token)", e["moved_kl"])] if e.get("moved_kl") and e["moved_kl"][1] is not None else []
    cells = [
        f"<tr><th>{name}</th><td>{_g(a)}</td><td>{_g(b)}</td><td>{_ratio((a, b))}</td></tr>" for name, (a, b) in rows
    ]
    cells.append(f"<tr><th>update cosine</th><td>1</td><td>{e['update_cosine']:+.3f}</td><td></td></tr>")
    held = e.get("held_out_reward")
    if held:
        d = held["difference"]
        bounds = f"[{d['ci_low']:+.4f}, {d['ci_high']:+.4f}]" if d["ci_low"] is not None else "(no interval)"
        interval = f"{d['mean']:+.4f} {bounds} at {d['level']:.2%}"
        cells.append(f"<tr><th>held-out reward ({held['prompts']} prompts x {held['samples_per_prompt']})</th>"
                     f"<td>{_g(held['as_run'])}</td><td>{_g(held['flipped'])}</td><td>{_h(interval)}</td></tr>")  # fmt: skip
    return (
        f"<table class='flip'><caption>flip <code>{_h(flip_name(e))}</code> on this step: {_h(flip_verdict(e))}"
        "</caption><tr><th></th><th>as run</th><th>with the flip</th><th>change</th></tr>" + "".join(cells) + "</table>"
    )


def card(k: int, f: Finding, report: Report) -> str:
    p = PITFALLS[f.id]
    parts = [
        f"<div class='card {f.severity}' id='{_h(f.id)}'><span class='sev'>{k}. {f.severity}</span> <b>{_h(f.id)}</b>: "
        f"{_h(p.title)}<br>{_h(f.summary)}"
    ]
    fix, in_config = fix_of(f, report.uses_vllm), config_fix(f, report.uses_vllm)
    if in_config:
        parts.append(f"<br>fix in your config: <code>{_h(in_config)}</code>")
    if fix:
        parts.append(f"<br>{'in general' if in_config else 'fix'}: <code>{_h(fix)}</code>")
    if f.clears:
        parts.append(f"<br>fixing it ({_h(fix_words(f))} on this step) also clears: {_h(', '.join(f.clears))}")
    if report.exhibits is not None:
        parts.append(f"<figure>{svg_of(evidence_figure(f, report.exhibits), f'{k}-evidence')}</figure>")
    if f.effect:
        parts.append(flip_table(f.effect))
    if f.learning:
        level = (report.horizon or {}).get("level", 0.95)
        figure = svg_of(horizon_arms(f.learning, fix_words(f), level), f"{k}-horizon")
        parts.append(f"<figure>{figure}<figcaption>{_h(did(f))}</figcaption></figure>")
    parts.append(f"<small>learn: {_h(p.teach)}; from: {_h(p.origin)}</small></div>")
    return "\n".join(parts)


def worth_knowing(report: Report, shown: list[Finding]) -> str:
    """The findings without a card (symptoms, info), one line each, a flip's table folded below its line."""
    rest = [f for f in report.present("info") if f not in shown]
    if not rest:
        return ""
    lines = []
    for f in rest:
        role = f"a symptom of {' + '.join(f.symptom_of)}: " if f.symptom_of else ""
        flip = f"<details><summary>its flip</summary>{flip_table(f.effect)}</details>" if f.effect else ""
        lines.append(f"<li><span class='sev'>{f.severity}</span> <b>{_h(f.id)}</b>: {_h(role + f.summary)}{flip}</li>")
    return f"<h2>Also found ({len(rest)})</h2><ul class='worth'>{''.join(lines)}</ul>"


def collapsed(report: Report) -> str:
    """The checks that found nothing, and those not run, one folded line per group."""
    groups = [
        ("checks found nothing", [f for f in report.findings if f.severity == "absent"]),
        ("checks not run without the model", list(report.not_run)),
    ]
    out = []
    for what, found in groups:
        if not found:
            continue
        items = "".join(
            f"<li><b>{_h(f.id)}</b>: {_h(PITFALLS[f.id].title)}</li>" if isinstance(f, Finding) else f"<li>{_h(f)}</li>"
            for f in found
        )
        out.append(f"<details><summary>{len(found)} {what}</summary><ul>{items}</ul></details>")
    return "".join(out)


def signal_table(report: Report) -> str:
    """The learning signal's path, one row per stage: the share it lets through, what it measured, the stage where
    it was lost marked; "" in a report without it."""
    from ..doctor.present import signal_path_of

    path = signal_path_of(report)
    if not path:
        return ""
    share = lambda kept: "n/a" if kept is None else f"{kept:.0%}"  # noqa: E731
    rows = "".join(
        f"<tr{' class=lost' if s['lost'] else ''}><td>{_h(s['stage'])}</td><td>{share(s['kept'])}</td>"
        f"<td>{_h(s['said'])}</td></tr>"
        for s in path
    )
    return ("<h2>The learning signal, stage by stage</h2><table class='signal'><tr><th>stage</th><th>lets through"
            f"</th><th>measured</th></tr>{rows}</table>")  # fmt: skip


def page(report: Report, title: str = "grpo-debug doctor") -> str:
    """The standalone page (no script, no outside resource, every figure inline)."""
    shown = carded(report)
    quiet = "" if report.causes("warning") else " quiet"
    heading = "Causes, each with its evidence and its fix" if not quiet else "Worth knowing"
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{_h(title)}</title>",
        f"<style>{STYLE}</style></head><body><h1>{_h(title)}</h1>",
        f"<p class='verdict{quiet}' id='verdict'>{_h(verdict(report))}</p>",
        f"<p class='meta'>{len(report.findings)} checks in {report.seconds:.1f} s; {_h(horizon_line(report))}</p>",
        f"<p class='meta'>{_h(probe_line(report))}</p>",
        f"<p class='meta'>{_h(budget_line(report))}</p>" if budget_line(report) else "",
        signal_table(report),
        f"<h2>The causal chain</h2>{chain_svg(report)}",
        f"<h2>{heading}</h2>",
        *(card(k, f, report) for k, f in enumerate(shown, start=1)),
        worth_knowing(report, shown),
        collapsed(report),
        "</body></html>",
    ]
    return "\n".join(parts)


def write_pngs(report: Report, folder: str | Path) -> list[Path]:
    """`doctor --png DIR`: every figure of the page as a PNG file, named `<rank>-<finding>-evidence|horizon.png`."""
    from ..files import write_atomically
    from .report_figures import figures_of

    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(e.errno, f"could not make the folder {folder}: {e.strerror or e}") from None
    written = []
    for name, fig in figures_of(report).items():
        path = folder / f"{name}.png"  # whole or not at all: a full disk leaves no half-written figure
        write_atomically(
            path, lambda f, fig=fig: fig.savefig(f, format="png", dpi=120, bbox_inches="tight"), binary=True
        )
        written.append(path)
    return written
