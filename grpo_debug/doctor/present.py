"""The doctor's report as text (the command line) and a table (a notebook cell); its standalone HTML page, with
its figures, is `grpo_debug.ui.doctor_page`."""

from __future__ import annotations

from ..detectors.findings import LOUD, Finding
from ..pitfalls import PITFALLS
from .report import Report, fix_of, flip_measurable


def norms(effect: dict) -> str:
    """The two updates' norms, where the effect has them (a report written before they were recorded has not)."""
    if "update_norm" not in effect:
        return ""
    before, after = effect["update_norm"]
    ratio = f" (x{after / before:.3g})" if before > 0 else ""
    return f", update norm {before:.3g} -> {after:.3g}{ratio}"


def flip_verdict(e: dict) -> str:
    """What a flip did to the update, in words: moves it, cosmetic, shrinks the gradient, removes the update, or
    cannot show on this step (no gradient either way)."""
    if not flip_measurable(e):
        said = "not measurable on this step: no gradient with the flip or without it"
        r = e.get("resampled")
        if r is None:
            return said + ("" if "resampled" not in e else "; nor on fresh draws of its prompts")
        moves = "does not move" if r["cosmetic"] else "moves"
        return (
            f"{said}; on its prompts sampled anew (seed {r['seed']}, grad_norm {r['grad_norm'][0]:.3g} -> "
            f"{r['grad_norm'][1]:.3g}) the update {moves} (cosine {r['update_cosine']:+.3f})"
        )
    verdict = "cosmetic: the update does not move" if e["cosmetic"] else "moves the update"
    g0, g1 = e["grad_norm"]
    if not e.get("removes_gradient") and g0 > 0 and g1 < 0.01 * g0:
        moves = "does not move" if e["cosmetic"] else "moves"
        verdict = f"shrinks the gradient to {g1 / g0:.2%} of its norm; under the trainer's optimizer the update {moves}"
    if e.get("removes_gradient"):
        verdict = "removes the update (the gradient is gone): no fix on this step"
    return verdict


def flip_name(e: dict) -> str:
    """`field=value`: the switch a flip set."""
    (field, value), = e["toggle"].items()  # fmt: skip
    return f"{field}={value}"


def effect_line(f: Finding) -> str:
    e = f.effect
    if not e:
        return ""
    if "error" in e:
        return f"flip {flip_name(e)}: not possible here ({e['error']})"
    moved = "" if e["dlogp_moved"] is None else f", d loss/d logp moved {e['dlogp_moved']:.0%}"
    verdict = flip_verdict(e)
    line = (
        f"flip {flip_name(e)}: grad_norm {e['grad_norm'][0]:.3g} -> {e['grad_norm'][1]:.3g}, "
        f"update cosine {e['update_cosine']:+.3f}{norms(e)}{moved}: {verdict}"
    )
    held = e.get("held_out_reward")
    if held:
        line += (
            f"; {held['verdict']} ({held['prompts']} prompts x {held['samples_per_prompt']}, "
            f"{held['difference']['level']:.2%} level; {held['completions_changed']} completions changed)"
        )
    return line


def chain_line(f: Finding) -> str:
    """What the differential said of a finding: the symptoms its fix cleared, or the causes it is a symptom of."""
    if f.symptom_of:
        return f"a symptom of {' + '.join(f.symptom_of)}: fixing {'it' if len(f.symptom_of) == 1 else 'them'} clears it"
    if f.clears:
        fixed = ", ".join(f"{k}={v}" for k, v in f.fixed_with)
        return f"fixing it ({fixed} on this step) also clears: {', '.join(f.clears)}"
    return ""


def learning_line(f: Finding) -> str:
    """What the finding's fix did over the horizon, against the run continued alike (same seeds)."""
    e = f.learning
    if not e:
        return ""
    return (
        f"followed {e['steps']} steps x {len(e['seeds'])} seeds: {e['verdict']}; KL to the start "
        f"{e['kl_to_start'][0]:.3g} -> {e['kl_to_start'][1]:.3g} nats per token; mean update norm "
        f"{e['update_norm'][0]:.3g} -> {e['update_norm'][1]:.3g}"
    )


def horizon_line(report: Report) -> str:
    h = report.horizon
    if not h:
        return "one-step effects only (--horizon K follows each fix for K steps, with --task)"
    if not h["steps"]:
        return f"not followed over steps: {h['why']}"
    cut, unfollowed = h.get("cut") or {}, h.get("not_followed") or {}
    who = (
        "the likeliest causes' fixes"
        if cut.get("causes")
        else "each other cause's fix"
        if unfollowed
        else "each cause's fix"
    )
    said = f"{who} followed {h['steps']} steps x {h['seeds']} seeds ({h['level']:.2%} intervals)"
    if cut.get("causes"):
        said += f"; cut for the budget, not followed: {', '.join(cut['causes'])}"
    if cut.get("steps_asked", h["steps"]) > h["steps"] or cut.get("seeds_asked", h["seeds"]) > h["seeds"]:
        said += f" (asked: {cut['steps_asked']} steps x {cut['seeds_asked']} seeds)"
    return said + "".join(f"; {k}'s fix not followed: {why}" for k, why in unfollowed.items())


def budget_line(report: Report) -> str:
    """The diagnosis's budget, where the seconds went, and what it cut ("" for a report without one)."""
    b = report.budget
    if not b or b.get("seconds") is None:
        return ""
    went = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in b["phases"].items())
    cut = (
        f"; cut to fit it: {', '.join(b['cut'])} (a finding not flipped keeps its detector's severity)"
        if b["cut"]
        else "; nothing cut"
    )
    return f"budget {b['seconds']:g} s (--budget): {went}{cut}"


def signal_path_of(report: Report) -> list[dict]:
    """The step's signal path as the `signal_lost` finding measured it (`detectors.signal_path`): one dict per stage;
    [] in a report without it (one written before it was measured, or `--no-model`)."""
    found = next((f for f in report.findings if f.id == "signal_lost"), None)
    return list(found.evidence.get("path", ())) if found else []


def probe_line(report: Report) -> str:
    """Whether the pipeline carries a reward the model can learn (`probe`), with the probe's curve where it was
    trained over steps."""
    p = report.probe
    if p is None:
        return "probe: not run (the command runs it unless --no-probe; --probe K adds its curve over K steps)"
    if "why" in p:  # no probe chosen, run or left time
        return f"probe: {p['why']}"
    if "mass_by_step" in p:
        curve = " -> ".join(f"{m:.4f}" for m in p["mass_by_step"])
        return f"probe: {p['said']} (its mass trained {p['steps']} steps, mean of {len(p['seeds'])} seeds: {curve})"
    return f"probe: {p['said']}" + (f" ({p['curve']})" if "curve" in p else "")


def signal_lines(report: Report) -> list[str]:
    """The signal's path, stage by stage: the share each lets through and what it measured."""
    path = signal_path_of(report)
    if not path:
        return []
    lines = ["the learning signal, stage by stage (the share each stage lets through of what came in):"]
    for s in path:
        kept = "  n/a" if s["kept"] is None else f"{s['kept']:5.0%}"
        mark = "  <- lost here" if s["lost"] else ""
        lines.append(f"  {s['stage']:<10} {kept}  {s['said']}{mark}")
    return lines


def text(report: Report, at_least: str = "info") -> str:
    shown = report.present(at_least)
    causes = sum(not f.symptom_of for f in shown)
    lines = signal_lines(report) + [
        f"the doctor: {len(shown)} findings at {at_least} or above ({causes} causes, {len(shown) - causes} "
        "symptoms), causes first, each symptom after its cause"
    ]
    for rank, f in enumerate(shown, start=1):
        p = PITFALLS[f.id]
        lines.append(f"{rank:2d}. [{f.severity}] {f.id}: {f.summary}")
        for line in (chain_line(f), effect_line(f), learning_line(f)):
            if line:
                lines.append(f"    {line}")
        if fix_of(f, report.uses_vllm):
            lines.append(f"    fix: {fix_of(f, report.uses_vllm)}")
        if not f.symptom_of:
            lines.append(f"    learn: notebooks/{p.teach}")
    absent = [f.id for f in report.findings if f.severity == "absent"]
    lines.append(f"absent ({len(absent)}): {', '.join(absent)}")
    if report.not_run:
        lines.append(f"not run without the model ({len(report.not_run)}): {', '.join(report.not_run)}")
    lines.append(horizon_line(report))
    lines.append(probe_line(report))
    if budget_line(report):
        lines.append(budget_line(report))
    lines.append(f"({report.seconds:.1f} s)")
    return "\n".join(lines)


def table(report: Report, at_least: str = "absent"):
    """One row per finding, ranked: what a notebook cell shows. A column no shown finding fills (`over steps`
    where the fixes were not followed over steps) is left out."""
    import pandas as pd

    rows = [
        {
            "severity": f.severity,
            "finding": f.id,
            "what": f.summary,
            "cause or symptom": chain_line(f) or ("cause" if f.severity in ("problem", "warning") else ""),
            "flip on this step": effect_line(f),
            "over steps": learning_line(f),
            "fix": fix_of(f, report.uses_vllm),
            "learn": PITFALLS[f.id].teach,
        }
        for f in report.present(at_least)
    ]
    shown = pd.DataFrame(rows, index=pd.RangeIndex(1, len(rows) + 1, name="rank"))
    return shown[[c for c in shown.columns if c in ("severity", "finding") or shown[c].astype(bool).any()]]


def short_table(report: Report, at_least: str = "info"):
    """One short row per finding, ranked (severity, finding, cause or the causes it is a symptom of): a table that
    fits a notebook cell whole; `details` prints the rest below it."""
    import pandas as pd

    rows = [
        {
            "severity": f.severity,
            "finding": f.id,
            "role": f"symptom of {' + '.join(f.symptom_of)}"
            if f.symptom_of
            else ("cause" if f.severity in LOUD else ""),
        }
        for f in report.present(at_least)
    ]
    return pd.DataFrame(rows, index=pd.RangeIndex(1, len(rows) + 1, name="rank"))


def details(report: Report, at_least: str = "info", width: int = 116) -> str:
    """Each shown finding's summary, flip and fix, wrapped to `width`: what `short_table` leaves out."""
    import textwrap

    lines = []
    for k, f in enumerate(report.present(at_least), start=1):
        said = [f.summary, effect_line(f), learning_line(f)]
        fix = fix_of(f, report.uses_vllm)
        said += [f"fix: {fix}"] if fix else []
        lines.append(f"{k}. {f.id}")
        lines += [textwrap.fill(t, width, initial_indent="   ", subsequent_indent="   ") for t in said if t]
    return "\n".join(lines)
