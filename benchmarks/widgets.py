"""Dashboard latency on the bundled model:
`python benchmarks/widgets.py [--threads N] [--repeats R] [--set KEY=VALUE ...] [--fields FIELD ...]`.

Prints JSON, then the same as a table: for each field of the dashboard (default: every control of
`StepPanel`), the seconds one change takes through `apply_change` up to the end of the field's own phase
or the loss, whichever is later (median and max over flips to another value and back), the phases it
re-ran (with their seconds); then the same change through `StepPanel.on_change`, redraw included, in the
dashboard at the notebook's config (num_iterations = 1: the panel stops at the loss) and in the dashboard
after the num_iterations slider went to 2 (the panel then runs the update: a change of the clip range or
delta re-reads the passes' cached log-probs; any other change re-runs the update, whose second pass
re-scores the rollout with the weights the first pass left).

Targets (issue 12): a change that re-scores nothing within 0.5 s; a change that re-scores (a log-prob
field, or anything that re-runs the update's passes) within 2 s. Each change is held to the target of
what it re-ran. Outside a kernel the panel's Output captures nothing and a displayed figure is never
encoded, so the PNG and HTML encoding that Jupyter adds to a redraw is timed on its own and added to give
the kernel estimate. `met` compares that with the target.
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
from common import QUICK_SET, add_quick
from IPython.core.pylabtools import print_figure

from grpo_debug.config import PHASES, StepConfig
from grpo_debug.overrides import parse_overrides
from grpo_debug.step import GRPOStep, StepRun
from grpo_debug.ui.notebook import setup
from grpo_debug.ui.tables import per_sample
from grpo_debug.ui.widgets import CHOICES, DEFAULT_FIELDS, FIGURES, OPTIONAL, SLIDERS, StepPanel, apply_change, options

RESCORES, LOSS_SIDE = 2.0, 0.5  # seconds: a change that re-scores the rollout, one that does not
FLIP_TO = {"num_iterations": 2, "epsilon_low": 0.1, "epsilon_high": 0.28, "top_entropy_quantile": 0.2}  # from defaults


def target_seconds(rerun: set[str]) -> float:
    """The target of a change that re-ran these phases."""
    return RESCORES if rerun & {"rollout", "logprobs", "update"} else LOSS_SIDE


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


def flips(step: GRPOStep, field: str, change, repeats: int) -> tuple[list[float], set[str]]:
    """Seconds of each change to another value and back, `repeats` times, and every phase they re-ran."""
    original = getattr(step.cfg, field)
    seconds, rerun = [], set()
    for _ in range(repeats):
        for value in (other_value(field, original), original):
            start = time.perf_counter()
            result = change(field, value)
            seconds.append(time.perf_counter() - start)
            rerun |= set(result.rerun if result is not None else step.last_rerun)
    return seconds, rerun


def summarize(seconds: list[float]) -> dict:
    return {"median_seconds": round(statistics.median(seconds), 3), "max_seconds": round(max(seconds), 3)}


def rerun_seconds(step: GRPOStep) -> dict[str, float]:
    """The phases the last change re-ran, with their seconds."""
    return {p: round(step.result.timings[p].seconds, 3) for p in step.last_rerun}


def apply_change_latency(step: GRPOStep, field: str, repeats: int) -> dict:
    seconds, rerun = flips(step, field, lambda f, v: apply_change(step, f, v, until=phase_end(f)), repeats)
    target = target_seconds(rerun)
    return {
        **summarize(seconds),
        "target_seconds": target,
        "met": statistics.median(seconds) <= target,
        "rerun_seconds": rerun_seconds(step),
    }


def panel_latency(panel: StepPanel, field: str, repeats: int, encoding: dict[str, float]) -> dict:
    with contextlib.redirect_stdout(io.StringIO()):  # outside a kernel, display() prints the figures' reprs
        seconds, rerun = flips(panel.step, field, panel.on_change, repeats)
    first = PHASES.index(StepConfig.phase_of(field))
    redrawn = [name for name, (phase, _) in FIGURES.items() if PHASES.index(phase) >= first]
    in_kernel = statistics.median(seconds) + encoding["table"] + sum(encoding[name] for name in redrawn)
    target = target_seconds(rerun)
    return {
        **summarize(seconds),
        "rerun": sorted(rerun, key=lambda p: (p not in PHASES, PHASES.index(p) if p in PHASES else 0)),
        "rerun_seconds": rerun_seconds(panel.step),
        "figures_redrawn": redrawn,
        "target_seconds": target,
        "kernel_estimate_seconds": round(in_kernel, 3),
        "met": in_kernel <= target,
    }


def table(report: dict) -> str:
    """The JSON's latencies, one row per field: seconds (medians; panels: the kernel estimate), what the
    change re-ran, and whether it meets the target of what it re-ran."""
    mu1, mu2 = report["panel_mu1"], report["panel_mu2"]
    cell = lambda r: (
        f"{r['kernel_estimate_seconds']:.3f} ({', '.join(r['rerun'])}; <= {r['target_seconds']}) "
        f"{'met' if r['met'] else 'NOT met'}"
    )
    rows = [
        "| field | apply_change | dashboard at num_iterations = 1, in kernel | dashboard at num_iterations = 2, "
        "in kernel |",
        "|---|---|---|---|",
    ]
    for field, a in report["apply_change"].items():
        rows.append(f"| {field} | {a['median_seconds']:.3f} | {cell(mu1[field])} | {cell(mu2[field])} |")
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
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="StepConfig changes, e.g. num_prompts=4 num_generations=4 (notebook 09's panel)",
    )
    parser.add_argument(
        "--fields",
        nargs="*",
        default=DEFAULT_FIELDS,
        metavar="FIELD",
        help="the controls to time (default: every control of the dashboard)",
    )
    add_quick(parser)
    args = parser.parse_args()
    if args.quick:
        args.repeats = 1
    fields = args.fields
    matplotlib.use("Agg")  # headless; pyplot picks its backend at the first figure
    setup(args.threads)  # the notebooks' settings: figure dpi, deterministic algorithms
    cfg = StepConfig(**{**(QUICK_SET if args.quick else {}), **parse_overrides(args.set)})
    report = {
        "threads": args.threads,
        "quick": args.quick,
        "torch": torch.__version__,
        "config_changes": args.set,
        "load_average_1min_before": round(os.getloadavg()[0], 2),
    }

    step = GRPOStep(cfg)
    step.run(step.cfg, until="update")  # warm-up: rollout and first-call overheads out of the numbers
    report["apply_change"] = {f: apply_change_latency(step, f, args.repeats) for f in fields}

    samples = [encode_seconds(step.result) for _ in range(3)]
    encoding = {name: statistics.median(s[name] for s in samples) for name in samples[0]}
    report["redraw_png_html_encoding_seconds"] = {name: round(v, 3) for name, v in encoding.items()}
    for key, mu in (("panel_mu1", cfg.num_iterations), ("panel_mu2", 2)):
        with contextlib.redirect_stdout(io.StringIO()):
            panel = StepPanel(step, DEFAULT_FIELDS)  # the dashboard
            panel.on_change("num_iterations", mu)
        report[key] = {f: panel_latency(panel, f, args.repeats, encoding) for f in fields}  # mu: 1-2, 2-4
        report[f"{key}_targets_met"] = f"{sum(r['met'] for r in report[key].values())}/{len(report[key])}"
        with contextlib.redirect_stdout(io.StringIO()):
            panel.on_change("num_iterations", cfg.num_iterations)
    report["load_average_1min_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(report, indent=1))
    print()
    print(table(report))


if __name__ == "__main__":
    main()
