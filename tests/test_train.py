"""Short training runs (`grpo_debug.runs.train`): paired arms, the carried optimizer, resumption, TracIn arms,
and the CLI's determinism."""

import json
import subprocess
import sys

import pytest
import torch

from grpo_debug.config import StepConfig
from grpo_debug.runs.arms import ARMS, Plan, Selection, parse_arm, step_config
from grpo_debug.runs.results import metric_curve
from grpo_debug.runs.train import train

BASE = StepConfig(num_prompts=2, num_generations=4, max_new_tokens=48, per_sample_grad_norms=False)
TIMES = ("seconds",)


def numbers(records):
    return [{k: v for k, v in r.items() if k not in TIMES} for r in records]


def test_parse_arm_reads_names_changes_and_tracin_keys():
    assert parse_arm("fixed") == ARMS["fixed"]
    nodrop = parse_arm("nodrop:dropout=true,beta=0.1")
    assert nodrop.name == "nodrop" and dict(nodrop.changes) == {"dropout": True, "beta": 0.1}
    assert parse_arm("trl").config(BASE).preset_name() == "trl"
    t = parse_arm("t16:select=top_half,val_source=topk,val_size=16,flip_sign=true")
    assert t.selection == Selection(keep="top_half", source="topk", size=16, flip_sign=True)
    for bad, says in [
        ("x:beta=-1", "beta"),
        ("x:nonsense=1", "nonsense"),
        ("x:val_size=8", "16 to 128"),
        ("x:select=best", "keep"),
        ("x:beta", "key=value"),
        (":beta=1", "no name"),
    ]:
        with pytest.raises(ValueError, match=says):
            parse_arm(bad)


def test_arms_share_prompts_and_sampling_seeds_per_step():
    a, b = (step_config(BASE, parse_arm(n), seed=1, t=3, train_prompts=128) for n in ("fixed", "k1"))
    assert (a.seed, a.prompt_offset) == (b.seed, b.prompt_offset) == (1003, 6)
    assert a.replace(kl_estimator="k1") == b
    assert step_config(BASE, ARMS["fixed"], 0, 65, 128).prompt_offset == 2  # 64 batches of 2: an epoch


@pytest.fixture(scope="module")
def three_steps(tmp_path_factory):
    path = tmp_path_factory.mktemp("train") / "p.jsonl"
    return train(
        Plan([ARMS["fixed"], parse_arm("k1")], 3, 1, BASE, eval_every=2, eval_prompts=4), path, show_progress=False
    )


def test_a_run_logs_trl_metrics_every_step_and_the_held_out_reward(three_steps):
    steps = [r for r in three_steps["records"] if "eval" not in r]
    assert [(r["arm"], r["step"]) for r in steps] == [(a, t) for a in ("fixed", "k1") for t in (1, 2, 3)]
    for name in (
        "reward",
        "reward_std",
        "frac_reward_zero_std",
        "kl",
        "entropy",
        "grad_norm",
        "loss",
        "completions/mean_length",
        "clip_ratio/region_mean",
    ):
        assert all(name in r for r in steps), name
    evals = [(r["arm"], r["step"]) for r in three_steps["records"] if "eval" in r]
    assert evals == [(a, t) for a in ("fixed", "k1") for t in (0, 2, 3)]
    first = {r["arm"]: r for r in steps if r["step"] == 1}  # same rollout at the same weights: same reward
    assert first["fixed"]["reward"] == first["k1"]["reward"] and first["fixed"]["kl"] == 0.0
    later = {r["arm"]: r for r in steps if r["step"] == 3}
    assert later["fixed"]["kl"] > 0  # the policy moved away from the reference
    row = three_steps["summary"]["k1"]
    assert row["minus_fixed"]["ci_low"] <= row["minus_fixed"]["mean"] <= row["minus_fixed"]["ci_high"]
    assert "held-out reward" in row["verdict"]
    assert [r["step"] for r in metric_curve(three_steps, "fixed", "eval/reward")] == [0, 2, 3]


@pytest.mark.slow  # `make test-slow`: two train commands, each a fresh process
def test_a_resumed_run_gives_the_same_numbers(three_steps, tmp_path):
    path = tmp_path / "p.jsonl"
    train(
        Plan([ARMS["fixed"], parse_arm("k1")], 2, 1, BASE, eval_every=2, eval_prompts=4),
        path,
        show_progress=False,
        keep_progress=True,
    )
    assert (tmp_path / "p.ckpt" / "fixed-seed0.pt").exists()
    with path.open("a") as f:  # k1 seed 0 was stopped after its step-0 evaluation, before any checkpoint
        f.write(json.dumps({"arm": "k1", "seed": 0, "step": 0, "eval": {"reward": -1.0}}) + "\n")
    (tmp_path / "p.ckpt" / "k1-seed0.pt").unlink()
    resumed = train(
        Plan([ARMS["fixed"], parse_arm("k1")], 3, 1, BASE, eval_every=2, eval_prompts=4), path, show_progress=False
    )
    assert numbers(resumed["records"]) == numbers(three_steps["records"])
    assert not path.exists() and not (tmp_path / "p.ckpt").exists()  # removed once complete
    with pytest.raises(ValueError, match="another comparison"):
        path.write_text(json.dumps({"header": {"other": 1}}) + "\n")
        train(Plan([ARMS["fixed"]], 1, 1, BASE), path, show_progress=False)


def test_the_optimizer_carries_over_between_steps():
    from grpo_debug.step import GRPOStep

    step = GRPOStep(BASE)
    for t in range(2):
        step.run(step_config(BASE, ARMS["fixed"], 0, t, 128), until="update")
        step.advance()
    state = step.optimizer.state_dict()["state"]
    assert {int(s["step"]) for s in state.values()} == {2}  # two AdamW steps on one optimizer, as TRL takes
    assert step.result.update is None  # a new step starts from the updated weights


def test_a_tracin_arm_records_the_fraction_it_selected(tmp_path):
    arm = parse_arm("tr:select=influence>0,val_source=same_batch")
    out = train(Plan([arm], 2, 1, BASE, eval_every=2, eval_prompts=4), tmp_path / "p.jsonl", show_progress=False)
    steps = [r for r in out["records"] if "eval" not in r]
    assert all(0 <= r["selected_fraction"] <= 1 and "val_loss" in r for r in steps)
    assert 0 <= out["summary"]["tr"]["selected_fraction"]["mean"] <= 1


def test_a_summary_is_families_of_verdicts_with_their_correction(three_steps):
    row = three_steps["summary"]["k1"]["minus_fixed"]
    assert (
        row["family"] == "held-out reward difference"
        and row["other"] == "fixed"
        and row["family_size"] == 1
        and row["level"] == 0.95
    )
    assert row["method"].startswith("crossed seeds x prompts" if row["n_seeds"] > 1 else "one seed")
    assert row["holm_p"] == row["p_value"]
    change = three_steps["summary"]["fixed"]["change_from_start"]
    assert change["family_size"] == 2 and change["level"] == 0.975  # Bonferroni over the two arms


@pytest.mark.slow  # `make test-slow`: two train commands, each a fresh process
def test_the_cli_writes_the_same_numbers_twice(tmp_path):
    outs = []
    for k in range(2):
        out = tmp_path / f"out{k}.json"
        cmd = [
            sys.executable,
            "-m",
            "grpo_debug",
            "train",
            "--steps",
            "2",
            "--arm",
            "fixed",
            "--arm",
            "nodrop:dropout=true",
            "--seeds",
            "1",
            "--eval-prompts",
            "4",
            "--no-progress",
            "--json",
            str(out),
            "--set",
            "num_prompts=2",
            "num_generations=4",
            "max_new_tokens=48",
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        assert "held-out reward after 2 steps" in done.stdout and "nodrop" in done.stdout
        outs.append(json.loads(out.read_text()))
    assert numbers(outs[0]["records"]) == numbers(outs[1]["records"])
    assert outs[0]["command"].startswith("python -m grpo_debug train --steps 2")
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_debug",
            "train",
            "--steps",
            "2",
            "--arm",
            "x:beta=-1",
            "--json",
            str(tmp_path / "x.json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "beta" in bad.stderr


def test_the_optimizer_aware_score_selects_too():
    """score=adam: each sample scored by the step a fresh AdamW would take on it (materialised gradients)."""
    from grpo_debug.runs.train import influence
    from grpo_debug.step import GRPOStep

    step = GRPOStep(BASE)
    run = step.run(step_config(BASE, ARMS["fixed"], 0, 0, 128), until="loss")
    sgd, loss_sgd = influence(step, run, Selection(source="same_batch"))
    adam, loss_adam = influence(step, run, Selection(source="same_batch", score="adam"))
    assert sgd.shape == adam.shape == (run.rollout.num_samples,) and loss_sgd == loss_adam
    assert torch.isfinite(adam).all() and not torch.allclose(sgd.double(), adam.double())
    flipped, _ = influence(step, run, Selection(source="same_batch", flip_sign=True))
    assert torch.allclose(flipped, -sgd, rtol=1e-5, atol=1e-12)  # the TracIn-sign report's sign negates every score


def test_two_runs_sharing_an_arm_merge_only_when_that_arm_logged_the_same_numbers(three_steps):
    import copy

    from grpo_debug.runs.results import merge_results

    first = {**copy.deepcopy(three_steps), "command": "a"}
    second = {**copy.deepcopy(three_steps), "command": "b"}
    second["arms"] = {"fixed": second["arms"]["fixed"], "k1_again": second["arms"]["k1"]}
    for r in second["records"]:
        r["arm"] = "k1_again" if r["arm"] == "k1" else r["arm"]
    merged = merge_results(first, second)
    assert list(merged["arms"]) == ["fixed", "k1", "k1_again"] and merged["command"] == ["a", "b"]
    numbers = lambda d: {k: v for k, v in d.items() if k not in ("claim", "verdict")}  # those name the arm
    assert numbers(merged["summary"]["k1_again"]["minus_fixed"]) == numbers(merged["summary"]["k1"]["minus_fixed"])
    second["records"][1]["reward"] += 1e-6  # fixed's step-1 record
    with pytest.raises(ValueError, match="other numbers"):
        merge_results(first, second)
    with pytest.raises(ValueError, match="steps"):
        merge_results(first, {**second, "steps": 4})


def test_select_arms_keeps_their_records_and_pairs_with_another_run(three_steps):
    import copy

    from grpo_debug.runs.results import merge_results, select_arms

    only_fixed = select_arms(three_steps, ["fixed"])
    assert list(only_fixed["arms"]) == ["fixed"] and {r["arm"] for r in only_fixed["records"]} == {"fixed"}
    assert only_fixed["summary"]["fixed"]["reward_final"] == three_steps["summary"]["fixed"]["reward_final"]
    other = copy.deepcopy(select_arms(three_steps, ["k1"]))  # a run without fixed, paired through the first
    merged = merge_results(only_fixed, other)
    assert merged["summary"]["k1"]["minus_fixed"] == three_steps["summary"]["k1"]["minus_fixed"]
    with pytest.raises(ValueError, match="no arm"):
        select_arms(three_steps, ["tracin"])


def test_difference_curve_is_the_paired_difference_at_every_evaluation(three_steps):
    from grpo_debug.runs.results import difference_curve, paired_difference

    rows = difference_curve(three_steps, "k1", "fixed")
    assert [r["step"] for r in rows] == [0, 2, 3]
    assert rows[0]["mean"] == rows[0]["low"] == rows[0]["high"] == 0  # one start, one evaluation seed: no difference
    last = paired_difference(three_steps, "k1", "fixed")
    assert (rows[-1]["mean"], rows[-1]["low"], rows[-1]["high"]) == (last.mean, last.ci_low, last.ci_high)


def test_training_curves_colour_an_arm_alike_in_every_panel_and_figure(three_steps):
    import matplotlib

    matplotlib.use("Agg")
    from grpo_debug.runs.results import difference_curve, metric_curve
    from grpo_debug.ui import plots

    curves = {
        "kl": [row for arm in ("fixed", "k1") for row in metric_curve(three_steps, arm, "kl")],
        "minus fixed": difference_curve(three_steps, "k1", "fixed"),
    }  # a panel without fixed
    colours = lambda fig: {
        (ax.get_title().removesuffix(" (log axis)"), line.get_label()): line.get_color()
        for ax in fig.axes
        for line in ax.get_lines()
    }
    both = colours(plots.training_curves(curves))
    assert both[("kl", "k1")] == both[("minus fixed", "k1")] != both[("kl", "fixed")]
    alone = colours(plots.training_curves({"minus fixed": curves["minus fixed"]}, arms=["fixed", "k1"]))
    assert alone[("minus fixed", "k1")] == both[("kl", "k1")]


def test_record_differences_holds_at_float32_rounding_and_names_what_parts():
    from grpo_debug.runs.results import record_differences

    stored = [{"arm": "fixed", "step": 1, "kl": 1.0e-10, "loss": 5.7315, "triage": "NORMAL: loss = 6.97e-07 (~0)"}]
    rounded = [{**stored[0], "kl": 2.0e-10, "loss": 5.73147, "triage": "NORMAL: loss = 7.08e-07 (~0)"}]
    assert record_differences(rounded, stored) == []
    moved = [{**stored[0], "loss": 5.74}]
    assert record_differences(moved, stored) == ["record 0 (fixed, step 1): loss 5.74 against 5.7315"]
    reworded = [{**stored[0], "triage": "ALERT: loss = 6.97e-07 (~0)"}]
    assert record_differences(reworded, stored) == ["record 0 (fixed, step 1): triage reads otherwise"]
    assert record_differences(stored + stored, stored) == ["2 records against 1"]
    assert record_differences([{**stored[0], "extra": 1}], stored) == ["record 0: keys ['extra'] in one only"]


def test_a_run_that_chooses_a_setting_evaluates_on_validation_prompts_never_the_tests(tmp_path):
    from grpo_debug.evaluation import eval_prompts
    from grpo_debug.runs.results import merge_results
    from grpo_debug.runs.train import held_out
    from grpo_debug.step import GRPOStep

    step = GRPOStep(BASE)
    chosen, test = held_out(step, BASE, 3, "validation"), held_out(step, BASE, 3)
    assert chosen["per_prompt"] != test["per_prompt"], "the validation evaluation sampled the test prompts"
    assert not set(step.task.prompts("validation", 3)) & set(eval_prompts(step.task, 3))
    plan = Plan([ARMS["fixed"]], 1, 1, BASE, eval_every=1, eval_prompts=3, eval_set="validation")
    result = train(plan, tmp_path / "v.jsonl", show_progress=False)
    assert result["eval_set"] == "validation"
    assert [r["eval"]["per_prompt"] for r in result["records"] if "eval" in r][0] == chosen["per_prompt"]
    with pytest.raises(ValueError, match="eval_set"):
        merge_results(result, {k: v for k, v in result.items() if k != "eval_set"})
    with pytest.raises(ValueError, match="eval_set must be test or validation"):
        Plan([ARMS["fixed"]], 1, 1, BASE, eval_every=1, eval_prompts=3, eval_set="train")
