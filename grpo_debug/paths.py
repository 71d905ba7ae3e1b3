"""Where the bundled data and model live."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = ROOT / "data"
DEFAULT_MODEL_DIR = DATA_DIR / "models" / "rookworld-tiny"
DEFAULT_MODEL = str(DEFAULT_MODEL_DIR)
HUB_MODEL = "jrahn/RookWorld-LM-124M"
