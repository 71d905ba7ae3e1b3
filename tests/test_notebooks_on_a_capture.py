"""Every notebook that walks a step takes `CAPTURE` (and `TASK`) at the top instead of `MODEL`: each one is
executed here, top to bottom, on a step captured from a 2-step TRL run of the bundled model (as notebook 10
makes it) and opened with the bundled task, and must end on that captured step.

Not here: 06b (it loads the committed training experiments of the bundled model) and 10 (it is the capture's
own notebook, run by nbval)."""

from pathlib import Path

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient

from grpo_debug.capture import CaptureCallback
from grpo_debug.config import StepConfig
from grpo_debug.trl_bridge import trl_trainer

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
ON_A_STEP = sorted(p.stem for p in NOTEBOOKS.glob("[0-9]*.py") if p.stem not in ("06b_training", "10_your_run"))


pytestmark = pytest.mark.usefixtures("task_registry_restored")


@pytest.fixture(scope="module")
def capture(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run")
    cfg = StepConfig(num_prompts=2, num_generations=4, max_new_tokens=32, beta=0.04)  # notebook 10's demo run
    trainer = trl_trainer(cfg, str(out), max_steps=2, disable_dropout=True)
    trainer.add_callback(CaptureCallback(out / "captures", steps=[2]))
    trainer.train()
    return out / "captures" / "step-2"


def on_capture(name: str, capture: Path, task: str | None) -> nbformat.NotebookNode:
    text = (NOTEBOOKS / f"{name}.py").read_text()
    assert text.count("\nCAPTURE = None\n") == 1 and text.count("\nTASK = None\n") == 1, "no CAPTURE/TASK at the top"
    text = text.replace("\nCAPTURE = None\n", f"\nCAPTURE = {str(capture)!r}\n")
    text = text.replace("\nTASK = None\n", f"\nTASK = {task!r}\n")
    notebook = jupytext.reads(text, fmt="py:percent")
    notebook.cells.append(nbformat.v4.new_code_cell(  # it walked the captured step, not the bundled one
        "assert step.capture is not None and str(step.capture.path) == CAPTURE, step.capture\n"
        "assert step.cfg.model == str(step.capture.path / 'policy')"))
    return notebook


@pytest.mark.parametrize("name", ON_A_STEP)
def test_the_notebook_walks_a_captured_step(name, capture):
    notebook = on_capture(name, capture, StepConfig().task)
    NotebookClient(notebook, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
