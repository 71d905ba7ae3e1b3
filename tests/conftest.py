import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing in the tests may reach a hub
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).parent))  # test helpers (trl_probes)

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def scorer():
    from grpo_debug.chess.task import bundled_scorer
    scorer = bundled_scorer()  # the one the registered chess tasks use
    yield scorer
    scorer.close()
