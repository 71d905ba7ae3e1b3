"""`python tests/notebook_pairs.py [--fix]`: every notebook's `.py` (jupytext percent source) and `.ipynb`
(executed, what nbval compares) must hold the same cells. Exits 1 naming each pair that differs.

Edit the `.py`, then `jupytext --sync notebooks/NN_name.py` and re-execute the `.ipynb`
(`make notebooks` does both for every notebook).
"""

import difflib
import sys
from pathlib import Path

import jupytext

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def out_of_sync() -> list[str]:
    problems = []
    ipynbs = sorted(NOTEBOOKS.glob("*.ipynb"))
    sources = {p.with_suffix(".ipynb") for p in NOTEBOOKS.glob("[0-9]*.py")}
    for missing in sorted(sources - set(ipynbs)):
        problems.append(f"{missing.with_suffix('.py').name} has no executed .ipynb")
    for ipynb in ipynbs:
        source = ipynb.with_suffix(".py")
        if not source.exists():
            problems.append(f"{ipynb.name} has no paired .py source")
            continue
        expected = jupytext.writes(jupytext.read(ipynb), fmt="py:percent")
        actual = source.read_text()
        if expected != actual:
            diff = "".join(
                difflib.unified_diff(
                    expected.splitlines(True), actual.splitlines(True), str(ipynb.name), str(source.name), n=1
                )
            )
            problems.append(f"{ipynb.name} and {source.name} differ:\n{diff}")
    return problems


if __name__ == "__main__":
    problems = out_of_sync()
    for problem in problems:
        print(problem)
    if problems:
        print("run `make notebooks` (jupytext --sync, then execute) to bring the pairs together", file=sys.stderr)
    sys.exit(1 if problems else 0)
