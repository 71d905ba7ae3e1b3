import re
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[ ]", r.strip(), maxsplit=1)[0].lower() for r in requirements}


def test_environment_yml_names_the_same_dependencies_as_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = _names(project["dependencies"] + project["optional-dependencies"]["test"])
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = lines.index("  - pip:")
    pip = [line.strip()[2:] for line in lines[start + 1 :] if line.strip().startswith("- ")]
    assert _names([p for p in pip if not p.startswith("-e")]) == declared
    assert "-e ." in pip
    conda = [line.strip()[2:] for line in lines[:start] if line.startswith("  - ")]
    assert "python=3.11" in conda and "stockfish" in conda
    assert "conda-forge" in (ROOT / "environment.yml").read_text()


def test_ci_runs_the_readmes_test_command_and_nothing_else():
    """Every tier, `make test`, `make test-slow` and `make test-kernels`: nothing a test checks is left out of CI."""
    commands = [
        line
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.startswith(("#", "set "))
    ]
    assert commands == ["make test test-slow test-kernels"], f".ci/run runs {commands}, not every tier"
    readme = (ROOT / "README.md").read_text()
    assert "\nmake test test-slow test-kernels " in readme, "the README's test command is not what .ci/run runs"


def test_torch_is_pinned_where_it_is_installed():
    assert "torch==2.13.0" in (ROOT / "Makefile").read_text()
    assert "torch==2.13.0" in (ROOT / "environment.yml").read_text()


def test_a_cpu_user_sets_use_cpu_as_the_readme_says():
    """README, "Debug your own TRL run": on a machine without a GPU a plain GRPOConfig stops (TRL resolves bf16=None
    to True); use_cpu=True is the one setting that lets it run there."""
    import torch
    from trl import GRPOConfig

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the plain GRPOConfig runs here")
    with pytest.raises(ValueError, match="use_cpu"):
        GRPOConfig(output_dir="unused", report_to="none")
    assert GRPOConfig(output_dir="unused", report_to="none", use_cpu=True).use_cpu


def test_every_dependency_is_locked_to_one_version_with_hashes():
    """`make lab` and `make test` install from requirements.lock (made by `make lock`), hashes checked; torch is
    installed by its own pinned line before it."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = _names(project["dependencies"] + project["optional-dependencies"]["test"]) - {"torch"}
    lock = (ROOT / "requirements.lock").read_text()
    pinned = {m.group(1).lower() for m in re.finditer(r"^([A-Za-z0-9_.\-]+)==[^\s;]+", lock, re.M)}
    canon = lambda names: {re.sub(r"[-_.]+", "-", n) for n in names}
    assert canon(declared) <= canon(pinned), f"not in the lock: {sorted(canon(declared) - canon(pinned))}"
    assert "torch==" not in lock, "torch comes from the Makefile's own line (the CPU build), not the lock"
    assert lock.count("--hash=sha256:") >= len(pinned), "a locked package without a hash"
    makefile = (ROOT / "Makefile").read_text()
    assert "--require-hashes -r $(LOCK)" in makefile and "LOCK := requirements.lock" in makefile
