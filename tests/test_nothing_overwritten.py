"""Nothing of the user's is written through or replaced but the file they named (issue 70's data-loss cases): the
report writer's temporary file, the recorder's lock file, health.jsonl after a full disk, a killed run's half-written
captures."""

import errno
import json
import os
import sys
from pathlib import Path

import pytest

from grpo_debug.capture import writing
from grpo_debug.capture.folder_lock import LOCK_FILE, FolderInUse, take
from grpo_debug.files import write_text_atomically

TESTS = Path(__file__).resolve().parent


def test_the_writer_never_touches_a_users_tmp_file_nor_writes_through_a_symlink(tmp_path):
    (tmp_path / "r.json.tmp").write_text("my notes")
    (tmp_path / "precious.txt").write_text("precious")
    (tmp_path / "r2.json.tmp").symlink_to(tmp_path / "precious.txt")
    write_text_atomically(tmp_path / "r.json", "{}")
    write_text_atomically(tmp_path / "r2.json", "{}")
    assert (tmp_path / "r.json.tmp").read_text() == "my notes", "the user's r.json.tmp was overwritten"
    assert (tmp_path / "precious.txt").read_text() == "precious", "the writer wrote through a symlink"
    assert (tmp_path / "r2.json.tmp").is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "precious.txt",
        "r.json",
        "r.json.tmp",
        "r2.json",
        "r2.json.tmp",
    ]
    assert oct((tmp_path / "r.json").stat().st_mode & 0o777) == oct(0o666 & ~_umask()), "not the mode open() gives"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path):
    (tmp_path / "r.json").write_text("old")

    def fails(f):
        f.write("half")
        raise OSError(errno.ENOSPC, "No space left on device")

    from grpo_debug.files import write_atomically

    with pytest.raises(OSError, match="could not write .*r.json"):
        write_atomically(tmp_path / "r.json", fails)
    assert (tmp_path / "r.json").read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["r.json"]


@pytest.mark.parametrize("kind", ["symlink to a user's file", "dangling symlink", "directory"])
def test_a_lock_path_that_is_not_a_lock_file_is_refused_and_never_followed(tmp_path, kind):
    run = tmp_path / "out"
    run.mkdir()
    precious = tmp_path / "precious.txt"
    precious.write_text("precious")
    if kind == "symlink to a user's file":
        (run / LOCK_FILE).symlink_to(precious)
    elif kind == "dangling symlink":
        (run / LOCK_FILE).symlink_to(tmp_path / "elsewhere" / "made.lock")
    else:
        (run / LOCK_FILE).mkdir()
    with pytest.raises(FolderInUse, match=f"{LOCK_FILE} is a (symlink|directory), not a lock file"):
        take(run, "FlightRecorder")
    assert precious.read_text() == "precious", "the lock's symlink target was written"
    assert not (tmp_path / "elsewhere").exists(), "a file was made outside out_dir"


@pytest.mark.parametrize("code", [errno.EPERM, errno.EACCES], ids=["immutable", "another-users"])
def test_a_lock_file_that_cannot_be_opened_is_refused_not_shared(tmp_path, monkeypatch, code):
    """An immutable lock file (chattr +i) or another user's: refused in one line naming it, not a warning after
    which two runs would write one folder."""
    from grpo_debug.capture import folder_lock

    run = tmp_path / "out"
    run.mkdir()
    (run / LOCK_FILE).write_text("{}")
    real_open = os.open

    def refused(path, flags, *args, **kwargs):
        if str(path).endswith(LOCK_FILE):
            raise OSError(code, os.strerror(code))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(folder_lock.os, "open", refused)
    with pytest.raises(FolderInUse, match=f"{LOCK_FILE} cannot be opened .*give this run its own out_dir"):
        take(run, "FlightRecorder")


def test_a_line_cut_by_a_full_disk_is_cut_back_and_the_next_line_stands_alone(tmp_path, monkeypatch):
    health = tmp_path / "health.jsonl"
    writing.append_line(health, {"step": 1})
    real_write, calls = os.write, []

    def full_disk(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            real_write(fd, data[:5])  # part of the line reached the disk, then it filled
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(writing.os, "write", full_disk)
    with pytest.raises(OSError):
        writing.append_line(health, {"step": 2})
    monkeypatch.setattr(writing.os, "write", real_write)
    writing.append_line(health, {"step": 3})
    assert [json.loads(line)["step"] for line in health.read_text().splitlines()] == [1, 3], health.read_text()


def test_a_killed_runs_half_written_captures_are_removed_when_the_folder_is_taken(tmp_path):
    run = tmp_path / "out"
    (run / ".step-4.partial").mkdir(parents=True)
    (run / ".step-4.partial" / "weights.safetensors").write_bytes(b"\0" * 2048)
    (run / ".crash-step-2.partial").mkdir()
    (run / ".my-own.partial").mkdir()  # not a name of ours
    (tmp_path / "keep").mkdir()
    (run / ".step-9.partial").symlink_to(tmp_path / "keep")  # not followed
    sys.path.insert(0, str(TESTS))
    from grpo_debug.capture import CaptureCallback

    recorder = CaptureCallback(str(run), steps=[1])
    try:
        left = sorted(p.name for p in run.iterdir())
    finally:
        recorder.close()
    assert ".step-4.partial" not in left and ".crash-step-2.partial" not in left, left
    assert ".my-own.partial" in left and ".step-9.partial" in left and (tmp_path / "keep").is_dir(), left
