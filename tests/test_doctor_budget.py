"""`--budget` bounds the whole diagnosis (issue 72): the step and its detectors always run; the resample, the
flips, the probe and the horizon take what is left and are cut before they would run past it; the report says what
was cut and where the seconds went. No timing is asserted here (benchmarks/doctor.py measures how well it holds):
a budget too small for anything past the step cuts everything past it, on any machine."""

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_debug.config import StepConfig
from grpo_debug.doctor import diagnose
from grpo_debug.doctor.deadline import RESERVE, Deadline
from grpo_debug.doctor.present import budget_line, text
from grpo_debug.step import GRPOStep

sys.path.insert(0, str(Path(__file__).resolve().parent))
SMALL = dict(num_prompts=2, num_generations=4, max_new_tokens=8, learning_rate=1e-3, position_ids=False)


def test_a_deadline_without_a_budget_never_ends_and_one_with_it_keeps_its_reserve():
    assert Deadline(None, time.perf_counter()).left() == math.inf and Deadline(None, 0.0).for_phase() is None
    now = time.perf_counter()
    d = Deadline(10.0, now)
    assert 10.0 * (1 - RESERVE) - 1 < d.left() <= 10.0 * (1 - RESERVE), "the reserve is not kept back"
    assert d.holds(1.0) and not d.holds(10.0), "a phase longer than the time left was let run"
    assert Deadline(10.0, now - 20).for_phase() == 0.0, "a spent budget left a phase negative seconds"


@pytest.fixture(scope="module")
def step():
    return GRPOStep(StepConfig(**SMALL))


def test_a_budget_spent_by_the_step_cuts_every_flip_the_probe_and_the_horizon_and_says_so(step):
    report = diagnose(step, budget=0.01, horizon=2, horizon_seeds=2, probe=2)
    assert {"the probe", "the horizon"} <= set(report.budget["cut"]), report.budget
    assert report.horizon["why"].startswith("cut for the budget") and report.probe["carries"] is None
    flippable = [f for f in report.findings if f.id == "position_ids"]
    assert flippable and flippable[0].effect is None, "a flip ran past a spent budget"
    assert "the flip of position_ids" in report.budget["cut"], report.budget
    assert flippable[0].severity in ("warning", "problem"), "a finding not flipped lost its detector's severity"
    assert set(report.budget["phases"]) >= {"the step and its detectors", "the flips"}, report.budget
    said = budget_line(report)
    assert said.startswith("budget 0.01 s (--budget)") and "cut to fit it: " in said and said in text(report)
    assert json.dumps(report.to_json()["budget"]), "the budget is not in the JSON"


def test_a_budget_that_holds_the_diagnosis_cuts_nothing_and_changes_nothing(step):
    unbounded = diagnose(step, held_out=0)
    bounded = diagnose(step, held_out=0, budget=3600.0)
    assert bounded.budget["cut"] == [] and "nothing cut" in budget_line(bounded)
    assert budget_line(unbounded) == "", "a diagnosis without a budget printed a budget line"
    assert [(f.id, f.severity, f.effect) for f in bounded.findings] == [
        (f.id, f.severity, f.effect) for f in unbounded.findings
    ], "a budget that cut nothing changed the findings"


def test_the_command_counts_its_loading_against_the_budget(tmp_path):
    """From another folder, as a user runs it: a budget of 1 s is spent by loading and the step."""
    done = subprocess.run(
        [sys.executable, "-m", "grpo_debug", "doctor", "--budget", "1", "--json", str(tmp_path / "r.json"), "--set"]
        + [f"{k}={v}" for k, v in SMALL.items()],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    written = json.loads((tmp_path / "r.json").read_text())
    assert written["budget"]["seconds"] == 1.0 and "the flip of position_ids" in written["budget"]["cut"]
    assert "budget 1 s (--budget)" in done.stdout and "doctor: the step run and examined" in done.stderr


def test_the_docs_state_the_budgets_the_command_uses():
    from documentation import documentation

    from grpo_debug.cli.arguments import BUDGET
    from grpo_debug.horizon_bounds import most

    said = " ".join(documentation().split())
    assert (
        f"default on a CPU {BUDGET['cpu']:g} s at `--horizon 0` and {BUDGET['cpu horizon']:g} s with a horizon, "
        f"{BUDGET['cuda']:g} s on a GPU" in said
    ), "docs/doctor.md's default budgets are not the command's"
    assert f"{most(BUDGET['cpu horizon'])} at {BUDGET['cpu horizon']:g} s, {most(BUDGET['cuda'])} at" in said
    assert f"{RESERVE:.0%} kept back for the report" in said, "docs/doctor.md's reserve is not deadline.RESERVE's"


@pytest.mark.parametrize(
    "cut, not_followed, said",
    [
        ({"causes": ["dropout"], "late": ["dropout"]}, {}, "cut for the budget, not followed: dropout"),
        ({"causes": ["dropout"], "late": []}, {}, "cut for the budget, not followed: dropout"),
        ({"causes": []}, {"truncation": "a length past the model's 64 positions"}, "truncation's fix not followed"),
    ],
    ids=["cut-when-the-machine-ran-slow", "cut-by-the-plan", "a-fix-the-steps-cannot-take"],
)
def test_a_horizon_that_left_a_cause_out_never_says_each_causes_fix_was_followed(cut, not_followed, said):
    """A cause planned and then cut when the machine ran slower than its timed step (a loaded machine) is a cut
    like the plan's own: the text names it and does not say that each cause's fix was followed."""
    from grpo_debug.doctor.present import horizon_line
    from grpo_debug.doctor.report import Report

    h = {"steps": 8, "seeds": 3, "level": 0.975, "cut": {**cut, "steps_asked": 8, "seeds_asked": 3}}
    line = horizon_line(Report((), {}, 0.0, horizon={**h, "not_followed": not_followed}))
    assert said in line and "each cause's fix" not in line, line
