"""What the command line checks before any work starts, torch-free: output paths a file can really be made at,
the prompts the task holds, and `--set` on a capture (never a model or a task: a value never names code)."""

from __future__ import annotations

import os

from ..config import StepConfig
from ..overrides import parse_overrides


def check_outputs(parser, args) -> None:
    """`--json` and `--html`, where given, refused before any work starts unless writable."""
    for path, flag in ((args.json, "--json"), (args.html, "--html")):
        if path is not None:  # "" too: refused, not silently skipped
            check_writable(parser, path, flag)


def check_prompts(cfg: StepConfig) -> None:
    """The task holds the prompts the step asks for (num_prompts after prompt_offset, eval_prompts), checked
    before the model loads."""
    from ..task import check_prompt_counts

    check_prompt_counts(
        cfg.task,
        [
            ("train", cfg.prompt_offset + cfg.num_prompts, "prompt_offset + num_prompts ="),
            ("test", cfg.eval_prompts, "eval_prompts ="),
        ],
    )


def capture_overrides(parser, args) -> dict:
    """`--set` on a capture, typed, before torch loads: the capture's folder must be one, and its model and task
    are the run's (`--task` names your reward functions): a `--set` value never names code to load."""
    if not os.path.isfile(os.path.join(args.path, "capture.json")):
        parser.error(f"{args.path} is not a capture: no capture.json (CaptureCallback writes step-<k>/ folders)")
    try:
        overrides = parse_overrides(args.set)
    except ValueError as e:
        parser.error(str(e))
    named = sorted(set(overrides) & {"model", "task"})
    if named:
        parser.error(
            f"--set {', '.join(named)}: a capture's model and task are the run's (your reward functions: --task)"
        )
    return overrides


def check_writable(parser, path: str, flag: str = "--json") -> None:
    import tempfile

    out = os.path.abspath(path)
    folder = os.path.dirname(out)
    try:
        if os.path.isdir(out) or not os.path.isdir(folder):
            raise OSError
        tempfile.TemporaryFile(dir=folder).close()  # a file can really be made there (/proc passes os.access)
    except OSError:
        parser.error(f"{flag} {path or repr(path)}: not a writable file path (its folder must exist and be writable)")
