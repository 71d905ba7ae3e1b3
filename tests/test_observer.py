"""The observer changes nothing: importing grpo_debug leaves the process as it was, and a user's training run with
`CaptureCallback` added gives the same losses, bit for bit, as the same run without it. Both run in fresh processes
with none of the kernel variables the suite pins (`grpo_debug/kernels.py`): the user's environment, not ours."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from arithmetic_task import build_tiny_model
from tiny_capture import user_train_run

from grpo_debug.kernels import PINNED

TESTS = Path(__file__).resolve().parent


def users_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in PINNED}


def test_importing_grpo_debug_changes_no_environment_variable_and_no_torch_setting():
    script = (
        "import json, os, torch\n"
        "from trl import GRPOConfig, GRPOTrainer  # a training script's own imports: what they set is theirs\n"
        "before = (dict(os.environ), torch.get_num_threads(), torch.backends.cpu.get_cpu_capability())\n"
        "import grpo_debug, grpo_debug.capture\n"
        "from grpo_debug.capture import CaptureCallback, FlightRecorder, open_capture\n"
        "after = (dict(os.environ), torch.get_num_threads(), torch.backends.cpu.get_cpu_capability())\n"
        "changed = sorted(k for k in set(before[0]) | set(after[0]) if before[0].get(k) != after[0].get(k))\n"
        "print(json.dumps({'changed': changed, 'threads': [before[1], after[1]], 'cpu': [before[2], after[2]]}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=users_environment())
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["changed"] == [], f"importing grpo_debug changed the environment variables {seen['changed']}"
    assert seen["threads"][0] == seen["threads"][1], f"importing grpo_debug changed torch's threads: {seen}"
    assert seen["cpu"][0] == seen["cpu"][1], f"importing grpo_debug changed torch's CPU kernels: {seen}"


@pytest.mark.slow  # `make test-slow`: two TRL runs in fresh processes
def test_a_run_with_the_capture_callback_has_the_losses_of_the_run_without_it(tmp_path):
    build_tiny_model(tmp_path / "my-model")
    shutil.copy(TESTS / "user_train.py", tmp_path / "user_train.py")
    logged = {}
    for name, capture in (("without", None), ("with", [1, 2, 3])):
        changes = {"capture": capture, "max_steps": 3, "learning_rate": 1e-3}
        user_train_run(tmp_path, name, changes, env=users_environment())
        history = json.loads((tmp_path / name / "log_history.json").read_text())
        logged[name] = [(h["step"], h["loss"], h["grad_norm"]) for h in history if "loss" in h]
    assert (tmp_path / "with" / "captures" / "step-3" / "capture.json").exists(), "the callback captured nothing"
    assert len(logged["without"]) == 3, f"the run logged {logged['without']}"
    assert logged["with"] == logged["without"], (
        f"adding CaptureCallback changed the run's (step, loss, grad_norm): {logged['with']} vs {logged['without']}"
    )
