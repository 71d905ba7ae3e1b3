"""Fuzzed values through every place a person types a config value: the command line's `--set` and `--arm`,
and the dashboard's controls. Each either gives a config that checks itself or is refused with a ValueError
(the CLI: exit 2) that names the field; nothing else escapes."""

import dataclasses

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from grpo_debug.config import StepConfig
from grpo_debug.overrides import parse_overrides

FIELDS = [f.name for f in dataclasses.fields(StepConfig)]
CHOICES = sorted({c for f in dataclasses.fields(StepConfig) for c in (f.metadata.get("choices") or ())})
AWKWARD = [
    "",
    " ",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "1e308",
    "-1e308",
    "1e309",
    "1e-320",
    "0",
    "-0",
    "-1",
    "1",
    "0.5",
    "2",
    "18446744073709551616",
    "-9223372036854775809",
    "1_000",
    "0x10",
    " 3 ",
    "true",
    "False",
    "yes",
    "no",
    "on",
    "None",
    "null",
    "off",
    "=",
    "a=b",
    "１",
    "\x00",
    "é",
    "../../etc/passwd",
]
values = st.one_of(
    st.sampled_from(AWKWARD + CHOICES),
    st.text(max_size=6),
    st.integers(-(2**70), 2**70).map(str),
    st.floats().map(repr),
)
keys = st.one_of(
    st.sampled_from(FIELDS),
    st.sampled_from(FIELDS).map(lambda k: k[:-1] + "x"),
    st.text(max_size=6).filter(lambda k: not set(k) & set("=,:")),
)  # those separate keys
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def refused_naming(error: ValueError, key: str) -> bool:
    return key in str(error) or repr(key) in str(error)


@FUZZ
@given(key=keys, value=values)
@example(key="temperature", value="nan")
@example(key="seed", value="18446744073709551616")
@example(key="num_generations", value="3")  # breaks the batch layout: refused naming it
def test_a_set_value_gives_a_checked_config_or_a_refusal_naming_its_key(key, value):
    try:
        cfg = StepConfig.preset("fixed", **parse_overrides([f"{key}={value}"]))
    except ValueError as e:
        assert refused_naming(e, key), str(e)
    else:
        assert cfg == StepConfig(**dataclasses.asdict(cfg))  # it checks itself again


@FUZZ
@given(name=st.sampled_from(["fixed", "nodrop", "tracin", "newarm", "bogus", ""]), key=keys, value=values)
@example(name="tracin", key="flip_sign", value="maybe")
@example(name="fixed", key="seed", value="5")
def test_an_arm_gives_a_checked_arm_or_a_refusal_naming_its_key(name, key, value):
    from grpo_debug.runs.arms import parse_arm

    text = f"{name}:{key}={value}"
    try:
        arm = parse_arm(text)
    except ValueError as e:
        assert refused_naming(e, key) or (not name and "no name" in str(e)) or ("," in value or "," in key), str(e)
    else:
        assert arm.name == name and arm.config(StepConfig()) == arm.config(StepConfig())


@pytest.fixture(scope="module")
def panel():
    from grpo_debug.step import GRPOStep
    from grpo_debug.ui.widgets import StepPanel

    cfg = StepConfig(num_prompts=2, num_generations=2, eval_prompts=2, eval_samples=2)
    step = GRPOStep(cfg)
    return StepPanel(step)


panel_values = st.one_of(
    st.sampled_from(
        [
            -5.0,
            -1,
            0,
            1e-9,
            0.5,
            1.0,
            3.0,
            1e6,
            1e308,
            float("nan"),
            float("inf"),
            True,
            False,
            None,
            "off",
            "bogus",
            "",
        ]
        + CHOICES
    ),
    st.floats(),
    st.integers(-10, 10),
    st.text(max_size=4),
)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(value=panel_values, data=st.data())
def test_a_dashboard_change_runs_or_is_refused_in_the_status_line(panel, value, data):
    field = data.draw(st.sampled_from([*panel.fields, "bogus", "temprature"]))
    before = panel.step.cfg
    result = panel.on_change(field, value)
    if result is None:
        assert panel.step.cfg == before and "nothing re-ran" in panel.status.value
        assert field in panel.status.value, panel.status.value
    else:
        assert panel.step.cfg == before.replace(**{field: panel.step.cfg.__getattribute__(field)})
        assert "re-ran" in panel.status.value
    for name, control in panel.controls.items():  # every control shows the config, whatever happened
        shown = control.value
        assert shown == ("off" if getattr(panel.step.cfg, name) is None else getattr(panel.step.cfg, name)), name
    panel.on_change(field, getattr(before, field)) if field in panel.controls else None
