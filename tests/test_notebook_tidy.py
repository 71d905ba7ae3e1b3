"""`tests/notebook_pairs.py --tidy` (run by `make notebooks` after each execution): what changes on every
execution and means nothing (execution timestamps, where the kernel split a print, the widgets' random model ids) is taken out, so that an
unchanged notebook re-executed leaves `git status` clean."""

import json
import random
import re
import sys
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
from notebook_pairs import NOTEBOOKS, WIDGET_STATE, WIDGET_VIEW, tidy  # noqa: E402


def stored(name: str) -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)


def as_executed(nb: nbformat.NotebookNode, seed: int) -> nbformat.NotebookNode:
    """`nb` as a new execution may write it: fresh random widget ids, each code cell with its timestamps, a
    cell's first print of several lines in two pieces."""
    rng = random.Random(seed)
    ids = {key: f"{rng.getrandbits(128):032x}" for key in nb.metadata.widgets[WIDGET_STATE]["state"]}
    text = re.sub("|".join(ids), lambda m: ids[m.group(0)], json.dumps(nb))
    out = nbformat.from_dict(json.loads(text))
    for cell in out.cells:
        if cell.cell_type == "code":
            cell.metadata["execution"] = {"iopub.execute_input": f"2026-11-27T10:{rng.randrange(60):02d}:00Z"}
            for i, output in enumerate(cell.outputs):  # a print the kernel flushed in two pieces
                if output.output_type == "stream" and "\n" in output.text.rstrip("\n"):
                    cut = output.text.index("\n") + 1
                    second = nbformat.from_dict({**output, "text": output.text[cut:]})
                    output.text = output.text[:cut]
                    cell.outputs.insert(i + 1, second)
                    break
    return out


def streams(nb: nbformat.NotebookNode) -> int:
    return sum(o.output_type == "stream" for c in nb.cells for o in c.get("outputs", []))


def test_a_notebook_with_widgets_executed_again_tidies_back_to_its_stored_file():
    for name in ["07_influence", "09_dashboard"]:
        nb = stored(name)
        assert len(nb.metadata.widgets[WIDGET_STATE]["state"]) > 10, f"{name} stores no widgets to renumber"
        for seed in range(3):
            again = as_executed(nb, seed)
            assert streams(again) > streams(nb), f"{name}: no print split in pieces, the test would not see it joined"
            assert tidy(again) == nb, f"{name}: ids or timestamps of an execution survived tidy (seed {seed})"


def test_tidy_keeps_every_widget_an_output_reaches_and_drops_the_rest():
    nb = as_executed(stored("09_dashboard"), seed=0)
    state = nb.metadata.widgets[WIDGET_STATE]["state"]
    orphan = next(iter(state))
    state["f" * 32] = dict(state[orphan])  # a widget no output and no other widget refers to
    out = tidy(nb)
    kept = out.metadata.widgets[WIDGET_STATE]["state"]
    assert len(kept) == len(state) - 1, f"{len(state)} widgets, one unreachable: {len(kept)} kept"
    referred = set(re.findall(r"IPY_MODEL_([0-9a-f]{32})", json.dumps(kept)))
    shown = {
        o.data[WIDGET_VIEW]["model_id"]
        for c in out.cells
        for o in c.get("outputs", [])
        if WIDGET_VIEW in o.get("data", {})
    }
    assert referred | shown <= set(kept), (
        f"references to widgets tidy dropped: {sorted((referred | shown) - set(kept))}"
    )
    assert all(not c.metadata.get("execution") for c in out.cells), "an execution timestamp survived tidy"


def test_widgets_shown_without_a_stored_state_are_renumbered_too():
    executions = [as_executed(stored("09_dashboard"), seed) for seed in (1, 2)]
    for nb in executions:
        del nb.metadata["widgets"]  # a front end that saved the outputs but not the widgets' state
    first, second = (tidy(nb) for nb in executions)
    assert executions[0] != executions[1] and first == second, "random widget ids survived tidy without a state"
