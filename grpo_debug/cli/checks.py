"""What the command line checks before any work starts, torch-free: output paths a file can really be made at,
the prompts the task holds, and `--set` on a capture (never a model or a task: a value never names code)."""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

from ..config import StepConfig
from ..overrides import parse_overrides


def ascii_int(text: str) -> int:
    """An option's integer, in ASCII digits only (`int` would also read other scripts' digits, as the rest of
    the command line does not)."""
    if not re.fullmatch(r"[+-]?[0-9]+", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer (ASCII digits)")
    return int(text)


def check_outputs(parser, args, reads: str | None = None) -> None:
    """`--json` and `--html`, where given, refused before any work starts unless writable, and inside `reads`
    (the capture the command reads: every file of it is checksummed, so one more file makes it unreadable)."""
    for path, flag in ((args.json, "--json"), (args.html, "--html")):
        if path is not None:  # "" too: refused, not silently skipped
            check_writable(parser, path, flag)
            if reads is not None:
                check_outside(parser, path, flag, reads)


def check_outside(parser, path: str, flag: str, folder: str) -> None:
    """Refuse an output inside `folder`, which the command reads (one line, before any work)."""
    out, inside = os.path.realpath(path), os.path.realpath(folder)
    if out == inside or out.startswith(inside + os.sep):
        parser.error(f"{flag} {path}: inside {folder}, which this command reads; write it elsewhere")


def check_not_the_runs(parser, path: str, flag: str, run: str) -> None:
    """A run folder's page may sit beside its files but not replace one: not its health log or captures index,
    and not inside a capture folder (`step-<k>/`) or the doctor's reports."""
    from pathlib import Path

    out = os.path.realpath(path)
    for name in ("health.jsonl", "captures.json"):
        if out == os.path.realpath(os.path.join(run, name)):
            parser.error(f"{flag} {path}: that is the run's {name}, which this command reads; write it elsewhere")
    for folder in [*Path(run).glob("step-*"), Path(run) / "reports"]:
        if folder.is_dir():
            check_outside(parser, path, flag, str(folder))


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


def check_task(parser, task: str | None, capture: str | None) -> None:
    """A --task file imported and each of its reward functions called on the capture's first completion, as TRL
    calls it, before any model loads: an import that fails, a function that raises, exits or returns something
    other than one number (or None) per completion is one line naming the file, the function and the row."""
    if not task or ".py:" not in task:
        return
    from ..capture.reading import reward_functions
    from ..rewards import call_reward
    from ..task import callable_name

    try:
        funcs = reward_functions(task)
        prompt, completion = _first_row(capture)
        for func in funcs:
            call_reward(func, f"{task.rpartition(':')[0]}:{callable_name(func)}", [prompt], [completion])
    except ValueError as e:
        parser.error(str(e))


def _first_row(capture: str | None) -> tuple:
    """The capture's first prompt and completion as TRL gave them to reward functions (message lists in a
    conversational run); a stand-in pair without a readable capture (its own checks refuse it later)."""
    try:
        meta = json.loads((Path(capture) / "capture.json").read_text()) if capture else {}
        prompt, completion = meta["prompts"][0], meta["completions"][0]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return "What is 1+1? ", "2"
    if isinstance(prompt, list):
        return prompt, [{"role": "assistant", "content": str(completion)}]
    return str(prompt), str(completion)
