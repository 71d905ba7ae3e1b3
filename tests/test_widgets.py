"""Widget callbacks are plain functions: they re-run only what a field touches, within the latency targets."""

import pytest

from grpo_debug.config import StepConfig
from grpo_debug.step import GRPOStep
from grpo_debug.widgets import DEFAULT_FIELDS, StepPanel, apply_change, make_control

CFG = StepConfig(num_prompts=4, num_generations=4)


@pytest.fixture(scope="module")
def step():
    s = GRPOStep(CFG)
    s.run(CFG, until="loss")
    return s


@pytest.mark.parametrize("field,value,first", [("beta", 0.2, "loss"), ("kl_estimator", "k1", "loss"),
                                               ("loss_type", "dr_grpo", "loss"), ("scale_rewards", "none", "advantages"),
                                               ("std_floor", 0.1, "advantages"), ("mask", "seed004", "logprobs"),
                                               ("dropout", True, "logprobs")])
def test_a_change_reruns_from_its_phase_on_the_cached_rollout(step, field, value, first):
    rollout = step.result.rollout
    result = apply_change(step, field, value)
    assert result.rerun[0] == first and result.rerun[-1] == "loss"
    assert result.run.rollout is rollout
    assert getattr(result.run.config, field) == value
    apply_change(step, field, getattr(CFG, field))


def test_every_default_field_has_a_control():
    for field in DEFAULT_FIELDS:
        control = make_control(field, getattr(CFG, field))
        assert control.value == getattr(CFG, field)


def test_panel_callback_redraws(step):
    panel = StepPanel(step)
    panel.controls["beta"].value = 0.3  # fires on_change through the widget
    assert step.cfg.beta == 0.3 and "re-ran <b>loss</b>" in panel.status.value
    panel.controls["beta"].value = CFG.beta
