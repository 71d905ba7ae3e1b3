"""A device and a dtype for every command: the models move there once and every tensor of the step follows them.
On every machine: the CPU named explicitly, with bfloat16 weights (the replay within the tolerance stated for it,
the doctor with its flips, the commands from another folder). Where torch sees a GPU: a capture replayed there
within the GPU's stated tolerance, the doctor there, and the bundled step's every phase there."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_debug.capture import CaptureCallback
from grpo_debug.capture.opening import open_capture
from grpo_debug.capture.replay import reproduction, tolerance, within
from grpo_debug.capture.trl_bridge import trl_trainer
from grpo_debug.config import StepConfig
from grpo_debug.doctor import diagnose

pytestmark = pytest.mark.usefixtures("task_registry_restored")

needs_a_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU torch can see")
COMPARED = ("loss", "grad_norm", "kl", "entropy", "reward")


@pytest.fixture(scope="module")
def capture(tmp_path_factory) -> Path:
    """A real 2-step TRL run of the bundled model on the CPU (beta 0.04, dropout off, activation checkpointing on as
    TRL 1.16's default has it), its second step captured."""
    out = tmp_path_factory.mktemp("device")
    cfg = StepConfig(num_prompts=2, num_generations=4, max_new_tokens=24, beta=0.04)
    trainer = trl_trainer(cfg, str(out), max_steps=2, disable_dropout=True, activation_checkpointing=True)
    trainer.add_callback(CaptureCallback(out / "captures", steps=[2]))
    trainer.train()
    return out / "captures" / "step-2"


def replayed(capture: Path, device: str | None, dtype: str | None):
    step = open_capture(capture, device=device, weights_dtype=dtype)
    run = step.run(until="update")
    return step, run, reproduction(run, step.capture, step.policy, step)


def assert_within_its_tolerance(out: dict, device_type: str, dtype: torch.dtype) -> None:
    relative, absolute = tolerance(device_type, dtype)
    assert out["where"]["tolerance"] == {"relative": relative, "absolute": absolute}, out["where"]
    off = {
        k: (out["replayed"][k], out["logged"][k])
        for k in COMPARED
        if not within(out["replayed"][k], out["logged"][k], relative, absolute)
    }
    assert not off, f"on {device_type} in {dtype}, outside the stated tolerance (ours, trainer's): {off}"
    assert out["where"]["outside"] == [], f"the replay names metrics outside its tolerance: {out['where']}"


ON_EVERY_DEVICE = ["cpu", pytest.param("cuda", marks=needs_a_gpu)]


@pytest.mark.parametrize("device", ON_EVERY_DEVICE)
def test_bfloat16_weights_replay_within_the_stated_tolerance_with_every_tensor_there(capture, device):
    step, run, out = replayed(capture, device, "bfloat16")
    places = {(p.device.type, p.dtype) for p in step.policy.parameters()}
    assert places == {(device, torch.bfloat16)}, f"the policy is not all on {device} in bfloat16: {places}"
    assert {t.device.type for t in (run.logprobs.policy, run.rewards.total, run.advantages.values)} == {device}
    assert out["where"]["device"].startswith(device) and out["where"]["dtype"] == "bfloat16", out["where"]
    assert_within_its_tolerance(out, device, torch.bfloat16)
    assert out["difference"]["loss"] != 0 or out["difference"]["kl"] != 0, "bfloat16 weights changed no digit"


@pytest.mark.parametrize("device", [pytest.param("cpu", marks=pytest.mark.slow), *ON_EVERY_DEVICE[1:]])
def test_the_doctor_flips_each_cause_on_bfloat16_weights(capture, device):
    step = open_capture(capture, device=device, weights_dtype="bfloat16")
    report = diagnose(step, flip=True, held_out=0)
    flipped = [f for f in report.findings if f.effect]
    assert flipped, "no cause was flipped on the step in bfloat16"
    assert {"truncation", "kl_estimator"} <= {f.id for f in report.findings if f.severity != "absent"}


def test_float32_on_the_explicit_cpu_is_the_trainers_step_digit_for_digit_checkpointed_as_it_was(capture, monkeypatch):
    import transformers.modeling_utils

    calls = []
    checkpoint = transformers.modeling_utils.checkpoint
    monkeypatch.setattr(
        transformers.modeling_utils, "checkpoint", lambda *a, **k: calls.append(1) or checkpoint(*a, **k)
    )
    default = replayed(capture, None if not torch.cuda.is_available() else "cpu", None)[2]
    assert calls, "the run checkpointed its activations (TRL's default) and the replay did not"
    calls.clear()
    step, _, explicit = replayed(capture, "cpu", "float32")
    assert calls, "the replay on an explicit --device cpu did not checkpoint as the run did"
    assert explicit["replayed"] == default["replayed"], "an explicit --device cpu --dtype float32 changed the replay"
    assert_within_its_tolerance(explicit, "cpu", torch.float32)
    assert explicit["difference"]["grad_norm"] == 0 and explicit["logps"]["max_abs_difference"] == 0, explicit
    layers = [m for m in step.policy.modules() if hasattr(m, "gradient_checkpointing")]
    assert not any(m.gradient_checkpointing or m.training for m in layers), "the replay left checkpointing on"


@needs_a_gpu
def test_a_capture_replays_on_the_gpu_within_its_stated_tolerance(capture):
    step, run, out = replayed(capture, "cuda", None)
    assert next(step.policy.parameters()).is_cuda and run.logprobs.policy.is_cuda
    assert_within_its_tolerance(out, "cuda", torch.float32)
    assert run.update.update_norm > 0, "the update moved nothing on the GPU"


@needs_a_gpu
def test_the_bundled_step_runs_every_phase_and_the_doctor_follows_a_fix_on_the_gpu():
    from grpo_debug.step import GRPOStep

    cfg = StepConfig(num_prompts=2, num_generations=4, max_new_tokens=16, eval_prompts=4, bootstrap=50)
    step = GRPOStep(cfg, device="cuda")
    run = step.run()
    assert run.evaluation is not None and run.update.update_norm > 0
    report = diagnose(step, flip=True, held_out=2, horizon=2, horizon_seeds=2)
    assert any(f.learning for f in report.findings), "no fix was followed over the horizon on the GPU"


def command(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpo_debug", *args], capture_output=True, text=True, cwd=cwd)


def test_the_commands_take_a_device_and_refuse_one_this_machine_lacks_in_one_line(capture, tmp_path):
    done = command("replay", str(capture), "--device", "cpu", "--dtype", "float32", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "on cpu, weights float32: stated tolerance" in done.stdout, done.stdout
    assert "outside it: none" in done.stdout, done.stdout
    refused = {"tpu": "not a device torch knows"}
    if not torch.cuda.is_available():
        refused["cuda"] = "torch sees no GPU"
    for device, says in refused.items():
        done = command("doctor", str(capture), "--device", device, cwd=tmp_path)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and says in lines[-1], f"--device {device}: {done.returncode} {done.stderr}"
        assert "Traceback" not in done.stderr, done.stderr
