"""The notebooks' numbers at the digits every CPU computes alike (`grpo_debug/digits.py`), and the sanitizer
rules (`notebooks/sanitize.cfg`) that compare what is left as noise."""

import configparser
import math
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from grpo_debug.digits import order_of, significant

SANITIZE = Path(__file__).resolve().parent.parent / "notebooks" / "sanitize.cfg"


def sanitized(text: str) -> str:
    rules = configparser.ConfigParser()
    rules.read(SANITIZE)
    for section in rules.sections():
        text = re.sub(rules[section]["regex"], rules[section]["replace"], text)
    return text


def significant_digits(text: str) -> int:
    mantissa = text.split("e")[0].lstrip("-").replace(".", "").lstrip("0")
    return len(mantissa.rstrip("0")) if "." not in text.split("e")[0] else len(mantissa)


@given(st.floats(min_value=-1e12, max_value=1e12, allow_nan=False), st.integers(1, 6))
def test_a_number_keeps_its_value_to_the_digits_asked(x, digits):
    shown = significant(x, digits)
    assert math.isclose(float(shown), x, rel_tol=0.5 * 10 ** (1 - digits) * 1.0001, abs_tol=1e-300), (
        f"{x!r} shown as {shown!r} at {digits} digits is not the same number"
    )
    assert significant_digits(shown) <= digits, f"{x!r} shown as {shown!r} holds more than {digits} digits"


@pytest.mark.parametrize(
    "x, shown",
    [
        (22590.3125, "22600"),
        (22590.3105, "22600"),
        (337.3539, "337"),
        (337.3547, "337"),
        (0.037476, "0.0375"),
        (0.037477, "0.0375"),
        (5.6106, "5.61"),
        (5.6109, "5.61"),
        (1.0, "1.00"),
        (0.99999, "1.00"),
        (1.99e-5, "1.99e-05"),
        (0.0, "0.00e+00"),
        (float("nan"), "nan"),
    ],
)
def test_numbers_that_one_cpu_rounds_differently_read_alike(x, shown):
    """Pairs measured on two machines' kernels (README, "Same seed, same numbers") print the same."""
    assert significant(x) == shown, f"{x!r} printed {significant(x)!r}, not {shown!r}"


def test_the_sanitizer_compares_float_noise_and_exact_zero_alike():
    assert sanitized(significant(0.0)) == sanitized(significant(3.1e-9)) == sanitized(significant(-2.2e-7)), (
        "an exact 0 and float-rounding noise below 1e-4 must compare alike"
    )
    assert sanitized(significant(1.5e-4)) != sanitized(significant(0.0)), "1.5e-4 is a number, not noise"


def test_the_sanitizer_masks_what_is_measured_on_this_cpu_and_only_that():
    a = "bit-equal: True (measured on this CPU: largest 0, bit-equal True)"
    b = "bit-equal: True (measured on this CPU: largest 3e-08, bit-equal False)"
    assert sanitized(a) == sanitized(b), "a measurement said to be this CPU's is not compared"
    assert sanitized("largest 1e-2: True") != sanitized("largest 1e-2: False"), "the claim itself is compared"


def test_a_table_compares_by_its_words_not_its_padding():
    assert sanitized("loss    0.500  grad   1.20") == sanitized("loss  0.500      grad 1.20")
    assert sanitized("loss 0.500") != sanitized("loss 0.501")


def test_order_of():
    assert order_of(1.03e12) == order_of(8.84e11) == "1e+12", "noise-derived lengths read as their power of ten"
    assert order_of(0.0) == "0" and order_of(float("inf")) == "inf"
