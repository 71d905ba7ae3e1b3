"""When the user's own code fails during training: a reward function that raises on some rows. The run stops as it
would without the debugger (the same exception, non-zero exit), the traceback the user reads runs from their script
to their function with no frame of ours in it, a note under it names their reward function; FlightRecorder and
CaptureCallback each leave a health line saying what crashed and where, and a folder with the failing batch. A
failure of ours while recording the crash (a full disk, a bug) never replaces the user's exception."""

import errno
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
from arithmetic_task import build_tiny_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("task_registry_restored")

USER_SCRIPT = '''"""My GRPO run: a closeness reward looked up in my table of answers (which forgot one prompt)."""
import math
import sys

from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

PROMPTS = ["What is 1+2? ", "What is 3+4? ", "What is 5+6? ", "What is 7+1? "]
ANSWERS = {"What is 1+2? ": 3, "What is 3+4? ": 7, "What is 5+6? ": 11}


def closeness(prompts, completions, **kwargs):
    rewards = []
    for prompt, completion in zip(prompts, completions):
        digits = "".join(ch for ch in completion if ch.isdigit())[:6]
        guess = int(digits) if digits else 0
        rewards.append(math.exp(-abs(guess - ANSWERS[prompt]) / 10))  # the row that fails
    return rewards


if __name__ == "__main__":
    args = GRPOConfig(output_dir="run", per_device_train_batch_size=16, num_generations=4, max_completion_length=8,
                      max_steps=2, logging_steps=1, report_to="none", use_cpu=True)
    trainer = GRPOTrainer(model="my-model", reward_funcs=[closeness], args=args,
                          train_dataset=Dataset.from_dict({"prompt": PROMPTS}))
    if sys.argv[1] == "flight":
        from grpo_debug.capture import FlightRecorder

        trainer.add_callback(FlightRecorder("flight"))
    elif sys.argv[1] == "capture":
        from grpo_debug.capture import CaptureCallback

        trainer.add_callback(CaptureCallback("captures", steps=[2]))
    trainer.train()
'''
FAILING_LINE = next(i for i, line in enumerate(USER_SCRIPT.splitlines(), 1) if "the row that fails" in line)
FORGOTTEN = "What is 7+1? "
FRAME = re.compile(r'^  File "(.+)", line (\d+), in (\S+)$')


@pytest.fixture(scope="module")
def user(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("crashing-user")
    build_tiny_model(folder / "my-model")
    (folder / "my_train.py").write_text(USER_SCRIPT)
    return folder


@pytest.fixture(scope="module")
def runs(user) -> dict[str, subprocess.CompletedProcess]:
    """The user's script run from its own folder: without the debugger, with FlightRecorder, with CaptureCallback."""
    return {
        kind: subprocess.run(
            [sys.executable, "my_train.py", kind], cwd=user, capture_output=True, text=True, timeout=600
        )
        for kind in ("none", "flight", "capture")
    }


def frames(stderr: str) -> list[tuple[str, int, str]]:
    """(file, line, function) of every traceback entry printed, in order."""
    return [(m[1], int(m[2]), m[3]) for m in map(FRAME.match, stderr.splitlines()) if m]


def the_error(stderr: str) -> str:
    """The exception's own line: the last line starting with its type."""
    return next(line for line in reversed(stderr.splitlines()) if line.startswith("KeyError"))


@pytest.mark.parametrize("kind", ["flight", "capture"])
def test_the_run_stops_with_the_users_error_and_its_traceback_is_theirs(runs, user, kind):
    done, without = runs[kind], runs["none"]
    assert without.returncode != 0 and the_error(without.stderr) == f"KeyError: {FORGOTTEN!r}", without.stderr[-1500:]
    assert done.returncode == without.returncode, done.stderr[-3000:]
    assert the_error(done.stderr) == the_error(without.stderr), done.stderr[-3000:]
    seen = frames(done.stderr)
    last = seen[-1]
    assert Path(last[0]).resolve() == (user / "my_train.py").resolve() and last[1:] == (FAILING_LINE, "closeness"), seen
    ours = [f for f in seen if "grpo_debug" in Path(f[0]).parts]
    assert not ours, f"the user reads frames of ours: {ours}"
    assert [f[2] for f in seen] == [f[2] for f in frames(without.stderr)], "the traceback differs from the run's own"
    note = done.stderr.splitlines()[-1]
    assert note.startswith("grpo_debug: this error is in your reward function 'closeness'"), done.stderr[-1500:]
    assert f"my_train.py, line {FAILING_LINE}, in closeness" in note and "step 1" in note, note


@pytest.mark.parametrize(("kind", "folder"), [("flight", "flight"), ("capture", "captures")])
def test_a_health_line_and_the_failing_batch_are_left(runs, user, kind, folder):
    out = user / folder
    lines = [json.loads(line) for line in (out / "health.jsonl").read_text().splitlines()]
    assert len(lines) == 1, lines
    crashed = lines[0]["crashed"]
    assert lines[0]["step"] == 1 and crashed["type"] == "KeyError" and crashed["reward_function"] == "closeness"
    assert Path(crashed["file"]).name == "my_train.py" and crashed["line"] == FAILING_LINE, crashed
    assert crashed["function"] == "closeness" and crashed["folder"] == "crash-step-1", crashed
    record = json.loads((out / "crash-step-1" / "crash.json").read_text())
    assert record["exception"] == {"type": "KeyError", "module": "builtins", "message": repr(FORGOTTEN)}
    assert record["frame"]["line"] == FAILING_LINE and "ANSWERS[prompt]" in record["frame"]["code"], record["frame"]
    assert record["frame"]["locals"]["prompt"] == repr(FORGOTTEN), record["frame"]["locals"]
    assert len(record["prompts"]) == len(record["completions"]) == 16 and FORGOTTEN in record["prompts"]
    assert all(isinstance(c, str) for c in record["completions"])
    traceback = (out / "crash-step-1" / "traceback.txt").read_text()
    assert "grpo_debug" not in traceback and traceback.rstrip().endswith(f"KeyError: {FORGOTTEN!r}"), traceback
    assert not list(out.glob(".crash-step-*")), "a partial crash folder was left"
    assert f"{out.name}/crash-step-1/crash.json" in runs[kind].stderr


# ---- in the test's own process: what fails of ours while recording the crash


def raising_reward(completions, **kwargs):
    raise ZeroDivisionError("my reward's own error")


def train_until_it_crashes(folder: Path, recorder):
    """A plain GRPOConfig on the tiny model whose reward raises at once; the exception training raised."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(output_dir=str(folder / "run"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=4, max_steps=1, report_to="none", use_cpu=True)  # fmt: skip
    trainer = GRPOTrainer(model=str(folder / "my-model"), reward_funcs=[raising_reward], args=args,
                          train_dataset=Dataset.from_dict({"prompt": ["What is 1+2? ", "What is 3+4? "]}))  # fmt: skip
    trainer.add_callback(recorder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ZeroDivisionError) as raised:
            trainer.train()
    return raised.value


@pytest.fixture(scope="module")
def model_only(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("in-process")
    build_tiny_model(folder / "my-model")
    return folder


def test_a_crash_folder_that_cannot_be_written_leaves_the_users_error_as_it_is(model_only, tmp_path, monkeypatch):
    from grpo_debug.capture import FlightRecorder
    from grpo_debug.capture import crash as crash_module

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(crash_module, "write_crash", no_space)
    monkeypatch.setattr(crash_module, "append_line", no_space)
    error = train_until_it_crashes(model_only, FlightRecorder(tmp_path / "flight"))
    assert type(error) is ZeroDivisionError and str(error) == "my reward's own error"
    (note,) = error.__notes__
    assert "your reward function 'raising_reward'" in note and "the crash folder was not written" in note, note
    assert "no health line was written" in note and "No space left on device" in note, note
    assert not (tmp_path / "flight" / "crash-step-1").exists()


def test_a_bug_of_ours_while_recording_the_crash_leaves_the_users_error_as_it_is(model_only, tmp_path, monkeypatch):
    import traceback

    from grpo_debug.capture import CaptureCallback
    from grpo_debug.capture import crash as crash_module

    def broken(*args, **kwargs):
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr(crash_module, "crash_record", broken)
    error = train_until_it_crashes(model_only, CaptureCallback(tmp_path / "captures", steps=[1]))
    assert type(error) is ZeroDivisionError and not getattr(error, "__notes__", None)
    assert error.__context__ is None and error.__cause__ is None, "our bug was chained to the user's error"
    shown = "".join(traceback.format_exception(error))
    assert "a bug of ours" not in shown and "grpo_debug" not in shown, shown
    assert traceback.extract_tb(error.__traceback__)[-1].name == "raising_reward"


def test_the_users_frame_is_told_from_libraries():
    from grpo_debug.capture.crash import is_users_file, library_folders

    libraries = library_folders()
    import trl

    assert not is_users_file(trl.__file__, libraries) and not is_users_file(json.__file__, libraries)
    assert not is_users_file(str(TESTS.parent / "grpo_debug" / "capture" / "callback.py"), libraries)
    assert not is_users_file("<frozen runpy>", libraries)
    assert is_users_file(__file__, libraries) and is_users_file("<string>", libraries)
    assert not is_users_file("/somewhere/else/site-packages/numpy/core.py", libraries)
