"""One run per folder, even at the same moment (issue 57, item 4): a recorder locks its out_dir at construction
(`capture.folder_lock`), a second one on the folder is refused in one line naming the holder, a stale lock is taken
over and said, and the lock is let go at train end, at `close()` and when the recorder is collected."""

import gc
import multiprocessing
import os
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

from grpo_debug.capture.folder_lock import LOCK_FILE, FolderInUse, take, taken_again

REFUSED = (
    r"is being recorded by process {pid} \(started \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d\); give this run its own out_dir$"
)


def recorders():
    """Imported in the tests, not at the top: the spawned processes below import this module, and only the lock."""
    from grpo_debug.capture import CaptureCallback, FlightRecorder

    return CaptureCallback, FlightRecorder


def test_a_second_recorder_on_the_folder_is_refused_until_the_first_closes(tmp_path):
    CaptureCallback, FlightRecorder = recorders()
    out = tmp_path / "flight"
    first = FlightRecorder(out)
    assert (out / LOCK_FILE).is_file()
    with pytest.raises(FolderInUse, match=f"^{out} " + REFUSED.format(pid=os.getpid())) as refused:
        FlightRecorder(out)
    assert "\n" not in str(refused.value)
    with pytest.raises(FolderInUse):
        CaptureCallback(out, steps=[1])  # a CaptureCallback holds its folder alike
    first.close()
    assert not (out / LOCK_FILE).exists(), "the lock file stayed after close()"
    second = FlightRecorder(out)
    assert (out / LOCK_FILE).is_file()
    second.close()


def test_a_recorder_nothing_refers_to_lets_go(tmp_path):
    """A notebook cell run again: the recorder of the first run, unreachable (in a cycle with its trainer), is
    collected before the folder is refused."""
    CaptureCallback, FlightRecorder = recorders()
    out = tmp_path / "captures"
    first = CaptureCallback(out, steps=[1])
    first.trainer = SimpleNamespace(callback=first)  # a cycle, as a trainer's callback handler makes
    del first
    CaptureCallback(out, steps=[1]).close()


def test_a_stale_lock_is_taken_over_and_said(tmp_path):
    CaptureCallback, FlightRecorder = recorders()
    out = tmp_path / "flight"
    out.mkdir()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(gone.stdout)
    (out / LOCK_FILE).write_text(f'{{"pid": {pid}, "host": "{os.uname().nodename}", "started": 1.0e9}}\n')
    with pytest.warns(UserWarning, match=rf"FlightRecorder: {out}: taking over the lock of process {pid} "
                                         r"\(started 2001-09-\d\d .*\), which no longer runs"):  # fmt: skip
        recorder = FlightRecorder(out)
    assert f'"pid": {os.getpid()}' in (out / LOCK_FILE).read_text()
    recorder.close()


def test_a_refused_folder_holding_another_run_is_let_go(tmp_path):
    """FlightRecorder's refusal of a folder with another run's health log leaves no lock behind."""
    CaptureCallback, FlightRecorder = recorders()
    out = tmp_path / "old-run"
    out.mkdir()
    (out / "health.jsonl").write_text("{}\n")
    with pytest.raises(ValueError, match="holds another run's health.jsonl"):
        FlightRecorder(out)
    assert not (out / LOCK_FILE).exists()


def test_another_rank_of_a_distributed_run_takes_no_lock(tmp_path, monkeypatch):
    CaptureCallback, FlightRecorder = recorders()
    out = tmp_path / "captures"
    main = CaptureCallback(out, steps=[1])
    monkeypatch.setenv("RANK", "1")
    other = CaptureCallback(out, steps=[1])  # rank 1 shares rank 0's folder and writes nothing
    assert other.lock is None and main.lock.held
    main.close()


def test_a_second_train_takes_the_folder_again_or_records_nothing_without_raising(tmp_path):
    """At on_train_begin (training has begun): never raises; where another run took the folder meanwhile, why."""
    CaptureCallback, FlightRecorder = recorders()
    out = tmp_path / "captures"
    recorder = CaptureCallback(out, steps=[1])
    recorder.close()
    assert taken_again(recorder) is None and recorder.lock.held
    recorder.close()
    intruder = CaptureCallback(out, steps=[1])
    said = taken_again(recorder)
    assert said is not None and "is being recorded by process" in said and recorder.lock is None
    intruder.close()


def construct(folder: str, start, results, done) -> None:
    """In a spawned process: the folder taken as a recorder's construction takes it (`folder_lock.take`, what
    `CaptureCallback._setup` calls; the recorder itself would cost each process torch's and TRL's imports, 20 s on
    two busy cores), once every process is ready; 'ok' or the refusal, then held until the parent has every answer."""
    start.wait(60)
    try:
        lock = take(folder, "FlightRecorder")
        results.put(("ok", os.getpid()))
    except FolderInUse as e:
        lock = None
        results.put((str(e), os.getpid()))
    done.wait(60)
    del lock


def test_two_processes_started_at_once_on_one_folder_one_proceeds(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    start, done, results = ctx.Barrier(2), ctx.Event(), ctx.Queue()
    folder = str(tmp_path / "flight")
    workers = [ctx.Process(target=construct, args=(folder, start, results, done)) for _ in range(2)]
    for w in workers:
        w.start()
    try:
        answers = [results.get(timeout=120) for _ in workers]
    finally:
        done.set()
        for w in workers:
            w.join(60)
    said = sorted(a for a, _ in answers)
    assert said[1] == "ok" and said[0] != "ok", answers
    winner = next(pid for a, pid in answers if a == "ok")
    assert said[0].startswith(f"{folder} is being recorded by process {winner} (started "), said[0]
    assert all(w.exitcode == 0 for w in workers)
    gc.collect()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the winner let go at its exit: no stale lock to take over
        recorders()[1](Path(folder)).close()
