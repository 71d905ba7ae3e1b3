"""The observer never stops the observed: whatever fails in CaptureCallback or FlightRecorder (a full disk, a bad
folder, a bug of ours), training runs to its end, a warning names the step and the cause, and no half-written
capture is left where a reader would open it."""

import json
import warnings
from pathlib import Path

import pytest

from grpo_debug.capture import CaptureCallback, FlightRecorder
from grpo_debug.capture import callback as callback_module
from grpo_debug.capture.reading import load_capture
from grpo_debug.capture.trl_bridge import trl_trainer
from grpo_debug.config import StepConfig

pytestmark = pytest.mark.usefixtures("task_registry_restored")
STEPS = 2


def train_with(recorder, out: Path) -> tuple[int, list[str]]:
    """A 2-step TRL run of the bundled model with `recorder` added: the steps it trained, the warnings it gave."""
    cfg = StepConfig.preset("trl", num_prompts=2, num_generations=4, max_new_tokens=8)
    trainer = trl_trainer(cfg, str(out / "trl"), max_steps=STEPS)
    trainer.add_callback(recorder)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    return trainer.state.global_step, [str(w.message) for w in caught]


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob(".step-*")) if folder.is_dir() else []


def test_a_full_disk_skips_the_capture_and_training_goes_on(tmp_path, monkeypatch):
    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(callback_module.torch, "save", no_space)
    recorder = CaptureCallback(tmp_path / "captures", steps=[2])
    trained, said = train_with(recorder, tmp_path)
    assert trained == STEPS, f"training stopped at step {trained}"
    assert any("step 2 was not captured" in w and "No space left on device" in w for w in said), said
    assert not (tmp_path / "captures" / "step-2").exists() and not leftovers(tmp_path / "captures")
    assert "No space left" in recorder.skipped[2]


def test_a_capture_the_disk_has_no_room_for_is_refused_before_writing(tmp_path, monkeypatch):
    class Usage:
        free = 1000

    monkeypatch.setattr(callback_module.shutil, "disk_usage", lambda path: Usage())
    recorder = CaptureCallback(tmp_path / "captures", steps=[1])
    trained, said = train_with(recorder, tmp_path)
    assert trained == STEPS and "MB free" in recorder.skipped[1], recorder.skipped
    assert not list((tmp_path / "captures").iterdir()), "something was written for a capture with no room"


def test_a_bug_of_ours_while_recording_leaves_training_alone(tmp_path, monkeypatch):
    def broken(self, loss):
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr(CaptureCallback, "_keep_loss", broken)
    recorder = CaptureCallback(tmp_path / "captures", steps=[1, 2])
    trained, said = train_with(recorder, tmp_path)
    assert trained == STEPS
    assert set(recorder.skipped) == {1, 2} and all("a bug of ours" in r for r in recorder.skipped.values())
    assert any("step 1 will not be captured" in w for w in said), said


def test_a_flight_recorders_full_disk_is_its_health_lines_loss_not_the_runs(tmp_path, monkeypatch):
    from grpo_debug.capture import flight

    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(flight, "append_line", no_space)
    trained, said = train_with(FlightRecorder(tmp_path / "recorder"), tmp_path)
    assert trained == STEPS and any("record was not written" in w for w in said), said


def test_a_capture_is_whole_or_absent(tmp_path):
    recorder = CaptureCallback(tmp_path / "captures", steps=[2])
    train_with(recorder, tmp_path)
    assert load_capture(tmp_path / "captures" / "step-2").meta["step"] == 2
    assert not leftovers(tmp_path / "captures"), "a partial folder was left beside the capture"


@pytest.mark.parametrize("bad", ["file", "empty"])
def test_an_out_dir_that_is_no_folder_is_refused_before_training(tmp_path, bad):
    out = tmp_path / "captures.txt"
    out.write_text("not a folder")
    with pytest.raises(ValueError, match="is not a folder"):
        CaptureCallback(out if bad == "file" else "", steps=[1])
    with pytest.raises(ValueError, match="is not a folder"):
        FlightRecorder(out if bad == "file" else "")


def test_no_output_overwrites_what_the_command_reads(tmp_path, capsys):
    """replay and doctor refuse an output inside the capture they read (its files are checksummed); timeline refuses
    the run's health log, its captures index, a capture folder and the doctor's reports: one line, exit 2."""
    from grpo_debug.cli.commands import main

    capture = tmp_path / "flight" / "step-2"
    capture.mkdir(parents=True)
    (capture / "capture.json").write_text("{}")
    (tmp_path / "flight" / "health.jsonl").write_text("")
    refused = [
        ["replay", str(capture), "--json", str(capture / "capture.json")],
        ["replay", str(capture), "--html", str(capture / "tokens.html")],
        ["doctor", str(capture), "--json", str(capture / "report.json")],
        ["timeline", str(tmp_path / "flight"), "--html", str(tmp_path / "flight" / "health.jsonl")],
        ["timeline", str(tmp_path / "flight"), "--html", str(capture / "run.html")],
    ]
    for argv in refused:
        with pytest.raises(SystemExit) as done:
            main(argv)
        said = capsys.readouterr().err.strip().splitlines()[-1]
        assert done.value.code == 2 and "which this command reads" in said, (argv, said)
    assert (capture / "capture.json").read_text() == "{}" and not (capture / "tokens.html").exists()


def test_no_output_overwrites_any_input_of_any_command(tmp_path, capsys):
    """Every command's --json and --html against every input it reads beyond a capture or a run: the --task file,
    the reference and LoRA base model folders a capture names (through a link too), the model a step or a train
    run loads; and both outputs naming one file. One line, exit 2, before any work; every input unchanged."""
    from grpo_debug.cli.commands import main

    reference, base = tmp_path / "reference", tmp_path / "base"
    for model in (reference, base):
        model.mkdir()
        (model / "config.json").write_text('{"model_type": "gpt2"}')
    (tmp_path / "ref-link").symlink_to(reference)
    capture = tmp_path / "run" / "step-1"
    capture.mkdir(parents=True)
    meta = {"reference": {"name_or_path": str(tmp_path / "ref-link")}, "policy": {"base": {"folder": str(base)}}}
    (capture / "capture.json").write_text(json.dumps(meta))
    (tmp_path / "run" / "health.jsonl").write_text("")
    task = tmp_path / "tasks.py"
    task.write_text("def digits(completions, **kw):\n    return [0.0 for c in completions]\n")
    with_task = ["--task", f"{task}:digits"]
    refused = {
        "doctor --json over the --task file": ["doctor", str(capture), *with_task, "--json", str(task)],
        "replay --html over the --task file": ["replay", str(capture), *with_task, "--html", str(task)],
        "timeline --html over the --task file": [
            "timeline",
            str(tmp_path / "run"),
            "--doctor",
            *with_task,
            "--html",
            str(task),
        ],
        "doctor --json into the reference": ["doctor", str(capture), "--json", str(reference / "config.json")],
        "replay --json into the LoRA base": ["replay", str(capture), "--json", str(base / "report.json")],
        "timeline --doctor into a capture's reference": [
            "timeline",
            str(tmp_path / "run"),
            "--doctor",
            "--html",
            str(reference / "run.html"),
        ],
        "step --json into its model": ["step", "--set", f"model={reference}", "--json", str(reference / "config.json")],
        "doctor --html into its model": ["doctor", "--set", f"model={reference}", "--html", str(reference / "a.html")],
        "train --json into its model": [
            "train",
            "--steps",
            "1",
            "--arm",
            "fixed",
            "--set",
            f"model={reference}",
            "--json",
            str(reference / "config.json"),
        ],
        "doctor --json and --html one file": ["doctor", "--json", str(tmp_path / "r"), "--html", str(tmp_path / "r")],
    }
    for case, argv in refused.items():
        with pytest.raises(SystemExit) as done:
            main(argv)
        errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
        assert done.value.code == 2 and len(errors) == 1, (case, errors)
        assert "which this command reads" in errors[0] or "give each its own file" in errors[0], (case, errors[0])
    assert task.read_text().startswith("def digits") and (reference / "config.json").read_text().startswith("{")
    assert [p.name for p in reference.iterdir()] == ["config.json"] == [p.name for p in base.iterdir()]
