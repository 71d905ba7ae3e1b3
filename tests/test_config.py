"""StepConfig checks itself when built, before any model loads; presets; the CLI lists every key."""

import dataclasses
import subprocess
import sys

import pytest

from grpo_debug.config import PRESET_FIELDS, PRESETS, StepConfig
from grpo_debug.overrides import parse_overrides


@pytest.mark.parametrize(
    "field,value",
    [
        ("dropout", "maybe"),
        ("num_prompts", 0),
        ("temperature", 0),
        ("top_p", 2),
        ("beta", -1),
        ("loss_type", "foo"),
        ("learning_rate", float("inf")),
        ("num_generations", 1),
        ("mask", "seed004"),
        ("gather", "seed003"),
        ("num_prompts", 2.5),
    ],
)
def test_a_bad_value_is_rejected_naming_field_value_and_allowed(field, value):
    with pytest.raises(ValueError, match=rf"StepConfig\.{field} = .* is not allowed: it must be"):
        StepConfig(**{field: value, "model": "/no/such/model"})  # the model is never loaded


def test_choices_are_listed_in_the_error():
    with pytest.raises(ValueError, match="keep_first_eos, drop_eos_and_pad, all_positions"):
        StepConfig(mask="trl")


def test_cli_values_are_parsed_strictly():
    assert parse_overrides(["dropout=on", "beta=0.1"]) == {"dropout": True, "beta": 0.1}
    with pytest.raises(ValueError, match="dropout = 'maybe'"):
        parse_overrides(["dropout=maybe"])
    with pytest.raises(ValueError, match="num_prompts = 'two'"):
        parse_overrides(["num_prompts=two"])


def test_presets_cover_every_loss_side_field_and_keep_the_rest():
    assert set(PRESETS["trl"]) == set(PRESET_FIELDS)
    base = StepConfig(num_prompts=3, temperature=0.9, learning_rate=1e-5)
    trl = base.with_preset("trl")
    assert trl.preset_name() == "trl" and base.preset_name() == "fixed"
    assert (trl.num_prompts, trl.temperature, trl.learning_rate) == (3, 0.9, 1e-5)
    assert trl.with_preset("fixed") == base
    assert trl.replace(beta=0.1).preset_name() is None
    assert trl.pitfalls_on() == {
        "dropout": True,
        "position_ids": False,
        "loss_type": "dapo",
        "beta": 0.0,
        "kl_estimator": "k3_corrected",
    }
    with pytest.raises(ValueError, match="preset must be one of"):
        StepConfig.preset("vllm")


def test_cli_help_lists_every_key_and_a_bad_value_fails_before_loading():
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_debug", "step", "--help"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0
    for f in dataclasses.fields(StepConfig):
        assert f"  {f.name} (" in proc.stdout, f.name
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_debug", "step", "--set", "dropout=maybe"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "StepConfig.dropout = 'maybe' is not allowed" in proc.stderr
