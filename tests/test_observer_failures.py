"""The observer never stops the observed: whatever fails in CaptureCallback or FlightRecorder (a full disk, a
read-only folder, a bad folder, a bug of ours anywhere in it), training runs to its end with the losses of a run
without it, one warning names each failed step and the cause, the health line records the failure, and no
half-written capture is left where a reader would open it."""

import builtins
import errno
import io
import json
import os
import re
import warnings
from pathlib import Path

import pytest
from transformers import TrainerCallback

from grpo_debug.capture import CaptureCallback, FlightRecorder, flight, writing
from grpo_debug.capture.reading import load_capture
from grpo_debug.capture.trl_bridge import trl_trainer
from grpo_debug.config import StepConfig

pytestmark = pytest.mark.usefixtures("task_registry_restored")
STEPS = 2


def train_with(recorder, out: Path, steps: int = STEPS, *more) -> tuple[int, list[str], list]:
    """A TRL run of the bundled model with `recorder` (and `more` callbacks) added: the steps it trained, the
    recorder's warnings, and each step's logged loss and grad_norm."""
    cfg = StepConfig.preset("trl", num_prompts=2, num_generations=4, max_new_tokens=8)
    trainer = trl_trainer(cfg, str(out / "trl"), max_steps=steps, save_strategy="no")
    for callback in (*more, recorder):
        if callback is not None:
            trainer.add_callback(callback)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    said = [str(w.message) for w in caught if str(w.message).startswith(("CaptureCallback", "FlightRecorder"))]
    losses = [(h["step"], h["loss"], h["grad_norm"]) for h in trainer.state.log_history if "loss" in h]
    return trainer.state.global_step, said, losses


@pytest.fixture(scope="module")
def untouched(tmp_path_factory) -> dict[int, list]:
    """Each step's loss and grad_norm of the same runs without any recorder, by their number of steps."""
    out = tmp_path_factory.mktemp("untouched")
    return {steps: train_with(None, out / str(steps), steps)[2] for steps in (STEPS, 3)}


def warnings_per_step(said: list[str]) -> dict[int, int]:
    """How many warnings name each step ("step 2 ...", "steps 2, 3 ...")."""
    count: dict[int, int] = {}
    for text in said:
        named = re.match(r"\w+: steps? ([0-9, ]+)", text)
        for step in map(int, re.findall(r"[0-9]+", named.group(1))) if named else []:
            count[step] = count.get(step, 0) + 1
    return count


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob(".step-*")) if folder.is_dir() else []


def health_lines(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "health.jsonl").read_text().splitlines()]


class ReadOnlyFrom(TrainerCallback):
    """From the start of optimizer step `step`, `folder` is on a read-only file system: every file opened for
    writing and every folder made under it fails with EROFS, as the kernel answers."""

    def __init__(self, folder: Path, step: int, monkeypatch):
        self.folder, self.step, self.on = os.path.realpath(folder), step, False
        real_open, real_mkdir, real_os_open = io.open, os.mkdir, os.open
        writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

        def opened(file, mode="r", *args, **kwargs):
            if any(c in mode for c in "wax+"):
                self.refuse(file)
            return real_open(file, mode, *args, **kwargs)

        def made(path, *args, **kwargs):
            self.refuse(path)
            return real_mkdir(path, *args, **kwargs)

        def os_opened(path, flags, *args, **kwargs):  # os.open for writing (the health log, mkstemp) too
            if flags & writes:
                self.refuse(path)
            return real_os_open(path, flags, *args, **kwargs)

        for module, name, fake in ((builtins, "open", opened), (io, "open", opened), (os, "mkdir", made),
                                   (os, "open", os_opened)):  # fmt: skip
            monkeypatch.setattr(module, name, fake)

    def refuse(self, path) -> None:
        if self.on and isinstance(path, (str, os.PathLike)) and os.path.realpath(path).startswith(self.folder):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    def on_step_begin(self, args, state, control, **kwargs):
        self.on = self.on or state.global_step + 1 >= self.step


def test_a_full_disk_skips_the_capture_and_training_goes_on(tmp_path, monkeypatch, untouched):
    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writing.torch, "save", no_space)
    recorder = CaptureCallback(tmp_path / "captures", steps=[2])
    trained, said, losses = train_with(recorder, tmp_path)
    assert trained == STEPS and losses == untouched[STEPS], "training's own numbers changed"
    assert len(said) == 1 and "step 2 was not captured" in said[0] and "No space left on device" in said[0], said
    assert not (tmp_path / "captures" / "step-2").exists() and not leftovers(tmp_path / "captures")
    assert "No space left" in recorder.skipped[2]


def test_a_capture_the_disk_has_no_room_for_is_refused_before_writing(tmp_path, monkeypatch):
    class Usage:
        free = 1000

    monkeypatch.setattr(writing.shutil, "disk_usage", lambda path: Usage())
    recorder = CaptureCallback(tmp_path / "captures", steps=[1])
    trained, said, _ = train_with(recorder, tmp_path)
    assert trained == STEPS and "MB free" in recorder.skipped[1], recorder.skipped
    assert not list((tmp_path / "captures").iterdir()), "something was written for a capture with no room"


def test_a_bug_of_ours_while_recording_leaves_training_alone(tmp_path, monkeypatch):
    def broken(self, loss):
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr(CaptureCallback, "_keep_loss", broken)
    recorder = CaptureCallback(tmp_path / "captures", steps=[1, 2])
    trained, said, _ = train_with(recorder, tmp_path)
    assert trained == STEPS
    assert set(recorder.skipped) == {1, 2} and all("a bug of ours" in r for r in recorder.skipped.values())
    assert warnings_per_step(said) == {1: 1, 2: 1} and "step 1 was not captured" in said[0], said


def test_a_flight_recorders_full_disk_is_its_health_lines_loss_not_the_runs(tmp_path, monkeypatch, untouched):
    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(flight, "append_line", no_space)
    trained, said, losses = train_with(FlightRecorder(tmp_path / "recorder"), tmp_path)
    assert trained == STEPS and losses == untouched[STEPS]
    assert warnings_per_step(said) == {1: 1, 2: 1} and all("left no health line" in w for w in said), said


@pytest.mark.parametrize("recorder", ["CaptureCallback", "FlightRecorder"])
def test_a_folder_that_turns_read_only_mid_run_leaves_training_and_its_losses_alone(
    tmp_path, monkeypatch, untouched, recorder
):
    """Step 1 is written; from step 2 the folder is read-only. The run trains its 3 steps with the losses of a
    run without the recorder; steps 2 and 3 are each warned once, naming the cause; nothing half-written."""
    out = tmp_path / "out"
    ours = CaptureCallback(out, steps=[1, 2, 3]) if recorder == "CaptureCallback" else FlightRecorder(out)
    trained, said, losses = train_with(ours, tmp_path, 3, ReadOnlyFrom(out, 2, monkeypatch))
    assert trained == 3 and losses == untouched[3], "training's own numbers changed"
    assert warnings_per_step(said) == {2: 1, 3: 1}, said
    assert all("Read-only file system" in w for w in said), said
    assert not leftovers(out)
    if recorder == "CaptureCallback":
        assert load_capture(out / "step-1").meta["logged"]["loss"] == losses[0][1]
        assert sorted(ours.skipped) == [2, 3] and not (out / "step-2").exists()
    else:
        assert [line["step"] for line in health_lines(out)] == [1]


def test_a_flight_recorders_failed_capture_is_named_on_its_health_line(tmp_path, monkeypatch, untouched):
    """The disk is full when the triggered step 1 is written: the run goes on with its own losses, step 1 is warned
    once, its health line and captures.json say it was not captured and why, and no folder is left."""

    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writing.torch, "save", no_space)
    trained, said, losses = train_with(FlightRecorder(tmp_path / "run"), tmp_path)
    assert trained == STEPS and losses == untouched[STEPS]
    first = health_lines(tmp_path / "run")[0]
    assert first["trigger"] and first["capture"] is None, first
    assert "writing it failed (OSError: [Errno 28] No space left on device)" in first["not_captured"], first
    index = json.loads((tmp_path / "run" / "captures.json").read_text())
    assert index["captured"] == {} and "No space left" in index["not_captured"]["1"], index
    assert warnings_per_step(said)[1] == 1 and not list((tmp_path / "run").glob("*step-*")), said


BUGS = {  # a bug of ours in each part of the recorder, and whether the step's health line can still say so
    "_kept_generation": True,  # the wrapper around the trainer's generation
    "_kept_micro_batch": True,  # around _prepare_inputs
    "_kept_scores": True,  # around the loss's log-probs
    "_kept_loss": True,  # around training_step
    "_kept_grad_norm": True,  # around _get_grad_norm
    "_keep_random_state": True,  # the forward pre-hook
    "_records": True,  # on_step_begin
    "_step_metrics": True,  # on_pre_optimizer_step
    "_line": False,  # the health line itself
    "_close": False,  # on_log, on_step_begin, on_train_end
    "attach": False,  # on_train_begin
}


@pytest.mark.parametrize("part", list(BUGS))
def test_a_bug_of_ours_anywhere_leaves_training_and_its_losses_alone(tmp_path, monkeypatch, untouched, part):
    def broken(self, *args, **kwargs):
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr(FlightRecorder, part, broken)
    trained, said, losses = train_with(FlightRecorder(tmp_path / "run"), tmp_path)
    assert trained == STEPS and losses == untouched[STEPS], "training's own numbers changed"
    assert said and all("a bug of ours" in w for w in said), said
    assert all(n == 1 for n in warnings_per_step(said).values()), said
    if BUGS[part]:
        lines = health_lines(tmp_path / "run")
        assert [line["step"] for line in lines] == [1, 2] and all("a bug of ours" in line["failed"] for line in lines)


def test_a_capture_is_whole_or_absent(tmp_path):
    recorder = CaptureCallback(tmp_path / "captures", steps=[2])
    train_with(recorder, tmp_path)
    assert load_capture(tmp_path / "captures" / "step-2").meta["step"] == 2
    assert not leftovers(tmp_path / "captures"), "a partial folder was left beside the capture"


@pytest.mark.parametrize("bad", ["file", "empty", "under a file"])
def test_an_out_dir_that_is_no_folder_is_refused_before_training(tmp_path, bad):
    file = tmp_path / "captures.txt"
    file.write_text("not a folder")
    out = {"file": file, "empty": "", "under a file": file / "run"}[bad]
    with pytest.raises(ValueError, match="is not a folder"):
        CaptureCallback(out, steps=[1])
    with pytest.raises(ValueError, match="is not a folder"):
        FlightRecorder(out)


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
