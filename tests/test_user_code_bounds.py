"""User code in a box (issue 57, item 3): each call of a user's reward function has a time limit (`time_limit`,
`--reward-timeout`), a function that timed out is not called again (the row-by-row search included), and the
horizon asked of the doctor is bounded by its budget (`horizon_bounds`), refused before anything loads."""

import signal
import sys
import threading
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
from tiny_capture import captured_step, grpo_debug  # noqa: E402

from grpo_debug import time_limit  # noqa: E402
from grpo_debug.time_limit import RewardTimeout  # noqa: E402

pytestmark = pytest.mark.usefixtures("task_registry_restored")
SLACK = 5.0  # seconds past the limit a stop may take on a busy machine


@pytest.fixture
def limit():
    """A limit of 0.3 s for the test, then none, and no function remembered as timed out."""
    time_limit.set_reward_timeout(0.3, "--reward-timeout")
    yield 0.3
    time_limit.set_reward_timeout(None)
    time_limit.forget_timeouts()


def calls_logged(body):
    """A reward function that logs the size of each call, then does `body(completions)`."""
    calls = []

    def reward(prompts, completions, **kwargs):
        calls.append(len(completions))
        return body(completions)

    return reward, calls


def test_a_sleeping_function_stops_at_its_limit_and_is_not_called_again(limit):
    from grpo_debug.rewards import call_reward

    sleepy, calls = calls_logged(lambda completions: time.sleep(1e6))
    start = time.monotonic()
    with pytest.raises(RewardTimeout) as stopped:
        call_reward(sleepy, "mine.py:sleepy", ["p"] * 4, ["a", "b", "c", "d"])
    assert time.monotonic() - start < limit + SLACK
    said = str(stopped.value)
    assert "\n" not in said and "'mine.py:sleepy'" in said and "within 0.3 s (--reward-timeout)" in said, said
    assert "a batch of 4 rows" in said and "not called again" in said, said
    with pytest.raises(RewardTimeout, match="is not called again: it did not return within 0.3 s"):
        call_reward(sleepy, "mine.py:sleepy", ["p"], ["a"])
    assert calls == [4], f"called again after its timeout: {calls}"
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0), "the alarm was left armed"


def test_the_row_search_stops_at_a_row_that_times_out(limit):
    """A function that raises on the batch is called row by row to name the failing row; the row that sleeps ends
    the search with its timeout, naming that row, and the rows after it are never called."""
    from grpo_debug.rewards import call_reward

    def body(completions):
        if len(completions) > 1:
            raise KeyError("boom")
        if completions[0] == "c":
            time.sleep(1e6)
        return [1.0]

    flaky, calls = calls_logged(body)
    with pytest.raises(RewardTimeout) as stopped:
        call_reward(flaky, "flaky", ["p"] * 4, ["a", "b", "c", "d"])
    said = str(stopped.value)
    assert "on row 2 ('c') alone, called to find the row its KeyError came from" in said, said
    assert calls == [4, 1, 1, 1], f"the search went on past the row that timed out: {calls}"
    with pytest.raises(RewardTimeout):
        call_reward(flaky, "flaky", ["p"], ["a"])
    assert calls == [4, 1, 1, 1]


def test_a_function_that_swallows_the_alarm_meets_the_next_one(limit):
    """A bare `except:` around the sleep catches the first alarm; the alarm repeats each second and stops it."""

    def stubborn(completions):
        try:
            time.sleep(1e6)
        except BaseException:
            time.sleep(1e6)

    from grpo_debug.rewards import call_reward

    func, calls = calls_logged(stubborn)
    start = time.monotonic()
    with pytest.raises(RewardTimeout):
        call_reward(func, "stubborn", ["p"], ["a"])
    assert time.monotonic() - start < limit + time_limit.REPEAT_SECONDS + SLACK


def test_a_probe_does_not_swallow_a_timeout(limit):
    """The probes read a function that fails on a changed completion as 'no evidence'; one that times out on it
    stops the diagnosis instead."""
    from grpo_debug.detectors.probes import PAD, probe_rewards
    from grpo_debug.task import Task

    def body(completions):
        if completions[0].endswith(PAD):
            time.sleep(1e6)
        return [1.0] * len(completions)

    func, calls = calls_logged(body)
    func.__name__ = "pads_sleep"
    task = Task("probe", lambda s, n: ["q"] * n, (func,))
    with pytest.raises(RewardTimeout, match="'pads_sleep'.*a batch of 4 rows"):
        probe_rewards(task, ["q"] * 4, ["1", "2", "3", "4"], 2)
    assert calls == [4, 4]


def test_a_fast_function_leaves_the_outer_alarm_as_it_was(limit):
    """An ITIMER_REAL armed outside (pytest-timeout's signal method) is put back, less the call's time."""
    from grpo_debug.rewards import call_reward

    handler = signal.signal(signal.SIGALRM, lambda *a: None)
    try:
        signal.setitimer(signal.ITIMER_REAL, 100.0)
        rewards = call_reward(lambda prompts, completions, **k: [0.5] * len(completions), "fast", ["p"], ["a"])[0]
        left = signal.getitimer(signal.ITIMER_REAL)[0]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, handler)
    assert rewards.tolist() == [0.5] and 95.0 < left <= 100.0, left


def test_off_the_main_thread_the_function_runs_without_a_limit_and_says_so(limit):
    from grpo_debug.rewards import call_reward

    out, said = {}, []

    def run():
        import warnings

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out["rewards"] = call_reward(lambda prompts, completions, **k: [1.0], "fast", ["p"], ["a"])[0].tolist()
        said.extend(str(w.message) for w in caught)

    worker = threading.Thread(target=run, name="worker")
    worker.start()
    worker.join(30)
    assert out["rewards"] == [1.0]
    assert any("without a time limit here" in s and "'worker'" in s for s in said), said


# ---- through the command line


@pytest.fixture(scope="module")
def user(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("user")
    capture = captured_step(folder)
    (folder / "rewards.py").write_text(
        "import time\n\ndef sleepy(prompts, completions, **kwargs):\n    time.sleep(1e6)\n\n"
    )
    (folder / "batches.py").write_text(  # the run's own function's name: the doctor checks it is the run's
        "import time\n\n"
        "def digits(prompts, completions, **kwargs):\n"
        "    if len(completions) > 1:\n        time.sleep(1e6)\n    return [1.0] * len(completions)\n"
    )
    return {"folder": folder, "capture": capture, "rewards": folder / "rewards.py", "batches": folder / "batches.py"}


def one_line_error(done) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and lines and "Traceback" not in done.stderr, done.stderr
    assert lines[-1].startswith("python -m grpo_debug") and "error:" in lines[-1], done.stderr
    return lines[-1]


def test_the_doctor_stops_a_sleeping_reward_function_in_one_line(user):
    """--task's first check calls the function on one completion, before any model loads: it stops at 1 s."""
    start = time.monotonic()
    done = grpo_debug("doctor", user["capture"], "--task", f"{user['rewards']}:sleepy", "--reward-timeout", "1",
                      cwd=user["folder"])  # fmt: skip
    seconds = time.monotonic() - start
    line = one_line_error(done)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "rewards.py:sleepy" in line and "within 1 s (--reward-timeout) on a batch of 1 row" in line, line
    assert seconds < 60, f"stopped after {seconds:.0f} s"


def test_the_doctor_stops_a_function_that_sleeps_on_the_whole_batch(user):
    """A function that passes the one-row check and sleeps on the step's 4 completions (the doctor's own call)."""
    done = grpo_debug("doctor", user["capture"], "--no-model", "--task", f"{user['batches']}:digits",
                      "--reward-timeout", "1", cwd=user["folder"])  # fmt: skip
    line = one_line_error(done)
    assert "reward function 'digits'" in line and "within 1 s (--reward-timeout) on a batch of 4 rows" in line, line


# ---- the horizon's bounds, refused before anything loads

PROBE = (  # the command line run as `python -m grpo_debug`, then whether torch was ever imported
    "import atexit, runpy, sys\n"
    "atexit.register(lambda: print('torch imported:', 'torch' in sys.modules))\n"
    "sys.argv = ['grpo_debug', *sys.argv[1:]]\n"
    "runpy.run_module('grpo_debug', run_name='__main__', alter_sys=True)\n"
)
BOUNDS = {
    "a horizon past the default budget": (["--horizon", "999999999"], "--horizon 999999999: at most 6818 steps"),
    "seeds past a given budget": (
        ["--horizon-seeds", "1000", "--budget", "60"],
        "--horizon-seeds 1000: at most 681 seeds within a budget of 60 s",
    ),
    "a budget past a day": (["--budget", "1e9"], "--budget 1e+09: a number of seconds above 0 and at most 86400"),
    "a reward timeout of 0": (["--reward-timeout", "0"], "--reward-timeout 0: a number of seconds above 0"),
}


@pytest.mark.parametrize("case", list(BOUNDS))
def test_a_horizon_past_the_budget_is_refused_before_anything_loads(tmp_path, case):
    import os
    import subprocess

    arguments, says = BOUNDS[case]
    done = subprocess.run([sys.executable, "-c", PROBE, "doctor", *arguments], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(TESTS.parent)})  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and says in lines[0], done.stderr
    assert "torch imported: False" in done.stdout, done.stdout


def test_the_bound_is_what_the_budget_holds_and_diagnose_keeps_it():
    from grpo_debug.doctor import diagnose
    from grpo_debug.doctor.diagnose import fit
    from grpo_debug.horizon_bounds import FASTEST_STEP, horizon_problem, most

    assert most(120.0) == 1363 and most(0.01) == 2
    assert horizon_problem(1363, 3, 120.0) is None and horizon_problem(10**9, 3, None) is None  # no budget: no bound
    plan = fit(120.0, FASTEST_STEP, causes=1, steps=10**5, seeds=2)
    assert plan["steps"] <= most(120.0), f"the budget itself cuts to the bound: {plan}"
    with pytest.raises(ValueError, match="--horizon 999999999: at most 1363 steps within a budget of 120 s"):
        diagnose(None, horizon=999_999_999, budget=120.0)  # refused before the step is touched
