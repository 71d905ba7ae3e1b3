"""Every notebook that walks a step takes `CAPTURE` (and `TASK`) at the top instead of `MODEL`: each one is
executed here, top to bottom, on four captured steps, and must end on that captured step:
- bundled: a 2-step TRL run of the bundled model (as notebook 10 once made it), opened with the bundled task;
- defaults: a user's own script (`user_train.py`) on a tiny GPT-2 with TRL's defaults (dropout on, bfloat16,
  dapo, beta 0, logging every 10 steps) and prompts of different lengths (left padding with dropout on), opened
  with the user's reward functions ("user_train.py:REWARD_FUNCS");
- chat: the same script on a tiny Llama (rotary positions) with a chat template and message-list prompts (a
  conversational run), every completion at max_completion_length (`min_new_tokens`: no EOS can be sampled);
- mu2-ga2: the same script with num_iterations 2, gradient_accumulation_steps 2, beta 0.04, grpo (step 2: pass 2).

Each capture is a test class that builds only its own run, so that pytest-xdist (`--dist loadscope`, as
`make test` runs it) can take the four on different workers.

Not here: 06b (it loads the committed training experiments of the bundled model) and 10 (it is the capture's
own notebook, run by nbval)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jupytext
import nbformat
import pytest
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.util import run_sync

from grpo_debug.capture import CaptureCallback
from grpo_debug.capture.trl_bridge import trl_trainer
from grpo_debug.config import StepConfig

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NOT_A_STEP = ("03b_stockfish", "06b_training", "10_your_run")  # a chess engine, training runs, a run of its own
ON_A_STEP = sorted(p.stem for p in NOTEBOOKS.glob("[0-9]*.py") if p.stem not in NOT_A_STEP)


pytestmark = [
    pytest.mark.usefixtures("task_registry_restored"),
    pytest.mark.slow,  # `make test-slow`: 14 notebooks on each of four captures; nbval runs them on the bundled model
]


TESTS = Path(__file__).resolve().parent
USER_RUNS = {
    "defaults": {"mixed_lengths": True, "per_device_train_batch_size": 8},  # two prompts a step: one is padded
    "chat": {"model": "my-chat", "chat": True, "generation_kwargs": {"min_new_tokens": 16}},
    "mu2-ga2": {"num_iterations": 2, "gradient_accumulation_steps": 2, "beta": 0.04, "loss_type": "grpo"},
}


def make_capture(run: str, tmp_path_factory) -> tuple[Path, str]:
    """(capture folder, TASK) of one run: only that run is trained (each class below is one xdist scope)."""
    sys.path.insert(0, str(TESTS))
    from arithmetic_task import build_tiny_llama, build_tiny_model

    if run == "bundled":
        out = tmp_path_factory.mktemp("run")
        cfg = StepConfig(num_prompts=2, num_generations=4, max_new_tokens=32, beta=0.04)
        trainer = trl_trainer(cfg, str(out), max_steps=2, disable_dropout=True)
        trainer.add_callback(CaptureCallback(out / "captures", steps=[2]))
        trainer.train()
        return out / "captures" / "step-2", StepConfig().task
    user = tmp_path_factory.mktemp("user")
    build_tiny_model(user / "my-model")
    build_tiny_llama(user / "my-chat", chat=True)
    shutil.copy(TESTS / "user_train.py", user / "user_train.py")
    done = subprocess.run(
        [sys.executable, "user_train.py", run, "10", json.dumps(USER_RUNS[run])],
        cwd=user,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return user / run / "captures" / "step-2", f"{user / 'user_train.py'}:REWARD_FUNCS"


@pytest.fixture(scope="class")
def capture(request, tmp_path_factory) -> tuple[Path, str]:
    return make_capture(request.cls.RUN, tmp_path_factory)


@pytest.fixture(scope="class")
def kernel():
    """One kernel for a capture's notebooks, its namespace reset before each (`%reset -f`): torch, transformers
    and TRL are imported once instead of once per notebook. nbval runs every notebook in a fresh kernel."""
    km = AsyncKernelManager(kernel_name="python3")
    run_sync(km.start_kernel)(cwd=str(NOTEBOOKS))
    yield km
    run_sync(km.shutdown_kernel)(now=True)


def on_capture(name: str, capture: Path, task: str | None) -> nbformat.NotebookNode:
    text = (NOTEBOOKS / f"{name}.py").read_text()
    assert text.count("\nCAPTURE = None\n") == 1 and text.count("\nTASK = None\n") == 1, "no CAPTURE/TASK at the top"
    text = text.replace("\nCAPTURE = None\n", f"\nCAPTURE = {str(capture)!r}\n")
    text = text.replace("\nTASK = None\n", f"\nTASK = {task!r}\n")
    notebook = jupytext.reads(text, fmt="py:percent")
    notebook.cells.append(
        nbformat.v4.new_code_cell(  # it walked the captured step, not the bundled one
            "assert step.capture is not None and str(step.capture.path) == CAPTURE, step.capture\n"
            "from pathlib import Path\n"
            "assert Path(step.cfg.model) == step.capture.path.resolve() / 'policy'"
        )
    )
    return notebook


class OnACapture:
    RUN = ""

    @pytest.mark.parametrize("name", ON_A_STEP)
    def test_the_notebook_walks_the_captured_step(self, name, capture, kernel):
        path, task = capture
        notebook = on_capture(name, path, task)
        notebook.cells.insert(
            0, nbformat.v4.new_code_cell("%reset -f\nimport matplotlib.pyplot\nmatplotlib.pyplot.close('all')")
        )
        NotebookClient(notebook, km=kernel, timeout=900).execute()


class TestBundled(OnACapture):
    RUN = "bundled"


class TestDefaults(OnACapture):
    RUN = "defaults"


class TestChat(OnACapture):
    RUN = "chat"


class TestMu2Ga2(OnACapture):
    RUN = "mu2-ga2"
