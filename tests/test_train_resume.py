"""`train` never loses a run: killed at random moments (SIGKILL: no clean-up runs) and started again with the same
command, it ends with the JSON an uninterrupted run writes; a second run on the same output is refused."""

import json
import random
import signal
import subprocess
import sys
import time

import pytest

COMMAND = [
    "--steps",
    "3",
    "--eval-every",
    "1",
    "--arm",
    "fixed",
    "--seeds",
    "2",
    "--eval-prompts",
    "2",
    "--no-progress",
    "--set",
    "num_prompts=2",
    "num_generations=2",
    "max_new_tokens=8",
    "per_sample_grad_norms=false",
    "eval_samples=2",
]


def run(json_path, wait: bool = True, steps: int = 3):
    command = [*COMMAND[:1], str(steps), *COMMAND[2:]]
    process = subprocess.Popen(
        [sys.executable, "-m", "grpo_debug", "train", *command, "--json", str(json_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    if wait:
        process.wait(timeout=600)
    return process


def numbers(path) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "seconds"} for r in json.loads(path.read_text())["records"]]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The run's numbers, and how long it took from start to exit (imports included)."""
    path = tmp_path_factory.mktemp("once") / "out.json"
    start = time.perf_counter()
    assert run(path).returncode == 0
    return numbers(path), time.perf_counter() - start


@pytest.mark.slow  # `make test-slow`: twelve runs of the train command
def test_twelve_kills_at_random_moments_then_a_resume_end_with_the_uninterrupted_json(uninterrupted, tmp_path):
    """Each kill lands at a uniform moment of a whole run's life (start to exit, as this machine runs it): in
    the imports, a step, a checkpoint, the progress rewrite, or the result's write at the end."""
    expected, lifetime = uninterrupted
    path = tmp_path / "out.json"
    rng = random.Random(0)
    kills = 0
    while kills < 12:  # 20 took 110 s of the suite; 12 still land in imports, steps, checkpoints and writes
        process = run(path, wait=False)
        time.sleep(rng.uniform(0.5, lifetime))
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait()
            kills += 1
        elif process.returncode == 0:  # it finished before the kill: start over to keep killing
            path.unlink()
        else:
            pytest.fail(process.stderr.read()[-2000:])
    finished = run(path)
    assert finished.returncode == 0, finished.stderr.read()[-2000:]
    assert numbers(path) == expected
    assert not (tmp_path / "out.json.progress.jsonl").exists()


@pytest.mark.slow  # `make test-slow`: a full train command, then a refused one
def test_a_second_run_on_the_same_output_is_refused(tmp_path):
    path = tmp_path / "out.json"
    first = run(path, wait=False, steps=200)  # long enough to be running when the second starts
    progress = tmp_path / "out.json.progress.jsonl"
    for _ in range(600):  # the lock is taken before the progress file is written
        if progress.exists() or first.poll() is not None:
            break
        time.sleep(0.1)
    assert progress.exists(), first.stderr.read()[-2000:]
    second = run(path)
    still_running = first.poll() is None
    first.kill()
    first.wait()
    assert still_running and second.returncode == 2 and "another train run holds" in second.stderr.read()


def test_an_unwritable_output_is_refused_before_any_work(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "grpo_debug", "train", *COMMAND, "--json", str(tmp_path / "no" / "x.json")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2 and "not a writable file path" in done.stderr
    done = subprocess.run(
        [sys.executable, "-m", "grpo_debug", "train", *COMMAND, "--json", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2 and "not a writable file path" in done.stderr


def test_a_torn_or_mismatched_progress_file_is_named(tmp_path):
    from grpo_debug.runs.progress import Progress

    path = tmp_path / "p.jsonl"
    Progress(path, {"h": 1}).add({"arm": "fixed", "seed": 0, "step": 0, "eval": {}})
    with path.open("a") as f:
        f.write('{"arm": "fixed", "se')  # a kill while appending
    assert len(Progress(path, {"h": 1}).records) == 1
    path.write_text('{"header": {"h": 1}}\nnot json\n{"a": 1}\n')
    with pytest.raises(ValueError, match=r"p.jsonl, line 2"):
        Progress(path, {"h": 1})
    path.write_text("")
    (tmp_path / "p.ckpt").mkdir()
    (tmp_path / "p.ckpt" / "fixed-seed0.pt").write_bytes(b"x")
    with pytest.raises(ValueError, match="holds checkpoints"):
        Progress(path, {"h": 1})
