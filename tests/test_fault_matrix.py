"""Bad input at the command line's boundary, each with its documented outcome: a one-line refusal naming what is
wrong (exit 2, before any model loads), or a defined result (strict JSON that says where a number was not finite).
The capture's own fields are refused in tests/test_capture.py, the recorder's failures in
tests/test_observer_failures.py."""

import json
import math
import subprocess
import sys

import pytest

from grpo_debug.cli.commands import write_json
from grpo_debug.runs.results import non_finite_paths


@pytest.mark.parametrize("value", ["١٦", "1٦", "x1", "1.5", " 16"])
def test_an_option_takes_ascii_digits_only(value):
    done = subprocess.run(
        [sys.executable, "-m", "grpo_debug", "doctor", "--held-out", value], capture_output=True, text=True, timeout=120
    )
    lines = [line for line in done.stderr.splitlines() if "error:" in line]
    assert done.returncode == 2 and lines, f"--held-out {value!r}: exit {done.returncode}\n{done.stderr}"
    assert f"{value!r} is not an integer (ASCII digits)" in lines[0] and "Traceback" not in done.stderr, done.stderr


def test_json_outputs_are_strict_and_say_where_a_number_was_not_finite(tmp_path):
    value = {"loss": math.nan, "grad_norm": [1.0, math.inf], "kl": {"exact": -math.inf, "logged": 0.5}}
    assert non_finite_paths(value) == ["loss", "grad_norm[1]", "kl.exact"]
    write_json(str(tmp_path / "out.json"), value)

    def refuse(constant):
        raise AssertionError(f"{constant} in a JSON output: not strict JSON")

    out = json.loads((tmp_path / "out.json").read_text(), parse_constant=refuse)
    assert out["loss"] is None and out["grad_norm"] == [1.0, None] and out["kl"] == {"exact": None, "logged": 0.5}
    assert out["non_finite_as_null"] == ["loss", "grad_norm[1]", "kl.exact"], out
    write_json(str(tmp_path / "finite.json"), {"loss": 1.0})
    assert "non_finite_as_null" not in json.loads((tmp_path / "finite.json").read_text())
