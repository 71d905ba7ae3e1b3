"""The doctor on planted defects. Each user-style TRL run (`planted_train.py`: a plain GRPOConfig, the user's own
reward functions and model folder) plants one defect; the doctor, run on the captured step, must name it within
its two most severe findings, and on the clean run raise nothing above `info`. Then the command line from
another directory, the JSON's shape, and each finding's counterfactual."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
from arithmetic_task import build_tiny_llama, build_tiny_model, build_tiny_qwen2  # noqa: E402

from grpo_debug.config import StepConfig  # noqa: E402
from grpo_debug.doctor import diagnose  # noqa: E402
from grpo_debug.doctor.catalogue import PITFALLS  # noqa: E402
from grpo_debug.doctor.detectors import DETECTORS  # noqa: E402
from grpo_debug.step import GRPOStep  # noqa: E402

pytestmark = pytest.mark.usefixtures("task_registry_restored")

PLANTED = {  # planted_train.py's defect -> the finding that names it
    "constant_reward": "constant_reward",
    "top_p": "sampler_truncation",
    "attention_dropout": "dropout",
    "position_ids": "position_ids",
    "short_completions": "truncation",
    "length_reward": "length_reward",
    "binary_pairs": "zero_std_groups",
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Every planted run, trained by the user's script in the user's folder; defect -> its captured step."""
    folder = tmp_path_factory.mktemp("planted")
    build_tiny_llama(folder / "llama")
    build_tiny_model(folder / "gpt2")
    build_tiny_qwen2(folder / "qwen2-dropout", attention_dropout=0.1)
    shutil.copy(TESTS / "planted_train.py", folder / "planted_train.py")
    captures = {}
    for defect in ("clean", *PLANTED):
        done = subprocess.run(
            [sys.executable, "planted_train.py", defect, f"out-{defect}"],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, f"the planted run {defect!r} failed:\n{done.stderr[-3000:]}"
        captures[defect] = folder / f"out-{defect}" / "captures" / "step-1"
    return captures


def ranks(report) -> list[str]:
    return [f.id for f in report.present("warning")]


def test_every_planted_defect_is_named_within_the_top_two(runs):
    table = {}
    for defect, expected in PLANTED.items():
        found = ranks(diagnose(GRPOStep.from_capture(runs[defect])))
        table[defect] = (expected, found.index(expected) + 1 if expected in found else None, found)
    print("\ndefect x rank:\n" + "\n".join(f"{d:18s} {e:20s} {r} {f}" for d, (e, r, f) in table.items()))
    missed = {d: f for d, (e, r, f) in table.items() if r is None or r > 2}
    assert not missed, f"planted defects not within the doctor's top two problems/warnings: {missed}"


def test_the_clean_run_raises_nothing_above_info(runs):
    report = diagnose(GRPOStep.from_capture(runs["clean"]))
    loud = [(f.id, f.severity, f.summary) for f in report.present("warning")]
    assert not loud, f"the clean run got findings above info: {loud}"
    assert {f.id for f in report.findings} == {d.__name__ for d in DETECTORS}, "a detector did not report"


def test_a_bfloat16_sampler_is_named_within_the_top_two():
    """TRL without vLLM samples with the trained model itself, so this defect is planted on our own step."""
    step = GRPOStep(StepConfig(num_prompts=2, num_generations=4, max_new_tokens=32, sampler_dtype="bfloat16"))
    found = ranks(diagnose(step))
    assert "precision" in found[:2], f"a bfloat16 sampler against a float32 trainer: the doctor ranked {found}"


def test_a_flip_that_moves_the_update_outranks_one_that_does_not(runs):
    """position_ids on a left-padded GPT-2: the flip moves the update; kl_estimator at beta 0 is never flipped."""
    report = diagnose(GRPOStep.from_capture(runs["position_ids"]))
    finding = next(f for f in report.findings if f.id == "position_ids")
    effect = finding.effect
    assert effect is not None and effect["toggle"] == {"position_ids": True}, "the cause was not flipped"
    assert effect["update_cosine"] < 0.99 and not effect["cosmetic"], f"the flip did not move the update: {effect}"
    assert report.findings[0].id == "position_ids", [f.id for f in report.findings[:3]]


def test_the_command_line_from_another_directory_writes_ranked_json_and_a_page(runs, tmp_path):
    out, page = tmp_path / "doctor.json", tmp_path / "doctor.html"
    done = subprocess.run(
        [sys.executable, "-m", "grpo_debug", "doctor", str(runs["attention_dropout"])]
        + ["--task", str(runs["attention_dropout"].parents[2] / "planted_train.py") + ":digits"]
        + ["--json", str(out), "--html", str(page)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    findings = json.loads(out.read_text())["findings"]
    assert all({"id", "severity", "evidence", "fix", "effect"} <= f.keys() for f in findings), findings[0].keys()
    order = [("problem", "warning", "info", "absent").index(f["severity"]) for f in findings]
    assert order == sorted(order), f"findings not ranked by severity: {[f['severity'] for f in findings]}"
    dropout = next(f for f in findings if f["id"] == "dropout")
    assert dropout["severity"] == "warning" and "attention_dropout" in dropout["summary"], dropout
    assert dropout["evidence"]["max_logp_gap"] > 0, "two train-mode scorings gave the same log-probs"
    assert "dropout" in done.stdout and "<div class='finding" in page.read_text()


def test_the_replay_names_dropout_that_is_a_config_field(runs):
    """Qwen2's attention_dropout has no nn.Dropout module: the replay still names it as the run's pitfall."""
    from grpo_debug.replay import reproduction

    step = GRPOStep.from_capture(runs["attention_dropout"])
    out = reproduction(step.run(until="update"), step.capture, step.policy, step)
    assert "dropout" in out["pitfalls"], out["pitfalls"]
    assert not out["causes"]["dropout"].startswith("absent: dropout off"), out["causes"]["dropout"]


def test_every_detector_has_one_catalogue_entry():
    assert [d.__name__ for d in DETECTORS] == list(PITFALLS), "the detectors and the catalogue name other pitfalls"
    for p in PITFALLS.values():
        if p.toggle is not None:
            field, value = p.toggle
            StepConfig().replace(**{field: value})  # a toggle the config accepts
