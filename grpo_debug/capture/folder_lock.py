"""One run per folder: a recorder (`CaptureCallback`, `FlightRecorder`) holds an exclusive lock on
`out_dir/.grpo-debug.lock` from its construction to the end of training, so that two runs started at the same
moment on one folder cannot interleave their health lines or replace each other's step folders.

    lock = take(out_dir, "FlightRecorder")   # FolderInUse (a ValueError, one line) where a live run holds it
    ...
    lock.release()                           # at train end; also when the recorder is collected, or at exit

The lock is `fcntl.flock` on a file descriptor held open for the recorder's life: the kernel drops it when the
process ends however it ends (a SIGKILL too), so a lock is never stale in the kernel; the file may stay, naming a
process that is gone, and the next recorder takes it over and says so (a warning naming that process). The file
holds the holder's pid, host and start time, which the refusal quotes. A recorder that is released removes the
file, and a taker that locked a file another releaser just removed tries again on the new one (inode checked).
Two recorders of one process conflict too (each lock is on its own open file); where the holder is this process,
unreachable recorders are collected first (a notebook cell run again), so that only a live one refuses.

Where it is taken: in the main process only (RANK unset or 0); the other ranks of a distributed run write nothing
and share the folder with their rank 0. What it is not: a lock a program that ignores it respects (flock is
advisory), and on a network file system it is as good as that system's locks (NFS: emulated with POSIX locks).
A folder where the lock file cannot be made (read-only, no such disk) is not refused: the recorder runs unguarded,
warned once, as its writes there would fail and be warned anyway (no failure of ours stops training). A lock path
that is something else (a symlink, a directory, a file that cannot be opened) is refused in one line at the
recorder's construction: it is never followed or written through, and two runs are never let in unguarded.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import gc
import json
import os
import socket
import stat
import time
import warnings
import weakref
from pathlib import Path

LOCK_FILE = ".grpo-debug.lock"
TRIES = 5  # a releaser removing the file between our open and our lock: try the new file
RECORD_WAIT = 0.5  # seconds a refusal waits for the holder's record (written right after its lock is taken)


class FolderInUse(ValueError):
    """Another live recorder holds the folder (one line)."""


class FolderLock:
    """An exclusive lock on one folder's lock file, held until `release` (or collection, or exit)."""

    def __init__(self, folder: Path, fd: int):
        self.folder, self.path, self.pid = folder, folder / LOCK_FILE, os.getpid()
        self._finalizer = weakref.finalize(self, _release, fd, self.path, self.pid)

    @property
    def held(self) -> bool:
        return self._finalizer.alive

    def release(self) -> None:
        """The lock file removed and the lock dropped; never raises (it runs at train end)."""
        self._finalizer()


def main_process() -> bool:
    """Whether this process writes the folder: not a rank other than 0 of a distributed run (RANK, as torchrun and
    accelerate set it)."""
    return os.environ.get("RANK", "0").strip() in ("", "0")


def take(folder: str | Path, who: str) -> FolderLock | None:
    """The folder locked for this recorder (`who` names it in warnings); FolderInUse where a live run holds it; None
    where no lock file can be made there (warned: the recorder runs unguarded)."""
    folder = Path(folder)
    collected = False
    for _ in range(TRIES):
        not_ours = _not_a_lock_file(folder / LOCK_FILE)
        if not_ours:
            raise FolderInUse(f"{folder / LOCK_FILE} is {not_ours}, not a lock file of grpo_debug's: remove it, or give "
                              "this run its own out_dir")  # fmt: skip
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EPERM, errno.EACCES) and os.path.lexists(folder / LOCK_FILE):
                # a link made meanwhile, an immutable file or another user's: a run there may not be guarded
                raise FolderInUse(f"{folder / LOCK_FILE} cannot be opened ({e.strerror or e}): remove it, or give "
                                  "this run its own out_dir") from None  # fmt: skip
            warnings.warn(f"{who}: no lock taken on {folder} ({e.strerror or e}): another run could write there too",
                          stacklevel=3)  # fmt: skip
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            held = e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
            holder = _holder(fd) if held else {}
            os.close(fd)
            if not held:
                warnings.warn(f"{who}: no lock taken on {folder} ({e.strerror or e}): another run could write there "
                              "too", stacklevel=3)  # fmt: skip
                return None
            if holder.get("pid") == os.getpid() and not collected:
                collected = True
                gc.collect()  # a recorder of this process nothing refers to any more lets go of it
                continue
            raise FolderInUse(f"{folder} is being recorded by {_who(holder)}; give this run its own out_dir") from None
        if not _same_file(fd, folder / LOCK_FILE):  # its holder removed it as it let go: lock the new one
            os.close(fd)
            continue
        before = _read(fd)
        if before:
            warnings.warn(f"{who}: {folder}: taking over the lock of {_who(before)}, which "
                          f"{'no longer runs' if not _alive(before) else 'no longer holds it'}", stacklevel=3)  # fmt: skip
        _write(fd, {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), "by": who})
        return FolderLock(folder, fd)
    warnings.warn(f"{who}: no lock taken on {folder}: its lock file kept changing", stacklevel=3)
    return None


def _not_a_lock_file(path: Path) -> str | None:
    """What `path` is where it is there and no regular file ('a symlink', 'a directory', ...): never followed nor
    written through (a link to a user's file would have it truncated); None where it is absent or a file."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    if stat.S_ISREG(mode):
        return None
    return "a symlink" if stat.S_ISLNK(mode) else ("a directory" if stat.S_ISDIR(mode) else "not a regular file")


def _release(fd: int, path: Path, pid: int) -> None:
    """The file removed while still held (so no taker locks a file about to go), then the lock dropped; in a forked
    child (another pid) only its copy of the descriptor is closed."""
    try:
        if os.getpid() == pid and _same_file(fd, path):
            path.unlink()
    except OSError:
        pass
    try:
        os.close(fd)
    except OSError:
        pass


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _read(fd: int) -> dict:
    """The holder's record, {} where the file is empty or not ours to read."""
    try:
        data = os.pread(fd, 4096, 0)
        value = json.loads(data.decode("utf-8", "replace")) if data.strip() else {}
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _holder(fd: int) -> dict:
    """The record of the lock's holder, waited for up to RECORD_WAIT seconds where it is still empty: a holder writes
    it right after it takes the lock, so two runs started at once would otherwise meet a file that names no one."""
    deadline = time.monotonic() + RECORD_WAIT
    record = _read(fd)
    while not record and time.monotonic() < deadline:
        time.sleep(0.01)
        record = _read(fd)
    return record


def _write(fd: int, record: dict) -> None:
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    except OSError:  # the lock holds without its record; a refusal then names no process
        pass


def _who(record: dict) -> str:
    """'process 123 (started 2026-11-27 10:00:00)', with its host where it is another; a record that is empty (its
    holder is writing it now) or damaged: 'another process'."""
    pid, started, host = record.get("pid"), record.get("started"), record.get("host")
    if not isinstance(pid, int) or isinstance(pid, bool):
        return "another process (its lock file names none yet)"
    when = ""
    if isinstance(started, (int, float)) and not isinstance(started, bool):
        try:
            when = f" (started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(started))})"
        except (OverflowError, ValueError, OSError):
            when = ""
    where = f" on {str(host)[:64]}" if isinstance(host, str) and host != socket.gethostname() else ""
    return f"process {pid}{where}{when}"


def _alive(record: dict) -> bool:
    """Whether the process a record names still runs (on this host; another host's cannot be told: not alive)."""
    pid = record.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or record.get("host") != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    return True


def lock_for(recorder, then=None) -> FolderLock | None:
    """`recorder.out_dir` locked for it (in the main process; FolderInUse where a live run holds it), and `then(folder)`
    called once it is (no other run writes there now: a dead run's leftovers can go)."""
    lock = take(recorder.out_dir, type(recorder).__name__) if main_process() else None
    if lock is not None and then is not None:
        then(Path(recorder.out_dir))
    return lock


def taken_again(recorder) -> str | None:
    """At the start of a train() after the recorder let go of its folder (a second train()): the lock taken again;
    never raises (training has begun): why not, where another run took the folder meanwhile."""
    if recorder.lock is None or recorder.lock.held:
        return None
    try:
        recorder.lock = take(recorder.out_dir, type(recorder).__name__)
    except FolderInUse as e:
        recorder.lock = None
        return str(e)
    except Exception:  # a bug of ours: the run goes on unguarded, as where no lock file can be made
        recorder.lock = None
    return None


def let_go_after(event):
    """A recorder's `on_train_end`, then its folder let go (`close`), whatever the event did."""

    @functools.wraps(event)
    def ended(self, *args, **kwargs):
        try:
            return event(self, *args, **kwargs)
        finally:
            self.close()

    return ended
