"""Groups of one text under narrowed sampling are judged by what the fix gives (`doctor.narrowed`): the step's
prompts sampled anew at the run's settings and at TRL's sampling defaults, paired by seed; a cold sampler that
costs the run its groups' signal warns though one draw held few groups of one text; sampling at TRL's defaults is
never resampled; the step and the caller's random state are left as they were."""

import pytest
import torch
from documentation import documentation  # noqa: E402  (tests/)

from grpo_debug.config import StepConfig
from grpo_debug.detectors.findings import Finding
from grpo_debug.doctor.narrowed import TRL_SAMPLING, narrowing_tested, sampled_shares, severity_of
from grpo_debug.doctor.resampled import RECOVERED_WARNING
from grpo_debug.step import GRPOStep

pytestmark = pytest.mark.usefixtures("task_registry_restored")

ONE_DRAW = Finding("identical_groups", "info", "1 of 2 groups", evidence={"identical_groups": [0], "share": 0.5})


@pytest.mark.parametrize(
    ("identical", "without_signal", "fixed", "severity"),
    [
        (0.61, 0.61, 0.03, "warning"),  # temperature 0.23: the fix gives 58% of the groups a gradient
        (0.19, 0.28, 0.08, "info"),  # top_p 0.91: 20%
        (0.55, 0.60, 0.50, "warning"),  # half the run's groups one text, whatever the fix gives
        (0.97, 1.0, 0.2, "problem"),
        (0.05, 0.3, 0.28, "info"),
    ],
)
def test_severity_comes_from_what_sampling_at_trls_defaults_gives(identical, without_signal, fixed, severity):
    as_run = {"identical": identical, "without_signal": without_signal, "groups": 48}
    got, said = severity_of(as_run, {"identical": 0.0, "without_signal": fixed, "groups": 48})
    assert got == severity, f"as run {as_run}, fixed {fixed}: {got} ({said})"
    assert f"the fix gives {without_signal - fixed:.0%} of the groups a gradient" in said, said


def test_a_cold_sampler_that_costs_the_run_its_signal_warns_and_the_step_is_left_as_it_was():
    step = GRPOStep(StepConfig(num_prompts=2, num_generations=4, max_new_tokens=24, temperature=0.1))
    run = step.run(until="advantages")
    torch.manual_seed(5)
    state = torch.get_rng_state()
    tested = narrowing_tested(step, [ONE_DRAW])[0]
    assert torch.equal(torch.get_rng_state(), state), "the resample moved the caller's random state"
    assert step.result is run and step.cfg.temperature == 0.1, "the resample left the step changed"
    as_run, fixed = tested.evidence["resampled"]["as_run"], tested.evidence["resampled"]["fixed"]
    recovered = as_run["without_signal"] - fixed["without_signal"]
    assert recovered >= RECOVERED_WARNING and tested.severity == "warning", f"{tested.severity}: {tested.summary}"
    assert as_run == sampled_shares(step, step.cfg, as_run["groups"] // 2), "the same step gave other numbers"


def test_where_every_completion_is_cut_both_samplings_let_them_finish():
    """Cut completions earn rewards whatever the sampler does: with truncation loud, the run's sampling and TRL's
    defaults are both measured with truncation's fix (max_new_tokens x4; stranger tuning seed 542: every completion
    cut at 6 tokens under temperature 0.24, where the fix had measured 0% and, finished, measures 19%)."""
    from grpo_debug.doctor.narrowed import finishing

    cfg = StepConfig(num_prompts=2, num_generations=4, max_new_tokens=6, temperature=0.1)
    for severity, expected in (("problem", {"max_new_tokens": 24}), ("warning", {"max_new_tokens": 24}), ("info", {})):
        assert finishing(cfg, [Finding("truncation", severity, "cut")]) == expected, severity
    step = GRPOStep(cfg)
    step.run(until="advantages")
    cut = Finding("truncation", "problem", "every completion cut")
    tested = narrowing_tested(step, [ONE_DRAW, cut])[0]
    assert tested.evidence["resampled"]["finished"] == {"max_new_tokens": 24}, tested.evidence
    assert "(both sampled with max_new_tokens=24: truncation's fix)" in tested.summary, tested.summary
    assert step.cfg.max_new_tokens == 6, "the resample left the step changed"


def test_sampling_at_trls_defaults_is_not_resampled():
    step = GRPOStep(StepConfig(num_prompts=2, num_generations=4, max_new_tokens=8, **TRL_SAMPLING))
    step.run(until="advantages")
    assert narrowing_tested(step, [ONE_DRAW]) == [ONE_DRAW], "nothing narrowed, yet the sampler was resampled"


def test_the_readme_states_the_levels_as_they_are():

    from grpo_debug.detectors.detectors import COLD, IDENTICAL_WARNING

    readme = " ".join(documentation().split())
    for said in (
        f"a temperature of {COLD:g} or less",
        f"the fix gives {RECOVERED_WARNING:.0%} of the groups a gradient or more",
        f"or where {'half' if IDENTICAL_WARNING == 0.5 else f'{IDENTICAL_WARNING:.0%}'} the run's groups are one text",
    ):
        assert said in readme, f"README.md does not say: {said}"
