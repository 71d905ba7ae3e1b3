"""A crash of the run, as a capture callback keeps it: what the user's code raised, where (the user's frame told from
Python's, the installed packages' and ours, its locals shortened), in which reward function, on which batch.

The run's own error passes the trainer's wrapped methods on its way out (`CaptureCallback._then`): the first
wrapper it reaches calls `record_crash`, which writes `out_dir/crash-step-<k>/` (crash.json, traceback.txt) and a
health line saying so, then adds a note to the error naming the user's function and the folder. Nothing here
raises past it: a write that fails is said in the note.
"""

from __future__ import annotations

import json
import linecache
import os
import reprlib
import shutil
import sysconfig
import time
import traceback
from pathlib import Path

from ..files import write_text_atomically
from .trainer_state import jsonable
from .writing import HEALTH_FILE, append_line, replace_folder

CRASH_FILE = "crash.json"

SHOWN = reprlib.Repr()  # a local's value in a crash record: short, whatever its size
SHOWN.maxstring = SHOWN.maxother = 200
MAX_LOCALS = 30
NOT_THE_USERS = ("site-packages", "dist-packages")  # folders of installed packages, wherever they are


def record_crash(error: Exception, trainer, out_dir: Path, generation: dict | None) -> None:
    """The crash, on disk before the error goes on (the main process writes): `out_dir/crash-step-<k>/` with
    the failing batch and where the user's code raised it, and a health line saying so; then a note on the
    error naming the user's function and the folder. A write that fails (a full disk, a read-only folder) is
    said in the note, never raised. `generation`: the generation batch the callback kept, where the error came
    after the rewards (the loss, the optimizer) and no frame holds the batch."""
    step = trainer.state.global_step + 1
    entries = traceback_entries(error.__traceback__)
    record = crash_record(error, entries, step, list(getattr(trainer, "reward_func_names", [])))
    if record["prompts"] is None:  # raised after the rewards (the loss, the optimizer): the step's batch
        record.update(kept_batch(generation, step))
    folder, problems = None, []
    if trainer.is_world_process_zero():
        try:
            folder = write_crash(out_dir, record, error)
        except Exception as e:
            problems.append(f"the crash folder was not written ({type(e).__name__}: {e})")
        try:
            append_line(out_dir / HEALTH_FILE, crash_line(record, folder, problems))
        except Exception as e:
            problems.append(f"no health line was written ({type(e).__name__}: {e})")
    error.add_note(crash_note(record, folder, problems))


def kept_batch(generation: dict | None, step: int) -> dict:
    """The prompts and completions of the generation batch kept for `step`, where one was."""
    if generation is None or step not in generation["fed_steps"]:
        return {}
    return {"prompts": jsonable(generation["prompts"]), "completions": jsonable(generation["completions"]),
            "batch_from": "the generation batch this step trains on"}  # fmt: skip


def without_frame(tb, frame):
    """`tb` without its first entry where that entry is `frame`: a wrapper of ours the error passed on its way
    out. A bare `raise` in that frame adds no entry back, so the user never reads a frame of ours."""
    return tb.tb_next if tb is not None and tb.tb_frame is frame else tb


def traceback_entries(tb) -> list[tuple]:
    """(frame, line) of each entry of `tb`, outermost first (where the error was raised: last)."""
    out = []
    while tb is not None:
        out.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    return out


def library_folders() -> tuple[str, ...]:
    """Where code that is not the user's lives: Python's own library, the installed packages, this package."""
    paths = sysconfig.get_paths()
    folders = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    folders.add(str(Path(__file__).resolve().parents[1]))
    return tuple(os.path.realpath(f) + os.sep for f in folders)


def is_users_file(filename: str, libraries: tuple[str, ...]) -> bool:
    """A file of the user's: not Python's, not an installed package's, not ours. Code with no file (`exec`, a
    notebook cell) is the user's; Python's frozen modules are not."""
    if filename.startswith("<"):
        return not filename.startswith("<frozen")
    real = os.path.realpath(filename)
    return not real.startswith(libraries) and not any(part in NOT_THE_USERS for part in Path(real).parts)


def frame_fields(frame, line: int) -> dict:
    """A traceback entry as the user reads it: file, line, function and the line's code."""
    code = frame.f_code
    return {"file": code.co_filename, "line": line, "function": code.co_name,
            "code": linecache.getline(code.co_filename, line).strip() or None}  # fmt: skip


def shown_locals(frame) -> dict[str, str]:
    """The frame's local variables, each shortened (`SHOWN`): the row a reward failed on is often one of them."""
    out = {}
    for name, value in list(frame.f_locals.items())[:MAX_LOCALS]:
        try:
            out[name] = SHOWN.repr(value)
        except Exception as e:  # a __repr__ of the user's that fails
            out[name] = f"<repr failed: {type(e).__name__}>"
    return out


def reward_function_in(entries: list[tuple], names: list[str]) -> str | None:
    """The reward function TRL was calling when the error came: TRL's loop names it (`reward_func_name`, or
    `func_name` for an async one)."""
    for frame, _ in reversed(entries):
        for key in ("reward_func_name", "func_name"):
            name = frame.f_locals.get(key)
            if isinstance(name, str) and name in names:
                return name
    return None


def batch_in_frames(entries: list[tuple]) -> dict:
    """The prompts and completions the failing call was handed (the innermost frame holding both as lists of one
    length: the reward function, or TRL's `_calculate_rewards`), and the dataset's other columns TRL passed with
    them (`reward_kwargs`' lists of that length)."""
    for frame, _ in reversed(entries):
        prompts, completions = frame.f_locals.get("prompts"), frame.f_locals.get("completions")
        if isinstance(prompts, list) and isinstance(completions, list) and len(prompts) == len(completions):
            n = len(prompts)
            kwargs = next((f.f_locals["reward_kwargs"] for f, _ in reversed(entries)
                           if isinstance(f.f_locals.get("reward_kwargs"), dict)), {})  # fmt: skip
            columns = {k: v for k, v in kwargs.items() if isinstance(v, list) and len(v) == n}
            return {"prompts": jsonable(prompts), "completions": jsonable(completions), "columns": jsonable(columns),
                    "batch_from": f"the call to {frame.f_code.co_name} that raised"}  # fmt: skip
    return {}


def said(error: BaseException) -> str:
    """The error's message (str), or what kept it from being read."""
    try:
        return str(error)
    except Exception as e:
        return f"<its message could not be read: {type(e).__name__}>"


def crash_record(error: Exception, entries: list[tuple], step: int, reward_names: list[str]) -> dict:
    """crash.json: the error (type, message), the user's frame it was raised in or under (`frame`: file, line,
    function, code, locals; None where no frame is the user's), the frame that raised it (`raised_at`), the
    reward function TRL was calling, and the batch it was called on."""
    libraries = library_folders()
    users = [entry for entry in entries if is_users_file(entry[0].f_code.co_filename, libraries)]
    frame = {**frame_fields(*users[-1]), "locals": shown_locals(users[-1][0])} if users else None
    batch = batch_in_frames(entries)
    return {
        "step": step,
        "time": time.time(),
        "exception": {"type": type(error).__name__, "module": type(error).__module__, "message": said(error)},
        "frame": frame,
        "raised_at": frame_fields(*entries[-1]) if entries else None,
        "reward_function": reward_function_in(entries, reward_names),
        "prompts": batch.get("prompts"),
        "completions": batch.get("completions"),
        "columns": batch.get("columns", {}),
        "batch_from": batch.get("batch_from"),
    }


def write_crash(out_dir: Path, record: dict, error: BaseException) -> Path:
    """out_dir/crash-step-<k>/: crash.json (`crash_record`) and traceback.txt (the frames from the trainer's
    method down, as the user reads them), written whole into a hidden folder and renamed into place."""
    final = out_dir / f"crash-step-{record['step']}"
    partial = out_dir / f".{final.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        write_text_atomically(partial / CRASH_FILE, json.dumps(jsonable(record), indent=1))
        write_text_atomically(partial / "traceback.txt", "".join(traceback.format_exception(error)))
        replace_folder(partial, final)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return final


def crash_line(record: dict, folder: Path | None, problems: list[str]) -> dict:
    """The health line of the step the run crashed on: `crashed` says what was raised, in which reward function,
    where, and the folder holding the batch; `failed`, what of ours could not be written."""
    where = record["frame"] or record["raised_at"] or {}
    line = {"step": record["step"], "time": record["time"], "metrics": {}, "findings": {}, "trigger": [],
            "capture": None}  # fmt: skip
    line["crashed"] = {
        **record["exception"],
        "reward_function": record["reward_function"],
        **{k: where.get(k) for k in ("file", "line", "function")},
        "folder": folder.name if folder is not None else None,
    }
    if problems:
        line["failed"] = "; ".join(problems)
    return jsonable(line)


def crash_note(record: dict, folder: Path | None, problems: list[str]) -> str:
    """The note under the user's error: whose code raised it (their reward function, by name, where TRL was
    calling one), where, on which step; that we let it through; where the batch is kept."""
    where = record["frame"] or record["raised_at"]
    at = f"{where['file']}, line {where['line']}, in {where['function']}" if where else "no frame"
    name, step = record["reward_function"], record["step"]
    if name and record["frame"]:
        head = f"grpo_debug: this error is in your reward function {name!r} ({at}), which TRL called on step {step}"
    elif name:
        head = (
            f"grpo_debug: TRL raised this error on what your reward function {name!r} returned ({at}), on step {step}"
        )
    elif record["frame"]:
        head = f"grpo_debug: this error is in your code ({at}), which the trainer ran on step {step}"
    else:
        head = f"grpo_debug: the trainer raised this error on step {step} ({at})"
    kept = f"; the failing batch is in {folder}{os.sep}{CRASH_FILE}" if folder is not None else ""
    return f"{head}. grpo_debug let it through as it was raised{kept}" + "".join(f"; {p}" for p in problems)
