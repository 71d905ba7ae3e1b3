"""Every benchmark script runs to the end in its quick mode and prints the keys benchmarks/README.md reads.

Nothing here times anything: the quick mode's sizes are too small for a number to mean something. What it
catches is a script that no longer runs (a renamed function, a GRPOStep reused for another task).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
pytestmark = pytest.mark.slow  # `make test-slow`: each script a fresh process that loads TRL (three minutes in all)

EXPECTED = {  # script, extra arguments -> the report's keys that the README's tables are built from
    ("step.py", ()): {
        "bundled_8x8_mixed",
        "bundled_8x8_mixed_readable",
        "bundled_8x8_mixed_no_per_sample_norms",
        "bundled_8x8_policy",
        "generation_one_call_vs_loop",
        "num_iterations_2_vs_1_8x8_mixed",
        "vs_trl_8x8_mixed",
        "gpt2_124m_shape_4x4_80_tokens",
    },
    ("influence.py", ()): {"bundled_8x8_mixed", "gpt2_124m_shape_8x8_80_tokens"},
    ("widgets.py", ("--fields", "logprob_temperature", "beta")): {
        "apply_change",
        "redraw_png_html_encoding_seconds",
        "panel_mu1",
        "panel_mu2",
    },
    ("capture.py", ()): {"runs", "median_overhead", "capture_mb"},
    ("doctor.py", ()): {
        "bundled",
        "capture_2_layers",
        "capture_2_layers_horizon_8",
        "bundled_budget",
        "capture_2_layers_horizon_8_budget",
    },
    ("train.py", ("--arm", "fixed", "tracin")): {"seconds_per_step"},
    ("reward_worker.py", ()): {"worker_start_seconds", "call_in_worker_ms", "call_in_process_ms", "cost_per_call_ms"},
}


def run_quick(script: str, extra: tuple[str, ...], cwd: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(BENCHMARKS.parent)}
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--quick", "--threads", "1", *extra],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=600,
    )
    assert done.returncode == 0, f"benchmarks/{script} --quick failed:\n{done.stderr[-3000:]}"
    report, _ = json.JSONDecoder().raw_decode(done.stdout)  # widgets.py prints a table after its JSON
    return report


def assert_quick_report(script: str, extra: tuple[str, ...], report: dict) -> None:
    missing = EXPECTED[script, extra] - report.keys()
    assert not missing, f"benchmarks/{script} --quick printed no {sorted(missing)}"
    assert report["quick"] is True, f"benchmarks/{script} ignored --quick"


OTHERS = [key for key in EXPECTED if key != ("step.py", ())]  # step.py's run is the next test's


@pytest.mark.parametrize("script,extra", OTHERS, ids=[s for s, _ in OTHERS])
def test_benchmark_runs_in_quick_mode(script, extra, tmp_path):
    assert_quick_report(script, extra, run_quick(script, extra, tmp_path))


def test_step_benchmark_runs_in_quick_mode_and_compares_with_trl_on_one_run(tmp_path):
    """Every key of step.py's report, and ours vs TRL side by side from the same run of the script (the README's
    table reads this ratio): one run of the script checks both."""
    report = run_quick("step.py", (), tmp_path)
    assert_quick_report("step.py", (), report)
    vs = report["vs_trl_8x8_mixed"]
    assert vs["ours_seconds"] > 0 and vs["trl_seconds"] > 0, f"a side of ours vs TRL was not timed: {vs}"
    assert vs["ours_over_trl"] == round(vs["ours_seconds"] / vs["trl_seconds"], 2), f"the ratio is not theirs: {vs}"
    assert vs["readable_seconds"] > 0, f"the readable step (every fast path off) was not timed: {vs}"
    assert vs["readable_over_trl"] == round(vs["readable_seconds"] / vs["trl_seconds"], 2), vs


def real_size_table(report: dict, path: Path) -> subprocess.CompletedProcess:
    """`real_size.py --table` of `report`, written to `path`."""
    path.write_text(json.dumps(report))
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / "real_size.py"), "--table", str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(BENCHMARKS.parent)},
        timeout=600,
    )


def test_real_size_benchmark_captures_and_replays_a_full_and_a_lora_run(tmp_path):
    """benchmarks/real_size.py --quick: both runs captured (the LoRA one as its adapter) and replayed to TRL's
    numbers, every number the README's table reads present."""
    report = run_quick("real_size.py", (), tmp_path)
    assert report["quick"] is True and {"parameters", "base_hash", "full", "lora"} <= report.keys(), sorted(report)
    full, lora = report["full"], report["lora"]
    for name, run in (("full", full), ("lora", lora)):
        missing = {"capture_mb", "callback_seconds", "peak_rss_mb"} - run["capture"].keys()
        missing |= {"open_seconds", "replay_seconds", "peak_rss_mb", "max_abs_difference"} - run["replay"].keys()
        missing |= {"imports_rss_mb", "estimate", "no_model_doctor"} - run["replay"].keys()
        assert not missing, f"the {name} run printed no {sorted(missing)}"
        assert run["replay"]["estimate"] and run["replay"]["estimate"]["replay_peak_mb"] > 0, run["replay"]["estimate"]
        assert run["replay"]["no_model_doctor"]["not_run"] > 0, run["replay"]["no_model_doctor"]
        assert run["replay"]["max_abs_difference"] < 1e-4, f"the {name} replay is off TRL's numbers: {run['replay']}"
    files = lora["capture"]["policy_files"]
    assert "adapter_model.safetensors" in files and "model.safetensors" not in files, f"LoRA capture's policy/: {files}"
    for name, run, count in (
        ("full", full, report["parameters"]),
        ("lora", lora, lora["capture"]["trainable_parameters"]),
    ):
        stored = run["capture"]["weights_mb"] * 2**20
        assert 4 * count <= stored <= 4 * count + 2**16, f"the {name} capture stores {stored} bytes for {count} floats"
        moments = run["capture"]["optimizer_mb"] * 2**20  # AdamW's two float32 moments per trained parameter
        assert 8 * count <= moments <= 8 * count + 2**20, f"the {name} optimizer state is {moments} bytes for {count}"
    done = real_size_table(report, tmp_path / "report.json")
    assert done.returncode == 0 and "| of which the optimizer's state (MB) |" in done.stdout, (
        f"--table failed: {done.stderr[-2000:]}"
    )
    assert "7B (Qwen2-7B" in done.stdout, f"--table printed no extrapolation:\n{done.stdout}"
    assert "| peak RSS above the imports: replay / TRL run (target <= 1.1) |" in done.stdout, done.stdout
    # a report of `--device cuda --phases capture` (the TRL runs alone): the GPU's row, no replay rows
    for run in (full, lora):
        del run["replay"]
        run["capture"]["peak_gpu_mb"] = 1024.0
    done = real_size_table({**report, "device": "cuda"}, tmp_path / "captures_only.json")
    assert done.returncode == 0, f"--table of a captures-only report failed: {done.stderr[-2000:]}"
    assert "| peak GPU memory, TRL run with the capture (GB) | 1.0 | 1.0 |" in done.stdout, done.stdout
    assert "replay" not in done.stdout.split("7B (")[0], f"a captures-only table shows replay rows:\n{done.stdout}"


def test_stranger_corpus_trains_diagnoses_and_scores_three_tiny_runs(tmp_path):
    """benchmarks/stranger_corpus.py --quick: a clean, a single-defect and a double-defect run, each built, trained by
    its own user_train.py and diagnosed by the doctor's command line; the report scores every one. What is checked is
    the machinery (every run captured and diagnosed, every field a rate in [0, 1]), not the doctor's accuracy."""
    report = run_quick("stranger_corpus.py", (), tmp_path)
    assert report["quick"] is True
    trained = report["trained"]
    assert len(trained) == 3 and all(t["returncode"] == 0 and t["capture"] for t in trained), [
        (t["name"], t.get("failed"), t["stderr_tail"][-500:]) for t in trained
    ]
    assert not report["failed"] and not report["missing"], (report["failed"], report["missing"])
    assert report["scored"] == {"clean": 1, "single": 1, "double": 1}, report["scored"]
    for key in ("top1_rate_single", "both_in_top2_rate_double", "quiet_rate_clean"):
        assert 0.0 <= report[key] <= 1.0, f"{key} is not a rate: {report[key]}"
    assert report["doctor_seconds"]["n"] == 3 and report["doctor_seconds"]["max"] > 0, report["doctor_seconds"]
    assert not report["expected_ids_the_doctor_lacks"], "a planted defect expects a finding id the doctor lacks"
    for row in report["per_run"]:
        assert {"planted", "expected", "causes", "loud", "named"} <= row.keys(), row.keys()
        assert set(row["named"]) == set(row["expected"]), row
    planted = sorted(len(row["expected"]) for row in report["per_run"])
    assert planted == [0, 1, 2], f"the quick runs are not clean, single and double: {planted}"
    assert sum(sum(row.values()) for row in report["confusion"].values()) == 2, report["confusion"]


def test_the_stranger_tables_state_the_saved_reports():
    """Each stranger-corpus report saved in benchmarks/results/ has its rates in benchmarks/README.md (or, for the
    halves before 2026-11-30, benchmarks/HISTORY.md) as the report
    computed them (rate and runs, as the tables print them; the outside kinds' right and silent rates, all and held-out
    kinds only; the probe's table): a table edited by hand fails here."""
    folder = Path(__file__).resolve().parents[1] / "benchmarks"
    sys.path.insert(0, str(folder))
    from stranger_corpus import probe_lines

    readme = " ".join(" ".join((folder / name).read_text() for name in ("README.md", "HISTORY.md")).split())
    reports = sorted((folder / "results").glob("stranger-*.json"))
    assert reports, "no stranger-corpus report is saved"
    for path in reports:
        r = json.loads(path.read_text())
        for rate, kind in (("top1_rate_single", "single"), ("both_in_top2_rate_double", "double"),
                           ("quiet_rate_clean", "clean")):  # fmt: skip
            if r[rate] is None:  # no run of that kind in the report (the outside kinds' corpus): nothing to state
                continue
            said = f"{r[rate]:.0%} ({r['scored'][kind]})"
            assert said in readme, f"benchmarks/README.md does not state {path.name}'s {rate}: {said}"
        outside = r.get("outside") or {}
        for part in (outside, outside.get("held_out_kinds") or {}):
            for rate in ("right_rate", "silent_rate"):
                if part.get(rate) is not None:
                    said = f"{part[rate]:.0%} ({part['runs']})"
                    assert said in readme, f"benchmarks/README.md does not state {path.name}'s outside {rate}: {said}"
        for line in probe_lines(r.get("probe") or {}):  # the probe's table, as the report printed it
            assert " ".join(line.split()) in readme, f"benchmarks/README.md does not state {path.name}'s probe: {line}"
