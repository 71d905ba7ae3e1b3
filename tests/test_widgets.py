"""Widget callbacks are plain functions: they re-run only what a field touches, within the latency targets."""

import pytest

from grpo_debug.config import StepConfig
from grpo_debug.step import GRPOStep
from grpo_debug.ui.widgets import DEFAULT_FIELDS, StepPanel, apply_change, make_control

CFG = StepConfig(num_prompts=4, num_generations=4)


@pytest.fixture(scope="module")
def step():
    s = GRPOStep(CFG)
    s.run(CFG, until="loss")
    return s


@pytest.mark.parametrize("field,value,first", [("beta", 0.2, "loss"), ("kl_estimator", "k1", "loss"),
                                               ("loss_type", "dr_grpo", "loss"), ("scale_rewards", "none", "advantages"),
                                               ("std_floor", 0.1, "advantages"), ("mask", "drop_eos_and_pad", "logprobs"),
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


def test_influence_panel_flips_the_sign_from_the_cache_and_reuses_the_rollout():
    import torch
    from grpo_debug.tracin.influence import InfluenceChoice, InfluenceExplorer
    from grpo_debug.ui.widgets import InfluencePanel
    cfg = CFG.replace(beta=0.0)
    s = GRPOStep(cfg)
    s.run(cfg, until="loss")
    rollout = s.result.rollout
    panel = InfluencePanel(InfluenceExplorer(s, pool_size=32), InfluenceChoice(source="random", size=16))
    first = panel.current
    assert first.recomputed and len(first.scores) == rollout.num_samples
    flipped = panel.on_change("flip_sign", True)
    assert not flipped.recomputed and torch.equal(flipped.scores, -first.scores)
    panel.on_change("flip_sign", False)
    other = panel.on_change("kind", "seqloss-reward")
    assert other.recomputed and not torch.equal(other.scores, first.scores)
    topk = panel.on_change("source", "topk")  # served by the same random pool: no new samples for the batch
    assert topk.recomputed and s.result.rollout is rollout
    no_temperature = panel.on_change("logprob_temperature", False)
    assert no_temperature.recomputed and s.result.rollout is rollout and not s.cfg.logprob_temperature
    assert not torch.equal(no_temperature.scores, topk.scores)
    assert len(panel.controls) == 1 + 5 + 3
    shown = panel.current
    assert panel.on_change("size", 128) is shown and "needs more than the pool" in panel.status.value  # topk 128 of 32
    assert panel.choice.size == 16


def test_a_mask_change_reuses_the_scored_logprobs(step):
    before = step.result.logprobs
    result = apply_change(step, "mask", "drop_eos_and_pad")
    assert result.rerun[0] == "logprobs" and result.run.logprobs.policy is before.policy  # no forward
    assert result.run.logprobs.eos_kept == 0.0 and before.eos_kept == 1.0
    apply_change(step, "mask", "keep_first_eos")
    result = apply_change(step, "mask", "all_positions")  # PAD counts: the columns after EOS must be scored
    assert result.run.logprobs.policy is not before.policy
    apply_change(step, "mask", "keep_first_eos")


def test_preset_menu_switches_every_loss_side_field_and_shows_it(step):
    step.run(CFG, until="loss")
    panel = StepPanel(step)
    assert panel.preset.value == "fixed"
    panel.preset.value = "trl"
    assert step.cfg.preset_name() == "trl" and panel.controls["dropout"].value is True
    assert panel.controls["position_ids"].value is False and panel.controls["loss_type"].value == "dapo"
    panel.controls["beta"].value = 0.1
    assert panel.preset.value == "custom"
    panel.preset.value = "fixed"
    assert step.cfg == CFG
