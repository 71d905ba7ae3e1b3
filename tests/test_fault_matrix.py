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

from grpo_debug.cli.arguments import write_json
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


def a_run(folder, steps=(1, 2, 3), index=None, lines=None, index_text=None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "health.jsonl").write_text("\n".join(lines or [health_line(s) for s in steps]) + "\n")
    if index is not None or index_text is not None:
        (folder / "captures.json").write_text(json.dumps(index) if index_text is None else index_text)
    return folder


def a_line(step, findings=None, **more) -> str:
    return json.dumps({"step": step, "metrics": {}, "findings": findings or {}, **more})


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
    "a string finding": (dict(lines=[a_line(1, {"truncation": "warning"})]), r"line 1: findings \['truncation'\]"),
    "a repeated step": (dict(steps=(1, 2, 2, 3)), "line 3 goes from step 2 back to step 2"),
    "a step that is true": (dict(lines=[a_line(True)]), "line 1 is not a health record"),
    "a superscript step": (
        dict(index={"captured": {"²": {"folder": "step-²", "trigger": []}}}),
        r"captures.json: captured step '²' is not step-<k> inside the run",
    ),
    "an Arabic-Indic step": (
        dict(index={"captured": {}, "not_captured": {"١": "max_captures reached"}}),
        r"captures.json: not_captured step '١' is not a step number \(ASCII digits\)",
    ),
    "a damaged index": (dict(index_text='{"captured": {"1": '), r"captures.json is not valid JSON \("),
    "an index that is a list": (dict(index=["step-1"]), "captures.json is not a JSON object"),
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
    from grpo_debug.show.timeline import page as timeline_page
    from grpo_debug.show.timeline import read_run
    from grpo_debug.ui.doctor_page import page as doctor_page

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
@pytest.mark.parametrize("value", ["None", "float('nan')"])
def test_a_replay_whose_task_scores_no_completion_is_refused_not_reported(capture, tmp_path, capsys, value):
    """Your reward functions return None (or NaN) for every completion where the run scored them: every advantage
    would be 0 (TRL 1.16), so the replay compares nothing with the trainer's step. One line naming --task, exit 2,
    before the update, no output written; where the run scored none either, the replay goes on."""
    from grpo_debug.cli.capture_commands import unscorable
    from grpo_debug.cli.commands import main

    (tmp_path / "tasks.py").write_text(
        f"def rookworld(completions, **kw):\n    return [{value} for c in completions]\n"
    )
    with pytest.raises(SystemExit) as exited:
        main(["replay", str(capture), "--task", f"{tmp_path / 'tasks.py'}:rookworld", "--json", str(tmp_path / "o")])
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert exited.value.code == 2 and len(errors) == 1, errors
    assert "tasks.py:rookworld: no reward function scored any of the 8 completions" in errors[0], errors[0]
    assert "(each returned None or NaN;" in errors[0], errors[0]
    assert not (tmp_path / "o").exists()
    assert unscorable([True, True], {"f": [None, None]}, "t.py:f") is None  # the run scored none either
    assert unscorable([True, False], {"f": [1.0, 0.0]}, "t.py:f") is None  # one scored: a replay to compare


def test_one_function_that_scores_nothing_the_run_scored_stops_the_replay():
    """Of two functions, one returns NaN or None on every row the run's scored: the other's sum is not the trainer's
    reward (-1.469 where it logged -0.905), so the replay stops naming it; a function the run also left unscored,
    or one that scored a row, goes on."""
    from grpo_debug.cli.capture_commands import function_unscored

    captured = {"format": [1.0, 0.0], "judge": [0.5, 0.7]}
    said = function_unscored({"format": [False, False], "judge": [True, True]}, captured, "r.py:FUNCS")
    assert (
        said and "reward function 'judge' returned None or NaN on all 2 completions, where the run's scored 2" in said
    )
    assert function_unscored({"format": [False, False], "judge": [True, False]}, captured, "r.py:FUNCS") is None
    assert function_unscored({"judge": [True, True]}, {"judge": [None, None]}, "r.py:FUNCS") is None


def test_a_captures_index_past_its_bound_is_refused_before_it_is_read(tmp_path, capsys):
    from grpo_debug.cli.commands import main
    from grpo_debug.show.timeline import MAX_FILE_BYTES

    run = a_run(tmp_path / "run", index={"captured": {}})
    with open(run / "captures.json", "r+b") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse
    with pytest.raises(SystemExit) as exited:
        main(["timeline", str(run), "--html", str(tmp_path / "page.html")])
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert exited.value.code == 2 and len(errors) == 1 and "captures.json is 256 MB: over the 256 MB" in errors[0]


def test_a_capture_json_or_manifest_past_its_bound_is_refused_before_it_is_read(capture, monkeypatch):
    from grpo_debug import checksums
    from grpo_debug.capture import reading
    from grpo_debug.capture.reading import CaptureError, load_capture

    monkeypatch.setattr(checksums, "MAX_MANIFEST_BYTES", 100)
    assert re.search(r"checksums.json is \d+ bytes: over the 100 bytes this reads", checksums.checksum_problem(capture))
    monkeypatch.undo()
    monkeypatch.setattr(reading, "MAX_READ_BYTES", 100)
    with pytest.raises(CaptureError, match=r"capture.json is \d+ bytes: over the 100 bytes this reads"):
        load_capture(capture)


def test_without_an_index_a_folder_not_named_in_ascii_digits_is_left_out_with_a_note(tmp_path):
    from grpo_debug.show.timeline import page, read_run

    run = a_run(tmp_path / "run")  # a run killed before captures.json was written
    for name in ("step-²", "step-١"):
        (run / name).mkdir()
        (run / name / "capture.json").write_text("{}")
    read = read_run(run)
    assert not read.captures and not read.unopenable
    assert read.notes == [f"{name} is not step-<k> in ASCII digits: left out" for name in ("step-²", "step-١")]
    assert "step-² is not step-&lt;k&gt; in ASCII digits: left out" in page(read, tmp_path / "page.html")


def test_non_finite_or_huge_health_values_are_gaps_with_a_note(tmp_path):
    """±1e308, NaN, a word: no coordinate is NaN; each is a gap (the line breaks there) and named in a note."""
    from grpo_debug.show.timeline import page, read_run

    values = [0.1, 0.15, 1e308, 0.2, 0.25, math.nan, -1e308, "high", 0.3]
    lines = [a_line(k, {"truncation": {"severity": "ok", "value": v}}, metrics={"grad_norm": v})
             for k, v in enumerate(values, start=1)]  # fmt: skip
    text = page(read_run(a_run(tmp_path / "run", lines=lines)), tmp_path / "page.html")
    assert not re.search(r"(nan|inf)", " ".join(re.findall(r"(?:x|y|cx|cy|x1|x2|y1|y2|points)='[^']*'", text)))
    assert text.count("<polyline") == 2 * 2, "each series: steps 1-2 and 4-5 joined, nothing across a gap"
    note = "Not drawn, a gap in the line: step 3 (1e+308), step 6 (nan), step 7 (-1e+308), step 8 (&#x27;high&#x27;)"
    assert text.count(note) == 2, re.findall(r"Not drawn[^<]*", text)


def test_a_listed_capture_that_does_not_verify_is_shown_so_and_offers_no_command(capture, tmp_path, capsys):
    """A capture whose capture.json no longer matches its checksums (what a kill between the two once left): the
    page says it cannot be opened, offers no command that would refuse it, and --doctor names it and goes on."""
    import shutil

    from grpo_debug.cli.commands import main

    trigger = [{"id": "truncation", "severity": "problem", "summary": "cut"}]
    run = a_run(tmp_path / "run", index={"captured": {"2": {"folder": "step-2", "trigger": trigger}}})
    shutil.copytree(capture, run / "step-2")
    meta = json.loads((run / "step-2" / "capture.json").read_text())
    (run / "step-2" / "capture.json").write_text(json.dumps({**meta, "logged": {"loss": 1.0}}))
    main(["timeline", str(run), "--doctor", "--html", str(tmp_path / "page.html")])
    text = (tmp_path / "page.html").read_text()
    assert "step-2 cannot be opened: " in text and "does not match its checksum" in text
    assert "--doctor" not in text and "truncation" in text
    assert "no doctor's report on step 2: " in capsys.readouterr().err
    assert not (run / "reports").exists()


@pytest.mark.usefixtures("task_registry_restored")
def test_at_every_rename_a_reader_finds_each_listed_capture_whole(tmp_path, monkeypatch):
    """A FlightRecorder run read back at every moment something it wrote appears (each rename into place, each
    health line): every capture captures.json lists verifies against its checksums, byte for byte, so a kill at
    any of those moments leaves nothing timeline lists that doctor or replay would refuse."""
    import os

    from grpo_debug.capture import FlightRecorder, flight
    from grpo_debug.capture.trl_bridge import trl_trainer
    from grpo_debug.checksums import checksum_problem
    from grpo_debug.config import StepConfig
    from grpo_debug.show.timeline import read_run

    run, moments = tmp_path / "run", []

    def read_back():
        if (run / "health.jsonl").is_file():
            read = read_run(run)
            moments.append(sorted(read.captures))
            assert not read.unopenable, read.unopenable
            assert all(checksum_problem(c["folder"]) is None for c in read.captures.values())

    real_replace, real_append = os.replace, flight.append_line

    def replaced(src, dst, *args, **kwargs):
        real_replace(src, dst, *args, **kwargs)
        if str(dst).startswith(str(run)):
            read_back()

    def appended(path, record):
        real_append(path, record)
        read_back()

    monkeypatch.setattr(os, "replace", replaced)
    monkeypatch.setattr(flight, "append_line", appended)
    cfg = StepConfig.preset("trl", num_prompts=2, num_generations=4, max_new_tokens=8)
    trainer = trl_trainer(cfg, str(tmp_path / "trl"), max_steps=3, save_strategy="no")
    trainer.add_callback(FlightRecorder(run))
    trainer.train()
    assert moments and moments[-1], "nothing was captured: the test saw no capture listed"
    assert json.loads((run / f"step-{moments[-1][0]}" / "capture.json").read_text())["logged"], "TRL's log is in it"


def test_a_capture_folder_that_links_outside_the_run_is_refused(tmp_path, capsys):
    from grpo_debug.cli.commands import main

    (tmp_path / "other" / "step-1").mkdir(parents=True)
    run = a_run(tmp_path / "run", index={"captured": {"1": {"folder": "step-1", "trigger": []}}})
    (run / "step-1").symlink_to(tmp_path / "other" / "step-1")
    with pytest.raises(SystemExit) as exited:
        main(["timeline", str(run), "--html", str(tmp_path / "page.html")])
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert exited.value.code == 2 and len(errors) == 1 and "step-1 leads outside the run" in errors[0], errors
