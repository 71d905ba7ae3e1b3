"""The trainer's step, whole: real GRPOTrainer runs of a user's script (tests/user_train.py: a plain GRPOConfig, a
tiny Qwen2 in the user's folder, run from another directory) that take a part of TRL the replay must follow, each
replayed, landed and diagnosed as the trainer took it.

- a partly frozen model (`requires_grad=False` on all but the final norm before the trainer is built)
- `mask_truncated_completions=True`: TRL scores a truncated completion's text, then masks it from the loss"""

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
