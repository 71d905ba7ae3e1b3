"""What the flight recorder costs a TRL step: `python benchmarks/flight_recorder.py [--threads N] [--repeats R]
[--steps K]`.

The same short `GRPOTrainer` run (the fixed preset's `GRPOConfig`, 8 prompts x 8 samples, the bundled task's
prompts and rewards, `logging_steps=1`), K optimizer steps, without and with `FlightRecorder` (its defaults: a
health line every step, a capture when a signal rises), R times each, the two interleaved (their order swapped
every repeat, so that a drift of the machine falls on both). Two models: the bundled one (`paths.DEFAULT_MODEL`)
and a user's 2-layer Llama with random weights made in a temporary folder (the bundled tokenizer), the second
so short a step that the recorder's fixed costs per step (a JSON line fsync'd, the weight sample) show.

Prints JSON, per model: the wall seconds of each step (from one `on_step_end` to the next, every callback's
work included; step 1, the warm-up, left out), their median without and with the recorder and the ratio (target:
at most 1.05), the seconds the recorder counted itself per step (its own work in every hook and wrapper, the
captures included; not the few lines that decide a hook has nothing to do) and their share of the median step
without it (`recorder_hook_share`: what the wall ratio measures, without the machine's noise),
the captures it wrote, and whether both runs logged the same loss and grad_norm at every step (the recorder
must not change the run).
`--quick`: 2 prompts x 2 samples, 8 new tokens, 3 steps, one repeat (the tests run it; no number means anything).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import add_repeats, sizes_and_repeats
from transformers import LlamaConfig, LlamaForCausalLM, TrainerCallback

from grpo_debug.capture import FlightRecorder
from grpo_debug.capture.trl_bridge import trl_trainer
from grpo_debug.config import StepConfig
from grpo_debug.files import DEFAULT_MODEL
from grpo_debug.model import load_model


class StepClock(TrainerCallback):
    """When each optimizer step ended (added last: every other callback's on_step_end is inside)."""

    def __init__(self):
        self.ends: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.ends.append(time.perf_counter())


def user_model(folder: Path) -> Path:
    """A 2-layer Llama with random weights and the bundled tokenizer, saved as a user's model folder."""
    tokenizer = load_model(DEFAULT_MODEL).tokenizer
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=192,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def one_run(model: str, sizes: dict, steps: int, recorded: bool, folder: Path) -> dict:
    """K steps of the run; each step's wall seconds, what it logged and what the recorder did."""
    trainer = trl_trainer(StepConfig(model=model, **sizes), str(folder / "run"), max_steps=steps, disable_dropout=True)
    recorder = FlightRecorder(folder / "flight") if recorded else None
    if recorder is not None:
        trainer.add_callback(recorder)
    clock = StepClock()
    trainer.add_callback(clock)
    with contextlib.redirect_stdout(sys.stderr):  # TRL prints its logs: stdout is the report's JSON
        trainer.train()
    logged = [(h["loss"], h["grad_norm"]) for h in trainer.state.log_history if "loss" in h and "grad_norm" in h]
    return {
        "step_seconds": [b - a for a, b in zip(clock.ends, clock.ends[1:])],  # steps 2..K
        "logged": logged,
        "recorder_seconds": recorder.seconds if recorder else 0.0,
        "captures": len(recorder.written) if recorder else 0,
        "health_lines": len((folder / "flight" / "health.jsonl").read_text().splitlines()) if recorder else 0,
    }


def compare(model: str, sizes: dict, steps: int, repeats: int) -> dict:
    """The run without and with the recorder, `repeats` times each, interleaved."""
    runs = {False: [], True: []}
    for r in range(repeats):
        for recorded in (False, True) if r % 2 == 0 else (True, False):
            with tempfile.TemporaryDirectory() as tmp:
                runs[recorded].append(one_run(model, sizes, steps, recorded, Path(tmp)))
    without = [s for run in runs[False] for s in run["step_seconds"]]
    with_ = [s for run in runs[True] for s in run["step_seconds"]]
    return {
        "step_seconds_without": [round(s, 4) for s in without],
        "step_seconds_with": [round(s, 4) for s in with_],
        "median_without": statistics.median(without),
        "median_with": statistics.median(with_),
        "ratio": statistics.median(with_) / statistics.median(without),
        "recorder_hook_seconds_per_step": statistics.median(run["recorder_seconds"] / steps for run in runs[True]),
        "recorder_hook_share": statistics.median(run["recorder_seconds"] / steps for run in runs[True])
        / statistics.median(without),
        "captures": [run["captures"] for run in runs[True]],
        "health_lines": [run["health_lines"] for run in runs[True]],
        "identical_training": all(a["logged"] == b["logged"] for a, b in zip(runs[False], runs[True])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_repeats(parser, help="runs of each arm (interleaved)")
    parser.add_argument("--steps", type=int, default=6, help="K, optimizer steps per run (step 1 is not timed)")
    parser.add_argument(
        "--model", action="append", choices=("bundled", "user_2_layers"), help="only this model (repeat; default both)"
    )
    args = parser.parse_args()
    sizes, repeats = sizes_and_repeats(args)
    steps = 3 if args.quick else args.steps
    if steps < 3:
        parser.error("--steps: at least 3 (step 1 is a warm-up, and a step's time needs the step before it)")
    torch.set_num_threads(args.threads)
    report = {"threads": args.threads, "quick": args.quick, "steps": steps, "repeats": repeats}
    with tempfile.TemporaryDirectory() as tmp:
        models = {"bundled": DEFAULT_MODEL, "user_2_layers": str(user_model(Path(tmp) / "my-model"))}
        for name, model in models.items():
            if name in (args.model or models):
                report[name] = compare(model, sizes, steps, repeats)
    report["load_average_1min"] = os.getloadavg()[0]
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
