"""Groups without signal are judged on the run's share, resampled, not on one draw (`doctor.resampled`): groups of
2G split into two groups of G count both sizes on the same completions; a yes/no reward at G = 2 recovers what the
binomial says when G is doubled; a draw's high share that the run does not meet is info; the step and the caller's
random state are left as they were, and the same step gives the same numbers."""

import pytest
import torch
from documentation import documentation  # noqa: E402  (tests/)

from grpo_debug.advantages import groups_without_signal, summarize_advantages
from grpo_debug.config import StepConfig
from grpo_debug.detectors.findings import Finding
from grpo_debug.doctor.resampled import (
    MAX_COMPLETIONS,
    MAX_DRAWS,
    MIN_DRAWS,
    RECOVERED_WARNING,
    draws_for,
    halves_and_whole,
    resampled_signal,
    severity_of,
    signal_tested,
)
from grpo_debug.step import GRPOStep

pytestmark = pytest.mark.usefixtures("task_registry_restored")


def test_a_group_of_2G_is_two_groups_of_G_and_one_of_2G():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.0, 1.0, 0.0, 0.0])  # three groups of 2G = 4
    halves, whole = halves_and_whole(rewards, 2)
    assert halves.tolist() == [[True, False], [True, True], [False, True]], halves
    assert whole.tolist() == [False, True, False], whole
    copies = summarize_advantages(torch.full((6,), 0.7314), 3)
    assert groups_without_signal(copies).tolist() == [True, True], "float32 copies of one reward"


@pytest.mark.parametrize("p", [0.2, 0.5, 0.8])
def test_a_yes_no_reward_at_G_2_recovers_what_the_binomial_says(p):
    """pq(1 + p^2 + q^2): the share of groups of 2 with equal rewards less that of groups of 4, paired on the same
    draws; at the rates a warm model meets, above the warning level."""
    torch.manual_seed(0)
    rewards = (torch.rand(200_000) < p).float()
    halves, whole = halves_and_whole(rewards, 2)
    recovered = halves.float().mean().item() - whole.float().mean().item()
    q = 1 - p
    expected = p * q * (1 + p * p + q * q)
    assert abs(recovered - expected) < 0.01, f"p = {p}: recovered {recovered:.4f}, the binomial {expected:.4f}"
    assert expected >= RECOVERED_WARNING, f"G = 2 at p = {p} would read as chance: {expected:.3f}"


def test_draws_depend_on_the_batch_alone():
    assert draws_for(3, 7) == MAX_DRAWS and draws_for(16, 2) == 6, "draws for RESAMPLED_GROUPS groups"
    assert draws_for(8, 8) == MAX_COMPLETIONS // 128 and draws_for(64, 8) == MIN_DRAWS, "draws within MAX_COMPLETIONS"


@pytest.mark.parametrize(
    ("share_at_G", "share_at_2G", "drawn", "severity"),
    [
        (0.56, 0.17, "warning", "warning"),  # G = 2 on a yes/no reward: the fix recovers 39%
        (0.34, 0.15, "warning", "info"),  # two of three groups in one draw, a third of them in the run
        (0.93, 0.86, "warning", "warning"),  # the run's share: doubling G recovers little
        (0.92, 0.84, "problem", "problem"),  # every group in the draw, nearly every one in the run
        (1.0, 1.0, "info", "problem"),
        (0.82, 0.66, "warning", "warning"),  # G = 2 on a rare yes/no reward (p = 0.1): doubling G recovers 16%
        (0.3, 0.02, "info", "warning"),  # a draw that happened to be quiet, a run that is not
        (0.68, 0.51, "info", "info"),  # prompts always or never solved (stranger seed 345): no fix gives them signal
        (0.59, 0.26, "info", "warning"),  # G = 2 on a yes/no reward, three of eight in the draw (seed 562)
    ],
)
def test_severity_comes_from_the_runs_share_and_what_doubling_G_recovers(share_at_G, share_at_2G, drawn, severity):
    measured = {"share_at_G": share_at_G, "share_at_2G": share_at_2G, "recovered": share_at_G - share_at_2G}
    got, said = severity_of({**measured, "groups": 48, "draws": 16}, drawn)
    assert got == severity, f"{measured}, drawn {drawn}: {got} ({said})"
    assert f"{share_at_G:.0%} of groups of G without signal" in said, said


def test_the_resample_leaves_the_step_and_the_random_state_and_repeats_itself():
    step = GRPOStep(StepConfig(num_prompts=2, num_generations=4, max_new_tokens=8))
    step.run(until="advantages")
    before, cfg = step.result, step.cfg
    torch.manual_seed(123)
    state = torch.get_rng_state()
    first = resampled_signal(step, 4)
    assert torch.equal(torch.get_rng_state(), state), "the resample moved the caller's random state"
    assert step.result is before and step.cfg == cfg, "the resample left the step changed"
    assert first == resampled_signal(step, 4), "the same step resampled twice gave other numbers"
    assert first["groups"] == 8 and 0 <= first["share_at_2G"] <= first["share_at_G"] <= 1, first


def test_every_draw_with_a_group_without_signal_is_resampled():
    """A draw of three groups of eight without signal is info by the detector's level, yet as likely from a run at
    half (stranger tuning seed 562): it is resampled like a loud one; a draw with none is not, nor another finding."""
    step = GRPOStep(StepConfig(num_prompts=2, num_generations=4, max_new_tokens=8))
    step.run(until="advantages")
    quiet = [Finding("zero_std_groups", "absent", "none"), Finding("truncation", "warning", "t")]
    assert signal_tested(step, quiet) == quiet, "a finding with no group without signal, or another one, was changed"
    for severity in ("info", "warning"):
        drawn = Finding("zero_std_groups", severity, "1 of 2", evidence={"of_groups": 2})
        tested = signal_tested(step, [drawn])[0]
        assert tested.evidence["resampled"]["draws"] == draws_for(2, 4), tested.evidence
        assert "resampled 32 groups at 2G" in tested.summary, tested.summary


def test_the_readme_states_the_warning_level_as_it_is():
    readme = documentation()
    said = f"doubling num_generations gives {RECOVERED_WARNING:.0%} of the groups a gradient or more"
    assert said in " ".join(readme.split()), f"README.md does not say: {said}"
