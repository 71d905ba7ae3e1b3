"""What a fix does to learning (`doctor.horizon`): the step continued for a few steps with and without a fix, from
the same seeds. A continuation leaves the step as it was; the same seed continues alike, so a fix that changes
nothing differs by exactly 0; the doctor follows each cause's fix and ranks by it; a capture without reward
functions for new completions says it cannot."""

import json
import math

import pytest
import torch

from grpo_debug.config import StepConfig
from grpo_debug.doctor import diagnose
from grpo_debug.doctor.horizon import compare, continuations, continue_step
from grpo_debug.doctor.present import text
from grpo_debug.step import GRPOStep

pytestmark = pytest.mark.usefixtures("task_registry_restored")
SMALL = dict(num_prompts=2, num_generations=4, max_new_tokens=24)


@pytest.fixture(scope="module")
def step():
    return GRPOStep(StepConfig(**SMALL, position_ids=False))


def test_a_continuation_leaves_the_step_as_it_was(step):
    run = step.run(until="update")
    start = {k: v.clone() for k, v in step.initial_state.items()}
    before = (step.result, step.cfg, step.optimizer, step.at_reference)
    continued = continuations(step, {}, steps=3, seeds=[0])
    assert len(continued[0].rewards) == 3 and continued[0].kl_to_start > 0, continued
    assert (step.result, step.cfg, step.optimizer, step.at_reference) == before, "the trial left the step changed"
    assert step.result is run and all(torch.equal(start[k], v) for k, v in step.initial_state.items())
    weights = step.policy.state_dict()
    assert all(torch.equal(start[k], weights[k]) for k in start), "the policy is not back at the step's start"


def test_with_dropout_on_the_same_seed_still_continues_alike():
    """Dropout masks are drawn per step from the continuation's seed: the same numbers every time."""
    dropout = GRPOStep(StepConfig(**SMALL, dropout=True, sample_dropout=True))
    dropout.run(until="update")
    first, again = (continuations(dropout, {}, steps=2, seeds=[0]) for _ in range(2))
    assert first == again, f"dropout on: the same seed continued otherwise ({first} against {again})"


def test_the_same_seed_continues_alike_and_a_fix_that_changes_nothing_differs_by_zero(step):
    first, again = (continuations(step, {}, steps=2, seeds=[0, 1]) for _ in range(2))
    assert [c.rewards for c in first] == [c.rewards for c in again], "the same seeds gave other continuations"
    nothing = continuations(step, {"kl_estimator": "k1"}, steps=2, seeds=[0, 1])  # beta 0: no KL term at all
    effect = compare(first, nothing)
    assert effect["difference"]["mean"] == 0.0 and effect["reward_as_run"] == effect["reward_fixed"], effect
    assert "not detected" in effect["verdict"], effect["verdict"]


def test_the_doctor_follows_each_cause_and_says_so(step):
    report = diagnose(step, held_out=0, horizon=2, horizon_seeds=2)
    followed = [f for f in report.findings if f.learning]
    causes = [f.id for f in report.causes() if f.fixed_with or f.effect]
    assert followed and {f.id for f in followed} <= set(causes), (followed, causes)
    assert all(f.learning["steps"] == 2 and f.learning["seeds"] == [0, 1] for f in followed), followed
    for severity in ("problem", "warning"):  # within a severity, the larger gain first
        gains = [f.learning["difference"]["mean"] for f in report.causes() if f.severity == severity and f.learning]
        assert gains == sorted(gains, reverse=True), f"{severity} causes not ranked by their fix's gain: {gains}"
    shown = text(report)
    assert "followed 2 steps x 2 seeds" in shown and "each cause's fix followed 2 steps" in shown, shown
    assert report.horizon == {**report.horizon, "steps": 2, "seeds": 2}, report.horizon
    for f in followed:  # each seed's KL after every step; the last is the KL to the start the verdict states
        for arm, at in zip(("as_run", "fixed"), f.learning["kl_to_start"]):
            last = [kl[-1] for kl in f.learning["kl_by_seed"][arm]]
            assert len(last) == 2 and abs(sum(last) / 2 - at) <= 1e-12 * max(at, 1.0), (f.id, arm, last, at)
    from grpo_debug.ui.doctor_page import page

    html = page(report)
    assert html.count("KL to the start (nats/token)") == len(followed), "a followed cause without its horizon plot"

    def refuse(constant):
        raise AssertionError(f"{constant} in the report's JSON")

    from grpo_debug.runs.results import strict_json

    out = json.loads(json.dumps(strict_json(report.to_json()), allow_nan=False), parse_constant=refuse)
    assert out["horizon"]["steps"] == 2 and all(math.isfinite(v) for v in out["horizon"]["as_run_rewards_by_step"])


def test_the_plan_is_cut_to_the_budget_causes_first_then_steps_then_seeds():
    from grpo_debug.doctor.diagnose import fit, plan_line

    whole = fit(None, 1.0, causes=3, steps=8, seeds=3)
    assert (whole["causes"], whole["steps"], whole["seeds"], whole["estimate"]) == (3, 8, 3, 96.0), whole
    cut = fit(40.0, 1.0, causes=3, steps=8, seeds=3)
    assert (cut["causes"], cut["steps"], cut["seeds"]) == (1, 8, 2) or cut["estimate"] <= 40.0, cut
    assert cut["causes"] == 1 and cut["estimate"] <= 40.0, f"causes go first, and the plan fits 40 s: {cut}"
    tight = fit(5.0, 1.0, causes=3, steps=8, seeds=3)
    assert (tight["causes"], tight["steps"], tight["seeds"]) == (1, 2, 2), f"the floor is 1 cause x 2 x 2: {tight}"
    assert "cut 2 of 3 causes, steps 8 -> 2, seeds 3 -> 2" in plan_line(tight, 3), plan_line(tight, 3)


@pytest.mark.slow  # `make test-slow`: two doctors with a horizon (about three minutes on two cores)
def test_the_horizon_keeps_to_its_budget(step):
    """A budget (the whole diagnosis's) that leaves the horizon room for its smallest plan but not for all it asks:
    the doctor times one step, cuts the plan, says what it cut, and the diagnosis takes no more than the budget and
    20%. The room is set from what the doctor's own gate reckons a step costs (the step with its detectors, an upper
    bound) as well as from the horizon's timed step, so that a machine where the two differ still tests the cut."""
    import time

    from grpo_debug.doctor.deadline import RESERVE

    dropout = GRPOStep(StepConfig(**SMALL, dropout=True, sample_dropout=True, position_ids=False))
    t0 = time.perf_counter()
    free = diagnose(dropout, held_out=0, horizon=4, horizon_seeds=3)
    whole = time.perf_counter() - t0
    assert free.horizon["steps"] == 4, f"no budget: nothing is cut ({free.horizon})"
    per_step = free.horizon["seconds_per_step"]
    phases = free.budget["phases"]
    rest = whole - phases["the horizon"]  # the diagnosis before its horizon
    causes = len([f for f in free.findings if f.learning])
    asked = (1 + causes) * 3 * 4 * per_step  # every cause's arm and the run's, 3 seeds x 4 steps
    room = max(14 * per_step, 12 * phases["the step and its detectors"])  # the gate asks (2 + 2x2x2) x that bound
    assert room < asked - 2 * per_step, f"the room ({room:.1f} s) holds all the horizon asks ({asked:.1f} s)"
    budget = (1.1 * rest + room) / (1 - RESERVE)
    t0 = time.perf_counter()
    cut = diagnose(dropout, held_out=0, horizon=4, horizon_seeds=3, budget=budget)
    spent = time.perf_counter() - t0
    h = cut.horizon
    assert h["steps"], f"the horizon was cut whole with room for its smallest plan: {h}, {cut.budget}"
    assert h["cut"]["causes"] or h["steps"] < 4 or h["seeds"] < 3, f"nothing of the plan was cut: {h}"
    assert h["cut"]["steps_asked"] == 4 and h["cut"]["seeds_asked"] == 3, h
    assert spent <= 1.2 * budget + 2 * per_step, f"the diagnosis took {spent:.1f} s against a budget of {budget:.1f} s"


def test_a_fix_that_samples_otherwise_is_read_where_both_arms_sample_alike(step):
    """A colder or hotter sampler earns another batch reward from the same weights: such an arm is compared on the
    reward of the policy it left, sampled as the run samples at a seed both arms share. A change of sampling that
    samples alike (top_p 1.0 where it is 1.0) leaves the same weights, so the two differ by exactly 0."""
    step.run(until="update")
    as_run = continuations(step, {}, steps=2, seeds=[0, 1])
    assert all(c.sampled_as_run and c.end_reward is not None for c in as_run), as_run
    alike = compare(as_run, continuations(step, {"top_p": 1.0}, steps=2, seeds=[0, 1]))
    assert alike["measured"].startswith("reward after the K steps"), alike["measured"]
    assert alike["difference"]["mean"] == 0.0, f"a sampler that samples alike differs: {alike['difference']}"
    hotter = continuations(step, {"temperature": 1.5}, steps=2, seeds=[0, 1])
    effect = compare(as_run, hotter)
    assert effect["reward_fixed"] == [c.end_reward for c in hotter], "the hotter arm read from its own batches"
    assert effect["reward_as_run"] == [c.end_reward for c in as_run], "the run read from its batches, not the end"
    assert "sampled as the run samples" in effect["verdict"], effect["verdict"]
    kept = compare(as_run, continuations(step, {"kl_estimator": "k1"}, steps=2, seeds=[0, 1]))
    assert kept["measured"] == "batch reward of steps 2..K", f"a fix that samples alike is read otherwise: {kept}"
    unread = [continue_step(step, {}, 2, s, end_reward=False) for s in (0, 1)]
    assert all(c.end_reward is None for c in unread), "a continuation sampled an end batch it was not asked for"
    with pytest.raises(AssertionError, match="end_reward=True"):
        compare(unread, hotter)
