"""The user's reward functions in a process of their own (issue 70, item 3): a `--task FILE.py:NAME` file is
imported once per command, in one worker; a function that swallows every signal, ignores SIGALRM, sits in a C loop
holding the GIL, leaves a thread running, calls os._exit or raises KeyboardInterrupt is stopped within
--reward-timeout + 5 s with one line naming it, and the command exits once its report is written."""

import sys
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
from tiny_capture import captured_step, grpo_debug  # noqa: E402

pytestmark = pytest.mark.usefixtures("task_registry_restored")
SLACK = 5.0

REWARDS = """
import os, signal, threading, time
from pathlib import Path

Path("imported.log").open("a").write("imported\\n")  # module-level code: it must run once per command

def retries(prompts, completions, **kwargs):  # a retry loop around an API, with a bare except
    while True:
        try:
            time.sleep(1e6)
        except:  # noqa: E722
            pass

def ignores(prompts, completions, **kwargs):
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    time.sleep(1e6)

def c_loop(prompts, completions, **kwargs):
    return [float(sum(range(10**13)))] * len(completions)  # C code that never lets the GIL go

def exits(prompts, completions, **kwargs):
    os._exit(0)

def interrupted(prompts, completions, **kwargs):
    raise KeyboardInterrupt("stopped by hand")

def digits(prompts, completions, **kwargs):  # the run's own function's name, leaking a thread
    threading.Thread(target=time.sleep, args=(1e6,)).start()  # not a daemon: it would keep a process alive
    return [float(sum(ch.isdigit() for ch in c)) for c in completions]

def later_nan(prompts, completions, **kwargs):
    Path("calls.log").open("a").write("call\\n")
    calls = len(Path("calls.log").read_text().splitlines())
    return [float(len(c)) if calls == 1 else float("nan") for c in completions]
"""


LATER = """
calls = []

def digits(prompts, completions, **kwargs):  # the run's own name: a number on its first two calls, NaN after
    calls.append(len(completions))
    return [float(sum(ch.isdigit() for ch in c)) if len(calls) <= 2 else float("nan") for c in completions]
"""

HANGS = """
import time

calls = []

def digits(prompts, completions, **kwargs):  # an API reward under the run's name: answers once, then retries forever
    calls.append(len(completions))
    while len(calls) > 1:
        try:
            time.sleep(1e6)
        except:  # noqa: E722
            pass
    return [float(sum(ch.isdigit() for ch in c)) for c in completions]
"""


@pytest.fixture(scope="module")
def user(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("user")
    capture = captured_step(folder)
    (folder / "rewards.py").write_text(REWARDS)
    (folder / "later.py").write_text(LATER)
    (folder / "hangs.py").write_text(HANGS)
    return {"folder": folder, "capture": capture}


def doctor(user, func: str, *extra, timeout: float = 120):
    start = time.monotonic()
    done = grpo_debug("doctor", user["capture"], "--no-model", "--task", f"rewards.py:{func}", "--reward-timeout",
                      "1", *extra, cwd=user["folder"], timeout=timeout)  # fmt: skip
    return done, time.monotonic() - start


def one_line(done) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize("func", ["retries", "ignores", "c_loop"])
def test_a_function_that_will_not_stop_is_stopped_at_its_limit_in_one_line(user, func):
    done, seconds = doctor(user, func)
    line = one_line(done)
    assert func in line and "within 1 s (--reward-timeout)" in line, line
    assert seconds < 1 + SLACK + 20, f"{func}: the command took {seconds:.0f} s"  # + the command's own start


@pytest.mark.parametrize("command", ["doctor", "replay"])
def test_a_function_that_hangs_after_its_first_call_is_stopped_mid_run_in_one_line(user, command):
    """Its check call returns; the step's own batch then never does: stopped at the limit mid-run, one line naming
    the function and the batch, for both commands."""
    start = time.monotonic()
    extra = ["--no-model"] if command == "doctor" else []
    done = grpo_debug(command, user["capture"], *extra, "--task", "hangs.py:digits", "--reward-timeout", "1",
                      cwd=user["folder"], timeout=120)  # fmt: skip
    seconds = time.monotonic() - start
    lines = [line for line in done.stderr.strip().splitlines() if not line.startswith("Loading weights")]
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    line = lines[0]
    assert "'digits'" in line and "within 1 s (--reward-timeout)" in line and "rows" in line, line
    assert seconds < 1 + SLACK + 20, f"{command}: the command took {seconds:.0f} s"


def test_replay_imports_the_task_file_once(user):
    log = user["folder"] / "imported.log"
    log.unlink(missing_ok=True)
    done = grpo_debug("replay", user["capture"], "--task", "rewards.py:digits", cwd=user["folder"], timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert log.read_text().splitlines() == ["imported"], f"the task file was imported {log.read_text()!r}"


def test_os_exit_in_a_reward_is_one_line_and_no_exit_0(user):
    line = one_line(doctor(user, "exits")[0])
    assert "reward function 'rewards.py:exits'" in line and "ended its process (exit code 0)" in line, line


def test_a_keyboard_interrupt_from_a_reward_is_one_line_naming_it(user):
    line = one_line(doctor(user, "interrupted")[0])
    assert "'rewards.py:interrupted'" in line and "raised KeyboardInterrupt: stopped by hand" in line, line


def test_a_leaked_thread_does_not_keep_the_command_alive_and_the_file_is_imported_once(user):
    log = user["folder"] / "imported.log"
    log.unlink(missing_ok=True)
    done, seconds = doctor(user, "digits", "--json", "leaks.json", timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (user["folder"] / "leaks.json").is_file(), "no report written"
    assert log.read_text().splitlines() == ["imported"], f"the task file was imported {log.read_text()!r}"


def test_a_reward_that_turns_nan_after_its_first_calls_is_a_bad_reward_not_dropped(user):
    """Its first calls (the check's row, the step's own batch) are numbers; every completion scored later (the
    horizon's continuations) is NaN, which TRL's sum and the horizon's mean skip: a bad_reward warning says so."""
    import json

    done = grpo_debug("doctor", user["capture"], "--task", "later.py:digits", "--horizon", "2", "--horizon-seeds", "2",
                      "--probe", "0", "--held-out", "0", "--json", "later.json", cwd=user["folder"], timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    found = next(
        f for f in json.loads((user["folder"] / "later.json").read_text())["findings"] if f["id"] == "bad_reward"
    )
    assert found["severity"] == "warning" and "scored after this step's own" in found["summary"], found
    none, scored = found["evidence"]["none_later"]["digits"]
    assert none == scored > 0, found["evidence"]


def test_the_trainer_state_reaches_the_worker_as_a_trainer_state_built_when_read():
    """TRL's trainer_state keyword crosses to the worker as its fields; the first attribute read builds the real
    TrainerState (transformers imported then, not at every worker's start)."""
    import pickle

    from transformers import TrainerState

    from grpo_debug.reward_process import LazyTrainerState, _portable

    sent = pickle.loads(pickle.dumps(_portable(TrainerState(global_step=6, max_steps=10))))
    assert isinstance(sent, LazyTrainerState)
    assert (sent.global_step, sent.max_steps) == (6, 10) and isinstance(sent._state, TrainerState)
