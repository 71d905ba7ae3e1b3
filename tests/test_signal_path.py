"""The doctor follows the learning signal (issue 69's examples, each on a real GRPOTrainer run of the user's script
tests/user_train.py: a plain GRPOConfig, a tiny Qwen2 in the user's folder, the doctor run from that folder): the
stage where the signal is lost is named, and the setting that lost it traced, for causes no catalogued pitfall names.

- learning_rate 1e-10: the update moves nothing (the update stage, learning_rate)
- top_entropy_quantile 0.02: 2% of the completion tokens carry a gradient (the tokens stage, top_entropy_quantile)
- top_k 3 at temperature 1.3: the sampler can produce a sliver of the policy's completions (the samples stage)
- beta 10: the KL term's gradient outweighs the policy term's (the loss stage, beta)
- a judge's noisy score: the rewards are not the completions' own (rescored, reordered, against the logged ones)
- reward functions edited after the run: the recomputed rewards differ from the trainer's logged ones, rows named
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
from tiny_capture import qwen2_user, user_train_run  # noqa: E402

from grpo_debug.detectors.findings import Finding  # noqa: E402
from grpo_debug.doctor.diagnose import severity_from_flip  # noqa: E402
from grpo_debug.doctor.present import flip_verdict  # noqa: E402

pytestmark = pytest.mark.usefixtures("task_registry_restored")
STAGES = ["samples", "rewards", "advantages", "tokens", "loss", "parameters", "update"]


@pytest.fixture(scope="module")
def user(tmp_path_factory) -> Path:
    return qwen2_user(tmp_path_factory.mktemp("user"))


def doctor(captures: Path, user: Path, funcs: str = "user_train.py:REWARD_FUNCS", probe: str = "0") -> dict:
    """`python -m grpo_debug doctor` on the run's last captured step, from the user's folder, with their rewards (the
    probe's path; `probe` K > 0: its curve over K steps too)."""
    step = sorted(captures.glob("step-*"))[-1]
    out = user / f"{captures.parent.name}-report.json"
    done = subprocess.run(
        [sys.executable, "-m", "grpo_debug", "doctor", str(step), "--task", funcs, "--horizon", "0", "--held-out", "0",
         "--probe", probe, "--budget", "600", "--json", str(out)],  # the budget's own tests: test_doctor_budget.py
        cwd=user, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, f"the doctor failed on {step}:\n{done.stderr[-2000:]}"
    report = json.loads(out.read_text())
    report["text"] = done.stdout
    return report


def first_loud(report: dict) -> dict:
    loud = [f for f in report["findings"] if f["severity"] in ("problem", "warning")]
    assert loud, f"the doctor was silent: {[(f['id'], f['severity']) for f in report['findings']]}"
    return loud[0]


def stage(report: dict, name: str) -> dict:
    found = next(f for f in report["findings"] if f["id"] == "signal_lost")
    return next(s for s in found["evidence"]["path"] if s["stage"] == name)


def test_a_learning_rate_far_too_small_is_lost_at_the_update(user):
    report = doctor(user_train_run(user, "tiny_rate", {"learning_rate": 1e-10}), user)
    first = first_loud(report)
    assert first["id"] == "signal_lost" and first["evidence"]["stage"] == "update", first
    assert first["evidence"]["lost_to"].startswith("learning_rate"), first["evidence"]["lost_to"]
    assert "learning_rate" in first["fix"], first["fix"]
    update = stage(report, "update")
    assert update["measured"]["moved_kl"] < 1e-10, update
    path = [line.split()[0] for line in report["text"].splitlines() if line.startswith("  ") and "%" in line[:20]]
    assert path[:7] == STAGES, f"the text report does not open with the signal's path: {report['text'][:1500]}"
    assert "<- lost here" in report["text"].split("the doctor:")[0], report["text"][:1500]
    probe = report["probe"]  # a reward the model can learn, through the same pipeline: the update moves nothing
    assert probe["carries"] is False and probe["verdict"] == "lost" and probe["stage"] == "update", probe["said"]
    assert probe["lost_to"].startswith("learning_rate") and "whatever the reward" in probe["said"], probe
    moved = next(s for s in probe["path"] if s["stage"] == "update")["measured"]["moved_kl"]
    assert moved < 1e-10 and "probe:" in report["text"], f"the probe's update moved KL {moved}"


def test_a_token_filter_that_keeps_2_percent_is_lost_at_the_tokens(user):
    report = doctor(user_train_run(user, "few_tokens", {"top_entropy_quantile": 0.02}), user)
    first = first_loud(report)
    assert first["id"] == "signal_lost" and first["evidence"]["stage"] == "tokens", first
    assert first["evidence"]["lost_to"] == "top_entropy_quantile 0.02", first["evidence"]
    tokens = stage(report, "tokens")
    assert tokens["kept"] <= 0.1 and tokens["measured"]["removed"]["top_entropy_quantile 0.02"] >= 0.9, tokens
    probe = report["probe"]  # the probe's signal, on the same completions, is lost where the run's was
    assert probe["verdict"] == "lost" and probe["stage"] == "tokens", probe["said"]
    assert probe["lost_to"] == "top_entropy_quantile 0.02", probe["lost_to"]


def test_a_sampler_that_keeps_a_few_tokens_loses_the_signal_at_the_samples_whatever_its_flip(user):
    """top_k 3 at a warm temperature, without vLLM: scoring over the sampler's support may leave the update as it is,
    but the step can sample only the completions the cut leaves, a sliver of the policy's: the finding stays loud."""
    report = doctor(user_train_run(user, "few_tokens_sampled", {"top_k": 3, "temperature": 1.3}), user)
    samples = stage(report, "samples")
    reach = samples["measured"]["reach"]
    assert reach is not None and reach <= 0.1 and samples["lost"], samples
    assert samples["lost_to"].startswith("top_k 3"), samples
    found = {f["id"]: f for f in report["findings"]}
    truncation = found["sampler_truncation"]
    assert truncation["severity"] in ("problem", "warning"), truncation
    assert truncation["evidence"]["reach"] == pytest.approx(reach), (truncation["evidence"], reach)
    assert f"can produce {reach:.0%} of the policy's completions" in truncation["summary"], truncation["summary"]
    loud = [f["id"] for f in report["findings"] if f["severity"] in ("problem", "warning")]
    assert "sampler_truncation" in loud, loud  # (a tiny model sampled this narrowly never ends: truncation leads)


def test_a_judge_that_scores_by_chance_gives_rewards_that_are_not_the_completions_own(user):
    report = doctor(
        user_train_run(user, "judged", {"judged": True, "learning_rate": 3e-4}),
        user,
        "user_train.py:JUDGED_REWARD_FUNCS",
        probe="8",
    )
    found = next(f for f in report["findings"] if f["id"] == "rewards_not_own")
    assert found["severity"] in ("problem", "warning"), found
    e = found["evidence"]
    assert set(e["rescored_moved"]) == {"judged"} and set(e["reordered_moved"]) == {"judged"}, e
    assert set(e["rows_differing"]) == {"judged"}, f"only judged should differ from the logged rewards: {e}"
    assert first_loud(report)["id"] in ("rewards_not_own", "signal_lost"), first_loud(report)
    probe = report["probe"]  # the pipeline carries a reward the model can learn: the judge is where it is lost
    assert probe["carries"] is True and "lost at the reward" in probe["said"], probe["said"]
    assert probe["rise"]["ci_low"] > 0, f"trained 8 steps at 3e-4 the probe's mass did not rise: {probe['rise']}"


def test_a_reward_that_scores_one_completion_in_sixteen_is_lost_at_the_rewards_and_named_by_bad_reward(user):
    """Groups with one reward scored and the rest None carry no signal: the rewards stage loses it (not the
    advantages, as NaN counted as variety once said), and bad_reward, of that stage, leads."""
    report = doctor(user_train_run(user, "rarely", {"rarely": True}), user, "user_train.py:RARELY_REWARD_FUNCS")
    lost = next(f for f in report["findings"] if f["id"] == "signal_lost")
    assert lost["evidence"]["stage"] == "rewards" and lost["evidence"]["lost_to"] == "None rewards", lost["summary"]
    rewards = stage(report, "rewards")
    assert rewards["kept"] == 0 and rewards["measured"]["unscored"] == rewards["measured"]["groups"], rewards
    assert first_loud(report)["id"] == "bad_reward", first_loud(report)


def test_a_clean_run_loses_no_stage_and_its_rewards_are_its_own(user):
    report = doctor(user_train_run(user, "plain", {"learning_rate": 3e-4}), user)  # a rate this tiny model learns at
    by_id = {f["id"]: f for f in report["findings"]}
    assert by_id["signal_lost"]["severity"] == "absent", by_id["signal_lost"]["summary"]
    assert by_id["rewards_not_own"]["severity"] == "absent", by_id["rewards_not_own"]
    assert "equal the trainer's logged ones" in by_id["rewards_not_own"]["summary"], by_id["rewards_not_own"]
    assert [s["stage"] for s in by_id["signal_lost"]["evidence"]["path"]] == STAGES
    assert report["probe"]["carries"] is True, report["probe"]


@pytest.mark.slow
def test_a_kl_weight_that_swamps_the_policy_term_is_lost_at_the_loss(user):
    report = doctor(user_train_run(user, "swamped", {"beta": 10.0, "learning_rate": 1e-2, "max_steps": 3,
                                                     "capture": [3]}), user)  # fmt: skip
    loss = stage(report, "loss")
    assert loss["measured"]["kl_over_policy"] > 1, loss
    first = first_loud(report)
    assert first["id"] == "signal_lost" and first["evidence"]["stage"] == "loss", first
    assert first["evidence"]["lost_to"] == "beta 10", first["evidence"]
    probe = report["probe"]  # the probe's policy term, too, is outweighed by the KL term's
    assert probe["verdict"] == "lost" and probe["stage"] == "loss" and probe["lost_to"] == "beta 10", probe["said"]


@pytest.mark.slow
def test_reward_functions_edited_after_the_run_differ_from_the_logged_rewards_on_named_rows(user):
    (user / "edited.py").write_text(
        "def digits(completions, **kwargs):\n"
        "    return [2.0 * sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]\n\n\n"
        "def short(completions, **kwargs):\n"
        "    return [-len(c) / 16 for c in completions]\n\n\n"
        "REWARD_FUNCS = [digits, short]\n"
    )
    report = doctor(user_train_run(user, "edited", {}), user, "edited.py:REWARD_FUNCS")
    found = next(f for f in report["findings"] if f["id"] == "rewards_not_own")
    e = found["evidence"]
    assert found["severity"] in ("problem", "warning") and list(e["rows_differing"]) == ["digits"], found
    assert e["differs_from_logged"]["digits"], e
    assert not e["rescored_moved"] and not e["reordered_moved"], f"edited, not noisy: {e}"
    assert "logged" in found["summary"] and "row" in found["summary"], found["summary"]


def test_a_flip_on_a_step_with_no_gradient_either_way_is_not_measurable_never_cosmetic():
    """The trainer's momentum moves the weights alike with and without the flip when neither has a gradient: the
    cosine is 1, and it says nothing of what the flip would do to a step that learns."""
    effect = {"toggle": {"dropout": False}, "grad_norm": [0.0, 0.0], "update_cosine": 1.0, "update_norm": [0.3, 0.3],
              "dlogp_moved": 0.0, "cosmetic": False, "measurable": False, "removes_gradient": False}  # fmt: skip
    found = Finding("dropout", "warning", "dropout is on in the trainer's forwards", {}, effect)
    kept = severity_from_flip(found)
    assert kept.severity == "warning", f"a flip that cannot show was read as no effect: {kept.summary}"
    assert flip_verdict(effect).startswith("not measurable on this step"), flip_verdict(effect)


def test_a_flip_with_no_gradient_on_its_step_is_measured_on_its_prompts_sampled_anew(user, monkeypatch):
    """resampled_effect on a real capture (the user's rewards): fresh draws of the step's prompts from its start
    weights with the trainer's optimizer; a flip that changes nothing reads cosmetic (both arms on the same
    completions: cosine 1), one that rescales each group's advantages moves the update; the step is left as it was."""
    from grpo_debug.capture.opening import open_capture
    from grpo_debug.doctor.flips import NO_GRADIENT, resampled_effect
    from grpo_debug.step import trained_state

    captures = user_train_run(user, "resample", {"learning_rate": 3e-4})
    monkeypatch.chdir(user)
    step = open_capture(str(sorted(captures.glob("step-*"))[-1]), "user_train.py:REWARD_FUNCS")
    base = step.run(step.cfg, until="update")
    step.restore_policy()
    start = {k: v.clone() for k, v in trained_state(step.policy).items()}
    same = resampled_effect(step, base.config, "scale_rewards", base.config.scale_rewards)
    assert same is not None and same["grad_norm"][0] > NO_GRADIENT, f"no draw with a gradient: {same}"
    assert same["update_cosine"] > 1 - 1e-6 and same["cosmetic"], f"a flip that changes nothing moved: {same}"
    other = "none" if base.config.scale_rewards != "none" else "group"
    moved = resampled_effect(step, base.config, "scale_rewards", other)
    assert moved is not None and not moved["cosmetic"], f"rescaling each group's advantages read as cosmetic: {moved}"
    now = trained_state(step.policy)
    assert all(torch.equal(start[k], now[k]) for k in start), "resampling left the step's weights changed"


def test_a_not_measurable_flip_takes_its_severity_from_the_resampled_step():
    resampled = {"seed": 7, "grad_norm": [0.5, 0.5], "update_cosine": 1.0, "update_norm": [0.3, 0.3], "cosmetic": True}
    effect = {"toggle": {"dropout": False}, "grad_norm": [0.0, 0.0], "update_cosine": 1.0, "update_norm": [0.3, 0.3],
              "dlogp_moved": 0.0, "cosmetic": False, "measurable": False, "removes_gradient": False,
              "resampled": resampled}  # fmt: skip
    found = Finding("dropout", "warning", "dropout is on in the trainer's forwards", {}, effect)
    assert severity_from_flip(found).severity == "info", "a resampled step where the flip is cosmetic was not read"
    assert "sampled anew" in severity_from_flip(found).summary, severity_from_flip(found).summary
    moving = {**effect, "resampled": {**resampled, "update_cosine": 0.5, "cosmetic": False}}
    kept = severity_from_flip(Finding("dropout", "warning", "dropout is on", {}, moving))
    assert kept.severity == "warning", f"a flip that moves a resampled step's update was demoted: {kept.summary}"
    assert "the update moves (cosine +0.500)" in flip_verdict(moving), flip_verdict(moving)


def test_the_probes_verdict_is_the_first_pipeline_stage_that_loses_its_signal_and_is_printed_with_its_curve():
    """read_path on stages as probe_path measures them: lost at the first stage after the rewards that loses nearly
    all (the setting traced), carries where none does, no verdict where the probe's own rewards do not vary; the
    report's line carries the curve where the probe was trained over steps."""
    from grpo_debug.detectors.signal_path import Stage
    from grpo_debug.doctor.present import probe_line
    from grpo_debug.doctor.probe import TokenProbe, read_path

    probe = TokenProbe((3, 5), ("a", "b"), 0.48)
    varied, flat = Stage("rewards", 0.9, "9/10 groups vary"), Stage("rewards", 0.0, "0/10 groups vary")
    through = [Stage(n, 1.0, f"{n} through") for n in ("advantages", "tokens", "loss", "parameters", "update")]
    masked = [*through[:1], Stage("tokens", 0.02, "2% carry", "top_entropy_quantile 0.02"), *through[2:3],
              Stage("parameters", 0.001, "frozen", "requires_grad=False on 99.9% of the weights"), *through[4:]]  # fmt: skip
    lost = read_path(probe, [varied, *masked])
    assert (lost["verdict"], lost["stage"], lost["lost_to"], lost["carries"]) == (
        "lost", "tokens", "top_entropy_quantile 0.02", False), lost  # fmt: skip
    assert "lost at the tokens: top_entropy_quantile 0.02" in lost["said"], lost["said"]
    carries = read_path(probe, [varied, *through])
    assert carries["verdict"] == "carries" and carries["carries"] is True and "lost at the reward" in carries["said"]
    none = read_path(probe, [flat, *masked])
    assert none["verdict"] is None and none["carries"] is None, "a probe without varied rewards gave a verdict"

    class Probed:
        probe = {**carries, "mass_by_step": [0.5, 0.5001], "seeds": [0, 1], "steps": 1}

    assert (
        probe_line(Probed) == f"probe: {carries['said']} (its mass trained 1 steps, mean of 2 seeds: 0.5000 -> 0.5001)"
    )
