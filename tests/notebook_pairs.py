"""`python tests/notebook_pairs.py [--tidy NOTEBOOK ...]`: every notebook's `.py` (jupytext percent source) and
`.ipynb` (executed, what nbval compares) must hold the same cells, and each stored `.ipynb` must be tidy: nothing
in it that changes on every execution and means nothing (the cells' execution timestamps, the widgets' random
model ids), so that re-executing a notebook leaves `git status` clean where its outputs did not change. Exits 1
naming each notebook that differs. `--tidy` rewrites the notebooks given, tidy.

Edit the `.py`, then `jupytext --sync notebooks/NN_name.py` and re-execute the `.ipynb`
(`make notebooks` does both for every notebook, and tidies it).
"""

import copy
import difflib
import json
import re
import sys
from pathlib import Path

import jupytext
import nbformat

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"

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
        stored = nbformat.read(ipynb, as_version=4)
        if tidy(stored) != stored:
            problems.append(
                f"{ipynb.name} is not tidy (execution timestamps, prints split in pieces or random widget ids)"
            )
    return problems


def tidy(nb: dict) -> dict:
    """`nb` without the cells' execution timestamps, a cell's consecutive prints to one stream as one output (the
    kernel splits them where its flushes happen to fall), its widgets renumbered 1, 2, ... in the order they are
    reached from the cells' outputs (each widget's state walked in key order), widgets no output reaches dropped."""
    nb = copy.deepcopy(nb)
    for cell in nb["cells"]:
        cell.get("metadata", {}).pop("execution", None)
        if "outputs" in cell:
            cell["outputs"] = joined_streams(cell["outputs"])
    widgets = nb.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE)
    shown = [
        o["data"][WIDGET_VIEW]["model_id"]
        for c in nb["cells"]
        for o in c.get("outputs", [])
        if WIDGET_VIEW in o.get("data", {})
    ]
    if not shown and widgets is None:
        return nb
    state = widgets.get("state", {}) if widgets else {}
    order = []
    for model in shown:  # breadth first from each shown widget, so the numbering follows the notebook
        queue = [model]
        while queue:
            current = queue.pop(0)
            if current in order:
                continue
            order.append(current)  # shown but not in the stored state: renumbered all the same
            queue.extend(model_ids(state.get(current, {}), set(state)))
    new = {old: f"{i + 1:032x}" for i, old in enumerate(order)}
    text = json.dumps({"cells": nb["cells"], "state": {k: state[k] for k in order if k in state}})
    ids = '"(IPY_MODEL_)?(' + "|".join(new) + ')"'  # an id is a whole string, alone or behind IPY_MODEL_
    renumbered = json.loads(re.sub(ids, lambda m: f'"{m.group(1) or ""}{new[m.group(2)]}"', text) if new else text)
    nb["cells"] = nbformat.from_dict(renumbered["cells"])
    if widgets is not None:
        widgets["state"] = nbformat.from_dict(renumbered["state"])
    return nb


def joined_streams(outputs: list[dict]) -> list[dict]:
    """`outputs` with each run of consecutive outputs to the same stream (stdout, stderr) joined into one."""
    joined = []
    for output in outputs:
        last = joined[-1] if joined else None
        if (
            output.get("output_type") == "stream"
            and last
            and last.get("output_type") == "stream"
            and last["name"] == output["name"]
        ):
            last["text"] += output["text"]
        else:
            joined.append(output)
    return joined


def model_ids(value, known: set[str]) -> list[str]:
    """The widget ids `value` refers to (`IPY_MODEL_<id>`, or a `model_id`), in the order a walk in key order
    meets them."""
    if isinstance(value, dict):
        return [m for key in sorted(value) for m in model_ids(value[key], known)]
    if isinstance(value, list):
        return [m for item in value for m in model_ids(item, known)]
    if isinstance(value, str):
        name = value.removeprefix("IPY_MODEL_")
        return [name] if name in known else []
    return []


if __name__ == "__main__":
    if sys.argv[1:2] == ["--tidy"]:
        for path in sys.argv[2:]:
            nbformat.write(tidy(nbformat.read(path, as_version=4)), path)
        sys.exit(0)
    problems = out_of_sync()
    for problem in problems:
        print(problem)
    if problems:
        print("run `make notebooks` (jupytext --sync, then execute) to bring the pairs together", file=sys.stderr)
    sys.exit(1 if problems else 0)
