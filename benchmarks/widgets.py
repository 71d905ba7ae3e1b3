"""Dashboard latency on the bundled model: `python benchmarks/widgets.py [--threads N] [--repeats R]`.

Prints JSON: for each field of the dashboard, the seconds one change takes through `apply_change`
(median and max over flips to another value and back), the phases it re-ran (with their seconds)
and its target (issue: loss, KL and advantage toggles within 0.5 s; log-prob toggles within 2 s);
then the same change through `StepPanel.on_change`, redraw included. Outside a kernel the panel's
Output captures nothing and a displayed figure is never encoded, so the PNG and HTML encoding that
Jupyter adds to a redraw is timed on its own and added to give the kernel estimate. `met` compares
the median with the target.
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
from grpo_debug.ui.widgets import CHOICES, DEFAULT_FIELDS, FIGURES, SLIDERS, StepPanel, apply_change

TARGET_SECONDS = {"logprobs": 2.0, "advantages": 0.5, "loss": 0.5}  # by the first phase a field re-runs


def target_seconds(field: str) -> float:
    return TARGET_SECONDS[StepConfig.phase_of(field)]


def other_value(field: str, value):
    if field in CHOICES:
        options = CHOICES[field]
        return options[(options.index(value) + 1) % len(options)]
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


def apply_change_latency(step: GRPOStep, field: str, repeats: int) -> dict:
    seconds = flips(step, field, lambda f, v: apply_change(step, f, v, until="loss"), repeats)
    target = target_seconds(field)
    return {**summarize(seconds), "target_seconds": target, "met": statistics.median(seconds) <= target,
            "rerun_seconds": {p: round(step.result.timings[p].seconds, 3) for p in step.last_rerun}}


def panel_latency(panel: StepPanel, field: str, repeats: int, encoding: dict[str, float]) -> dict:
    with contextlib.redirect_stdout(io.StringIO()):  # outside a kernel, display() prints the figures' reprs
        seconds = flips(panel.step, field, panel.on_change, repeats)
    first = PHASES.index(StepConfig.phase_of(field))
    redrawn = [name for name, (phase, _) in FIGURES.items() if PHASES.index(phase) >= first]
    in_kernel = statistics.median(seconds) + encoding["table"] + sum(encoding[name] for name in redrawn)
    return {**summarize(seconds), "figures_redrawn": redrawn, "kernel_estimate_seconds": round(in_kernel, 3),
            "met": in_kernel <= target_seconds(field)}


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
    args = parser.parse_args()
    matplotlib.use("Agg")  # headless; pyplot picks its backend at the first figure
    setup(args.threads)  # the notebooks' settings: figure dpi, deterministic algorithms
    cfg = StepConfig(**parse_overrides(args.set))
    report = {"threads": args.threads, "torch": torch.__version__, "config_changes": args.set,
              "load_average_1min_before": round(os.getloadavg()[0], 2)}

    step = GRPOStep(cfg)
    step.run(step.cfg, until="loss")  # warm-up: rollout and first-call overheads out of the numbers
    report["apply_change"] = {f: apply_change_latency(step, f, args.repeats) for f in DEFAULT_FIELDS}
    report["targets_met"] = f"{sum(r['met'] for r in report['apply_change'].values())}/{len(DEFAULT_FIELDS)}"

    with contextlib.redirect_stdout(io.StringIO()):
        panel = StepPanel(step)
    samples = [encode_seconds(step.result) for _ in range(3)]
    encoding = {name: statistics.median(s[name] for s in samples) for name in samples[0]}
    report["redraw_png_html_encoding_seconds"] = {name: round(v, 3) for name, v in encoding.items()}
    report["panel_on_change"] = {f: panel_latency(panel, f, args.repeats, encoding) for f in DEFAULT_FIELDS}
    report["panel_targets_met"] = f"{sum(r['met'] for r in report['panel_on_change'].values())}/{len(DEFAULT_FIELDS)}"
    report["load_average_1min_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
