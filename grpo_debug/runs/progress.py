"""A training run's progress on disk: a JSON-lines file of every record so far (rewritten atomically, a torn
last line cut off when it is opened again), one checkpoint per (arm, seed) at its last evaluation (tensors and
plain values, read with `weights_only=True`, sealed with the SHA-256 of its contents in the same file, so a
kill can never leave the two apart), and a lock that refuses a second run on the same output."""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
from pathlib import Path

import torch

from ..config import StepConfig
from ..files import write_atomically
from ..step import GRPOStep


class Progress:
    """The JSON-lines file of every record so far, and one checkpoint per (arm, seed) at its last evaluation."""

    def __init__(self, path: str | Path, header: dict):
        self.path, self.header = Path(path), header
        self.ckpt_dir = self.path.with_suffix(".ckpt")
        lines, tail = self._read()
        if lines and lines[0] != {"header": header}:
            raise ValueError(f"{self.path} holds another comparison ({lines[0]}); remove it or pick another path")
        if not lines and self.ckpt_dir.exists() and any(self.ckpt_dir.iterdir()):
            raise ValueError(
                f"{self.path} is empty or missing but {self.ckpt_dir} holds checkpoints: the records "
                "they belong to are lost; remove both to start over"
            )
        self._mend(tail)
        self.records = lines[1:]
        if not lines:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._rewrite()

    def _read(self) -> tuple[list[dict], bytes]:
        """(the file's records, what follows its last newline: b"" unless a kill stopped an append). That
        tail counts as a record when it is a whole one; any other bad line is refused."""
        if not self.path.exists():
            return [], b""
        whole, tail = _split_torn_tail(self.path.read_bytes())
        records = _parse_lines(self.path, whole)
        record = _whole_record(tail)
        return records + ([record] if record is not None else []), tail

    def _mend(self, tail: bytes) -> None:
        """A torn last line cut off the file itself (a newline added where only that was missing), so that the
        next append starts a line of its own instead of joining it into a line the next resume refuses."""
        if not tail:
            return
        if _whole_record(tail) is None:
            _truncate(self.path, self.path.stat().st_size - len(tail))
        else:
            _append_bytes(self.path, b"\n")

    def _rewrite(self) -> None:
        """The whole file written atomically (temporary file, fsync, rename)."""
        text = "".join(json.dumps(x) + "\n" for x in [{"header": self.header}, *self.records])
        write_atomically(self.path, lambda f: f.write(text))

    def remove(self) -> None:
        remove_progress(self.path)

    def checkpoint(self, arm: str, seed: int) -> Path:
        return self.ckpt_dir / f"{arm}-seed{seed}.pt"

    def resume_point(self, arm: str, seed: int) -> int:
        """The step the (arm, seed) checkpoint was taken after (0: none); records after it are dropped, and
        with no checkpoint every record of it is (its step-0 evaluation is taken again)."""
        path = self.checkpoint(arm, seed)
        done = read_checkpoint(path)["step"] if path.exists() else 0
        if done and not any(
            r["arm"] == arm and r["seed"] == seed and r["step"] == done and "eval" in r for r in self.records
        ):
            raise ValueError(
                f"{path} was taken after step {done}, but {self.path} has no evaluation of {arm} seed "
                f"{seed} at that step: the two do not belong together; remove both to start over"
            )
        stale = lambda r: r["arm"] == arm and r["seed"] == seed and (r["step"] > done or not done)
        if any(stale(r) for r in self.records):
            self.records = [r for r in self.records if not stale(r)]
            self._rewrite()
        return done

    def add(self, record: dict) -> None:
        self.records.append(record)
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def save(self, step: GRPOStep, arm: str, seed: int, t: int) -> None:
        self.ckpt_dir.mkdir(exist_ok=True)
        state = {
            "step": t,
            "policy": step.policy.state_dict(),
            "optimizer": step.optimizer.state_dict() if step.optimizer else None,
        }
        write_atomically(self.checkpoint(arm, seed), lambda f: torch.save(sealed(state), f), binary=True)

    def load(self, step: GRPOStep, base: StepConfig, arm: str, seed: int) -> None:
        path = self.checkpoint(arm, seed)
        state = read_checkpoint(path)
        try:
            step.policy.load_state_dict(state["policy"])
            step.start_from_current_weights(state["optimizer"])
        except (RuntimeError, ValueError, KeyError, TypeError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ValueError(f"{path} does not fit this run's model and optimizer ({first})") from None


def sealed(state: dict) -> dict:
    """`state` serialised (torch.save) and stored beside the SHA-256 of those bytes, in one file."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    raw = buffer.getvalue()
    return {"sha256": hashlib.sha256(raw).hexdigest(), "payload": torch.frombuffer(bytearray(raw), dtype=torch.uint8)}


def read_checkpoint(path: Path) -> dict:
    """A checkpoint's state after its checksum is verified; every problem is one sentence naming the file."""
    try:
        outer = torch.load(path, weights_only=True)
    except Exception as e:  # a truncated or edited file fails in many ways inside torch
        raise ValueError(f"{path} cannot be read as a checkpoint ({type(e).__name__}: {e})") from None
    if not (isinstance(outer, dict) and set(outer) == {"sha256", "payload"}):
        raise ValueError(f"{path} carries no checksum (written by an older version?): remove it to start over")
    raw = outer["payload"].numpy().tobytes()
    if hashlib.sha256(raw).hexdigest() != outer["sha256"]:
        raise ValueError(f"{path} does not match its checksum: it changed after it was written")
    try:
        state = torch.load(io.BytesIO(raw), weights_only=True)
    except Exception as e:
        raise ValueError(f"{path} cannot be read as a checkpoint ({type(e).__name__}: {e})") from None
    if not (isinstance(state, dict) and isinstance(state.get("step"), int) and isinstance(state.get("policy"), dict)):
        raise ValueError(f"{path} is not a training checkpoint (no step and policy)")
    return state


def remove_progress(progress_path: str | Path) -> None:
    """A finished run's progress file and checkpoints (once its result is written)."""
    path = Path(progress_path)
    ckpt_dir = path.with_suffix(".ckpt")
    if ckpt_dir.exists():
        for file in ckpt_dir.iterdir():
            file.unlink()
        ckpt_dir.rmdir()
    path.unlink(missing_ok=True)


def _split_torn_tail(data: bytes) -> tuple[bytes, bytes]:
    """(every line that ends in a newline, what follows the last newline)."""
    end = data.rfind(b"\n") + 1
    return data[:end], data[end:]


def _parse_lines(path: Path, whole: bytes) -> list[dict]:
    records = []
    for number, line in enumerate(whole.split(b"\n")[:-1], start=1):
        try:
            records.append(json.loads(line))
        except ValueError as e:  # JSONDecodeError, or UnicodeDecodeError for bytes that are not UTF-8
            raise ValueError(f"{path}, line {number}: not a JSON record ({e})") from None
    return records


def _whole_record(line: bytes) -> dict | None:
    """The JSON object `line` holds, or None if it is cut short (no prefix of a record is a JSON object)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _truncate(path: Path, size: int) -> None:
    with path.open("r+b") as f:
        f.truncate(size)
        os.fsync(f.fileno())


def _append_bytes(path: Path, data: bytes) -> None:
    with path.open("ab") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _lock(path: Path):
    """An exclusive lock on `path` for this process's life (released when it ends, however it ends): a second
    run on the same output is refused instead of interleaving its records with the first's."""

    path.parent.mkdir(parents=True, exist_ok=True)
    handle = path.open("w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise RuntimeError(
            f"another train run holds {path}: it writes the same output; wait for it or pick another --json"
        ) from None
    return handle
