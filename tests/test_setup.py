import re
from pathlib import Path

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


def test_ci_runs_make_test_and_nothing_else():
    commands = [
        line
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.startswith(("#", "set "))
    ]
    assert commands == ["make test"]


def test_torch_is_pinned_where_it_is_installed():
    assert "torch==2.13.0" in (ROOT / "Makefile").read_text()
    assert "torch==2.13.0" in (ROOT / "environment.yml").read_text()
