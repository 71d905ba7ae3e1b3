"""Run by tests/test_capture.py under `torchrun --nproc_per_node 2` (or `accelerate launch --num_processes 2
--cpu`): a 2-step GRPOTrainer run of a tiny model on two CPU processes (gloo), each generating half of the batch
(one prompt each, of different lengths), with CaptureCallback(steps=[2]).

    torchrun --nproc_per_node 2 tests/capture_two_processes.py MODEL_FOLDER OUT_DIR [KEY=VALUE ...]

The layout is given as KEY=VALUE: `ga` (gradient_accumulation_steps = steps_per_generation, default 1: one
micro-batch per process), `iterations` (num_iterations, default 1), `dropout` (1: disable_dropout=False,
default 0), `loss_type` (default: the StepConfig's), `steps` (max_steps, default 2: steps 2 to `steps` captured).
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from arithmetic_task import arithmetic_task  # noqa: E402

from grpo_debug.capture import CaptureCallback  # noqa: E402
from grpo_debug.capture.trl_bridge import trl_trainer  # noqa: E402
from grpo_debug.config import StepConfig  # noqa: E402
from grpo_debug.task import Task, register_task  # noqa: E402

PROCESSES = 2


def layout(pairs: list[str]) -> dict[str, str]:
    """KEY=VALUE arguments as a dict; one line naming an argument that is not KEY=VALUE."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in ("ga", "iterations", "dropout", "loss_type", "steps"):
            raise SystemExit(f"not a layout argument (ga=, iterations=, dropout=, loss_type=, steps=): {pair!r}")
        out[key] = value
    return out


if __name__ == "__main__":
    model, out, given = sys.argv[1], Path(sys.argv[2]), layout(sys.argv[3:])
    ga, iterations, steps = int(given.get("ga", 1)), int(given.get("iterations", 1)), int(given.get("steps", 2))
    # prompts of two lengths, one group per process: each process left-pads to its own width, so the gather
    # must pad the narrower share on the left again
    uneven = ["What is 3+4? ", "What is 12+34? "]
    base = arithmetic_task()
    task = Task("arithmetic", lambda prompt_set, n: uneven[:n], base.reward_funcs, base.reward_weights)
    register_task("arithmetic", lambda: task)
    cfg = StepConfig(
        model=model,
        task="arithmetic",
        num_prompts=2,
        num_generations=4,
        max_new_tokens=4,
        beta=0.04,
        fast=False,
        position_ids=False,
        **({"loss_type": given["loss_type"]} if "loss_type" in given else {}),
    )
    per_micro_batch = cfg.num_prompts * cfg.num_generations // PROCESSES // ga  # B*G rows over processes and GA
    trainer = trl_trainer(
        cfg,
        str(out),
        task,
        max_steps=steps,
        disable_dropout=given.get("dropout", "0") != "1",
        per_device_train_batch_size=per_micro_batch,
        gradient_accumulation_steps=ga,
        steps_per_generation=ga,
        num_iterations=iterations,
    )
    trainer.add_callback(CaptureCallback(out / "captures", steps=list(range(2, steps + 1))))
    trainer.train()
    # destroys the process group: a gloo process that exits with it alive can abort at exit (SIGABRT,
    # "terminate called without an active exception"), after training and the captures are done
    trainer.accelerator.end_training()
    # and still did, once in CI (2026-11-29), in static destructors after the group was gone: both processes' captures
    # are sealed by now, so the harness leaves without running them
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
