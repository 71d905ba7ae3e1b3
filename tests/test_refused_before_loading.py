"""`doctor` and `replay` check `--task` (its file, its import, its name, each function's signature) and `--set` (its
keys, its values, no rollout field on a capture) before any capture or model is read: against a real capture, a
bad argument is refused in one line, in words, with exit status 2, before torch is even imported (measured: about
0.1-0.2 s on a CPU where importing torch takes 6 s; the bound here is generous for slow machines)."""

import functools
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
from tiny_capture import captured_step  # noqa: E402

pytestmark = pytest.mark.usefixtures("task_registry_restored")
BOUND_SECONDS = 15.0  # measured 0.1-0.2 s; CI machines are slow, and this is a bound, not a benchmark
# the command line run as `python -m grpo_debug`, then whether torch was ever imported, said on stdout at exit
PROBE = (
    "import atexit, runpy, sys\n"
    "atexit.register(lambda: print('torch imported:', 'torch' in sys.modules))\n"
    "sys.argv = ['grpo_debug', *sys.argv[1:]]\n"
    "runpy.run_module('grpo_debug', run_name='__main__', alter_sys=True)\n"
)


@pytest.fixture(scope="module")
def capture(tmp_path_factory) -> Path:
    """A user's one-step run of a tiny Llama (a plain GRPOConfig), its step captured."""
    return captured_step(tmp_path_factory.mktemp("user"))


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> Path:
    """Task files of every kind a user gets wrong."""
    folder = tmp_path_factory.mktemp("tasks")
    (folder / "mine.py").write_text(
        "def one_argument(x):\n    return [1.0]\n\n"
        "def good(prompts, completions, **kwargs):\n    return [1.0 for c in completions]\n\n"
        "def digits(completions, **kwargs):\n"
        "    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]\n\n"
        "NOT_A_FUNCTION = 3\nEMPTY = []\nMIXED = [good, 'good']\nREWARD_FUNCS = [good]\n"
    )
    (folder / "syntax.py").write_text("def f(:\n")
    (folder / "raises.py").write_text("raise ImportError('no module named my_helpers')\n")
    return folder


CASES = {  # arguments after the capture's folder: what the one line must say
    "a rollout field on a capture": (
        ["doctor", "--set", "top_p=1.0"],
        "--set top_p=1.0: top_p is a rollout field: a capture's completions are the trainer's; to see another "
        "top_p, pass --task and the doctor samples anew",
    ),
    "a bad --set before a bad --task": (["doctor", "--task", "TASKS/nowhere.py:F", "--set", "top_pp=1"], "'top_pp'"),
    "a rollout field to replay": (["replay", "--set", "temperature=0.5"], "temperature is a rollout field"),
    "a value out of range": (["doctor", "--set", "beta=-1"], "StepConfig.beta = -1.0 is not allowed"),
    "a task file that is not there": (["doctor", "--task", "TASKS/nowhere.py:F"], "no file"),
    "a task file that does not parse": (["doctor", "--task", "TASKS/syntax.py:f"], "syntax.py, line 1"),
    "a task file that raises on import": (["replay", "--task", "TASKS/raises.py:F"], "raised ImportError"),
    "a name the file lacks": (["doctor", "--task", "TASKS/mine.py:MISSING"], "defines no 'MISSING'"),
    "a name that is no function": (["doctor", "--task", "TASKS/mine.py:NOT_A_FUNCTION"], "NOT_A_FUNCTION is 3"),
    "an empty list": (["doctor", "--task", "TASKS/mine.py:EMPTY"], "EMPTY is an empty list"),
    "a list with a string": (
        ["doctor", "--task", "TASKS/mine.py:MIXED"],
        "MIXED[1] is 'good' (type str), not a reward",
    ),
    "a signature TRL cannot call": (
        ["doctor", "--task", "TASKS/mine.py:one_argument"],
        "reward function 'one_argument' takes (x): it cannot be called as TRL calls a reward function",
    ),
    "a task that is neither": (["doctor", "--task", "polcy"], "not a registered task"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_argument_is_refused_in_one_line_before_anything_loads(capture, tasks, tmp_path, case):
    arguments, says = CASES[case]
    command, *rest = arguments
    rest = [a.replace("TASKS", str(tasks)) for a in rest]
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", PROBE, command, str(capture), *rest],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(TESTS.parent)},
    )
    seconds = time.perf_counter() - start
    print(f"{case}: refused in {seconds:.2f} s")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert says in lines[0] and "error:" in lines[0], lines[0]
    assert "rollout" not in says or "[" not in lines[0], f"a Python list, not words: {lines[0]}"
    assert "torch imported: False" in done.stdout, f"torch was imported before the refusal: {done.stdout}"
    assert seconds < BOUND_SECONDS, f"{case}: refused after {seconds:.1f} s"


def test_what_trl_can_call_passes_the_check(tasks):
    from grpo_debug.cli.checks import signature_problem, task_functions

    class Scorer:
        def __call__(self, prompts, completions, **kwargs):
            return [0.0] * len(completions)

    def keywords_only(*, completions, **kwargs):
        return [0.0] * len(completions)

    def with_an_answer(completions, answer=None, **kwargs):
        return [0.0] * len(completions)

    for func in (Scorer(), keywords_only, with_an_answer, functools.partial(with_an_answer, answer=1)):
        assert signature_problem(func) is None, func
    assert "takes (obj, /)" in signature_problem(len)
    assert [f.__name__ for f in task_functions(f"{tasks}/mine.py:REWARD_FUNCS")] == ["good"]
    assert [f.__name__ for f in task_functions(f"{tasks}/mine.py:good")] == ["good"]
    assert task_functions("policy") is None  # a registered task


def test_a_good_task_on_a_capture_still_runs(capture, tasks, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "grpo_debug", "doctor", str(capture), "--no-model", "--task", f"{tasks}/mine.py:digits"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0 and "the doctor:" in done.stdout, done.stderr[-2000:]


def test_rollout_fields_are_said_in_words():
    from grpo_debug.cli.checks import rollout_refusal

    two = rollout_refusal(["top_p", "temperature"], "doctor", has_task=True)
    assert two.startswith("top_p and temperature are rollout fields: a capture's completions are the trainer's")
    assert "leave top_p and temperature out of --set" in two and "[" not in two
    assert "run doctor CAPTURE --task FILE.py:NAME: it samples anew" in rollout_refusal(["top_k"], "replay", False)
