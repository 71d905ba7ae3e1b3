"""The doctor's tiers, on both sides of each threshold: `update_size` by the KL one update makes on its own
completions, `kl_blowup` by the KL to the reference (exact where measured, else TRL's logged kl), and the
recorder's kl signal with the same thresholds. The thresholds are tied to the committed calibration
(data/calibration/update_size.json): the test fails if the constants and the measurement part."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from grpo_debug.capture import health
from grpo_debug.config import StepConfig
from grpo_debug.detectors import detectors as d
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


@pytest.mark.parametrize(
    ("share", "severity"), [(d.UPDATE_WARNING * 0.99, "absent"), (d.UPDATE_WARNING * 1.01, "warning")]
)
def test_an_update_that_moves_the_weights_past_a_hundredth_of_their_norm_warns_whatever_its_kl(facts, share, severity):
    """A confident policy's own completions show a KL near 0 for a large move (p near 1): the weights' share decides."""
    norm = facts.run.update.update_norm
    moved = dataclasses.replace(facts, step_kl=d.MOVED_KL_WARNING * 1e-3, weight_norm=norm / share)
    finding = d.update_size(moved)
    assert finding.severity == severity, f"a move of {share:.2%} of the weights' norm is {finding.severity}: {finding}"


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
    total[torch.stack(list(per_function.values())).isnan().all(0)] = float("nan")  # unscorable, as TRL marks it
    rewards = dataclasses.replace(facts.run.rewards, per_function=per_function, total=total)
    return dataclasses.replace(facts, run=dataclasses.replace(facts.run, rewards=rewards), reward_weights=weights)


def test_a_function_erased_by_another_is_a_warning_and_one_that_counts_is_not(facts):
    n = len(facts.run.rewards.total)
    torch.manual_seed(0)
    small, large = torch.rand(n), torch.rand(n)
    erased = d.dominant_reward(with_rewards(facts, {"small": small, "large": 1000 * large}))
    assert erased.severity == "warning" and erased.evidence["erased"] == ["small"], erased
    kept = d.dominant_reward(with_rewards(facts, {"small": small, "large": 5 * large}))
    assert kept.severity in ("info", "absent") and "erased" not in kept.evidence, kept
    normalised = facts.run.config.replace(multi_objective_aggregation="normalize_then_sum")
    erased_facts = with_rewards(facts, {"small": small, "large": 1000 * large})
    cured = d.dominant_reward(
        dataclasses.replace(erased_facts, run=dataclasses.replace(erased_facts.run, config=normalised))
    )
    assert cured.severity in ("info", "absent"), f"normalize_then_sum still erases a function: {cured}"


def test_none_rewards_for_a_quarter_of_the_completions_is_a_warning(facts):
    n = len(facts.run.rewards.total)
    at = int(n * d.NONE_WARNING)
    for nones, severity in ((at, "warning"), (at - 1, "info")):
        values = torch.rand(n)
        values[:nones] = float("nan")
        finding = d.bad_reward(with_rewards(facts, {"sometimes": values}))
        assert finding.severity == severity, f"{nones} of {n} None rewards: {finding.severity}, not {severity}"


def test_a_few_none_rewards_that_come_and_go_with_whitespace_are_a_warning(facts):
    """Below NONE_WARNING's share, a None is 'does not apply' unless the probe shows it moves with whitespace
    appended, content kept: then the function reads the text's form, and the rows it drops are no design."""
    from grpo_debug.detectors.probes import RewardProbe

    n = len(facts.run.rewards.total)
    values = torch.rand(n)
    values[:1] = float("nan")
    probe = RewardProbe("sometimes", 0.0, 0.0, 0.0, 0.0, 0.1, True, none_moved=0.5)
    steady = dataclasses.replace(probe, none_moved=0.0)
    for p, severity in ((probe, "warning"), (steady, "info")):
        one = with_rewards(facts, {"sometimes": values})
        finding = d.bad_reward(dataclasses.replace(one, reward_probes={"sometimes": p}))
        assert finding.severity == severity, f"1 of {n} None, none_moved {p.none_moved}: {finding.severity}"
        assert ("comes and goes with whitespace" in finding.summary) == (severity == "warning"), finding.summary


def test_a_none_that_only_whitespace_brings_is_a_warning_though_this_step_has_none(facts):
    """A function that returns None by the text's parity scores every completion of a step whose answers all have
    even length: the probe (one space appended, content kept) turns it None on NONE_WARNING's share or more, so it is
    named before a step with an odd answer loses those rows (stranger tuning seed 982)."""
    from grpo_debug.detectors.probes import RewardProbe

    n = len(facts.run.rewards.total)
    scored = with_rewards(facts, {"by_parity": torch.rand(n)})
    for moved, severity in ((1.0, "warning"), (d.NONE_WARNING, "warning"), (0.1, "absent")):
        probe = RewardProbe("by_parity", 0.0, 0.0, 0.0, 0.0, 0.1, True, none_moved=moved)
        finding = d.bad_reward(dataclasses.replace(scored, reward_probes={"by_parity": probe}))
        assert finding.severity == severity, f"no None, none_moved {moved}: {finding.severity}, not {severity}"
        assert ("no None on this step" in finding.summary) == (severity == "warning"), finding.summary


def test_completions_no_function_scored_are_a_problem_only_when_all_are(facts):
    n = len(facts.run.rewards.total)
    everywhere = d.bad_reward(with_rewards(facts, {"never": torch.full((n,), float("nan"))}))
    assert everywhere.severity == "problem" and everywhere.evidence["unscorable"] == n, everywhere
    values = torch.rand(n)
    values[: n - 1] = float("nan")
    but_one = d.bad_reward(with_rewards(facts, {"rarely": values}))
    assert but_one.severity == "warning" and but_one.evidence["unscorable"] == n - 1, but_one


def odd_rows_none(prompts, completions, **kwargs):
    return [None if i % 2 else float(len(c) % 3) for i, c in enumerate(completions)]


def odd_rows_infinite(prompts, completions, **kwargs):
    return [float("inf") if i % 2 else float(len(c) % 3) for i, c in enumerate(completions)]


def always_none(prompts, completions, **kwargs):
    return [None] * len(completions)


@pytest.mark.parametrize("funcs", [(odd_rows_none, always_none), (odd_rows_infinite,)], ids=["none", "infinite"])
def test_bad_rewards_are_named_beside_every_other_detector(funcs):
    """Rows no function scored (TRL 1.16: reward NaN, advantage 0) and infinite rewards (read as None by the
    doctor, a problem) are named by bad_reward while every other detector still runs on the step: the cut
    completions of max_new_tokens 4 among them."""
    from grpo_debug.doctor import diagnose
    from grpo_debug.task import Task, load_task

    bundled = load_task(StepConfig().task)
    task = Task("bad-rewards", bundled.prompts, funcs)
    step = GRPOStep(StepConfig(num_prompts=2, num_generations=4, max_new_tokens=4), task=task)
    report = diagnose(step, flip=False)
    found = {f.id: f for f in report.findings}
    assert len(found) == len(d.DETECTORS), f"some detectors did not run: {sorted(found)}"
    assert found["truncation"].severity != "absent", f"the cut completions went unseen: {found['truncation']}"
    bad = found["bad_reward"]
    if funcs[0] is odd_rows_infinite:
        assert bad.severity == "problem" and bad.evidence["infinite_rewards"] == {"odd_rows_infinite": 4}, bad
    else:
        assert bad.evidence["unscorable"] == 4 and bad.severity == "warning", bad
    assert step.task is task, "the doctor left its finite-only reading of the task on the step"


@pytest.mark.parametrize(
    ("history", "severity"),
    [
        (((1, 0.01), (2, 0.03)), "warning"),  # x3 per step from 0.03: past 1 nat in about 4 steps
        (((1, 0.001), (2, 0.002), (3, 0.004)), "warning"),  # x2 from 0.004 (0.001 is noise): 1 nat in 7.97 steps
        (((1, 0.0015), (2, 0.003)), "absent"),  # x2 from 0.003: 8.4 steps to 1 nat, past the horizon
        (((1, 0.01), (3, 0.03)), "absent"),  # x1.73 per step
        (((1, 0.0001), (2, 0.03)), "absent"),  # the first below the estimator's noise: no growth measured
    ],
)
def test_kl_growth_from_the_logged_history(facts, history, severity):
    """Below the level's warning, a logged kl that doubles per step and would pass 1 nat within the horizon is a
    warning; slower growth, growth that needs longer, or growth measured from noise, is not."""
    kl = history[-1][1]
    finding = d.kl_blowup(dataclasses.replace(facts, kl_against_exact=None, logged_kl=kl, kl_history=history))
    assert finding.severity == severity, f"logged kl {history}: {finding.severity}, not {severity}: {finding}"


def test_kl_growth_tiers_on_both_sides():
    assert d.kl_growth(((1, 0.01), (2, 0.03))) == pytest.approx(3.0)
    assert d.kl_growth(((1, 0.01), (3, 0.04))) == pytest.approx(2.0)
    assert d.kl_growth(((1, 0.0005), (2, 0.03))) is None, "a kl below the noise floor is no base to grow from"
    assert d.kl_growth(((2, 0.01),)) is None


@pytest.mark.parametrize(("value", "severity"), both_sides(d.LARGE_ADVANTAGE_WARNING, d.LARGE_ADVANTAGE_PROBLEM))
def test_large_advantages_tiers(facts, value, severity):
    adv = dataclasses.replace(facts.run.advantages, max_abs_advantage=value)
    finding = d.large_advantages(dataclasses.replace(facts, run=dataclasses.replace(facts.run, advantages=adv)))
    assert finding.severity == severity, f"max |A| {value}: {finding.severity}, not {severity}: {finding}"


@pytest.mark.parametrize(("ratio", "severity"), both_sides(d.CLIPPED_INFO, d.CLIPPED_WARNING))
def test_grad_clipped_tiers(facts, ratio, severity):
    """grad_norm / max_grad_norm: info from 2 (half the length cut), and no louder from 10 (nine tenths cut): AdamW
    divides a clip that scales every step alike out of its update; the clip is no cause of its own."""
    severity = "absent" if severity == "absent" else "info"
    cfg = facts.run.config.replace(max_grad_norm=0.5)
    update = dataclasses.replace(facts.run.update, grad_norm=0.5 * ratio)
    run = dataclasses.replace(facts.run, config=cfg, update=update)
    finding = d.grad_clipped(dataclasses.replace(facts, run=run))
    assert finding.severity == severity, f"grad_norm {ratio}x max_grad_norm: {finding.severity}, not {severity}"
    unclipped = d.grad_clipped(
        dataclasses.replace(facts, run=dataclasses.replace(run, config=cfg.replace(max_grad_norm=0)))
    )
    assert unclipped.severity == "absent", unclipped
    no_gradient = dataclasses.replace(run, update=dataclasses.replace(update, grad_norm=0.0))
    assert d.grad_clipped(dataclasses.replace(facts, run=no_gradient)).severity == "absent"


@pytest.mark.parametrize("id", ["dropout", "grad_clipped"])
def test_a_finding_whose_flip_leaves_the_update_as_it_is_is_info(id):
    """A statistic that says only that something differs (dropout on, a clip) is a warning only where flipping it
    on the step changes the update under the trainer's optimizer."""
    from grpo_debug.detectors.findings import Finding
    from grpo_debug.doctor.diagnose import severity_from_flip

    effect = {"update_cosine": 1.0000022, "update_norm": [2e-4, 2e-4], "cosmetic": True}
    found = Finding(id, "warning", "the statistic", effect=effect)
    assert severity_from_flip(found).severity == "info", severity_from_flip(found)
    assert "leaves the update as it is" in severity_from_flip(found).summary
    moved = Finding(id, "warning", "the statistic", effect={**effect, "update_cosine": 0.9, "cosmetic": False})
    assert severity_from_flip(moved).severity == "warning", "a flip that moves the update was made info"


def test_a_truncated_sampler_is_judged_by_its_flip_only_without_vllm():
    """top_p kept 88% of the mass: with vLLM the importance ratio carries that factor on every token (TRL #6789),
    a consequence in itself; the trainer sampling with its own model has no such ratio, so the flip decides."""
    from grpo_debug.detectors.findings import Finding
    from grpo_debug.doctor.diagnose import severity_from_flip

    effect = {"update_cosine": 0.99999, "update_norm": [2e-4, 2e-4], "cosmetic": True}
    found = Finding("sampler_truncation", "warning", "the sampler kept 88.0% of the mass", effect=effect)
    assert severity_from_flip(found, uses_vllm=False).severity == "info", "no vLLM ratio, a flip that moves nothing"
    assert severity_from_flip(found, uses_vllm=True).severity == "warning", "vLLM's ratio carries the kept mass"
    moved = dataclasses.replace(found, effect={**effect, "update_cosine": 0.9, "cosmetic": False})
    assert severity_from_flip(moved, uses_vllm=False).severity == "warning", "a flip that moves the update is loud"


def with_advantages(facts, per_function: dict):
    from grpo_debug.advantages import summarize_advantages

    f = with_rewards(facts, per_function)
    adv = summarize_advantages(f.run.rewards.total, f.run.config.num_generations, f.run.config.scale_rewards)
    return dataclasses.replace(f, run=dataclasses.replace(f.run, advantages=adv))


def test_a_sliver_warns_where_the_division_blows_it_up_and_names_whose_it_is(facts):
    """A group whose only spread is a length-paying function's 0.001 is divided into full-size advantages; one
    whose spread is float rounding (std 1.3e-7, fresh tuning seed 138's first group) is divided by TRL's 1e-4 eps
    and stays small: no blow-up to warn of."""
    assert facts.run.config.scale_rewards == "group" and len(facts.run.rewards.total) == 8, facts.run.config
    close = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    thorough = torch.tensor([0.05, 0.05, 0.05, 0.051, 0.05, 0.05, 0.05, 0.05])
    sliver = d.advantage_scale(with_advantages(facts, {"close": close, "thorough": thorough}))
    assert sliver.severity == "warning" and sliver.evidence["sliver_functions"] == ["thorough"], sliver
    rounding = close.clone()
    rounding[3] -= 3e-7
    kept_small = d.advantage_scale(with_advantages(facts, {"close": rounding, "thorough": torch.full((8,), 0.05)}))
    assert kept_small.severity == "absent", f"a rounding divided by TRL's eps was read as a sliver: {kept_small}"


def with_entropy(facts, nats: float, history: tuple[dict, ...]):
    lp = dataclasses.replace(facts.run.logprobs, entropies=torch.full_like(facts.run.logprobs.entropies, nats))
    return dataclasses.replace(facts, run=dataclasses.replace(facts.run, logprobs=lp), logged_history=history)


@pytest.mark.parametrize(
    "history, severity",
    [
        (({"step": 1, "entropy": 0.9}, {"step": 2, "entropy": 0.3}, {"step": 3, "entropy": 0.01}), "warning"),
        (({"step": 1, "entropy": 0.02}, {"step": 2, "entropy": 0.01}, {"step": 3, "entropy": 0.01}), "info"),
        ((), "warning"),
    ],
    ids=["fell during the run", "as low at the first step", "no history to date it"],
)
def test_entropy_collapse_is_a_fall_during_the_run(facts, history, severity):
    low = d.entropy_collapse(with_entropy(facts, d.ENTROPY_COLLAPSE / 5, history))
    assert low.severity == severity, f"entropy {d.ENTROPY_COLLAPSE / 5} after {history}: {low.summary}"
    if history:
        assert f"step {history[0]['step']}" in low.summary, "the summary names the step it compares with"
    high = d.entropy_collapse(with_entropy(facts, d.ENTROPY_COLLAPSE * 2, history))
    assert high.severity == "absent", "an entropy above the level is no collapse, whatever the history"


@pytest.mark.parametrize(("share", "lost"), [(1e-4, False), (1e-8, True)])
def test_the_update_loses_the_signal_only_where_its_kl_is_near_0_and_its_weights_barely_move(facts, share, lost):
    """A KL of 1e-15 on the step's own completions with the weights moved by 1e-4 of their norm is a confident policy
    (or a LoRA whose B is near 0), not a rate that moves nothing; at 1e-8 of the norm the update is what lost it."""
    from grpo_debug.detectors.signal_path import update

    norm = facts.run.update.update_norm
    stage = update(dataclasses.replace(facts, step_kl=1e-15, weight_norm=norm / share))
    assert stage.lost == lost, f"KL 1e-15 at {share:g} of the weights' norm: lost {stage.lost} ({stage.said})"
    assert stage.lost_to.startswith("learning_rate") == lost, stage.lost_to
