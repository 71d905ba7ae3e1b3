"""Run by tests/test_capture.py under `torchrun --nproc_per_node 2`: a 2-step GRPOTrainer run of the tiny Llama
on two CPU processes (gloo), each generating half of the batch (one prompt each, of different lengths), with
CaptureCallback(steps=[2]).

    torchrun --nproc_per_node 2 tests/capture_two_processes.py MODEL_FOLDER OUT_DIR
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from arithmetic_task import arithmetic_task  # noqa: E402

from grpo_debug.capture import CaptureCallback  # noqa: E402
from grpo_debug.capture.trl_bridge import trl_trainer  # noqa: E402
from grpo_debug.config import StepConfig  # noqa: E402
from grpo_debug.task import Task, register_task  # noqa: E402

PROCESSES = 2

if __name__ == "__main__":
    model, out = sys.argv[1], Path(sys.argv[2])
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
    )
    per_process = cfg.num_prompts * cfg.num_generations // PROCESSES  # the B*G rows split over the processes
    trainer = trl_trainer(
        cfg, str(out), task, max_steps=2, disable_dropout=True, per_device_train_batch_size=per_process
    )
    trainer.add_callback(CaptureCallback(out / "captures", steps=[2]))
    trainer.train()
