"""A fast-growing logged KL is a forecast, and the doctor runs it (`doctor.forecast`): kl_blowup loud from the growth
alone is kept only where the run, continued as it stands, moves the policy past the warning level; on the bundled
step at a learning rate that moves it far, it stays a warning; at a rate that barely moves it, it becomes info; a
finding loud from its level, or quiet, is left alone."""

import pytest

from grpo_debug.config import StepConfig
from grpo_debug.detectors.detectors import KL_BLOWUP_WARNING
from grpo_debug.detectors.findings import Finding
from grpo_debug.doctor.forecast import forecast_tested
from grpo_debug.step import GRPOStep

pytestmark = pytest.mark.usefixtures("task_registry_restored")
SMALL = dict(num_prompts=2, num_generations=4, max_new_tokens=16)


def grown(kl: float = 0.03, steps: float = 2.0) -> Finding:
    said = f"exact KL(pi || ref) {kl} nats per token, the logged kl growing x10 per step"
    return Finding("kl_blowup", "warning", said, evidence={"kl": kl, "steps_to_problem": steps})


@pytest.mark.parametrize(("learning_rate", "severity"), [(3e-2, "warning"), (1e-9, "info")])
def test_a_growth_forecast_is_kept_only_where_the_continued_run_moves_past_the_warning(learning_rate, severity):
    step = GRPOStep(StepConfig(**SMALL, learning_rate=learning_rate))
    step.run(until="update")
    before = step.result
    tested = forecast_tested(step, [grown(), Finding("truncation", "info", "t")])
    f = tested[0]
    moved = f.evidence["continued_kl"]
    assert f.severity == severity, f"learning_rate {learning_rate}: moved {moved} nats, severity {f.severity}"
    assert (moved >= KL_BLOWUP_WARNING) == (severity == "warning"), f"{moved} against {KL_BLOWUP_WARNING}"
    assert f.evidence["continued_steps"] == 2 and "continued as it stands for 2 steps" in f.summary, f.summary
    assert tested[1] == Finding("truncation", "info", "t"), "another finding was changed"
    assert step.result is before, "the forecast left the step changed"


def test_a_finding_loud_from_its_level_or_quiet_is_left_alone():
    step = GRPOStep(StepConfig(**SMALL))
    level = Finding("kl_blowup", "problem", "KL 5.9", evidence={"kl": 5.9})
    quiet = Finding("kl_blowup", "absent", "KL 0.01", evidence={"kl": 0.01, "steps_to_problem": 30.0})
    assert forecast_tested(step, [level]) == [level] and forecast_tested(step, [quiet]) == [quiet]


def test_the_kl_history_is_the_captures_own_course_where_trl_logged_no_step():
    """GRPOConfig logs every 10 steps by default: a capture at step 3 holds no kl logged by TRL, yet its own course
    has each step's kl, which kl_blowup's growth reads."""
    from types import SimpleNamespace

    from grpo_debug.doctor.facts import kl_history

    course = [{"step": 1, "kl": 0.0}, {"step": 2, "kl": 0.0447}, {"step": 3, "kl": 0.45, "reward": 0.75}]
    assert kl_history(SimpleNamespace(logged_kl=[], logged_history=course)) == ((1, 0.0), (2, 0.0447), (3, 0.45))
    logged = [(10, 0.2), (20, 0.4)]
    assert kl_history(SimpleNamespace(logged_kl=logged, logged_history=course)) == tuple(logged), "TRL's log first"
