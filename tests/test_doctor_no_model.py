"""`doctor --no-model`: the detectors a capture's own tensors answer, run without building the model. On a real
TRL capture they agree with the full doctor's, no model is loaded, the rest are named as not run; the command
prints what opening the capture would take before it loads anything."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_debug.capture import CaptureCallback
from grpo_debug.capture.trl_bridge import trl_trainer
from grpo_debug.config import StepConfig
from grpo_debug.doctor import WITHOUT_MODEL, diagnose, diagnose_without_model
from grpo_debug.doctor.detectors import DETECTORS

pytestmark = pytest.mark.usefixtures("task_registry_restored")


@pytest.fixture(scope="module")
def capture(tmp_path_factory) -> Path:
    """A real 2-step TRL run of the bundled model (TRL's own pitfalls on: dropout, no position_ids; beta 0.04),
    its second step captured."""
    out = tmp_path_factory.mktemp("no-model")
    cfg = StepConfig(num_prompts=2, num_generations=4, max_new_tokens=24, beta=0.04)
    cfg = cfg.replace(position_ids=False, dropout=True, sample_dropout=True)
    trainer = trl_trainer(cfg, str(out), max_steps=2)
    trainer.add_callback(CaptureCallback(out / "captures", steps=[2]))
    trainer.train()
    return out / "captures" / "step-2"


def test_without_the_model_the_capture_answers_what_it_can_and_agrees_with_the_full_doctor(capture, monkeypatch):
    from grpo_debug.capture.opening import open_capture

    full = {f.id: f for f in diagnose(open_capture(capture), flip=False).findings}

    def no_model(*args, **kwargs):
        raise AssertionError("--no-model loaded a model")

    monkeypatch.setattr("grpo_debug.model.load_model", no_model)
    monkeypatch.setattr("grpo_debug.capture.reading.load_model", no_model)
    report = diagnose_without_model(capture)
    ran = {f.id: f for f in report.findings}
    assert set(ran) == set(WITHOUT_MODEL), f"ran {sorted(ran)}, not the detectors a capture answers"
    assert set(report.not_run) == {d.__name__ for d in DETECTORS} - set(WITHOUT_MODEL), report.not_run
    differ = {k: (f.severity, full[k].severity) for k, f in ran.items() if f.severity != full[k].severity}
    differ.pop("kl_blowup", None)  # below: the logged kl against the exact one
    assert not differ, f"without the model, these findings differ from the full doctor's (ours, full): {differ}"
    logged, exact = ran["kl_blowup"], full["kl_blowup"]
    assert logged.evidence["source"] == "TRL's logged kl" and exact.evidence["source"].startswith("exact"), logged
    assert "dropout's noise" in logged.summary, f"the logged kl's dropout noise is not said: {logged.summary}"


def test_the_command_prints_the_capture_size_and_runs_without_the_model_from_another_folder(capture, tmp_path):
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "grpo_debug", "doctor", str(capture), "--no-model", "--json", str(report)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    first = done.stdout.splitlines()[0]
    assert first.startswith("capture ") and "MB on disk" in first and "GB of memory" in first, first
    assert "not run without the model" in done.stdout, done.stdout
    written = json.loads(report.read_text())
    assert set(written["not_run"]) and {f["id"] for f in written["findings"]} == set(WITHOUT_MODEL)


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [(["--no-model"], "give the capture's folder"), (["CAPTURE", "--no-model", "--horizon", "2"], "need the model")],
)
def test_no_model_refuses_what_needs_a_model_in_one_line(capture, arguments, problem):
    arguments = [str(capture) if a == "CAPTURE" else a for a in arguments]
    done = subprocess.run([sys.executable, "-m", "grpo_debug", "doctor", *arguments], capture_output=True, text=True)
    assert done.returncode == 2 and problem in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
