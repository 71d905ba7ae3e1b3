"""Widget callbacks are plain functions: they re-run only what a field touches, within the latency targets."""

import math

import pytest
import torch

from grpo_debug.config import StepConfig
from grpo_debug.loss import IMPORTANCE_SAMPLING_LEVELS, LOSS_TYPES, SAMPLER_CORRECTION_MODES
from grpo_debug.step import GRPOStep
from grpo_debug.ui.widgets import (
    DEFAULT_FIELDS,
    OFF,
    OFF_POLICY_FIELDS,
    PITFALL_FIELDS,
    StepPanel,
    apply_change,
    config_value,
    make_control,
    panel_until,
    summary,
    widget_value,
)

CFG = StepConfig(num_prompts=4, num_generations=4)


@pytest.fixture(scope="module")
def step():
    s = GRPOStep(CFG)
    s.run(CFG, until="loss")
    return s


@pytest.mark.parametrize(
    "field,value,first",
    [
        ("beta", 0.2, "loss"),
        ("kl_estimator", "k1", "loss"),
        ("loss_type", "dr_grpo", "loss"),
        ("scale_rewards", "none", "advantages"),
        ("std_floor", 0.1, "advantages"),
        ("mask", "drop_eos_and_pad", "logprobs"),
        ("dropout", True, "logprobs"),
    ],
)
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
        assert control.value == widget_value(field, getattr(CFG, field))
        assert config_value(field, control.value) == getattr(CFG, field)


def test_panel_callback_redraws(step):
    panel = StepPanel(step, fields=PITFALL_FIELDS)  # no update-phase control: the panel stops at the loss
    assert panel.until == "loss"
    panel.controls["beta"].value = 0.3  # fires on_change through the widget
    assert step.cfg.beta == 0.3 and "re-ran <b>loss</b>" in panel.status.value
    assert "sampler vs trainer: healthy" in panel.status.value  # every fix on, top_p 0.95: within verl's ranges
    panel.controls["beta"].value = CFG.beta


def test_a_typed_value_is_never_clamped_the_config_accepts_or_refuses_it(step):
    panel = StepPanel(step, fields=PITFALL_FIELDS)
    beta = panel.controls["beta"]
    beta.entry.value = -5.0  # typed: an ipywidgets slider would have clamped it to 0 without a word
    assert step.cfg.beta == CFG.beta and "beta" in panel.status.value and "nothing re-ran" in panel.status.value
    assert beta.value == beta.entry.value == CFG.beta  # the control went back to the config's value
    beta.entry.value = 0.8  # above the slider's range: accepted, and the slider's range grows to show it
    assert step.cfg.beta == 0.8 and beta.slider.value == 0.8 and beta.slider.max >= 0.8
    beta.slider.value = 0.2  # dragged
    assert step.cfg.beta == 0.2 and beta.entry.value == 0.2
    beta.value = CFG.beta
    assert step.cfg == CFG


def test_influence_panel_flips_the_sign_from_the_cache_and_reuses_the_rollout():
    import torch

    from grpo_debug.ui.influence import InfluenceChoice, InfluenceExplorer, InfluencePanel

    cfg = CFG.replace(beta=0.0)
    s = GRPOStep(cfg)
    s.run(cfg, until="loss")
    rollout = s.result.rollout
    panel = InfluencePanel(InfluenceExplorer(s, pool_size=32), InfluenceChoice(source="random", size=16))
    first = panel.current
    assert first.recomputed and len(first.scores) == rollout.num_samples
    flipped = panel.on_change("flip_sign", True)
    assert not flipped.recomputed and torch.equal(flipped.scores, -first.scores)
    from grpo_debug.tracin.influence import signs

    moved = int((signs(first.scores) != 0).sum())  # every sample with a sign changes it; a zero score has none
    paired = panel.paired()
    assert moved > 0 and int(paired["sign changed"].sum()) == moved and len(paired) == rollout.num_samples
    assert f"{moved} of {rollout.num_samples} samples changed sign, Spearman -1.00" in panel.status.value
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


# ---- the off-policy controls: the default panel has num_iterations, so it runs the update once mu >= 2


@pytest.fixture(scope="module")
def panel(step):
    step.run(CFG, until="loss")
    return StepPanel(step)


def test_the_off_policy_controls_take_their_options_from_the_config():
    assert set(OFF_POLICY_FIELDS) <= set(DEFAULT_FIELDS) and "loss_type" in DEFAULT_FIELDS
    assert panel_until(DEFAULT_FIELDS) == "update" and panel_until(PITFALL_FIELDS) == "loss"
    assert panel_until(DEFAULT_FIELDS, CFG) == "loss"  # mu = 1: one on-policy pass, nothing for the clip range
    assert panel_until(DEFAULT_FIELDS, CFG.replace(num_iterations=2)) == "update"
    values = lambda control: [v for _, v in control.options]
    assert values(make_control("loss_type", "grpo")) == list(LOSS_TYPES)
    assert values(make_control("importance_sampling_level", "token")) == list(IMPORTANCE_SAMPLING_LEVELS)
    assert values(make_control("vllm_importance_sampling_mode", "sequence_mask")) == list(SAMPLER_CORRECTION_MODES)
    delta = make_control("delta", None)
    assert delta.value == OFF and values(delta)[0] == OFF and len(values(delta)) > 1
    for value in values(delta)[1:]:
        assert StepConfig(delta=value).delta == value  # every offered value is allowed
    assert make_control("delta", 3.0).value == 3.0  # a value off the menu is added to it
    fields = StepConfig.__dataclass_fields__
    for name in ("epsilon_low", "top_entropy_quantile"):  # the slider spans the field's allowed range
        control = make_control(name, getattr(CFG, name))
        assert (control.min, control.max) == (fields[name].metadata["low"], fields[name].metadata["high"])
    mu = make_control("num_iterations", 1)
    assert type(mu.slider).__name__ == "IntSlider" and type(mu.entry).__name__ == "IntText"
    assert mu.min == 1 and mu.max >= 2
    assert type(make_control("vllm_importance_sampling_correction", False)).__name__ == "Checkbox"


@pytest.mark.parametrize(
    "field,value,expected",
    [
        ("num_iterations", 2, 2),
        ("epsilon_low", 0.1, 0.1),
        ("epsilon_high", 0.28, 0.28),
        ("delta", 1.5, 1.5),
        ("importance_sampling_level", "sequence", "sequence"),
        ("vllm_importance_sampling_correction", True, True),
        ("vllm_importance_sampling_mode", "token_truncate", "token_truncate"),
        ("top_entropy_quantile", 0.5, 0.5),
        ("loss_type", "cispo", "cispo"),
    ],
)
def test_an_off_policy_control_sets_its_field_and_reruns_only_what_it_touches(panel, field, value, expected):
    step = panel.step
    before = step.result
    assert before.update is None and step.cfg == CFG and panel.until == "loss"  # mu = 1
    panel.controls[field].value = value  # through the widget
    run = step.result
    assert getattr(step.cfg, field) == expected and step.cfg == CFG.replace(**{field: expected})
    assert run.rollout is before.rollout and run.logprobs is before.logprobs and run.advantages is before.advantages
    if field == "num_iterations":  # read by the update only: the loss is the previous run's
        assert list(run.rerun) == ["update"] and run.loss is before.loss
        assert len(run.update.iterations) == 2
    else:
        assert list(run.rerun) == ["loss"] and run.loss is not before.loss and run.update is None
    assert f"re-ran <b>{', '.join(run.rerun)}</b>" in panel.status.value
    panel.controls[field].value = make_control(field, getattr(CFG, field)).value  # back
    assert step.cfg == CFG


@pytest.mark.parametrize("field,value", [("epsilon_high", 4.0), ("epsilon_low", 0.01), ("delta", 1.01)])
def test_at_mu_2_a_clip_range_change_rereads_the_passes_exactly(panel, field, value):
    """Pass 1 is on-policy, so the clip range cannot change what pass 2 scores: the panel re-reads the
    passes' cached log-probs, and every number equals a full re-run of the update."""
    step = panel.step
    panel.controls["num_iterations"].value = 2
    result = panel.on_change(field, value)
    assert result.rerun == ["loss", "passes re-read"] and result.run.update is None
    full = step.run(step.cfg, until="update", remember=False)
    for reread, taken in zip(result.passes, full.update.iterations, strict=True):
        assert reread.metrics == pytest.approx(taken.metrics, abs=1e-7)
        assert torch.equal(reread.clipped, taken.clipped) and torch.equal(reread.logps, taken.logps)
        # the losses sit near 0 (ratio 1, centred advantages): the two sums round alike to 1e-10, not to 1e-6 of it
        assert reread.losses == pytest.approx(taken.losses, rel=1e-6, abs=1e-10)
    assert all(math.isnan(g) for g in result.passes[-1].grad_norms)  # the last step itself is not re-taken
    assert (
        summary(result.run, result.passes)["iteration_2/clip_ratio/region_mean"]
        == full.update.iterations[1].metrics["clip_ratio/region_mean"]
    )
    beta = panel.on_change("beta", 0.1)  # pass 1's gradient changes: pass 2 scores other weights
    assert beta.rerun == ["loss", "update"] and beta.passes is None
    panel.on_change("beta", CFG.beta)
    panel.on_change(field, getattr(CFG, field))
    panel.controls["num_iterations"].value = 1
    assert step.cfg == CFG


def test_delta_off_is_none(panel):
    step = panel.step
    panel.controls["delta"].value = 2.0
    assert step.cfg.delta == 2.0
    panel.controls["delta"].value = OFF
    assert step.cfg.delta is None and step.cfg == CFG
    assert panel.on_change("delta", None) is not None and step.last_rerun == []  # None itself: nothing changed


def test_the_summary_shows_entropy_and_the_clip_ratio_of_each_pass(panel):
    step = panel.step
    panel.controls["num_iterations"].value = 2
    shown = summary(step.result)
    assert shown["entropy"] > 0 and "entropy = " in panel.status.value
    assert shown["iteration_1/clip_ratio/region_mean"] == 0.0  # the first pass is on-policy: ratio 1
    assert shown["iteration_2/clip_ratio/region_mean"] > 0
    assert "iteration_2/clip_ratio/region_mean" in panel.status.value
    wide = panel.on_change("epsilon_high", 4.0)  # a wider clip range cuts fewer tokens in the second pass
    assert wide.rerun == ["loss", "passes re-read"]
    assert (
        summary(wide.run, wide.passes)["iteration_2/clip_ratio/region_mean"]
        < shown["iteration_2/clip_ratio/region_mean"]
    )
    cispo = panel.on_change("loss_type", "cispo")  # cispo logs its own clip ratio
    assert "iteration_2/cispo_clip_ratio" in summary(cispo.run)
    panel.on_change("loss_type", CFG.loss_type)
    panel.on_change("epsilon_high", CFG.epsilon_high)
    panel.controls["num_iterations"].value = 1
    assert step.cfg == CFG and list(summary(step.result)) == [k for k in shown if not k.startswith("iteration_")]


def test_a_refused_combination_keeps_the_config_and_says_why(panel):
    step = panel.step
    panel.controls["loss_type"].value = "vespo"
    before = step.result
    panel.controls["vllm_importance_sampling_correction"].value = True  # vespo needs a token-level mode
    assert "token_truncate or token_mask" in panel.status.value and "nothing re-ran" in panel.status.value
    assert step.result is before and not step.cfg.vllm_importance_sampling_correction
    assert panel.controls["vllm_importance_sampling_correction"].value is False  # the control went back
    panel.controls["vllm_importance_sampling_mode"].value = "token_mask"
    panel.controls["vllm_importance_sampling_correction"].value = True
    assert step.cfg.vllm_importance_sampling_correction and step.last_rerun == ["loss"]  # mu = 1: no update
    for field in ("vllm_importance_sampling_correction", "vllm_importance_sampling_mode", "loss_type"):
        panel.controls[field].value = getattr(CFG, field)
    assert step.cfg == CFG


def test_a_bad_field_or_preset_is_refused_in_the_status_line(step):
    panel = StepPanel(step, fields=PITFALL_FIELDS)
    before = step.cfg
    assert panel.on_change("bogus", 1) is None and "no StepConfig field 'bogus'" in panel.status.value
    assert panel.on_preset("bogus") is None and "no preset 'bogus'" in panel.status.value
    assert panel.on_change("beta", -5.0) is None and "beta" in panel.status.value  # StepConfig refuses it
    assert step.cfg == before
