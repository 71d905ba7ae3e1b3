"""What the command line checks before any work starts, torch-free: output paths a file can really be made at,
the prompts the task holds, `--task` (its file imported, its reward functions' signatures) and `--set` on a
capture (never a model or a task: a value never names code; never how the trainer sampled). A bad argument is
refused in one line before any capture or model is read, in well under a second (torch takes seconds to import)."""

from __future__ import annotations

import argparse
import functools
import inspect
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


def check_capture_folder(parser, path: str) -> None:
    """The capture's folder is one (it holds capture.json); its own checks come when it is read."""
    if not os.path.isfile(os.path.join(path, "capture.json")):
        parser.error(f"{path} is not a capture: no capture.json (CaptureCallback writes step-<k>/ folders)")


def capture_overrides(parser, args) -> dict:
    """`--set` on a capture, typed, before torch loads and before the capture's folder is looked at: its model and
    task are the run's (`--task` names your reward functions): a `--set` value never names code to load; its
    rollout fields are the trainer's (`rollout_refusal`)."""
    named = sorted({pair.partition("=")[0] for pair in args.set} & {"model", "task"})  # before any value is read
    if named:
        parser.error(
            f"--set {', '.join(named)}: a capture's model and task are the run's (your reward functions: --task)"
        )
    try:
        overrides = parse_overrides(args.set)
    except ValueError as e:
        parser.error(str(e))
    rollout = [key for key in overrides if StepConfig.phase_of(key) == "rollout"]
    if rollout:
        given = " ".join(pair for pair in args.set if pair.partition("=")[0] in rollout)
        parser.error(f"--set {given}: {rollout_refusal(rollout, args.command, bool(getattr(args, 'task', None)))}")
    return overrides


def rollout_refusal(fields: list[str], command: str, has_task: bool) -> str:
    """Why `--set` may not change how a capture sampled, and what shows another value: a capture's completions
    are the trainer's (the replay reproduces them, the doctor examines them); the doctor samples anew from the
    captured weights, with the user's reward functions (--task), where such a field is a cause."""
    one = len(fields) == 1
    names = fields[0] if one else f"{', '.join(fields[:-1])} and {fields[-1]}"
    head = f"{names} {'is a rollout field' if one else 'are rollout fields'}: a capture's completions are the trainer's"
    other = f"another {names}" if one else "other values"
    if command == "replay":
        doctor = "run doctor CAPTURE --task FILE.py:NAME: it samples anew"
        return f"{head}, which the replay reproduces; to see {other}, {doctor}"
    if has_task:
        cause = "it is a cause" if one else "they are causes"
        return f"{head}; with --task the doctor samples anew where {cause}: leave {names} out of --set"
    return f"{head}; to see {other}, pass --task and the doctor samples anew"


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
    longest = os.pathconf(folder, "PC_NAME_MAX")
    if len(os.fsencode(os.path.basename(out))) > longest:
        parser.error(f"{flag} {path}: a file name longer than {longest} bytes, the most its file system takes")


def check_task(parser, task: str | None, capture: str | None) -> None:
    """--task checked in two rounds, each refusal one line naming the file and the function: first without torch
    (`task_functions`: the file, its import, the name, each function's signature), then each function called on
    the capture's first completion as TRL calls it (a function that raises, exits or returns something other
    than one number, or None, per completion), before any model loads."""
    if not task:
        return
    columns = capture_columns(capture)
    try:
        funcs = task_functions(task, list(columns))
    except ValueError as e:
        parser.error(str(e))
    if funcs is None:  # a registered task: the bundled step's own rewards
        return
    from ..capture.columns import trainer_keywords
    from ..rewards import call_reward
    from ..task import callable_name

    try:
        prompt, completion = _first_row(capture)
        first = {name: values[:1] for name, values in columns.items()}  # the first row's columns, as TRL passes them
        meta = capture_meta(capture) if capture else {}
        config = meta.get("grpo_config") if isinstance(meta.get("grpo_config"), dict) else {}
        step = meta.get("step") if isinstance(meta.get("step"), int) else 1
        first |= trainer_keywords(step, config.get("max_steps") if isinstance(config.get("max_steps"), int) else None)
        for func in funcs:
            called = functools.partial(func, **first)
            call_reward(called, f"{task.rpartition(':')[0]}:{callable_name(func)}", [prompt], [completion])
    except (ValueError, TimeoutError) as e:  # TimeoutError: time_limit.RewardTimeout (--reward-timeout)
        parser.error(str(e))


def launch_task(task: str | None, grace: float = 1.0) -> bool:
    """`--task FILE.py:NAME`'s worker spawned now (`reward_process.launch`), `check_task` then waiting for it; True
    where its import of the user's file is still going after `grace` seconds (a file that imports TRL: seconds), so
    that the command may import what it needs meanwhile, each process on its own core. A file that imports in less
    is checked before this process imports torch, and so refused without it. False for a registered task or no file."""
    file, _, name = (task or "").rpartition(":")
    if ".py:" not in (task or "") or not os.path.isfile(file):
        return False
    from ..reward_process import launch

    return not launch(file, name, f"--task {task}").replied(grace)


def capture_columns(capture: str | None) -> dict[str, list]:
    """The dataset columns the capture holds (capture.json's `columns`, TRL's reward_kwargs), {} where it holds none
    or cannot be read (its own checks refuse it later)."""
    columns = capture_meta(capture).get("columns", {})
    ok = isinstance(columns, dict) and all(isinstance(v, list) and v for v in columns.values())
    return columns if ok else {}


def task_functions(task: str, columns: list[str] = ()) -> list | None:
    """The reward functions `--task FILE.py:NAME` names, torch-free (None: a registered task's name): the file
    exists, imports, NAME is a callable or a non-empty list of them, each callable as TRL calls a reward
    function with the dataset's `columns` the capture holds (`signature_problem`). ValueError, one line, for
    anything else."""
    from ..task import callable_name, task_names

    if ".py:" not in task:
        if task in task_names():
            return None
        raise ValueError(
            f"--task {task}: not a registered task ({', '.join(task_names())}) nor FILE.py:NAME, a file of yours and "
            "the name of a reward function (or a list of them) in it"
        )
    file, _, name = task.rpartition(":")
    if not os.path.isfile(file):
        raise ValueError(f"--task {task}: no file {file}")
    from ..reward_process import functions

    funcs = functions(file, name, f"--task {task}")  # imported once, in the reward functions' own process
    for func in funcs:
        problem = signature_problem(func, columns)
        if problem:
            raise ValueError(f"--task {task}: reward function {callable_name(func)!r} {problem}")
    return funcs


TRL_EXTRAS = ("completion_ids", "environments")  # TRL 1.16's other keywords the replay does not pass
TRL_GIVEN = ("trainer_state", "log_extra", "log_metric")  # ...and those it does (`columns.trainer_keywords`)


def signature_problem(func, columns: list[str] = ()) -> str | None:
    """Why `func` cannot be called as a reward function, or None: TRL calls it with keywords (prompts=,
    completions=, completion_ids=, trainer_state=, log_extra=, log_metric= and the dataset's columns; the doctor
    with all of them but completion_ids, and the `columns` the capture holds), so those must bind. A parameter it
    needs that is none of them is a dataset column the capture does not hold, named. A callable whose signature Python cannot read (a
    builtin) is let through."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return None
    params = signature.parameters.values()
    keywords = any(p.kind is p.VAR_KEYWORD for p in params)
    takes_both = keywords or {"prompts", "completions"} <= set(signature.parameters)  # if not, refused below
    given = {"prompts", "completions", *TRL_GIVEN, *columns}
    needed = [
        p.name
        for p in params
        if takes_both
        and p.default is p.empty
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and p.name not in given
    ]
    if needed and needed[0] in TRL_EXTRAS:
        return f"needs {needed[0]!r}, which TRL passes to a reward function and this release does not yet"
    if needed:
        held = f"the columns {list(columns)}" if columns else "no dataset column"
        return (
            f"needs {needed[0]!r}, a dataset column TRL passes as a keyword, and the capture holds {held}: capture "
            "a run whose dataset has it (grpo_debug captures every column TRL passes to the reward functions)"
        )
    try:
        signature.bind(prompts=[], completions=[], **{name: [] for name in (*TRL_GIVEN, *columns)})
    except TypeError as e:
        return (
            f"takes {signature}: it cannot be called as TRL calls a reward function, with keywords prompts= and "
            f"completions= ({e}); write def {getattr(func, '__name__', 'f')}(prompts, completions, **kwargs)"
        )
    return None


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
