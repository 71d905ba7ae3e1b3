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
from planted_train import CLEAN_RUNS, DEFECTS, DOUBLE_DEFECTS, USER_RUNS  # noqa: E402

from grpo_debug.capture import open_capture  # noqa: E402
from grpo_debug.config import StepConfig  # noqa: E402
from grpo_debug.detectors.detectors import DETECTORS  # noqa: E402
from grpo_debug.doctor import diagnose  # noqa: E402
from grpo_debug.doctor.present import text  # noqa: E402
from grpo_debug.pitfalls import PITFALLS  # noqa: E402
from grpo_debug.step import GRPOStep  # noqa: E402

pytestmark = pytest.mark.usefixtures("task_registry_restored")

PLANTED = {  # planted_train.py's defect -> the finding that names it
    "constant_reward": "constant_reward",
    "attention_dropout": "dropout",
    "position_ids": "position_ids",
    "short_completions": "truncation",
    "length_reward": "length_reward",
    "binary_pairs": "zero_std_groups",
    "learning_rate": "update_size",  # and kl_blowup beside it (below)
    "reward_1000x": "dominant_reward",
    "dr_grpo": "loss_normaliser",
    "reward_none_half": "bad_reward",
}
DOUBLE_PLANTED = {  # two defects -> the two findings that name them
    "position_ids+short_completions": ("position_ids", "truncation"),
    "attention_dropout+length_reward": ("dropout", "length_reward"),
    "learning_rate+attention_dropout": ("update_size", "dropout"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Every planted run, trained by the user's script in the user's folder; defect -> its captured step."""
    folder = tmp_path_factory.mktemp("planted")
    build_tiny_llama(folder / "llama")
    build_tiny_llama(folder / "llama-chat", chat=True)
    build_tiny_model(folder / "gpt2")
    build_tiny_qwen2(folder / "qwen2-dropout", attention_dropout=0.1)
    shutil.copy(TESTS / "planted_train.py", folder / "planted_train.py")
    defects = ("clean", *DEFECTS, *DOUBLE_DEFECTS, *CLEAN_RUNS, *USER_RUNS)
    done = subprocess.run(
        [sys.executable, "planted_train.py", *(arg for d in defects for arg in (d, f"out-{d}"))],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, f"a planted run failed (the last one named):\n{done.stderr[-3000:]}"
    return {d: max((folder / f"out-{d}" / "captures").glob("step-*")) for d in defects}  # each run's last step


def ranks(report) -> list[str]:
    """The causes at warning or above, ranked (no symptom of another finding)."""
    return [f.id for f in report.causes()]


def misranked(findings: list[dict]) -> str:
    """'' where the causes are ranked by severity and each symptom comes after all its causes; else what is not."""
    severities = ("problem", "warning", "info", "absent")
    causes = [severities.index(f["severity"]) for f in findings if not f["symptom_of"]]
    if causes != sorted(causes):
        return f"causes not ranked by severity: {[(f['id'], f['severity']) for f in findings]}"
    place = {f["id"]: k for k, f in enumerate(findings)}
    late = [f["id"] for f in findings if any(place[c] > place[f["id"]] for c in f["symptom_of"])]
    return f"symptoms above their causes: {late}" if late else ""


@pytest.fixture(scope="module")
def reports(runs) -> dict:
    """The doctor's report on every planted and clean run, opened with the run's own reward functions as a user
    passes them (`--task`: the doctor calls them on changed completions and samples anew); no held-out prompts (a
    capture's reward functions come with no test set)."""
    return {
        name: diagnose(open_capture(capture, task=_reward_funcs(name)), held_out=0) for name, capture in runs.items()
    }


def _reward_funcs(run: str) -> list:
    return list({**DEFECTS, **DOUBLE_DEFECTS, **CLEAN_RUNS, **USER_RUNS}[run][1])


def severity_table(reports: dict, expected: dict[str, tuple[str, ...]]) -> str:
    """defect x rank x severity: where each expected finding stands among the run's causes."""
    lines = []
    for run, ids in expected.items():
        causes = reports[run].causes()
        for finding in ids:
            rank = next((k for k, f in enumerate(causes, start=1) if f.id == finding), None)
            severity = next(f.severity for f in reports[run].findings if f.id == finding)
            lines.append(f"{run:32s} {finding:20s} rank {rank} {severity:8s} causes {[f.id for f in causes]}")
    return "\n".join(lines)


@pytest.mark.slow  # `make test-slow`: the planted runs take about four minutes to train
def test_every_planted_defect_is_named_within_the_top_two(reports):
    table = {d: (e, ranks(reports[d])) for d, e in PLANTED.items()}
    print("\ndefect x rank x severity:\n" + severity_table(reports, {d: (e,) for d, e in PLANTED.items()}))
    missed = {d: f for d, (e, f) in table.items() if e not in f[:2]}
    assert not missed, f"planted defects not within the doctor's top two causes: {missed}"
    found = ranks(reports["learning_rate"])
    kl = next(f for f in reports["learning_rate"].findings if f.id == "kl_blowup")
    assert found[0] == "update_size", f"learning_rate 0.1: the update first: {found}"
    assert kl.severity in ("warning", "problem") and kl.symptom_of == ("update_size",), (
        f"learning_rate 0.1: the KL the earlier updates built is named, a symptom of the update's rate: {kl}"
    )
    erased = next(f for f in reports["reward_1000x"].findings if f.id == "dominant_reward")
    assert erased.evidence["erased"] == ["digits"], f"the 1000x reward erases digits: {erased}"
    assert erased.severity in ("warning", "problem") and erased.effect and "error" not in erased.effect, (
        f"the erased function is not named at warning or above with a flip (normalize_then_sum): {erased}"
    )


@pytest.mark.slow  # `make test-slow`: the planted runs
def test_two_defects_at_once_are_both_named_and_each_cause_is_above_its_symptoms(reports):
    print("\ntwo defects x rank x severity:\n" + severity_table(reports, DOUBLE_PLANTED))
    for run, (first, second) in DOUBLE_PLANTED.items():
        found = ranks(reports[run])
        assert first in found[:3] and second in found[:3], f"{run}: not both named in the top three causes: {found}"
        place = {f.id: k for k, f in enumerate(reports[run].findings)}
        late = [f.id for f in reports[run].findings if any(place[c] > place[f.id] for c in f.symptom_of)]
        assert not late, f"{run}: symptoms ranked above their causes: {late}"


@pytest.mark.slow  # `make test-slow`: the planted runs
@pytest.mark.parametrize("run, other", [("top_p", None), ("top_p+constant_reward", "constant_reward")])
def test_top_p_without_vllm_is_as_loud_as_its_flip(reports, run, other):
    """top_p 0.8, the trainer sampling with its own model: the mass the sampler cut biases no importance ratio (that
    is vLLM's, TRL #6789), so sampler_truncation is named, and loud only where scoring over the sampler's support
    moves the update under the trainer's optimizer; a defect beside it is named first."""
    found = next(f for f in reports[run].findings if f.id == "sampler_truncation")
    assert found.severity != "absent" and found.effect and "error" not in found.effect, f"{run}: not flipped: {found}"
    expected = "info" if found.effect["cosmetic"] else "warning"
    assert found.severity == expected, f"{run}: {found.severity} where the flip says {expected}: {found.effect}"
    causes = ranks(reports[run])
    assert causes[:1] == ([other] if other else causes[:1]), f"{run}: {other} not the first cause: {causes}"
    if found.severity == "info":
        assert "sampler_truncation" not in causes and "leaves the update as it is" in found.summary, found.summary
    print(f"\n{run}: sampler_truncation {found.severity}, cosine {found.effect['update_cosine']:+.4f}; causes {causes}")


@pytest.mark.slow  # `make test-slow`: the planted runs
@pytest.mark.parametrize("run", ["clean", *CLEAN_RUNS])
def test_a_clean_run_raises_nothing_above_info(reports, run):
    """The plain clean run, GPT-2 with its positions fixed (PositionIdsGRPOTrainer, dropout off), a LoRA run and a
    conversational Llama: quiet."""
    loud = [(f.id, f.severity, f.summary) for f in reports[run].present("warning")]
    assert not loud, f"the clean run {run} got findings above info: {loud}"
    assert {f.id for f in reports[run].findings} == {d.__name__ for d in DETECTORS}, "a detector did not report"


def test_masking_every_completion_is_no_fix_and_raising_the_length_is():
    """8 new tokens cut every completion of the bundled step, and every completion fails the format: no gradient
    with the mask's flip or without it (the flip says it is not measurable, and it is no fix); the finding says to raise the length, and the differential, sampling anew with 4x
    the length, finds the equal rewards it left (every completion fails the format) to be its symptoms."""
    step = GRPOStep(StepConfig(num_prompts=2, num_generations=4, max_new_tokens=8, beta=0.0))
    report = diagnose(step, held_out=0)
    cut = next(f for f in report.findings if f.id == "truncation")
    assert cut.evidence["truncated_share"] == 1.0, f"the planted step is not cut everywhere: {cut.evidence}"
    assert cut.severity == "problem" and "raise it" in cut.summary, cut
    assert cut.effect["grad_norm"] == [0.0, 0.0] and cut.effect["measurable"] is False, (
        f"every reward is equal here (every completion fails the format): no gradient either way, {cut.effect}"
    )
    assert cut.fixed_with == (("max_new_tokens", 32),), f"the differential fixed truncation with {cut.fixed_with}"
    symptoms = {f.id: f.symptom_of for f in report.findings if f.symptom_of}
    assert symptoms.get("zero_std_groups") == ("truncation",), f"equal rewards of cut completions: {symptoms}"
    assert "not measurable on this step" in text(report), text(report)
    assert ranks(report)[0] == "truncation", ranks(report)


def test_a_bfloat16_sampler_is_named_within_the_top_two():
    """TRL without vLLM samples with the trained model itself, so this defect is planted on our own step."""
    step = GRPOStep(StepConfig(num_prompts=2, num_generations=4, max_new_tokens=32, sampler_dtype="bfloat16"))
    found = ranks(diagnose(step))
    assert "precision" in found[:2], f"a bfloat16 sampler against a float32 trainer: the doctor ranked {found}"


@pytest.mark.slow  # `make test-slow`: the planted runs
def test_a_flip_that_moves_the_update_outranks_one_that_does_not(runs):
    """position_ids on a left-padded GPT-2: the flip moves the update; kl_estimator at beta 0 is never flipped."""
    report = diagnose(open_capture(runs["position_ids"]))
    finding = next(f for f in report.findings if f.id == "position_ids")
    effect = finding.effect
    assert effect is not None and effect["toggle"] == {"position_ids": True}, "the cause was not flipped"
    assert effect["update_cosine"] < 0.99 and not effect["cosmetic"], f"the flip did not move the update: {effect}"
    assert report.findings[0].id == "position_ids", [f.id for f in report.findings[:3]]


@pytest.mark.slow  # `make test-slow`: the planted runs
def test_the_command_line_from_another_directory_writes_ranked_json_and_a_page(runs, tmp_path):
    out, page = tmp_path / "doctor.json", tmp_path / "doctor.html"
    done = subprocess.run(
        [sys.executable, "-m", "grpo_debug", "doctor", str(runs["attention_dropout"]), "--budget", "600"]
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
    assert not misranked(findings), misranked(findings)
    dropout = next(f for f in findings if f["id"] == "dropout")
    assert dropout["severity"] == "warning" and "attention_dropout" in dropout["summary"], dropout
    assert dropout["evidence"]["max_logp_gap"] > 0, "two train-mode scorings gave the same log-probs"
    assert "dropout" in done.stdout, done.stdout
    assert "<div class='card warning' id='dropout'>" in page.read_text(), "the page has no card for the dropout cause"


@pytest.mark.slow  # `make test-slow`: the planted runs
@pytest.mark.parametrize("run", list(USER_RUNS))
def test_the_command_line_reads_every_shape_of_user_run(runs, run, tmp_path):
    """TRL's defaults on GPT-2, a conversational Llama, two passes over two micro-batches: ranked JSON with
    every finding's id, severity, evidence, fix and effect; on GPT-2 with TRL's defaults its dropout is named."""
    out = tmp_path / "doctor.json"
    done = subprocess.run(
        [sys.executable, "-m", "grpo_debug", "doctor", str(runs[run]), "--json", str(out), "--budget", "600"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"the doctor failed on the {run} capture:\n{done.stderr[-3000:]}"
    findings = json.loads(out.read_text())["findings"]
    assert {f["id"] for f in findings} == set(PITFALLS), f"not every detector reported on the {run} capture"
    assert all({"id", "severity", "evidence", "fix", "effect"} <= f.keys() for f in findings), findings[0].keys()
    assert not misranked(findings), misranked(findings)
    loud = {f["id"]: f["summary"] for f in findings if f["severity"] in ("problem", "warning")}
    if run == "gpt2_defaults":
        assert "dropout" in loud, f"GPT-2's dropout, on under TRL's defaults, was not named: {loud}"
        advice = [f["id"] for f in findings if "vllm" in (f["fix"] or "") and f["severity"] != "absent"]
        shown = [line for line in done.stdout.splitlines() if line.strip().startswith("fix:") and "vllm" in line]
        assert not shown, f"vLLM advice on a run without vLLM ({advice}): {shown}"
    print(f"\n{run}: above info {loud}")


@pytest.mark.slow  # `make test-slow`: the planted runs
def test_the_replay_names_dropout_that_is_a_config_field(runs):
    """Qwen2's attention_dropout has no nn.Dropout module: the replay still names it as the run's pitfall."""
    from grpo_debug.capture.replay import reproduction

    step = open_capture(runs["attention_dropout"])
    out = reproduction(step.run(until="update"), step.capture, step.policy, step)
    assert "dropout" in out["pitfalls"], out["pitfalls"]
    assert not out["causes"]["dropout"].startswith("absent: dropout off"), out["causes"]["dropout"]


def test_every_detector_has_one_catalogue_entry():
    assert [d.__name__ for d in DETECTORS] == list(PITFALLS), "the detectors and the catalogue name other pitfalls"
    for p in PITFALLS.values():
        if p.toggle is not None:
            field, value = p.toggle
            StepConfig().replace(**{field: value})  # a toggle the config accepts


def _moved_step(**cfg) -> GRPOStep:
    """The bundled step one update away from its reference (learning rate 1e-3), so KL(pi || ref) > 0."""
    step = GRPOStep(StepConfig(num_prompts=2, num_generations=4, max_new_tokens=16, learning_rate=1e-3, **cfg))
    step.run(until="update")
    step.advance()
    return step


def test_the_kl_estimator_is_measured_against_the_exact_kl():
    """k1's expected gradient is 0 (all of the exact KL's gradient missing: a warning); k3 times the ratio has
    the reverse KL's gradient; the estimate on the sampled tokens is the kl the loss logs, as TRL does."""
    step = _moved_step(beta=0.04)
    measured = {}
    for estimator in ("k1", "k3_corrected"):
        step.cfg = step.cfg.replace(kl_estimator=estimator)
        report = diagnose(step, flip=False)
        measured[estimator] = next(f for f in report.findings if f.id == "kl_estimator")
    k1, fixed = measured["k1"], measured["k3_corrected"]
    assert k1.evidence["exact_kl"] > 1e-6, f"the step did not move away from its reference: {k1.evidence}"
    assert k1.severity == "warning" and k1.evidence["grad_rel_error"] > 0.99, k1
    assert fixed.severity == "absent" and fixed.evidence["grad_rel_error"] < 1e-3, fixed
    logged = step.run(step.cfg.replace(kl_estimator="k3"), until="loss").loss.metrics["kl"]
    sampled = fixed.evidence["estimate_on_sampled_tokens"]
    assert abs(sampled - logged) < 1e-6, f"k3 on the sampled tokens {sampled} is not the loss's kl {logged}"


def test_each_flip_is_paired_with_the_update_as_run_on_held_out_prompts():
    """The same held-out prompts and sampling seeds after both updates: a flip that leaves the update as it
    was gives a difference of exactly 0; one that moves it gives an interval at the family's level."""
    step = GRPOStep(StepConfig(num_prompts=4, num_generations=4, max_new_tokens=16, scale_rewards="group"))
    report = diagnose(step, held_out=4)
    flipped = [f for f in report.findings if f.effect and "held_out_reward" in f.effect]
    assert flipped, f"no finding was flipped on the bundled step: {[(f.id, f.severity) for f in report.findings]}"
    for f in flipped:
        held = f.effect["held_out_reward"]
        assert held["prompts"] == 4 and held["difference"]["level"] == 1 - 0.05 / len(flipped), held
        assert held["difference"]["mean"] == pytest.approx(held["flipped"] - held["as_run"], abs=1e-9), held
        if f.effect["update_cosine"] == 1.0:
            assert held["difference"]["mean"] == 0.0, f"{f.id}: the same update, another held-out reward: {held}"
        if held["completions_changed"] == 0:
            assert held["difference"]["mean"] == 0.0, f"{f.id}: the same completions, another reward: {held}"
    none = diagnose(step, held_out=0)
    assert all(f.effect is None or f.effect["held_out_reward"] is None for f in none.findings), "held_out=0 scored"


def test_the_readme_table_is_the_catalogue():
    from grpo_debug.pitfalls import markdown_table

    readme = (TESTS.parent / "docs" / "doctor.md").read_text()
    shown = readme.split("<!-- doctor catalogue: begin -->\n", 1)[1].split("\n<!-- doctor catalogue: end -->", 1)[0]
    assert shown == markdown_table(), "README's doctor table is not the catalogue: paste markdown_table() into it"
