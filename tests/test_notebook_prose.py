"""A notebook's prose may state a number only where a cell prints it: every decimal number in a markdown
cell must appear in some output of the same notebook, so the text and the computation cannot drift apart.

Not counted as stated numbers: code spans (`std_floor=0.1` names a setting) and version numbers
("TRL 1.16")."""

import re
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
DECIMAL = re.compile(r"(?<![\w.])(\d+\.\d+)(?![\w.]*\d)")
VERSION = re.compile(r"(?:TRL|transformers|torch|Python|jupytext|version|v)\s*$", re.IGNORECASE)


def stated_numbers(markdown: str) -> list[str]:
    prose = re.sub(r"`[^`]*`", " ", markdown)
    return [m.group(1) for m in DECIMAL.finditer(prose) if not VERSION.search(prose[: m.start()])]


def output_text(nb) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            parts.append(out.get("text", ""))
            for kind in ("text/plain", "text/html", "text/markdown"):
                value = out.get("data", {}).get(kind, "")
                parts.append(value if isinstance(value, str) else "".join(value))
    return "\n".join(parts)


def test_the_check_finds_a_stated_number_and_skips_code_and_versions():
    assert stated_numbers("the gap is 0.86 of the total, `top_p=0.9`, TRL 1.16 and 12 rows") == ["0.86"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_number_in_the_prose_is_printed_by_a_cell(path):
    nb = nbformat.read(path, as_version=4)
    printed = output_text(nb)
    missing = [
        (n, cell.source[:60])
        for cell in nb.cells
        if cell.cell_type == "markdown"
        for n in stated_numbers(cell.source)
        if n not in printed
    ]
    assert not missing, f"{path.name}: numbers stated in prose but printed by no cell: {missing}"


def asserts_anything(path: Path) -> bool:
    cells = nbformat.read(path, as_version=4).cells
    return any(c.cell_type == "code" and "assert " in c.source for c in cells)


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if asserts_anything(p)], ids=lambda p: p.stem)
def test_the_claims_are_checked_in_a_last_cell_of_their_own(path):
    """The checks that tie a sentence to its number sit in the notebook's last cell, under a "## Checks"
    heading, not between the teaching cells (an identity a cell demonstrates may stay in its cell)."""
    nb = nbformat.read(path, as_version=4)
    heading, last = nb.cells[-2], nb.cells[-1]
    assert heading.cell_type == "markdown" and heading.source.startswith("## Checks"), path.name
    assert last.cell_type == "code" and "assert " in last.source, path.name
    assert sum(c.source.startswith("## Checks") for c in nb.cells if c.cell_type == "markdown") == 1
