"""Where the bundled data and model live. GRPO_DEBUG_MODEL overrides the default model (a folder or hub id)."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = ROOT / "data"
DEFAULT_MODEL_DIR = DATA_DIR / "models" / "rookworld-tiny"
DEFAULT_MODEL = os.environ.get("GRPO_DEBUG_MODEL", str(DEFAULT_MODEL_DIR))
HUB_MODEL = "jrahn/RookWorld-LM-124M"
