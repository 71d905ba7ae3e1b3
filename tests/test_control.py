"""The positive control (data/experiments/control_plan.json, notebook 06b section 6): its plan came before its
results, its learning rate was chosen by the plan's rule on validation prompts, its runs are the plan's commands,
and README states its verdict as computed."""

import json
import subprocess

import pytest
from documentation import documentation  # tests/

from grpo_debug.files import DATA_DIR, ROOT
from grpo_debug.runs.control import chosen_rate, headline, positive_control, rates
from grpo_debug.runs.results import detected

EXPERIMENTS = DATA_DIR / "experiments"
PLAN = json.loads((EXPERIMENTS / "control_plan.json").read_text())


def first_commit(path) -> str:
    out = subprocess.run(
        ["git", "log", "--diff-filter=A", "--format=%H", "--", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out, f"{path} was never committed"
    return out[-1]


def history_is_whole() -> bool:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return False
    return out.stdout.strip() == "false"


@pytest.mark.skipif(not history_is_whole(), reason="needs the project's git history (a clone, not shallow)")
def test_the_plan_was_committed_before_any_of_its_results():
    plan = first_commit(EXPERIMENTS / "control_plan.json")
    for result in ("control_lr_a.json", "control_lr_b.json", "control_a.json", "control_b.json"):
        made = first_commit(EXPERIMENTS / result)
        before = subprocess.run(["git", "merge-base", "--is-ancestor", plan, made], cwd=ROOT).returncode == 0
        assert before and plan != made, f"{result} was committed before control_plan.json, or with it"


def test_the_learning_rate_is_the_plans_rule_on_validation_prompts():
    table = rates(EXPERIMENTS)
    assert sorted(table) == PLAN["stage_1"]["learning_rates"]
    best = max(table, key=lambda lr: (table[lr], -lr))
    assert chosen_rate(EXPERIMENTS) == repr(best)
    for file in ("control_lr_a.json", "control_lr_b.json"):
        stored = json.loads((EXPERIMENTS / file).read_text())
        assert stored["eval_set"] == "validation" and stored["command"] in PLAN["stage_1"]["commands"]


def test_the_control_ran_the_plans_commands_at_the_chosen_rate_on_new_seeds():
    control = positive_control(EXPERIMENTS)
    commands = [c.format(lr=chosen_rate(EXPERIMENTS)) for c in PLAN["stage_2"]["commands"]]
    assert control["command"] == commands, "the control's files were not made by the plan's commands"
    assert list(control["arms"]) == PLAN["stage_2"]["arms"] and control.get("eval_set", "test") == "test"
    assert (control["steps"], control["seeds"], control["first_seed"]) == (24, 8, 40)
    change = control["summary"]["fixed"]["change_from_start"]
    assert change["family_size"] == 4 and abs(change["level"] - 0.9875) < 1e-12, "the plan's family and level"


def test_readme_and_notebook_state_the_control_as_computed():
    control = positive_control(EXPERIMENTS)
    line = headline(control)
    said = " ".join(documentation().split())
    assert line in said, f"docs/notebooks.md does not state the positive control as computed: {line}"
    below = {arm: control["summary"][arm]["minus_fixed"] for arm in ("trl", "dropout", "no_temperature")}
    found = {arm: detected(d) for arm, d in below.items()}
    assert found == {"trl": True, "dropout": True, "no_temperature": False}, "README's secondary sentence"
    assert below["trl"]["mean"] < 0 and below["dropout"]["mean"] < 0 and below["trl"]["family_size"] == 3
    cells = json.loads((ROOT / "notebooks" / "06b_training.ipynb").read_text())["cells"]
    printed = " ".join("".join(o.get("text", "")) for c in cells for o in c.get("outputs", []))
    assert line in " ".join(printed.split()), "notebook 06b's stored output does not print the computed verdict"
