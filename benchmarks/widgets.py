"""Dashboard latency on the bundled model:
`python benchmarks/widgets.py [--threads N] [--repeats R] [--set KEY=VALUE ...] [--fields FIELD ...]`.

Prints JSON, then the same as a table: for each field of the dashboard (default: every control of
`StepPanel`), the seconds one change takes through `apply_change` up to the end of the field's own phase
or the loss, whichever is later (median and max over flips to another value and back), the phases it
re-ran (with their seconds) and its target (issue: loss-side toggles (loss, KL, advantage, clip range)
within 0.5 s; toggles that re-score (log-prob fields, and num_iterations, whose every pass re-scores the
rollout) within 2 s); then the same change through `StepPanel.on_change`, redraw included, in two panels:
one that stops at the loss (the pitfall fields alone build such a panel) and the default one, which runs
the update because num_iterations is one of its controls (a loss-side change then re-runs the update as
well, and with it the update's forward and backward passes). Outside a kernel the panel's Output captures
nothing and a displayed figure is never encoded, so the PNG and HTML encoding that Jupyter adds to a
redraw is timed on its own and added to give the kernel estimate. `met` compares that with the target.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import time

import matplotlib
import torch
from IPython.core.pylabtools import print_figure

from grpo_debug.config import PHASES, StepConfig, parse_overrides
from grpo_debug.notebook import setup
from grpo_debug.step import GRPOStep, StepRun
from grpo_debug.ui.tables import per_sample
from grpo_debug.ui.widgets import (CHOICES, DEFAULT_FIELDS, FIGURES, OPTIONAL, SLIDERS, StepPanel, apply_change,
                                   options, panel_until)

# by the first phase a field re-runs: re-scoring toggles 2 s, loss-side toggles 0.5 s
TARGET_SECONDS = {"logprobs": 2.0, "advantages": 0.5, "loss": 0.5, "update": 2.0}
FLIP_TO = {"num_iterations": 2, "epsilon_low": 0.1, "epsilon_high": 0.28, "top_entropy_quantile": 0.2}  # from defaults


def target_seconds(field: str) -> float:
    return TARGET_SECONDS[StepConfig.phase_of(field)]


def phase_end(field: str) -> str:
    """The last phase `apply_change` runs for `field`: its own phase, but never before the loss."""
    return max(StepConfig.phase_of(field), "loss", key=PHASES.index)


def other_value(field: str, value):
    if field in FLIP_TO and value != FLIP_TO[field]:
        return FLIP_TO[field]
    if field in CHOICES or field in OPTIONAL:
        values = options(field)
        return values[(values.index(value) + 1) % len(values)]
    if field in SLIDERS:
        lo, hi, _ = SLIDERS[field]
        return hi if value != hi else lo
    return not value


def flips(step: GRPOStep, field: str, change, repeats: int) -> list[float]:
    """Seconds of each change to another value and back, `repeats` times."""
    original = getattr(step.cfg, field)
    seconds = []
    for _ in range(repeats):
        for value in (other_value(field, original), original):
            start = time.perf_counter()
            change(field, value)
            seconds.append(time.perf_counter() - start)
    return seconds


def summarize(seconds: list[float]) -> dict:
    return {"median_seconds": round(statistics.median(seconds), 3), "max_seconds": round(max(seconds), 3)}


def rerun_seconds(step: GRPOStep) -> dict[str, float]:
    """The phases the last change re-ran, with their seconds."""
    return {p: round(step.result.timings[p].seconds, 3) for p in step.last_rerun}


def apply_change_latency(step: GRPOStep, field: str, repeats: int) -> dict:
    seconds = flips(step, field, lambda f, v: apply_change(step, f, v, until=phase_end(f)), repeats)
    target = target_seconds(field)
    return {**summarize(seconds), "target_seconds": target, "met": statistics.median(seconds) <= target,
            "rerun_seconds": rerun_seconds(step)}


def panel_latency(panel: StepPanel, field: str, repeats: int, encoding: dict[str, float]) -> dict:
    with contextlib.redirect_stdout(io.StringIO()):  # outside a kernel, display() prints the figures' reprs
        seconds = flips(panel.step, field, panel.on_change, repeats)
    first = PHASES.index(StepConfig.phase_of(field))
    redrawn = [name for name, (phase, _) in FIGURES.items() if PHASES.index(phase) >= first]
    in_kernel = statistics.median(seconds) + encoding["table"] + sum(encoding[name] for name in redrawn)
    return {**summarize(seconds), "rerun_seconds": rerun_seconds(panel.step), "figures_redrawn": redrawn,
            "kernel_estimate_seconds": round(in_kernel, 3), "met": in_kernel <= target_seconds(field)}


def table(report: dict) -> str:
    """The JSON's latencies, one row per field: seconds (medians; panels: the kernel estimate) and whether
    they meet the field's target."""
    loss_panel, full_panel = report["loss_panel_on_change"], report["panel_on_change"]
    met = lambda r: "met" if r["met"] else "NOT met"
    rows = ["| field | phase | target | apply_change | loss-only panel, in kernel | panel with the update, in "
            "kernel | its re-run phases (s) |", "|---|---|---|---|---|---|---|"]
    for field, a in report["apply_change"].items():
        full = full_panel[field]
        loss = loss_panel.get(field)
        loss = f"{loss['kernel_estimate_seconds']:.3f} {met(loss)}" if loss else "n/a (update field)"
        phases = ", ".join(f"{p} {s:.2f}" for p, s in full["rerun_seconds"].items())
        rows.append(f"| {field} | {StepConfig.phase_of(field)} | {a['target_seconds']} | "
                    f"{a['median_seconds']:.3f} {met(a)} | {loss} | {full['kernel_estimate_seconds']:.3f} {met(full)} "
                    f"| {phases} |")
    return "\n".join(rows)


def encode_seconds(run: StepRun) -> dict[str, float]:
    """What Jupyter adds to a redraw: each figure as PNG (as the inline backend does), the table as HTML."""
    out = {}
    for name, (_, draw) in FIGURES.items():
        fig = draw(run)
        start = time.perf_counter()
        print_figure(fig, "png")
        out[name] = time.perf_counter() - start
    table = per_sample(run).head(16)
    start = time.perf_counter()
    table.to_html()
    out["table"] = time.perf_counter() - start
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=3, help="flips to another value and back, per field")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="StepConfig changes, e.g. num_prompts=4 num_generations=4 (notebook 09's panel)")
    parser.add_argument("--fields", nargs="*", default=DEFAULT_FIELDS, metavar="FIELD",
                        help="the controls to time (default: every control of the dashboard)")
    args = parser.parse_args()
    fields = args.fields
    matplotlib.use("Agg")  # headless; pyplot picks its backend at the first figure
    setup(args.threads)  # the notebooks' settings: figure dpi, deterministic algorithms
    cfg = StepConfig(**parse_overrides(args.set))
    report = {"threads": args.threads, "torch": torch.__version__, "config_changes": args.set,
              "load_average_1min_before": round(os.getloadavg()[0], 2)}

    step = GRPOStep(cfg)
    step.run(step.cfg, until="update")  # warm-up: rollout and first-call overheads out of the numbers
    report["apply_change"] = {f: apply_change_latency(step, f, args.repeats) for f in fields}
    report["targets_met"] = f"{sum(r['met'] for r in report['apply_change'].values())}/{len(fields)}"

    with contextlib.redirect_stdout(io.StringIO()):
        full_panel = StepPanel(step, fields, until=panel_until(DEFAULT_FIELDS))  # the dashboard's: runs the update
    samples = [encode_seconds(step.result) for _ in range(3)]
    encoding = {name: statistics.median(s[name] for s in samples) for name in samples[0]}
    report["redraw_png_html_encoding_seconds"] = {name: round(v, 3) for name, v in encoding.items()}
    report["panel_on_change"] = {f: panel_latency(full_panel, f, args.repeats, encoding) for f in fields}
    report["panel_targets_met"] = f"{sum(r['met'] for r in report['panel_on_change'].values())}/{len(fields)}"
    loss_fields = [f for f in fields if StepConfig.phase_of(f) != "update"]
    with contextlib.redirect_stdout(io.StringIO()):
        loss_panel = StepPanel(step, loss_fields, until="loss")  # stops at the loss: no per-iteration metrics
    report["loss_panel_on_change"] = {f: panel_latency(loss_panel, f, args.repeats, encoding) for f in loss_fields}
    report["loss_panel_targets_met"] = (f"{sum(r['met'] for r in report['loss_panel_on_change'].values())}"
                                        f"/{len(loss_fields)}")
    report["load_average_1min_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(report, indent=1))
    print()
    print(table(report))


if __name__ == "__main__":
    main()
