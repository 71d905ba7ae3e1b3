import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing in the tests may reach a hub
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).parent))  # test helpers (trl_probes)

from grpo_debug.kernels import pin

pin()  # AVX2 kernels before any torch op, as the Makefile exports them (grpo_debug/kernels.py says why)

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def scorer():
    from grpo_debug.chess.task import bundled_scorer

    scorer = bundled_scorer()  # the one the registered chess tasks use
    yield scorer
    scorer.close()


@pytest.fixture(scope="module")
def task_registry_restored():
    """Opening a capture registers its task (capture:<path>): leave the registry as the other tests find it."""
    import grpo_debug.task as task_module

    factories, loaded = dict(task_module._FACTORIES), dict(task_module._LOADED)
    yield
    for registry, saved in ((task_module._FACTORIES, factories), (task_module._LOADED, loaded)):
        registry.clear()
        registry.update(saved)


# `make test` and `make test-slow` run pytest-xdist with --dist loadscope: each file, test class and notebook goes
# whole to one worker, in collection order. The slowest ones go first, so that no worker is left with one at the end
# (the order within each is kept); each tier keeps this order among its own. Ranked by each scope's summed seconds in
# one run of the whole suite (`--junitxml`, 2026-11-26, commit 31729ca); the rest keep their order.
SLOWEST_FIRST = (
    "tests/test_notebooks_on_a_capture.py::TestBundled",
    "tests/test_doctor.py",
    "tests/test_benchmarks.py",
    "tests/test_your_run.py",
    "tests/test_browser.py",
    "tests/test_train_resume.py",
    "notebooks/07_influence.ipynb",
    "notebooks/05c_mismatch.ipynb",
    "tests/test_capture.py",
    "notebooks/07b_selection.ipynb",
    "tests/test_step.py",
    "tests/test_influence.py",
    "notebooks/05b_off_policy.ipynb",
    "tests/test_train.py",
    "tests/test_diagnostics.py",
    "notebooks/02_logprobs.ipynb",
    "notebooks/06b_training.ipynb",
    "tests/test_notebooks_on_a_capture.py",
    "tests/test_widgets.py",
    "tests/test_mismatch.py",
    "notebooks/09_dashboard.ipynb",
    "notebooks/10_doctor.ipynb",
    "notebooks/08_diagnostics.ipynb",
)


# The notebooks nbval runs in `make test-slow` rather than `make test` (the advanced notebooks, each over a
# minute); the rest of `make test-slow` is marked `@pytest.mark.slow` where it stands.
SLOW_NOTEBOOKS = (
    "notebooks/05b_off_policy.ipynb",
    "notebooks/05c_mismatch.ipynb",
    "notebooks/06b_training.ipynb",
    "notebooks/07_influence.ipynb",
    "notebooks/07b_selection.ipynb",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.startswith(SLOW_NOTEBOOKS):
            item.add_marker(pytest.mark.slow)

    def rank(item) -> int:
        return next((i for i, prefix in enumerate(SLOWEST_FIRST) if item.nodeid.startswith(prefix)), len(SLOWEST_FIRST))

    items.sort(key=rank)  # stable
