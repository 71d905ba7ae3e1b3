"""The stored outputs are read by a person: every code cell's text output at most 40 lines of at most 200
characters, and no table wider than 8 columns or with a column that holds nothing (every value NaN, None or
empty). Read from the stored `.ipynb` files, so nothing is executed here.

A table is a pandas DataFrame's HTML (`class="dataframe"`), its columns the value cells of a body row (the index
is in header cells). Text is what a cell prints and any result shown as plain text only (a result with an HTML
or image form is read in that form). Figures are not checked here, their axes are not in the stored PNG: every
figure function checks its own axes as it draws (`ui.plots.unlabelled_axes`), so nbval's run of every notebook
checks every figure.

`KNOWN` names the cells that break a rule today, each by its notebook and a piece of its source, so the rule
holds everywhere else; a known cell that stops breaking it fails the test until it is taken off the list."""

from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
MAX_LINES = 40
MAX_WIDTH = 200  # characters in one printed line: a verdict, a config or a message past it is a wall of text
MAX_COLUMNS = 8
EMPTY = {"NaN", "nan", "None", "<NA>", "NaT", ""}

# (notebook stem, a piece of the cell's source) -> the rule it breaks
KNOWN = {}


class DataFrameTables(HTMLParser):
    """The value cells of each body row of every DataFrame table in an HTML output."""

    def __init__(self):
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.in_body, self.row, self.cell = False, None, None

    def handle_starttag(self, tag, attrs):
        if tag == "table" and "dataframe" in (dict(attrs).get("class") or ""):
            self.tables.append([])
        elif tag == "tbody" and self.tables:
            self.in_body = True
        elif tag == "tr" and self.in_body:
            self.row = []
        elif tag == "td" and self.row is not None:
            self.cell = []

    def handle_endtag(self, tag):
        if tag == "td" and self.cell is not None:
            self.row.append("".join(self.cell).strip())
            self.cell = None
        elif tag == "tr" and self.row is not None:
            self.tables[-1].append(self.row)
            self.row = None
        elif tag == "tbody":
            self.in_body = False

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)


def joined(value) -> str:
    return value if isinstance(value, str) else "".join(value)


def text_lines(cell) -> list[str]:
    lines = []
    for out in cell.get("outputs", []):
        data = out.get("data", {})
        if "text" in out:
            lines += joined(out["text"]).splitlines()
        elif "text/plain" in data and not any(k == "text/html" or k.startswith("image/") for k in data):
            lines += joined(data["text/plain"]).splitlines()
    return lines


def tables(cell) -> list[list[list[str]]]:
    found = []
    for out in cell.get("outputs", []):
        html = joined(out.get("data", {}).get("text/html", ""))
        if "dataframe" in html:
            parser = DataFrameTables()
            parser.feed(html)
            found += [rows for rows in parser.tables if rows]
    return found


def breaks(cell) -> set[str]:
    """The rules a cell's stored outputs break: "lines", "width", "columns"."""
    lines = text_lines(cell)
    broken = {"lines"} if len(lines) > MAX_LINES else set()
    if any(len(line) > MAX_WIDTH for line in lines):
        broken.add("width")
    for rows in tables(cell):
        width = max(len(r) for r in rows)
        columns = list(zip(*(r for r in rows if len(r) == width)))
        if width > MAX_COLUMNS or any(all(v in EMPTY for v in column) for column in columns):
            broken.add("columns")
    return broken


def known_rules(path: Path, cell) -> set[str]:
    return {rule for (stem, piece), rule in KNOWN.items() if stem == path.stem and piece in cell.source}


def test_the_check_counts_lines_and_reads_a_dataframe():
    import pandas as pd

    wide = pd.DataFrame({f"c{i}": [1.0] for i in range(9)})
    empty = pd.DataFrame({"a": [1.0, 2.0], "b": [float("nan")] * 2})
    narrow = pd.DataFrame({"a": [1.0], "b": [""], "c": ["x"]}).set_index("a")
    as_output = lambda table: {"output_type": "execute_result", "data": {"text/html": table.to_html()}}
    cell = lambda *outputs: {"cell_type": "code", "source": "", "outputs": list(outputs)}
    assert breaks(cell(as_output(wide))) == {"columns"} and breaks(cell(as_output(empty))) == {"columns"}
    assert breaks(cell(as_output(narrow.assign(b="y")))) == set()
    assert breaks(cell(as_output(narrow))) == {"columns"}, "a column of empty strings holds nothing"
    printed = {"output_type": "stream", "name": "stdout", "text": "line\n" * (MAX_LINES + 1)}
    assert breaks(cell(printed)) == {"lines"}
    wide_line = {"output_type": "stream", "name": "stdout", "text": "x" * (MAX_WIDTH + 1) + "\nshort\n"}
    assert breaks(cell(wide_line)) == {"width"}
    shown_as_html = {"output_type": "execute_result", "data": {"text/plain": "x\n" * 99, "text/html": "<b>x</b>"}}
    assert breaks(cell(shown_as_html)) == set(), "a result shown as HTML is not read as its plain text"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_output_fits_a_reader(path):
    nb = nbformat.read(path, as_version=4)
    broken = [
        (i, cell.source.splitlines()[0][:60], sorted(breaks(cell) - known_rules(path, cell)))
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code" and breaks(cell) - known_rules(path, cell)
    ]
    assert not broken, (
        f"{path.name}: cells whose output is over {MAX_LINES} lines of text or has a line over {MAX_WIDTH} "
        f"characters, or a table over {MAX_COLUMNS} "
        f"columns or with an empty column: {broken}"
    )


def test_the_known_cells_still_break_their_rule():
    """A cell on the KNOWN list that now reads well comes off it, so the rule covers it from then on."""
    fixed = []
    for (stem, piece), rule in KNOWN.items():
        cells = [
            c for c in nbformat.read(NOTEBOOKS[0].parent / f"{stem}.ipynb", as_version=4).cells if piece in c.source
        ]
        assert len(cells) == 1, f"{stem}: {piece!r} names {len(cells)} cells, not one"
        if rule not in breaks(cells[0]):
            fixed.append((stem, piece))
    assert not fixed, f"these cells now keep the rule: take them off KNOWN: {fixed}"
