"""The flight recorder on a user's own TRL run: a health line every optimizer step, the step where the user's reward
turns constant captured (and only it), opened as a step that reproduces what TRL logged; a clean run stays quiet;
the run page opens in a real browser; bad folders are refused in one line."""

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from documentation import documentation  # noqa: E402  (tests/)

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
from arithmetic_task import build_tiny_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("task_registry_restored")
PROMPTS = [f"What is {a}+{b}? " for a, b in [(1, 2), (3, 4), (5, 6), (7, 1), (2, 2), (9, 0), (4, 4), (6, 3)]]
STEPS = 4
TURNS_CONSTANT = 3


def build_model_that_stops(folder: Path) -> Path:
    """The tests' tiny random GPT-2, made to end its answers: its final layer norm's bias points at the EOS
    embedding (tied to the output), so an EOS comes every few tokens. A random model that never stops would
    truncate every completion, which the recorder rightly flags: here a clean run must be clean."""
    from transformers import GPT2LMHeadModel

    build_tiny_model(folder)
    model = GPT2LMHeadModel.from_pretrained(folder)
    with torch.no_grad():
        eos = model.transformer.wte.weight[model.config.eos_token_id]
        model.transformer.ln_f.bias += 20 * eos / eos.norm()
    model.save_pretrained(folder)
    return folder


def digits_until(turn: int | None):
    """The user's reward: the share of digits in the answer, until step `turn`, from which it is 0.5 for every
    completion (a broken reward: a constant)."""

    def digits(completions, trainer_state=None, **kwargs):
        if turn is not None and trainer_state.global_step + 1 >= turn:
            return [0.5] * len(completions)
        return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]

    return digits


def user_run(folder: Path, model: Path, turn: int | None, report_to="none", **recorder) -> tuple[Path, list, list]:
    """A plain GRPOConfig (TRL's defaults but the sizes), the user's reward, FlightRecorder: (its folder, what TRL
    logged each step, the warnings at the end of training). `report_to`: the trackers the run reports to."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from grpo_debug.capture import FlightRecorder

    args = GRPOConfig(
        output_dir=str(folder / "run"),
        per_device_train_batch_size=64,
        num_generations=8,
        max_completion_length=32,
        max_steps=STEPS,
        logging_steps=1,
        report_to=report_to,
        use_cpu=True,
    )
    trainer = GRPOTrainer(
        model=str(model),
        reward_funcs=[digits_until(turn)],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
    )
    trainer.add_callback(FlightRecorder(folder / "flight", **recorder))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    logged = [h for h in trainer.state.log_history if "loss" in h]
    return folder / "flight", logged, [str(w.message) for w in caught if "FlightRecorder" in str(w.message)]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return build_model_that_stops(tmp_path_factory.mktemp("user") / "my-model")


@pytest.fixture(scope="module")
def broken(tmp_path_factory, model):
    return user_run(tmp_path_factory.mktemp("broken"), model, TURNS_CONSTANT)


def health_lines(flight: Path) -> list[dict]:
    return [json.loads(line) for line in (flight / "health.jsonl").read_text().splitlines()]


def test_every_step_has_a_health_line_in_trls_names_and_the_doctors_ids(broken):
    flight, logged, _ = broken
    lines = health_lines(flight)
    assert [line["step"] for line in lines] == list(range(1, STEPS + 1))
    for line, log in zip(lines, logged):
        m = line["metrics"]
        for name in ("frac_reward_zero_std", "completions/clipped_ratio", "rewards/digits/mean", "entropy", "loss"):
            assert name in m, (line["step"], name, sorted(m))
        assert m["grad_norm"] == pytest.approx(log["grad_norm"], rel=1e-6) and m["loss"] == pytest.approx(log["loss"])
        assert "rewards/digits/length_correlation" in m and m["update/relative_norm"] > 0
        assert {"zero_std_groups", "constant_reward", "length_reward", "truncation", "entropy_collapse"} <= set(
            line["findings"]
        ) and {"clip_saturated", "update_size", "grad_norm_spike", "reward_collapse"} <= set(line["findings"])
        assert all(f["severity"] in ("ok", "warning", "problem") for f in line["findings"].values())
    before, after = lines[TURNS_CONSTANT - 2], lines[TURNS_CONSTANT - 1]
    assert before["findings"]["zero_std_groups"]["severity"] == "ok"
    assert after["findings"]["zero_std_groups"]["severity"] == "problem"
    assert after["findings"]["constant_reward"]["severity"] == "problem"


def test_the_step_where_the_reward_turns_constant_is_captured_and_only_it(broken):
    flight, logged, caught = broken
    assert sorted(p.name for p in flight.glob("step-*")) == [f"step-{TURNS_CONSTANT}"], "steps 1-2 were clean"
    lines = health_lines(flight)
    assert [line["capture"] for line in lines] == [None, None, f"step-{TURNS_CONSTANT}", None]
    assert lines[TURNS_CONSTANT]["trigger"] == [], "a condition that persists triggers once, when it starts"
    meta = json.loads((flight / f"step-{TURNS_CONSTANT}" / "capture.json").read_text())
    assert {"zero_std_groups", "constant_reward"} <= {r["id"] for r in meta["trigger"]}
    assert all(r["severity"] == "problem" for r in meta["trigger"])
    assert "constant_reward" in (flight / f"step-{TURNS_CONSTANT}" / "README.md").read_text()
    index = json.loads((flight / "captures.json").read_text())
    assert list(index["captured"]) == [str(TURNS_CONSTANT)] and index["not_captured"] == {} and not caught


def test_the_captured_step_opens_and_reproduces_what_trl_logged(broken):
    from grpo_debug.capture import open_capture
    from grpo_debug.capture.replay import reproduction

    flight, logged, _ = broken
    step = open_capture(flight / f"step-{TURNS_CONSTANT}")
    out = reproduction(step.run(until="update"), step.capture, step.policy, step)
    for name in ("loss", "grad_norm", "entropy", "frac_reward_zero_std"):
        assert out["replayed"][name] == pytest.approx(out["logged"][name], rel=1e-4, abs=1e-7), name
    assert out["logged"]["frac_reward_zero_std"] == 1.0 and out["logps"]["max_abs_difference"] < 1e-4


def test_a_clean_run_stays_quiet(tmp_path, model):
    flight, _, caught = user_run(tmp_path, model, turn=None)
    lines = health_lines(flight)
    assert len(lines) == STEPS and all(line["trigger"] == [] for line in lines), [line["trigger"] for line in lines]
    assert not list(flight.glob("step-*")) and not caught


# ---- the signals and the budget, without a run


def test_the_signals_use_the_doctors_thresholds():
    from grpo_debug.capture import health
    from grpo_debug.detectors import detectors as d

    assert health.zero_std_groups(1.0).severity == "problem"
    assert health.zero_std_groups(d.NO_SIGNAL_WARNING).severity == "warning"
    assert health.zero_std_groups(d.NO_SIGNAL_WARNING - 0.01).severity == "ok"
    assert health.truncation(d.TRUNCATED_WARNING).severity == "warning" and health.truncation(0.1).severity == "ok"
    assert health.truncation(1.0).severity == "problem", "every completion cut: the doctor says problem, so does health"
    low = d.ENTROPY_COLLAPSE / 2
    assert health.entropy_collapse(low, first=1.0).severity == "warning", "a fall below the level warns"
    assert health.entropy_collapse(low).severity == "ok", "the run's first step has no fall to warn of"
    assert health.entropy_collapse(low, first=low * 1.5).severity == "ok", "as low at the start: the model's own"
    assert health.clip_saturated(d.CLIP_SATURATED).severity == "warning"
    assert health.update_size(d.UPDATE_WARNING * 2).severity == "warning"
    assert health.length_reward({"a": d.LENGTH_CORRELATION, "b": -0.9}, {"a": 1e-4, "b": 1.0}).severity == "warning"
    assert health.length_reward({"a": -0.9}, {"a": 1.0}).severity == "ok", "a length penalty is not a length reward"
    chance = health.length_reward({"a": 0.75, "b": 0.1}, {"a": 0.006, "b": 0.4})  # Holm: 2 x 0.006 > 0.01
    assert chance.severity == "ok" and "not significant" in chance.summary, "a large r by chance must not trigger"
    assert [health.constant_reward(c, ["a", "b"]).severity for c in ([], ["a"], ["a", "b"])] == [
        "ok",
        "warning",
        "problem",
    ]
    assert health.grad_norm_spike(10.0, [1.0] * 4, 3.0, 5).value is None, "not before min_history steps"
    assert health.grad_norm_spike(3.5, [1.0, 1.0, 9.0, 1.0, 1.0], 3.0, 5).severity == "warning"
    assert health.reward_collapse(0.2, [0.5] * 5, [0.2] * 5, 1.0, 5).severity == "warning"
    assert health.reward_collapse(0.4, [0.5] * 5, [0.2] * 5, 1.0, 5).severity == "ok"


def test_the_generation_signals_and_the_sampler_check():
    from grpo_debug.capture import health

    G = 4
    ids = torch.ones(8, 6, dtype=torch.long)
    mask = torch.tensor([[1] * n + [0] * (6 - n) for n in (1, 2, 3, 4, 2, 2, 2, 2)])
    tensors = {"completion_ids": ids, "completion_mask": mask}
    rewards = {"longer": [1, 2, 3, 4, 0, 0, 0, 0], "same": [1.0] * 8}
    s = health.generation_signals(rewards, {"longer": 1.0, "same": 1.0}, tensors, G)
    assert s["groups_without_signal"] == 0.5 and s["constant_functions"] == ["same"]
    assert s["length_correlation"]["longer"] == pytest.approx(1.0) and s["sampler"] is None
    logps = torch.full((8, 6), -1.0)
    tensors.update(old_per_token_logps=logps, sampling_per_token_logps=logps - 2.0)  # a sampler far off
    far = health.generation_signals(rewards, {"longer": 1, "same": 1}, tensors, G)["sampler"]
    assert health.sampler_mismatch(far).severity == "warning"
    tensors["sampling_per_token_logps"] = logps
    same = health.generation_signals(rewards, {"longer": 1, "same": 1}, tensors, G)["sampler"]
    assert health.sampler_mismatch(same).severity == "ok"


def test_the_budget_keeps_the_first_steps_and_the_worst_after_them():
    """max_captures 3: the first 2 triggered steps, then the last place goes to a strictly worse step each time."""
    from grpo_debug.capture.health import admit, badness

    warning, problem = {"severity": "warning"}, {"severity": "problem"}
    triggered = {2: [warning], 5: [warning], 7: [warning], 8: [warning, warning], 9: [warning], 11: [problem]}
    first, last, refused, replaced = [], None, [], []
    for step, reasons in triggered.items():
        place = admit(first, last, 3, badness(reasons))
        if place == "first":
            first.append(step)
        elif place == "last":
            replaced += [last[0]] if last else []
            last = (step, badness(reasons))
        else:
            refused.append(step)
    assert first == [2, 5] and last[0] == 11 and replaced == [7, 8] and refused == [9]


def test_a_step_replaced_in_the_last_place_is_removed_and_named(tmp_path):
    """max_captures 1: the one place holds the worst triggered step; the one it replaces leaves the disk, the index
    and `written`, and the end of training names it."""
    from types import SimpleNamespace

    from grpo_debug.capture import FlightRecorder

    recorder = FlightRecorder(tmp_path, max_captures=1)
    recorder.trainer = SimpleNamespace(accelerator=SimpleNamespace(is_main_process=True))
    for step, severity in ((2, "warning"), (5, "problem")):
        (tmp_path / f"step-{step}").mkdir()
        recorder.written[step] = tmp_path / f"step-{step}"
        recorder.triggered[step] = reasons = [{"id": "truncation", "severity": severity, "summary": "..."}]
        recorder._captured(step, recorder.written[step], {"place": "last", "reasons": reasons})
    assert not (tmp_path / "step-2").exists() and (tmp_path / "step-5").is_dir() and list(recorder.written) == [5]
    with pytest.warns(UserWarning, match="step 2 triggered but was not captured: replaced by step 5"):
        recorder.on_train_end(None, None, None)
    index = json.loads((tmp_path / "captures.json").read_text())
    assert list(index["captured"]) == ["5"] and list(index["not_captured"]) == ["2"] and "at most 1" in index["rule"]


def test_the_settings_are_checked():
    from grpo_debug.capture import FlightRecorder

    for bad in ({"max_captures": 0}, {"grad_spike": 1.0}, {"min_history": 30}, {"trigger_on": ("nope",)}):
        with pytest.raises(ValueError):
            FlightRecorder("flight", **bad)


# ---- the run page


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "grpo_debug", *args], capture_output=True, text=True, timeout=600, cwd=cwd
    )


def test_bad_run_folders_are_refused_in_one_line(tmp_path, broken):
    flight = broken[0]
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "health.jsonl").write_text("")
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    good = (flight / "health.jsonl").read_text().splitlines()
    (corrupt / "health.jsonl").write_text(good[0] + "\nnot json\n" + good[1] + "\n")  # no record begun: refused
    for folder, said in (
        (tmp_path / "nowhere", "no such folder"),
        (tmp_path, "holds no health.jsonl"),
        (empty, "is empty"),
        (corrupt, "line 2 is not JSON"),
    ):
        done = run_cli("timeline", str(folder), "--html", str(tmp_path / "run.html"))
        errors = [line for line in done.stderr.splitlines() if "error:" in line]
        assert done.returncode == 2 and len(errors) == 1 and said in errors[0], done.stderr
        assert "Traceback" not in done.stderr


def test_a_killed_run_is_drawn_without_its_cut_last_line(tmp_path, broken):
    from grpo_debug.show.timeline import read_run

    killed = tmp_path / "killed"
    killed.mkdir()
    text = (broken[0] / "health.jsonl").read_text()
    (killed / "health.jsonl").write_text(text + text.splitlines()[0][:40])  # killed in the middle of a line
    run = read_run(killed)
    assert run.unfinished and [r["step"] for r in run.lines] == list(range(1, STEPS + 1))


def test_a_line_torn_by_a_full_disk_is_left_out_and_the_rest_drawn(tmp_path, broken):
    """A disk full while step 2's line was written left half of it; the writer of an older release appended step 3's
    line onto the next line: the run is drawn from every whole line, the cut one said. Today's writer cuts a
    failed write back (`append_line`), and starts a new line after a cut one."""
    from grpo_debug.capture.writing import append_line
    from grpo_debug.show.timeline import read_run

    lines = (broken[0] / "health.jsonl").read_text().splitlines()
    torn = tmp_path / "torn"
    torn.mkdir()
    (torn / "health.jsonl").write_text(lines[0] + "\n" + lines[1][:30] + "\n" + "\n".join(lines[2:]) + "\n")
    run = read_run(torn)
    assert run.unfinished and [r["step"] for r in run.lines] == [1, *range(3, STEPS + 1)], [
        r["step"] for r in run.lines
    ]
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "health.jsonl").write_text(lines[0] + "\n" + lines[1][:30])  # killed mid-line, then resumed
    append_line(cut / "health.jsonl", json.loads(lines[2]))
    assert (cut / "health.jsonl").read_text().splitlines()[2] == json.dumps(json.loads(lines[2])), (
        "appended onto a cut line"
    )
    assert [r["step"] for r in read_run(cut).lines] == [1, 3]


@pytest.mark.slow  # `make test-slow`: Chromium
def test_the_run_page_opens_in_a_real_browser_and_links_the_doctors_report(tmp_path, broken):
    from test_browser import ARTIFACTS, _standalone_page

    flight, page = broken[0], tmp_path / "run.html"
    made = run_cli("timeline", str(flight), "--html", str(page), "--doctor", "--no-flip")
    assert made.returncode == 0, made.stderr[-3000:]
    report = flight / "reports" / f"step-{TURNS_CONSTANT}.html"
    assert report.is_file() and "zero_std_groups" in report.read_text()
    with _standalone_page(page) as (browser, requests, errors):
        browser.wait_for_selector("svg.series", timeout=30_000)
        charts = browser.evaluate("() => [...document.querySelectorAll('svg.series')].map(s => s.dataset.id)")
        captured = browser.evaluate("() => document.querySelectorAll('svg.series line.captured').length")
        links = browser.evaluate("() => [...document.querySelectorAll('a.report, a.capture')].map(a => a.href)")
        problems = browser.evaluate("() => document.querySelectorAll('svg circle.problem').length")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        browser.screenshot(path=str(ARTIFACTS / "browser_run_timeline.png"), full_page=True)
    assert not errors, errors
    assert all(u.startswith("file://") for u in requests), [u for u in requests if not u.startswith("file://")]
    assert {"zero_std_groups", "constant_reward", "truncation", "grad_norm", "reward"} <= set(charts), charts
    assert captured == len(charts), "every chart marks the captured step"
    assert problems >= 2 * (STEPS - TURNS_CONSTANT + 1), "both problems drawn from the step the reward turned"
    readme = flight / f"step-{TURNS_CONSTANT}" / "README.md"
    assert report.resolve().as_uri() in links and readme.resolve().as_uri() in links, links


@pytest.mark.slow  # `make test-slow`: a benchmark's quick mode, as tests/test_benchmarks.py
def test_the_benchmark_runs_in_quick_mode(tmp_path):
    from test_benchmarks import run_quick

    report = run_quick("flight_recorder.py", (), tmp_path)
    for model in ("bundled", "user_2_layers"):
        r = report[model]
        assert r["median_without"] > 0 and r["median_with"] > 0 and r["ratio"] > 0
        assert r["identical_training"], f"{model}: the recorder changed the run"
        assert r["health_lines"] == [report["steps"]]
    assert report["quick"] is True


def test_the_readme_states_the_recorders_defaults():
    """The README's sentence on the flight recorder states its defaults: they are the code's."""
    from grpo_debug.capture import flight

    readme = " ".join(documentation().split())
    assert f"grad_norm passes {flight.GRAD_SPIKE:g} x its running median" in readme, "README: grad_spike"
    assert f"more than {'one' if flight.REWARD_DROP == 1 else flight.REWARD_DROP} reward_std" in readme
    first = {5: "four"}.get(flight.MAX_CAPTURES, "?")
    assert f"`max_captures` ({flight.MAX_CAPTURES}) keeps the first {first}" in readme, "README: max_captures"
