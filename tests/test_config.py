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
    """true/false only (any case), ASCII digits only, each key once, cross-field rules and upper bounds."""
    assert parse_overrides(["dropout=True", "beta=0.1", "seed=+3"]) == {"dropout": True, "beta": 0.1, "seed": 3}
    for word in ("on", "yes", "1", "maybe"):
        with pytest.raises(ValueError, match=f"dropout = '{word}' is not allowed: it must be true or false"):
            parse_overrides([f"dropout={word}"])
    with pytest.raises(ValueError, match="num_prompts = 'two'"):
        parse_overrides(["num_prompts=two"])
    for digits in ("\u0663", "\uff11", "1_000", "0x10", " 3"):  # Arabic-Indic 3, fullwidth 1, Python-only forms
        with pytest.raises(ValueError, match="ASCII digits"):
            parse_overrides([f"max_new_tokens={digits}"])
    with pytest.raises(ValueError, match="'temperature' is given twice"):
        parse_overrides(["temperature=1", "temperature=2"])
    with pytest.raises(ValueError, match="num_generations = 100000 is not allowed"):
        StepConfig(**parse_overrides(["num_generations=100000"]))
    with pytest.raises(ValueError, match="1024 x 32 = 32768 samples is not allowed"):
        StepConfig(num_prompts=1024, num_generations=32)
    with pytest.raises(ValueError, match="clip_min = 5 is not allowed with clip_max = 1"):
        StepConfig(vllm_importance_sampling_clip_min=5.0, vllm_importance_sampling_clip_max=1.0)


@pytest.mark.parametrize(
    "argv, says",
    [
        (["step", "--set", "model=/nonexistent/model"], "no model folder at '/nonexistent/model'"),
        (["step", "--set", "model=/etc"], "/etc is not a model folder: it has no config.json"),
        (["step", "--json", ""], "--json '': not a writable file path"),
        (["step", "--set", "temperature=\u0663"], "ASCII digits"),
        (["replay", "/nonexistent"], "/nonexistent is not a capture"),
        (["step", "--set", "num_prompts=1000"], "prompt_offset + num_prompts = 1000: 1000 train prompts asked for"),
        (["train", "--steps", "1", "--arm", "fixed", "--json", "/proc/t.json"], "--json /proc/t.json: not a writable"),
        (["train", "--steps", "99999999999999", "--arm", "fixed", "--json", "x.json"], "steps must be 1..100000"),
        (
            ["train", "--steps", "2", "--arm", "../../elsewhere/x:dropout=true", "--json", "x.json"],
            "arm name '../../elsewhere/x'",
        ),
    ],
)
def test_a_bad_command_line_value_is_one_line_and_exit_2(argv, says, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "grpo_debug", *argv], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert says in done.stderr.splitlines()[-1], f"the last line does not say {says!r}: {done.stderr[-600:]}"
    assert not list(tmp_path.iterdir()), f"a refused command wrote {list(tmp_path.iterdir())}"


def test_a_set_value_never_names_code_to_load_on_a_capture(tmp_path):
    """`replay CAPTURE --set task=evil.py:F` is refused before anything is imported: the file never runs."""
    capture = tmp_path / "step-1"
    capture.mkdir()
    (capture / "capture.json").write_text("{}")
    evil = tmp_path / "evil.py"
    evil.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').write('ran')\nF = []\n")
    for command in ("replay", "doctor"):
        done = subprocess.run(
            [sys.executable, "-m", "grpo_debug", command, str(capture), "--set", f"task={evil}:F"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2 and "a capture's model and task are the run's" in done.stderr, done.stderr
        assert not (tmp_path / "ran").exists(), f"{command} ran the file named in --set"


def test_presets_cover_every_loss_side_field_and_keep_the_rest():
    assert set(PRESETS["trl"]) <= set(PRESET_FIELDS)
    default = StepConfig()
    assert all(v != getattr(default, k) for k, v in PRESETS["trl"].items()), "the trl preset states only differences"
    assert set(StepConfig.preset_fields("trl")) == set(PRESET_FIELDS)
    assert default.replace(**StepConfig.preset_fields("trl")) == StepConfig.preset("trl").replace(sample_dropout=False)
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
    corrected = trl.replace(vllm_importance_sampling_correction=True)  # the summed sequence ratio acts only so
    assert corrected.pitfalls_on()["vllm_importance_sampling_aggregation"] == "sum"
    assert corrected.preset_name() is None
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


def test_every_spec_default_is_the_config_default():
    """A spec's defaults (what `compute_loss(**fields)`, `Scoring(...)`, `Optimization()` take when a field is not
    given) are StepConfig()'s, so that no default of a phase disagrees with the config's."""
    from grpo_debug.loss import LossSpec
    from grpo_debug.scoring import Scoring
    from grpo_debug.specs import loss_spec_of, optimization_of, scoring_of
    from grpo_debug.update import Optimization

    cfg = StepConfig()
    spec = loss_spec_of(cfg)
    assert LossSpec(max_completion_length=spec.max_completion_length) == spec, (
        "LossSpec's defaults are not the config's"
    )
    assert Scoring(temperature=cfg.temperature) == scoring_of(cfg), "Scoring's defaults are not the config's"
    assert Optimization() == optimization_of(cfg), "Optimization's defaults are not the config's"


def test_a_captured_step_refuses_a_sampling_change_in_words():
    from grpo_debug.config import rollout_fields_refused

    one = rollout_fields_refused(["top_p"])
    assert one.startswith("top_p is a rollout field: a capture's completions are the trainer's"), one
    assert "--task" in one and "[" not in one, f"not words, or no next step: {one}"
    assert rollout_fields_refused(["top_p", "temperature"]).startswith("top_p and temperature are rollout fields")
