"""What capturing a step costs: `python benchmarks/capture.py [--threads N] [--repeats R]`.

A real TRL `GRPOTrainer` run of the bundled model (8 prompts x 8 samples, the fixed preset) for 3 optimizer
steps with `CaptureCallback(steps=[2])`, R times. Prints JSON: step 2's time as TRL logs it (`step_time`),
the seconds the callback spent (the weight snapshot, the trainer's scoring forward, gathering, writing the
folder) and their ratio (target: under 10%), and the capture folder's size in MB (target: under 50).
`--quick`: 2 prompts x 2 samples, 8 new tokens, one run (run by `make test`; no number means anything).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from common import add_repeats, sizes_and_repeats

from grpo_debug.capture import CaptureCallback
from grpo_debug.capture.trl_bridge import trl_trainer
from grpo_debug.config import StepConfig


def one_run(threads: int, sizes: dict) -> dict:
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = trl_trainer(StepConfig(**sizes), tmp, max_steps=3, disable_dropout=True)
        callback = CaptureCallback(Path(tmp) / "captures", steps=[2])
        trainer.add_callback(callback)
        with contextlib.redirect_stdout(sys.stderr):  # TRL prints its logs: stdout is the report's JSON
            trainer.train()
        step_time = next(h["step_time"] for h in trainer.state.log_history if h.get("step") == 2 and "step_time" in h)
        folder = Path(tmp) / "captures" / "step-2"
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 1024**2
    return {
        "step_2_seconds": step_time,
        "capture_seconds": callback.seconds,
        "overhead": callback.seconds / step_time,
        "capture_mb": size,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_repeats(parser)
    args = parser.parse_args()
    sizes, repeats = sizes_and_repeats(args)
    runs = [one_run(args.threads, sizes) for _ in range(repeats)]
    report = {
        "threads": args.threads,
        "quick": args.quick,
        "load_average_1min": os.getloadavg()[0],
        "runs": runs,
        "median_overhead": statistics.median(r["overhead"] for r in runs),
        "capture_mb": runs[0]["capture_mb"],
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
