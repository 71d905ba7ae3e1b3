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


def check_outputs(parser, args, reads: list[str]) -> None:
    """`--json` and `--html`, where given, refused in one line before any work starts: a path no file can be made
    at, both naming one file, or one that is, or lies inside, a file or folder the command reads (`reads`: a
    capture's files are checksummed, so even one more file there makes it unreadable)."""
    given = (("--json", getattr(args, "json", None)), ("--html", getattr(args, "html", None)))
    outputs = [(flag, path) for flag, path in given if path is not None]
    for flag, path in outputs:  # "" too: refused, not silently skipped
        check_writable(parser, path, flag)
        for read in reads:
            if covers(read, path):
                what = "that is" if same_file(read, path) else "inside"
                parser.error(f"{flag} {path}: {what} {read}, which this command reads; write it elsewhere")
    if len(outputs) == 2 and same_file(outputs[0][1], outputs[1][1]):
        parser.error(f"--json and --html both name {outputs[0][1]}: give each its own file")


def same_file(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def covers(read: str, out: str) -> bool:
    """Writing `out` would change `read`: the same file, or a file inside the folder `read` (links followed)."""
    out, read = os.path.realpath(out), os.path.realpath(read)
    return out == read or out.startswith(read.rstrip(os.sep) + os.sep)


def task_reads(task: str | None) -> list[str]:
    """The file a `--task FILE.py:NAME` imports (a registered task's name reads none)."""
    return [task.rpartition(":")[0]] if task and ".py:" in task else []


def capture_reads(capture: str) -> list[str]:
    """A capture folder and the local model folders its capture.json names, which the replay and the doctor load:
    the reference model, a LoRA run's base."""
    meta = capture_meta(capture)
    named = [_field(meta, "reference", "name_or_path"), _field(meta, "policy", "base", "folder")]
    return [capture, *(name for name in named if isinstance(name, str) and name and os.path.isdir(name))]


def run_reads(run: str, doctor: bool) -> list[str]:
    """What `timeline` reads in a FlightRecorder folder: its health log, its captures index, each capture, the
    doctor's reports (a page may sit beside them, not replace one); with `--doctor`, each capture's models too."""
    captures = sorted(str(p) for p in Path(run).glob("step-*") if p.is_dir())
    reads = [os.path.join(run, "health.jsonl"), os.path.join(run, "captures.json"), os.path.join(run, "reports")]
    for capture in captures:
        reads += capture_reads(capture) if doctor else [capture]
    return reads


def model_reads(configs) -> list[str]:
    """The local model folders these StepConfigs load (a hub id reads the cache: not checked)."""
    return sorted({cfg.model for cfg in configs if os.path.isdir(cfg.model)})


def capture_meta(capture: str | None) -> dict:
    """capture.json as an object, size-bounded; {} where it cannot be read (the capture's own checks refuse it later)."""
    from ..files import MAX_READ_BYTES, read_bounded

    try:
        meta = json.loads(read_bounded(Path(capture) / "capture.json", MAX_READ_BYTES)) if capture else {}
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _field(value, *keys):
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value


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
    meta = capture_meta(capture)
    try:
        prompt, completion = meta["prompts"][0], meta["completions"][0]
    except (KeyError, IndexError, TypeError):
        return "What is 1+1? ", "2"
    if isinstance(prompt, list):
        return prompt, [{"role": "assistant", "content": str(completion)}]
    return str(prompt), str(completion)
