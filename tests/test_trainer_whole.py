"""The trainer's step, whole: real GRPOTrainer runs of a user's script (tests/user_train.py: a plain GRPOConfig, a
tiny Qwen2 in the user's folder, run from another directory) that take a part of TRL the replay must follow, each
replayed, landed and diagnosed as the trainer took it.

- a partly frozen model (`requires_grad=False` on all but the final norm before the trainer is built)
- `mask_truncated_completions=True`: TRL scores a truncated completion's text, then masks it from the loss
- a reward that reads a dataset column (`def correct(prompts, completions, answer, **kwargs)`)"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
from tiny_capture import qwen2_user, user_train_run  # noqa: E402

from grpo_debug.capture import open_capture  # noqa: E402
from grpo_debug.capture.landing import landing  # noqa: E402
from grpo_debug.capture.replay import reproduction  # noqa: E402

pytestmark = pytest.mark.usefixtures("task_registry_restored")
FINAL_NORM = "model.norm"


@pytest.fixture(scope="module")
def user(tmp_path_factory) -> Path:
    return qwen2_user(tmp_path_factory.mktemp("user"))


@pytest.fixture(scope="module")
def frozen(user) -> Path:
    """A 3-step run training only the final norm, steps 2 and 3 captured."""
    return user_train_run(user, "frozen", {"train_only": FINAL_NORM, "max_steps": 3, "capture": [2, 3]})


@pytest.fixture(scope="module")
def truncated(user) -> Path:
    """A 2-step run under mask_truncated_completions (16 tokens: a tiny random model rarely stops), step 2 captured."""
    return user_train_run(user, "truncated", {"mask_truncated_completions": True, "capture": [2]})


@pytest.fixture(scope="module")
def answered(user) -> Path:
    """A 2-step run whose dataset holds each prompt's answer, read by the reward function `correct`."""
    return user_train_run(user, "answered", {"answer_column": True, "capture": [2]})


def command(*argv, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpo_debug", *map(str, argv)], cwd=cwd, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


def reproduced(report: dict) -> list[str]:
    logged, replayed = report["logged"], report["replayed"]
    return [k for k in logged if abs(replayed[k] - logged[k]) <= 1e-4 * max(abs(logged[k]), abs(replayed[k])) + 1e-7]


def test_a_partly_frozen_run_is_replayed_with_the_same_part_frozen_and_lands_on_the_next_step(frozen):
    meta = json.loads((frozen / "step-2" / "capture.json").read_text())
    assert meta["policy"]["trainable"] == [f"{FINAL_NORM}.weight"], meta["policy"].get("trainable")
    step = open_capture(frozen / "step-2")
    trains = [n for n, p in step.policy.named_parameters() if p.requires_grad]
    assert trains == [f"{FINAL_NORM}.weight"], f"the replay trains {trains}, the run trained only the final norm"
    run = step.run(until="update")
    report = reproduction(run, step.capture, step.policy, step)
    assert report["logged"] and reproduced(report) == list(report["logged"]), (
        f"the replay of a partly frozen step is not the trainer's: {report['logged']} vs {report['replayed']}"
    )
    land = landing(step, frozen / "step-3")
    assert land["cosine"] >= 0.999 and abs(land["norm_ratio"] - 1) <= 1e-3, f"the update does not land: {land}"
    assert land["max_abs_difference"] < 0.1 * land["learning_rate"], f"the weights after are not the trainer's: {land}"


def test_a_partly_frozen_run_is_diagnosed_from_another_directory(frozen, user, tmp_path):
    out = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "grpo_debug", "doctor", str(frozen / "step-2"), "--task", "user_train.py:REWARD_FUNCS",
         "--horizon", "0", "--held-out", "0", "--json", str(out)],
        cwd=user, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, f"the doctor refused a partly frozen run:\n{done.stderr[-2000:]}"
    findings = json.loads(out.read_text())["findings"]
    assert all("no optimizer group" not in json.dumps(f) for f in findings), findings


def test_an_old_capture_without_the_trainable_list_freezes_what_the_optimizer_groups_did_not_hold(frozen, tmp_path):
    import shutil

    from grpo_debug.cli.commands import main

    old = tmp_path / "step-2"
    shutil.copytree(frozen / "step-2", old)
    meta = json.loads((old / "capture.json").read_text())
    del meta["policy"]["trainable"]
    (old / "capture.json").write_text(json.dumps(meta))
    assert main(["reseal", str(old)]) == 0
    step = open_capture(old)
    trains = [n for n, p in step.policy.named_parameters() if p.requires_grad]
    assert trains == [f"{FINAL_NORM}.weight"], f"read from the optimizer's groups, the replay trains {trains}"


def test_under_mask_truncated_completions_rewards_are_recomputed_on_the_texts_trl_scored(truncated, user):
    step = open_capture(truncated / "step-2", f"{user / 'user_train.py'}:REWARD_FUNCS")
    meta, mask = step.capture.meta, step.capture.batch["completion_mask"]
    masked = int((~mask.bool().any(1)).sum())
    assert masked >= 2, f"the run truncated {masked} completions: the test needs some"
    run = step.run(until="update")
    assert list(run.rollout.completions) == meta["completions"], (
        "the texts handed to the reward functions are not the ones TRL logged for this step"
    )
    for name, logged in meta["rewards"].items():
        ours = run.rewards.per_function[name].tolist()
        assert all(abs(a - b) <= 1e-6 for a, b in zip(ours, logged)), f"{name}: recomputed {ours}, TRL's {logged}"
    report = reproduction(run, step.capture, step.policy, step)
    for name in ("reward", "reward_std", "loss", "grad_norm"):
        assert name in report["logged"], f"TRL logged no {name}: {sorted(report['logged'])}"
    assert reproduced(report) == list(report["logged"]), (
        f"under mask_truncated_completions the replay is not the trainer's: {report['logged']} vs {report['replayed']}"
    )


def test_a_reward_that_reads_a_dataset_column_is_recomputed_as_trl_called_it(answered, user, tmp_path):
    meta = json.loads((answered / "step-2" / "capture.json").read_text())
    assert "answer" in meta["columns"] and len(meta["columns"]["answer"]) == len(meta["completions"]), meta["columns"]
    assert list(meta["rewards"]) == ["digits", "short", "correct"], list(meta["rewards"])
    for prompt, answer in zip(meta["prompts"], meta["columns"]["answer"]):  # each row's own answer, in row order
        a, b = prompt.removeprefix("What is ").removesuffix("? ").split("+")
        assert answer == int(a) + int(b), f"row {prompt!r} captured with the answer {answer}"
    step = open_capture(answered / "step-2", f"{user / 'user_train.py'}:COLUMN_REWARD_FUNCS")
    run = step.run(until="update")
    for name, logged in meta["rewards"].items():
        ours = run.rewards.per_function[name].tolist()
        assert all(abs(a - b) <= 1e-6 for a, b in zip(ours, logged)), f"{name}: recomputed {ours}, TRL's {logged}"
    new = step.run(step.cfg, until="rewards", remember=False).rollout  # the captured rollout: the same rows
    assert len(new.completions) == len(meta["completions"])
    out = tmp_path / "replay.json"
    done = command(
        "replay", answered / "step-2", "--task", "user_train.py:COLUMN_REWARD_FUNCS", "--json", out, cwd=user
    )
    assert done.returncode == 0, f"replay --task refused a reward that reads a column:\n{done.stderr[-2000:]}"
    replayed = json.loads(out.read_text())
    assert abs(replayed["replayed"]["reward"] - replayed["logged"]["reward"]) <= 1e-6, replayed
    out = tmp_path / "doctor.json"
    done = command("doctor", answered / "step-2", "--task", "user_train.py:COLUMN_REWARD_FUNCS", "--horizon", "0",
                   "--held-out", "0", "--json", out, cwd=user)  # fmt: skip
    assert done.returncode == 0, f"doctor --task refused a reward that reads a column:\n{done.stderr[-2000:]}"


def test_a_column_the_capture_does_not_hold_is_refused_in_one_line_naming_it(truncated, user):
    done = command("replay", truncated / "step-2", "--task", "user_train.py:correct", cwd=user)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and "needs 'answer'" in lines[-1] and "no dataset column" in lines[-1], done.stderr


def test_a_reward_function_weighted_0_is_named_where_it_silences_the_function(user, tmp_path):
    """TRL's reward_weights [0, 1, 0]: digits and correct are logged, and nothing they score reaches an advantage."""
    weighted = user_train_run(user, "weighted", {"answer_column": True, "reward_weights": [0.0, 1.0, 0.0]})
    out = tmp_path / "doctor.json"
    done = command("doctor", weighted / "step-2", "--no-flip", "--horizon", "0", "--held-out", "0", "--json", out,
                   cwd=user)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    constant = next(f for f in json.loads(out.read_text())["findings"] if f["id"] == "constant_reward")
    assert constant["evidence"]["weighted_zero"] == ["digits", "correct"], constant
    said = constant["summary"] if "summary" in constant else json.dumps(constant)
    assert "digits, correct are weighted 0" in said, f"the weight of 0 is named nowhere: {said}"


@pytest.mark.slow
def test_a_reward_that_reads_a_dataset_column_is_followed_over_steps_by_the_horizon(answered, user, tmp_path):
    """The horizon samples new completions of the captured prompts and scores them with `correct`, which needs each
    prompt's answer: every new completion keeps its prompt's column."""
    out = tmp_path / "doctor.json"
    done = command("doctor", answered / "step-2", "--task", "user_train.py:COLUMN_REWARD_FUNCS", "--horizon", "2",
                   "--held-out", "0", "--json", out, cwd=user)  # fmt: skip
    assert done.returncode == 0, f"the horizon failed on a reward that reads a column:\n{done.stderr[-2000:]}"
    horizon = json.loads(out.read_text())["horizon"]
    assert horizon["steps"] == 2 and len(horizon["as_run_rewards_by_step"]) == 2, horizon


def test_the_flight_recorder_keeps_the_columns_and_its_captures_replay_with_them(user, tmp_path):
    """A run recorded by the FlightRecorder (no CaptureCallback), its dataset holding each prompt's answer: the step
    it captured holds the column, and `replay --task` recomputes `correct` from it as TRL did."""
    flight = user_train_run(user, "flown", {"answer_column": True, "flight": True, "max_steps": 3})
    steps = sorted(flight.glob("step-*"))
    assert steps, f"the recorder captured no step (its health: {(flight / 'health.jsonl').read_text()[:800]})"
    meta = json.loads((steps[0] / "capture.json").read_text())
    assert len(meta["columns"]["answer"]) == len(meta["completions"]), meta.get("columns_dropped")
    out = tmp_path / "replay.json"
    done = command("replay", steps[0], "--task", "user_train.py:COLUMN_REWARD_FUNCS", "--json", out, cwd=user)
    assert done.returncode == 0, f"replay --task refused a flight capture with a column:\n{done.stderr[-2000:]}"
    assert max(json.loads(out.read_text())["rewards"].values()) <= 1e-6, json.loads(out.read_text())["rewards"]


def test_a_reward_that_reads_the_trainer_state_is_recomputed_at_the_captured_step(user, tmp_path):
    """TRL passes trainer_state (and log_metric, log_extra) to every reward function: a curriculum that reads the
    global step is recomputed at the step the trainer was at, and `replay --task` gives its logged rewards."""
    staged = user_train_run(user, "staged", {"staged": True, "max_steps": 3, "capture": [3]})
    out = tmp_path / "replay.json"
    done = command("replay", staged / "step-3", "--task", "user_train.py:STAGED_REWARD_FUNCS", "--json", out,
                   cwd=user)  # fmt: skip
    assert done.returncode == 0, f"replay --task refused a reward that reads trainer_state:\n{done.stderr[-2000:]}"
    drift = json.loads(out.read_text())["rewards"]
    assert drift["staged"] <= 1e-6, f"the curriculum was recomputed at another step than the trainer's: {drift}"
