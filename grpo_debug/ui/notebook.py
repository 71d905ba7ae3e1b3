"""One call at the top of every notebook: the same numbers on every run (`setup`), and the step to walk (`open_step`)."""

import os
import warnings

from ..kernels import pin

pin()  # the notebooks' own numbers: AVX2 kernels, before torch runs an op (kernels.py says why)

import matplotlib  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from ..digits import DIGITS, significant  # noqa: E402


def threads_asked() -> int:
    """The torch threads the variable GRPO_DEBUG_THREADS asks for (1 when unset): the kernel-varying test runs the
    notebooks at 2 to show that their stored outputs do not depend on it."""
    value = os.environ.get("GRPO_DEBUG_THREADS", "1")
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"GRPO_DEBUG_THREADS={value!r}: give a whole number of torch threads, 1 or more")
    return int(value)


def setup(threads: int | None = None) -> None:
    """One torch thread (float sums in a fixed order; `threads`, or the variable GRPO_DEBUG_THREADS, for more),
    pandas floats at 3 significant digits (`grpo_debug/digits.py`: what every CPU computes alike), a fixed figure style."""
    torch.set_num_threads(threads or threads_asked())
    pinned = os.environ.get("ATEN_CPU_CAPABILITY", "").upper()
    if pinned and torch.backends.cpu.get_cpu_capability() != pinned:
        warnings.warn(
            f"torch runs its CPU kernels at {torch.backends.cpu.get_cpu_capability()}, not the pinned "
            f"{pinned}: it ran an op before grpo_debug.ui.notebook was imported, so the numbers may differ "
            "from the stored outputs; import it first",
            stacklevel=2,
        )
    torch.use_deterministic_algorithms(True, warn_only=True)
    pd.set_option("display.precision", DIGITS)
    pd.set_option("display.float_format", significant)
    pd.set_option("display.max_colwidth", 70)
    pd.set_option("display.width", 140)
    transformers.utils.logging.set_verbosity_error()  # no progress bars or warnings with timings in outputs
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")  # peft on transformers 5
    matplotlib.rcParams.update({"figure.dpi": 80, "axes.grid": True, "grid.alpha": 0.3})


def open_step(
    model: str | None = None, capture: str | None = None, task: str | None = None, device: str | None = None, **fields
):
    """`setup()`, then the step a notebook walks: (cfg, step). `device` (default: the variable GRPO_DEBUG_DEVICE, e.g.
    "cuda"): where the models and the step's tensors live; unset, a capture opens on the GPU where torch sees one
    and the bundled step on the CPU (the stored outputs are the CPU's).

    - `capture`: a step captured from your TRL run (`grpo_debug.capture`). The step is that batch under the
      capture's own config (`open_capture`), `fields` applied except rollout fields: the captured
      rollout is fixed. `task`: your task plug-in (a registered name) with the run's reward functions, needed
      only by the cells that sample new completions (evaluation, validation sets).
    - otherwise `StepConfig(model=..., **fields)` on the bundled model unless `model` names another (a folder,
      or a hub name where the hub is reachable), on the task `task` (default: the bundled chess task)."""
    from ..capture.opening import open_capture
    from ..config import StepConfig
    from ..files import DEFAULT_MODEL
    from ..step import GRPOStep

    setup()
    device = device or os.environ.get("GRPO_DEBUG_DEVICE") or None
    if capture is not None:
        kept = {k: v for k, v in fields.items() if StepConfig.phase_of(k) != "rollout"}
        if kept != fields:
            print(
                f"CAPTURE {capture}: the notebook's rollout settings {sorted(set(fields) - set(kept))} are the "
                "capture's own here"
            )
        step = open_capture(capture, task, device=device, **kept)
        return step.cfg, step
    cfg = StepConfig(model=model or DEFAULT_MODEL, **fields, **({"task": task} if task else {}))
    return cfg, GRPOStep(cfg, device=device)


SHOWN_LINES = 32  # a shown source is the idea's lines; the rest is a pointer to the whole function


def show_source(*functions, lines: int = SHOWN_LINES) -> None:
    """Print the code of the functions a notebook is about (the readable path, not the fast one): each docstring
    cut to its first line, at most `lines` lines of each function, then where the whole of it is."""
    for function in functions:
        print("\n".join(idea_lines(function, lines)) + "\n")


def idea_lines(function, lines: int = SHOWN_LINES) -> list[str]:
    """`function`'s source with a long signature on one line (its parameters' names), its docstring cut to its first
    line, its first `lines` lines, and a pointer to the rest (its file and line) where there is more."""
    import ast
    import inspect
    import textwrap
    from pathlib import Path

    source = textwrap.dedent(inspect.getsource(function))
    code = source.splitlines()
    definition = ast.parse(source).body[0]
    body = definition.body
    if body[0].lineno - definition.lineno > 1:  # a signature over several lines: its names on one line
        stars = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
        names = ", ".join(stars.get(p.kind, "") + p.name for p in inspect.signature(function).parameters.values())
        returns = f" -> {ast.unparse(definition.returns)}" if definition.returns is not None else ""
        signature = textwrap.fill(f"def {function.__name__}({names}){returns}:", 118, subsequent_indent="        ")
        code = code[: definition.lineno - 1] + signature.splitlines() + code[body[0].lineno - 1 :]  # decorators kept
        body = ast.parse("\n".join(code)).body[0].body
    docstring = body[0] if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) else None
    if docstring is not None and isinstance(docstring.value.value, str):
        text = docstring.value.value.strip().splitlines()
        opening = code[docstring.lineno - 1]
        indent = opening[: len(opening) - len(opening.lstrip())]
        cut = indent + '"""' + text[0] + (" ..." if len(text) > 1 else "") + '"""'
        code = code[: docstring.lineno - 1] + [cut] + code[docstring.end_lineno :]
    if len(code) <= lines:
        return code
    where = Path(inspect.getsourcefile(function)).resolve()
    package = Path(__file__).resolve().parent.parent.parent
    name = where.relative_to(package) if where.is_relative_to(package) else where
    start = inspect.getsourcelines(function)[1]
    return code[:lines] + [f"    # ... {len(code) - lines} more lines: {name}, line {start} ({function.__name__})"]
