"""One call at the top of every notebook: the same numbers on every run (`setup`), and the step to walk (`open_step`)."""

import warnings

import matplotlib
import pandas as pd
import torch
import transformers


def setup(threads: int = 1) -> None:
    """One torch thread (float sums in a fixed order), 4-digit pandas floats, a fixed figure style."""
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    pd.set_option("display.precision", 4)
    pd.set_option("display.max_colwidth", 70)
    pd.set_option("display.width", 140)
    transformers.utils.logging.set_verbosity_error()  # no progress bars or warnings with timings in outputs
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")  # peft on transformers 5
    matplotlib.rcParams.update({"figure.dpi": 80, "axes.grid": True, "grid.alpha": 0.3})


def open_step(model: str | None = None, **fields):
    """`setup()`, then the step a notebook walks: (cfg, step), cfg = `StepConfig(model=..., **fields)` on the
    bundled model unless `model` names another (a folder, or a hub name where the hub is reachable)."""
    from .config import StepConfig
    from .paths import DEFAULT_MODEL
    from .step import GRPOStep
    setup()
    cfg = StepConfig(model=model or DEFAULT_MODEL, **fields)
    return cfg, GRPOStep(cfg)


def show_source(*functions) -> None:
    """Print the code of the functions a notebook is about: the readable path, not the fast one."""
    import inspect
    for function in functions:
        print(inspect.getsource(function))
