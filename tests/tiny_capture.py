"""A user's one-step TRL run of a tiny Llama (a plain GRPOConfig, a reward function of their own), its step
captured by CaptureCallback: the capture the CLI tests of tests/test_user_code_bounds.py,
tests/test_outputs_written.py and tests/test_refused_before_loading.py run commands on. The recorder's lock is let
go at train end (`folder_lock`). And the user's script tests/user_train.py run in a folder of its own beside a tiny
Qwen2 (`qwen2_user`, `user_train_run`), as the tests of the trainer's update, the landing and the optimizer's
schema run it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from arithmetic_task import build_tiny_llama, build_tiny_qwen2

from grpo_debug.capture.folder_lock import LOCK_FILE

TESTS = Path(__file__).resolve().parent


def digits(completions, **kwargs):
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def captured_step(user: Path) -> Path:
    """user/captures/step-1 of a 1-step run (2 prompts x 4 completions of at most 8 tokens) on the CPU."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from grpo_debug.capture import CaptureCallback

    build_tiny_llama(user / "my-llama")
    args = GRPOConfig(output_dir=str(user / "out"), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=8, max_steps=1, report_to="none", use_cpu=True)  # fmt: skip
    prompts = [f"What is {a}+{b}? " for a, b in [(1, 2), (3, 4)]]
    trainer = GRPOTrainer(model=str(user / "my-llama"), reward_funcs=[digits], args=args,
                          train_dataset=Dataset.from_dict({"prompt": prompts}))  # fmt: skip
    trainer.add_callback(CaptureCallback(user / "captures", steps=[1]))
    trainer.train()
    assert not (user / "captures" / LOCK_FILE).exists(), "the recorder kept its folder locked after training"
    return user / "captures" / "step-1"


def grpo_debug(*arguments, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m grpo_debug ARGUMENTS`, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "grpo_debug", *map(str, arguments)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(TESTS.parent)},
    )


def qwen2_user(folder: Path) -> Path:
    """`folder` with a tiny Qwen2 in my-model/ and the user's script user_train.py beside it."""
    build_tiny_qwen2(folder / "my-model")
    shutil.copy(TESTS / "user_train.py", folder / "user_train.py")
    return folder


def user_train_run(folder: Path, name: str, changes: dict, env: dict | None = None) -> Path:
    """`python user_train.py NAME 1 CHANGES` in a folder holding user_train.py and my-model/ (`qwen2_user`'s), under
    `env` (None: this process's), GRPOConfig's defaults with `changes`: the run's captures folder."""
    done = subprocess.run(
        [sys.executable, "user_train.py", name, "1", json.dumps(changes)],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, f"the user's run {name} failed:\n{done.stderr[-3000:]}"
    return folder / name / "captures"
