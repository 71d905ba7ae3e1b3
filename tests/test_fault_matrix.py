"""Bad input at the command line's boundary, each with its documented outcome: a one-line refusal naming what is
wrong (exit 2, before any model loads), or a defined result (strict JSON that says where a number was not finite).
The capture's own fields are refused in tests/test_capture.py, the recorder's failures in
tests/test_observer_failures.py."""

import json
import math
import re
import subprocess
import sys

import pytest

from grpo_debug.cli.commands import write_json
from grpo_debug.runs.results import non_finite_paths


@pytest.mark.parametrize("value", ["١٦", "1٦", "x1", "1.5", " 16"])
def test_an_option_takes_ascii_digits_only(value):
    done = subprocess.run(
        [sys.executable, "-m", "grpo_debug", "doctor", "--held-out", value], capture_output=True, text=True, timeout=120
    )
    lines = [line for line in done.stderr.splitlines() if "error:" in line]
    assert done.returncode == 2 and lines, f"--held-out {value!r}: exit {done.returncode}\n{done.stderr}"
    assert f"{value!r} is not an integer (ASCII digits)" in lines[0] and "Traceback" not in done.stderr, done.stderr


def test_json_outputs_are_strict_and_say_where_a_number_was_not_finite(tmp_path):
    value = {"loss": math.nan, "grad_norm": [1.0, math.inf], "kl": {"exact": -math.inf, "logged": 0.5}}
    assert non_finite_paths(value) == ["loss", "grad_norm[1]", "kl.exact"]
    write_json(str(tmp_path / "out.json"), value)

    def refuse(constant):
        raise AssertionError(f"{constant} in a JSON output: not strict JSON")

    out = json.loads((tmp_path / "out.json").read_text(), parse_constant=refuse)
    assert out["loss"] is None and out["grad_norm"] == [1.0, None] and out["kl"] == {"exact": None, "logged": 0.5}
    assert out["non_finite_as_null"] == ["loss", "grad_norm[1]", "kl.exact"], out
    write_json(str(tmp_path / "finite.json"), {"loss": 1.0})
    assert "non_finite_as_null" not in json.loads((tmp_path / "finite.json").read_text())


TASKS = {  # a --task file of the user's, and the one line it must give (exit 2, no traceback, no model loaded)
    "syntax": ("def digits(completions, **kw):\n    return [1.0 for c in completions\n", r"tasks\.py, line \d+"),
    "raises_at_import": ("raise RuntimeError('no GPU here')\n", "importing .*tasks.py raised RuntimeError: no GPU"),
    "exits_at_import": ("import sys\nsys.exit(0)\n", r"called sys.exit\(0\) when imported"),
    "raises_in_a_call": (
        "def digits(completions, **kw):\n    return [1 / 0 for c in completions]\n",
        "'.*tasks.py:digits' raised ZeroDivisionError: division by zero on row 0",
    ),
    "exits_in_a_call": (
        "import sys\ndef digits(completions, **kw):\n    sys.exit(3)\n",
        r"'.*tasks.py:digits' called sys.exit\(3\) on row 0",
    ),
    "returns_none": ("def digits(completions, **kw):\n    return None\n", "returned NoneType, not a list"),
    "returns_words": ("def digits(completions, **kw):\n    return ['high' for c in completions]\n", "'high' for row 0"),
    "no_such_name": ("def other(completions, **kw):\n    return [0.0 for c in completions]\n", "defines no 'digits'"),
}


@pytest.mark.parametrize("case", list(TASKS))
@pytest.mark.parametrize("command", ["doctor", "replay"])
def test_a_task_file_that_fails_is_one_line_before_any_model_loads(tmp_path, capsys, monkeypatch, case, command):
    """In process (the command line's own `main`): exit 2 with one line, the capture never opened, no model."""
    from grpo_debug.cli.commands import main

    source, expected = TASKS[case]
    (tmp_path / "tasks.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    capture = tmp_path / "no-capture-needed"  # the task is checked first: its capture is never opened
    args = [str(capture)] if command == "replay" else []
    with pytest.raises(SystemExit) as exited:
        main([command, *args, "--task", f"{tmp_path / 'tasks.py'}:digits"])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert exited.value.code == 2 and len(errors) == 1, f"{case}: exit {exited.value.code}\n{err[-2000:]}"
    assert re.search(expected, errors[0]), f"{case}: {errors[0]!r} does not say {expected!r}"


def test_a_task_file_is_checked_from_the_command_line_too(tmp_path):
    """The same refusal from a fresh process, as a user meets it: no traceback, no model loaded."""
    source, expected = TASKS["raises_in_a_call"]
    (tmp_path / "tasks.py").write_text(source)
    done = subprocess.run(
        [sys.executable, "-m", "grpo_debug", "doctor", "--task", f"{tmp_path / 'tasks.py'}:digits"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert done.returncode == 2 and len(errors) == 1 and re.search(expected, errors[0]), done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "Loading weights" not in done.stderr, done.stderr[-2000:]


def health_line(step: int, severity: str = "ok") -> str:
    return json.dumps({"step": step, "metrics": {"loss": 0.1}, "findings": {"truncation": {"severity": severity}}})


def a_run(folder, steps=(1, 2, 3), index=None, lines=None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "health.jsonl").write_text("\n".join(lines or [health_line(s) for s in steps]) + "\n")
    if index is not None:
        (folder / "captures.json").write_text(json.dumps(index))
    return folder


RUNS = {  # a FlightRecorder folder damaged or mixed, and the one line `timeline` gives
    "two runs into one log": (dict(steps=(1, 2, 3, 1, 2)), "line 4 goes from step 3 back to step 1: two runs"),
    "a capture outside the run": (
        dict(index={"captured": {"1": {"folder": "../../other/step-1", "trigger": []}}}),
        "captured step '1' is not step-<k> inside the run",
    ),
    "an absolute capture folder": (
        dict(index={"captured": {"1": {"folder": "/etc", "trigger": []}}}),
        "is not step-<k> inside the run",
    ),
    "a list for captured": (dict(index={"captured": ["step-1"]}), "'captured' and 'not_captured' are not JSON objects"),
    "a string trigger": (
        dict(index={"captured": {"1": {"folder": "step-1", "trigger": "truncation"}}}),
        "step 1's trigger is not a list of",
    ),
    "an unknown severity": (
        dict(lines=[health_line(1), health_line(2, "catastrophic")]),
        r"line 2: findings \['truncation'\] are not",
    ),
}


@pytest.mark.parametrize("case", list(RUNS))
def test_timeline_refuses_a_damaged_or_mixed_run_in_one_line(tmp_path, capsys, case):
    from grpo_debug.cli.commands import main

    shape, expected = RUNS[case]
    run = a_run(tmp_path / "run", **shape)
    (run / "step-1").mkdir(exist_ok=True)
    with pytest.raises(SystemExit) as exited:
        main(["timeline", str(run), "--html", str(tmp_path / "page.html")])
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert exited.value.code == 2 and len(errors) == 1 and re.search(expected, errors[0]), (case, errors)
    assert not (tmp_path / "page.html").exists(), "a page was written for a run that was refused"


def test_a_health_log_past_its_bound_is_refused_before_it_is_read(tmp_path, capsys):
    from grpo_debug.cli.commands import main
    from grpo_debug.show.timeline import MAX_FILE_BYTES

    run = a_run(tmp_path / "run")
    with open(run / "health.jsonl", "r+b") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: nothing is written, the size is what is read first
    with pytest.raises(SystemExit):
        main(["timeline", str(run), "--html", str(tmp_path / "page.html")])
    assert "MB: over the 256 MB this reads" in capsys.readouterr().err


def test_a_recorder_refuses_a_folder_that_holds_another_runs_log(tmp_path):
    from grpo_debug.capture import FlightRecorder

    run = a_run(tmp_path / "run")
    with pytest.raises(ValueError, match="holds another run's health.jsonl: a FlightRecorder writes one run per"):
        FlightRecorder(run)
    (tmp_path / "index-only").mkdir()
    (tmp_path / "index-only" / "captures.json").write_text("{}")  # a run killed before its first health line
    (tmp_path / "capture-only" / "step-3").mkdir(parents=True)
    for folder, held in (("index-only", "captures.json"), ("capture-only", "step-3")):
        with pytest.raises(ValueError, match=f"holds another run's {held}"):
            FlightRecorder(tmp_path / folder)
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / "notes.txt").write_text("")
    FlightRecorder(tmp_path / "fresh")  # a folder holding no run is taken
    FlightRecorder(tmp_path / "new")  # a new one too


def test_bidi_controls_and_nul_never_reach_a_page_raw(tmp_path):
    """A finding, a reward name or a trigger holding U+202E or NUL: the doctor's and the timeline's pages show
    their escapes (`\\u202e`, `\\x00`), as the token page does."""
    from grpo_debug.doctor import Finding, Report
    from grpo_debug.doctor.present import page as doctor_page
    from grpo_debug.show.timeline import page as timeline_page
    from grpo_debug.show.timeline import read_run

    hostile = "gpj.\u202eexe\x00"
    report = Report((Finding("truncation", "warning", hostile),), {}, 0.0)
    run = a_run(
        tmp_path / "run",
        index={"captured": {"1": {"folder": "step-1", "trigger": [{"id": hostile, "severity": "warning"}]}}},
    )
    (run / "step-1").mkdir()
    pages = {
        "doctor": doctor_page(report, f"title {hostile}"),
        "timeline": timeline_page(read_run(run), tmp_path / "page.html"),
    }
    for name, text in pages.items():
        assert "\u202e" not in text and "\x00" not in text, f"the {name} page holds a raw control character"
        assert "\\u202e" in text and "\\x00" in text, f"the {name} page does not show the escapes"


@pytest.mark.parametrize(
    ("setting", "value"),
    [("min_history", True), ("window", True), ("max_captures", True), ("update_sample", True), ("grad_spike", "3")],
)
def test_a_recorder_setting_follows_one_rule_for_booleans_and_numbers(tmp_path, setting, value):
    from grpo_debug.capture import FlightRecorder

    with pytest.raises(ValueError, match=setting):
        FlightRecorder(tmp_path / "run", **{setting: value})


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    """Step 2 of a real 2-step TRL run of the bundled model (CaptureCallback), its reward function `rookworld`."""
    from grpo_debug.capture import CaptureCallback
    from grpo_debug.capture.trl_bridge import trl_trainer
    from grpo_debug.config import StepConfig

    out = tmp_path_factory.mktemp("capture")
    cfg = StepConfig(num_prompts=2, num_generations=4, max_new_tokens=16, beta=0.04)
    trainer = trl_trainer(cfg, str(out / "trl"), max_steps=2, disable_dropout=True, save_strategy="no")
    trainer.add_callback(CaptureCallback(out / "captures", steps=[2]))
    trainer.train()
    return out / "captures" / "step-2"


@pytest.mark.usefixtures("task_registry_restored")
def test_a_replay_whose_task_scores_no_completion_is_refused_not_reported(capture, tmp_path, capsys):
    """Your reward functions return None for every completion where the run scored them: every advantage would
    be 0 (TRL 1.16), so the replay compares nothing with the trainer's step. One line naming --task, exit 2,
    before the update, no output written; where the run scored none either, the replay goes on."""
    from grpo_debug.cli.commands import main, unscorable

    (tmp_path / "tasks.py").write_text("def rookworld(completions, **kw):\n    return [None for c in completions]\n")
    with pytest.raises(SystemExit) as exited:
        main(["replay", str(capture), "--task", f"{tmp_path / 'tasks.py'}:rookworld", "--json", str(tmp_path / "o")])
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert exited.value.code == 2 and len(errors) == 1, errors
    assert "tasks.py:rookworld: no reward function scored any of the 8 completions" in errors[0], errors[0]
    assert not (tmp_path / "o").exists()
    assert unscorable([True, True], {"f": [None, None]}, "t.py:f") is None  # the run scored none either
    assert unscorable([True, False], {"f": [1.0, 0.0]}, "t.py:f") is None  # one scored: a replay to compare
