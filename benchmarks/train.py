"""Seconds per training step per arm type on the bundled model:
`python benchmarks/train.py [--threads N] [--steps K] [--arm NAME ...] [--set KEY=VALUE ...] [--from-experiments]`.

Runs K steps of each arm (one seed; its held-out evaluations, at step 0 and after step K, are not timed) and
prints JSON: per arm, the median and max seconds of a step (rollout, scoring, rewards, loss, the update;
for a TracIn arm also its validation set, the per-sample influence and the update on the selected samples).
`--from-experiments` instead reads the per-step seconds the committed runs under `data/experiments/`
recorded (one thread each, two runs sharing the 2-core machine).
`--quick`: 2 steps of 2 prompts x 2 samples, 8 new tokens (run by `make test`; no number means anything).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

import torch
from common import QUICK_SET, add_quick

from grpo_debug.config import StepConfig
from grpo_debug.files import DATA_DIR
from grpo_debug.overrides import parse_overrides
from grpo_debug.runs.arms import Plan, parse_arm
from grpo_debug.runs.train import train

DEFAULT_SET = ["num_prompts=4", "num_generations=8", "learning_rate=0.0002", "per_sample_grad_norms=false"]


def step_seconds(records: list[dict]) -> dict[str, dict]:
    by_arm: dict[str, list[float]] = {}
    for r in records:
        if "seconds" in r:
            by_arm.setdefault(r["arm"], []).append(r["seconds"])
    return {
        arm: {"steps": len(s), "median_seconds": round(statistics.median(s), 2), "max_seconds": round(max(s), 2)}
        for arm, s in by_arm.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--arm", nargs="*", default=["fixed", "tracin", "tracin_same_batch"])
    parser.add_argument("--set", nargs="*", default=DEFAULT_SET, metavar="KEY=VALUE")
    parser.add_argument("--from-experiments", action="store_true")
    add_quick(parser)
    args = parser.parse_args()
    if args.from_experiments:
        report = {
            path.stem: step_seconds(json.loads(path.read_text())["records"])
            for path in sorted((DATA_DIR / "experiments").glob("*.json"))
        }
    else:
        torch.set_num_threads(args.threads)
        base = StepConfig(**parse_overrides(args.set))
        if args.quick:
            base, args.steps = base.replace(**QUICK_SET), 2
        with tempfile.TemporaryDirectory() as tmp:
            plan = Plan(
                [parse_arm(a) for a in args.arm], args.steps, 1, base, eval_every=args.steps + 1, eval_prompts=4
            )
            out = train(plan, Path(tmp) / "bench.progress.jsonl", show_progress=False)
        report = {
            "threads": args.threads,
            "quick": args.quick,
            "config_changes": args.set,
            "load_average_1min": os.getloadavg()[0],
            "seconds_per_step": step_seconds(out["records"]),
        }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
