"""What running the user's reward functions in a process of their own costs (`grpo_debug.reward_process`):
`python benchmarks/reward_worker.py [--repeats N] [--rows R]`. Prints JSON: the worker's start (spawned, the task
file imported there once), and one call on a batch of R completions (64: the bundled step's 8 x 8) through the
worker against the same function called in this process, medians of `--repeats` calls, and the difference per
call. `--quick`: 4 rows, 3 calls (run by `make test`; no number means anything). The script imports no torch: the
spawned worker imports the starting script again, as it imports `python -m grpo_debug`'s torch-free command line."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from grpo_debug.reward_process import functions, stop_all

TASK = """
def digits(prompts, completions, **kwargs):
    return [float(sum(ch.isdigit() for ch in c)) for c in completions]
"""


def timed_calls(func, prompts: list[str], completions: list[str], repeats: int) -> list[float]:
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        func(prompts=prompts, completions=completions)
        seconds.append(time.perf_counter() - t0)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=1, help="taken for the other scripts' sake: no torch here")
    parser.add_argument("--repeats", type=int, default=20, help="calls timed (median)")
    parser.add_argument("--quick", action="store_true", help="4 rows and 3 calls: checks the script runs")
    parser.add_argument("--rows", type=int, default=64, help="completions per call")
    args = parser.parse_args()
    rows, repeats = (4, 3) if args.quick else (args.rows, args.repeats)
    prompts = [f"What is {k} + {k}? " for k in range(rows)]
    completions = [f"The answer is {2 * k}, as {k} + {k} makes {2 * k}." * 4 for k in range(rows)]
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / "task.py"
        file.write_text(TASK)
        t0 = time.perf_counter()
        (remote,) = functions(str(file), "digits", f"{file}:digits")
        start = time.perf_counter() - t0
        namespace: dict = {}
        exec(TASK, namespace)
        worker = timed_calls(remote, prompts, completions, repeats)
        here = timed_calls(namespace["digits"], prompts, completions, repeats)
        stop_all()
    median_worker, median_here = statistics.median(worker), statistics.median(here)
    report = {
        "quick": args.quick,
        "rows": rows,
        "calls": repeats,
        "worker_start_seconds": round(start, 3),
        "call_in_worker_ms": round(1e3 * median_worker, 3),
        "call_in_process_ms": round(1e3 * median_here, 3),
        "cost_per_call_ms": round(1e3 * (median_worker - median_here), 3),
    }
    json.dump(report, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
