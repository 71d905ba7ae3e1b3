"""The doctor's tiers, on both sides of each threshold: `update_size` by the KL one update makes on its own
completions, `kl_blowup` by the KL to the reference (exact where measured, else TRL's logged kl), and the
recorder's kl signal with the same thresholds. The thresholds are tied to the committed calibration
(data/calibration/update_size.json): the test fails if the constants and the measurement part."""

import dataclasses
import json
from pathlib import Path

import pytest

from grpo_debug.capture import health
from grpo_debug.config import StepConfig
from grpo_debug.doctor import detectors as d
from grpo_debug.doctor import examine
from grpo_debug.step import GRPOStep

CALIBRATION = Path(__file__).resolve().parent.parent / "data" / "calibration" / "update_size.json"


@pytest.fixture(scope="module")
def facts():
    step = GRPOStep(StepConfig(num_prompts=2, num_generations=4, max_new_tokens=16, beta=0.04))
    facts, _, _ = examine(step)
    return facts


def test_the_update_is_measured_as_the_kl_it_makes(facts):
    assert facts.step_kl is not None and facts.step_kl >= 0, f"the step's update KL was not measured: {facts.step_kl}"
    finding = d.update_size(facts)
    assert finding.evidence["moved_kl"] == facts.step_kl and "nats per token" in finding.summary, finding


def both_sides(warning: float, problem: float) -> list[tuple[float, str]]:
    """Each threshold and just below it, with the severity expected there."""
    return [(warning * 0.99, "absent"), (warning, "warning"), (problem * 0.99, "warning"), (problem, "problem")]


@pytest.mark.parametrize(("kl", "severity"), both_sides(d.MOVED_KL_WARNING, d.MOVED_KL_PROBLEM))
def test_update_size_tiers(facts, kl, severity):
    finding = d.update_size(dataclasses.replace(facts, step_kl=kl))
    assert finding.severity == severity, f"an update KL of {kl} is {finding.severity}, not {severity}: {finding}"


@pytest.mark.parametrize(("kl", "severity"), both_sides(d.KL_BLOWUP_WARNING, d.KL_BLOWUP_PROBLEM))
def test_kl_blowup_tiers_exact_logged_and_the_recorder(facts, kl, severity):
    exact = d.kl_blowup(dataclasses.replace(facts, kl_against_exact={"exact_kl": kl}))
    logged = d.kl_blowup(dataclasses.replace(facts, kl_against_exact=None, logged_kl=kl))
    assert exact.severity == severity and "exact KL" in exact.summary, exact
    assert logged.severity == severity and "logged kl" in logged.summary, logged
    recorder = {"absent": "ok"}.get(severity, severity)
    assert health.kl_blowup(kl).severity == recorder, f"the recorder and the doctor disagree at kl {kl}"


def test_kl_blowup_is_quiet_without_a_reference(facts):
    finding = d.kl_blowup(dataclasses.replace(facts, kl_against_exact=None, logged_kl=None))
    assert finding.severity == "absent" and "beta = 0" in finding.summary, finding
    assert health.kl_blowup(None).severity == "ok"


def test_the_tiers_are_what_the_calibration_measured():
    """Below the warning, one step left the held-out reward within 0.05 on every seed; at or past the problem
    level, every seed lost at least 0.3 of it; and the seeds are independent runs (3 or more)."""
    records = json.loads(CALIBRATION.read_text())["records"]
    assert len({r["seed"] for r in records}) >= 3, "the calibration has fewer than 3 seeds"
    quiet = [r for r in records if r["moved_kl"] < d.MOVED_KL_WARNING]
    broken = [r for r in records if r["moved_kl"] >= d.MOVED_KL_PROBLEM]
    assert quiet and broken, "the calibration has no step on one side of the tiers"
    moved = [r for r in quiet if abs(r["reward_change"]) >= 0.05]
    assert not moved, f"steps below MOVED_KL_WARNING moved the held-out reward: {moved}"
    kept = [r for r in broken if r["reward_change"] > -0.3]
    assert not kept, f"steps past MOVED_KL_PROBLEM kept the held-out reward: {kept}"


@pytest.mark.slow  # `make test-slow`: the calibration script end to end in its quick mode
def test_the_calibration_runs(tmp_path):
    from grpo_debug.doctor.calibration import main

    main(["--json", str(tmp_path / "out.json"), "--seeds", "1", "--quick"])
    out = json.loads((tmp_path / "out.json").read_text())
    assert {"command", "date", "commit", "records", "by_learning_rate"} <= out.keys(), sorted(out)
    assert len(out["records"]) == 3 and all(r["moved_kl"] >= 0 for r in out["records"]), out["records"]


def with_rewards(facts, per_function: dict, weights=None):
    """The facts with other reward functions (each (N,), NaN where None); the total as TRL sums them."""

    weights = weights or (1.0,) * len(per_function)
    total = sum(w * v.nan_to_num(0.0) for w, v in zip(weights, per_function.values()))
    rewards = dataclasses.replace(facts.run.rewards, per_function=per_function, total=total)
    return dataclasses.replace(facts, run=dataclasses.replace(facts.run, rewards=rewards), reward_weights=weights)


def test_a_function_erased_by_another_is_a_warning_and_one_that_counts_is_not(facts):
    import torch

    n = len(facts.run.rewards.total)
    torch.manual_seed(0)
    small, large = torch.rand(n), torch.rand(n)
    erased = d.dominant_reward(with_rewards(facts, {"small": small, "large": 1000 * large}))
    assert erased.severity == "warning" and erased.evidence["erased"] == ["small"], erased
    kept = d.dominant_reward(with_rewards(facts, {"small": small, "large": 5 * large}))
    assert kept.severity in ("info", "absent") and "erased" not in kept.evidence, kept


def test_none_rewards_for_a_quarter_of_the_completions_is_a_warning(facts):
    import torch

    n = len(facts.run.rewards.total)
    at = int(n * d.NONE_WARNING)
    for nones, severity in ((at, "warning"), (at - 1, "info")):
        values = torch.rand(n)
        values[:nones] = float("nan")
        finding = d.bad_reward(with_rewards(facts, {"sometimes": values}))
        assert finding.severity == severity, f"{nones} of {n} None rewards: {finding.severity}, not {severity}"
