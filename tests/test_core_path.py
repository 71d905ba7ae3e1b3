"""The student's path (README.md's table, "The student's path"): each notebook opens with what the reader will learn
and what they need first, ends with a summary of at most five lines before the maintainers' checks, shows no source
over 15 lines, and the README's minutes are computed from the stored notebooks at a stated pace, exercises included.

The pace (a careful student who knows PyTorch, reading every cell closely, formulas included): PROSE_WORDS words of
markdown a minute, CODE_LINES lines of code a minute, OUTPUT_LINES lines of output a minute (a printed line, or a
table's row), FIGURE_MINUTES a figure (or an HTML page other than a table). An exercise takes the minutes its heading
states ("Exercise 1: ... (about 5 minutes)"), in place of reading its solution (the cells tagged "solution"). The
maintainers' checks at the end of each notebook are not counted (a reader may skip them), and the set-up cell every
notebook opens with (MODEL, CAPTURE, TASK, open_step) is counted once, in the first notebook.
`python tests/test_core_path.py` prints each notebook's counts and minutes, the README's table."""

import re
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
PROSE_WORDS, CODE_LINES, OUTPUT_LINES, FIGURE_MINUTES = 80, 6, 10, 2.0
MAX_MINUTES = 150
MAX_SHOWN_LINES = 15
MAX_SUMMARY_LINES = 5
ROW = re.compile(r"^\| `(\d\d\w*)` \| .* \| (\d+) \|$")
TOTAL = re.compile(r"about (\d+) minutes in all")
EXERCISE = re.compile(r"(?:\*\*|## )Exercises? [^*\n]*\(about (\d+) minutes\)")
SET_UP = (  # the set-up lines every notebook opens with, read once
    "# The model by name: None is the bundled model;",
    "MODEL = None",
    "# Or a step captured from your own TRL run",
    "CAPTURE = None",
    "# With CAPTURE, your registered task",
    "TASK = None",
    "# setup() first: one torch thread",
    "cfg, step = open_step(MODEL, CAPTURE, TASK",
    "from grpo_debug.ui.notebook import open_step",
)


def readme_table() -> dict[str, int]:
    """{notebook stem: minutes} of README.md's student's path, in its order."""
    return {
        m.group(1): int(m.group(2)) for line in (ROOT / "README.md").read_text().splitlines() if (m := ROW.match(line))
    }


def reading(stem: str, first: bool) -> dict[str, float]:
    """What a reader reads in the stored notebook `stem`: markdown words, code lines, output lines, figures, and the
    minutes they take at the pace above."""
    cells = nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4).cells
    if len(cells) > 1 and cells[-2].source.startswith("## Checks"):
        cells = cells[:-2]
    words = code = output = figures = exercises = 0
    for cell in cells:
        if cell.cell_type == "markdown":
            words += len(cell.source.split())
            exercises += sum(int(m) for m in EXERCISE.findall(cell.source))
            continue
        if "solution" in cell.metadata.get("tags", []):
            continue  # the student writes it: the exercise's stated minutes
        lines = [line for line in cell.source.splitlines() if line.strip()]
        code += sum(1 for line in lines if first or not line.strip().startswith(SET_UP))
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "text" in out:
                output += len(out["text"].splitlines())
            elif "image/png" in data:
                figures += 1
            elif "text/html" in data:  # a table: its rows; any other page (08's tokens): a figure
                rows = "".join(data["text/html"]).count("<tr")
                output, figures = output + rows, figures + (rows == 0)
            elif "text/plain" in data:
                output += len("".join(data["text/plain"]).splitlines())
    minutes = words / PROSE_WORDS + code / CODE_LINES + output / OUTPUT_LINES + figures * FIGURE_MINUTES + exercises
    return {"words": words, "code": code, "output": output, "figures": figures, "exercises": exercises,
            "minutes": minutes}  # fmt: skip


def path_minutes() -> dict[str, dict[str, float]]:
    return {stem: reading(stem, i == 0) for i, stem in enumerate(readme_table())}


def test_the_readme_minutes_are_the_computed_ones_and_the_path_takes_at_most_150():
    computed = path_minutes()
    assert len(computed) >= 8, f"README's table of the student's path not found: {list(computed)}"
    stated = readme_table()
    wrong = {
        stem: (stated[stem], round(r["minutes"])) for stem, r in computed.items() if stated[stem] != round(r["minutes"])
    }
    assert not wrong, f"README's minutes (stated, computed): {wrong}; `python tests/test_core_path.py` prints the table"
    total = round(sum(r["minutes"] for r in computed.values()))
    said = TOTAL.search((ROOT / "README.md").read_text())
    assert said and int(said.group(1)) == total, f"README's total is not the computed {total} minutes"
    assert total <= MAX_MINUTES, f"the student's path takes {total} minutes at the stated pace, over {MAX_MINUTES}"


@pytest.mark.parametrize("stem", list(readme_table()))
def test_a_core_notebook_says_what_it_teaches_and_ends_on_a_short_summary(stem):
    cells = nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4).cells
    opening = cells[0].source
    assert "**What you will learn.**" in opening and "**What you need first.**" in opening, stem
    summaries = [c for c in cells if c.cell_type == "markdown" and c.source.startswith("## Summary")]
    assert len(summaries) == 1, f"{stem}: one '## Summary' cell"
    bullets = [line for line in summaries[0].source.splitlines()[1:] if line.strip()]
    assert len(bullets) <= MAX_SUMMARY_LINES, f"{stem}: a summary of {len(bullets)} lines"
    checks = cells[-2].source if len(cells) > 1 else ""
    assert checks.startswith("## Checks") and "Maintainers'" in checks, f"{stem}: the checks not marked as maintainers'"
    assert cells.index(summaries[0]) < len(cells) - 2, f"{stem}: the summary comes before the checks"


@pytest.mark.parametrize("stem", list(readme_table()))
def test_no_shown_source_on_the_core_path_is_over_15_lines(stem):
    cells = nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4).cells
    for cell in cells:
        if cell.cell_type != "code" or "show_source(" not in cell.source:
            continue
        text = "".join(out.get("text", "") for out in cell.get("outputs", []))
        for shown in text.strip().split("\n\n"):
            lines = shown.splitlines()
            assert len(lines) <= MAX_SHOWN_LINES, f"{stem}: a shown source of {len(lines)} lines: {lines[0]}"


if __name__ == "__main__":
    rows = path_minutes()
    print(
        f"pace: {PROSE_WORDS} words, {CODE_LINES} code lines, {OUTPUT_LINES} output lines a minute, "
        f"{FIGURE_MINUTES:g} min a figure"
    )
    for stem, r in rows.items():
        print(
            f"{stem:24s} {r['words']:5d} words {r['code']:4d} code {r['output']:4d} output {r['figures']:2d} figures "
            f"{r['exercises']:3d} min of exercises {r['minutes']:5.1f} min"
        )
    print(f"{'total':24s} {sum(r['minutes'] for r in rows.values()):.1f} min")
    sys.exit(0)
