"""The step engine on the bundled model: every toggle does what it claims, with numbers."""

import json
import subprocess
import sys

import pytest
import torch

from grpo_debug.config import StepConfig
from grpo_debug.logprobs import completion_mask
from grpo_debug.loss import compute_loss
from grpo_debug.overrides import parse_overrides
from grpo_debug.show.diagnostics import kl_estimator_check
from grpo_debug.show.metrics import metrics
from grpo_debug.step import GRPOStep

SMALL = StepConfig(num_prompts=4, num_generations=4, eval_prompts=4, eval_samples=2, bootstrap=200)


@pytest.fixture(scope="module")
def step():
    s = GRPOStep(SMALL)
    s.run(until="loss")
    return s


def test_all_fixes_on_sampler_and_recomputed_logps_agree(step):
    run = step.run(SMALL, until="loss")
    assert run.rollout.prompt_mask.eq(0).any(), "mixed prompts must be left-padded for this check to mean anything"
    assert run.logprobs.max_sampler_gap < 1e-4


@pytest.mark.parametrize(
    "pitfall",
    [
        dict(logprob_temperature=False),
        dict(dropout=True),
        dict(position_ids=False),
        dict(dtype="bfloat16"),
        dict(gather="first_position"),
    ],
)
def test_each_pitfall_alone_breaks_the_agreement(step, pitfall):
    gap = step.run(SMALL.replace(**pitfall), until="logprobs").logprobs.max_sampler_gap
    step.run(SMALL, until="loss")
    assert gap > 1e-2, pitfall


def test_value_mask_drops_the_eos_and_length_mask_keeps_it(step):
    rollout = step.run(SMALL, until="loss").rollout
    assert rollout.pad_token_id == rollout.eos_token_id and rollout.finished.any()
    eos_at = (rollout.completion_lengths - 1).unsqueeze(1)
    finished = rollout.finished
    assert completion_mask(rollout, "keep_first_eos").gather(1, eos_at)[finished].eq(1).all()
    assert completion_mask(rollout, "drop_eos_and_pad").gather(1, eos_at)[finished].eq(0).all()
    by_value = (rollout.completion_ids != rollout.pad_token_id).float()  # the naive value-based PAD mask
    assert by_value.gather(1, eos_at)[finished].eq(0).all()
    none = completion_mask(rollout, "all_positions")
    assert none.sum() > completion_mask(rollout, "keep_first_eos").sum()  # sums over PAD after the EOS


def test_a_toggle_reruns_only_the_phases_after_it(step):
    base = step.run(SMALL, until="loss")
    rollout_before = base.rollout
    step.run(SMALL.replace(beta=0.1), until="loss")
    assert step.last_rerun == ["loss"] and step.result.rollout is rollout_before
    step.run(SMALL.replace(beta=0.1, scale_rewards="batch"), until="loss")
    assert step.last_rerun == ["advantages", "loss"]
    step.run(SMALL.replace(mask="all_positions"), until="loss")
    assert step.last_rerun[0] == "logprobs" and step.result.rollout is rollout_before
    step.run(SMALL, until="loss")


def test_loss_is_about_zero_at_step_zero_while_the_gradient_is_not():
    run = GRPOStep(SMALL).run(SMALL.replace(beta=0.0), until="update")
    assert torch.equal(run.loss.ratio, torch.ones_like(run.loss.ratio))
    assert abs(run.loss.loss.item()) < 1e-5
    assert run.advantages.frac_reward_zero_std < 1 and run.update.grad_norm > 1e-3
    grouped = run.advantages.values.view(-1, SMALL.num_generations).sum(1)
    assert grouped.abs().max() < 1e-4  # advantages sum to 0 in every group


def test_same_seed_same_numbers():
    cfg = SMALL.replace(eval_prompts=2)
    first = {k: v for k, v in metrics(GRPOStep(cfg).run()).items() if not k.startswith("time/")}
    second = {k: v for k, v in metrics(GRPOStep(cfg).run()).items() if not k.startswith("time/")}
    assert first == second


def test_kl_estimators_values_and_gradients():
    check = kl_estimator_check()
    for unbiased_gradient in ("k2", "k3_corrected"):
        assert check[unbiased_gradient]["grad_rel_error"] < 0.02
    for biased_gradient in ("k1", "k3"):
        assert check[biased_gradient]["grad_rel_error"] > 0.3
    for unbiased_value in ("k1", "k3", "k3_corrected"):
        assert abs(check[unbiased_value]["value"] - check[unbiased_value]["exact_kl"]) < 0.02
    assert check["k2"]["value"] - check["k2"]["exact_kl"] > 0.03  # k2's value is biased


def test_sequence_reinforce_forms():
    logps = -torch.rand(4, 6)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1] * 6, [1, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]]).float()
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    total = compute_loss(logps, None, None, adv, mask, loss_type="reinforce_sum", beta=0.0).loss
    assert torch.allclose(total, (-adv * (logps * mask).sum(1)).mean())
    mean = compute_loss(logps, None, None, adv, mask, loss_type="reinforce_mean", beta=0.0).loss
    assert torch.allclose(mean, (-adv * (logps * mask).sum(1) / mask.sum(1)).mean())


def test_overrides_are_typed_and_checked():
    assert parse_overrides(["beta=0.1", "dropout=true", "num_prompts=2"]) == {
        "beta": 0.1,
        "dropout": True,
        "num_prompts": 2,
    }
    with pytest.raises(ValueError, match="'no_such_knob' is not a StepConfig key"):
        parse_overrides(["no_such_knob=1"])
    with pytest.raises(ValueError, match="did you mean temperature"):
        parse_overrides(["temprature=0.5"])
    with pytest.raises(ValueError, match="'temperature' has no value: write temperature=VALUE"):
        parse_overrides(["temperature"])


def test_a_cli_typo_is_answered_before_torch_loads():
    """The command line checks its arguments with the config alone: `import grpo_debug.config` and the parser
    import neither torch nor transformers (timing it would be a flaky test; the imports are what decide)."""
    code = (
        "import sys, grpo_debug.__main__ as m\n"
        "try:\n    m.main(['step', '--set', 'temprature=0.5'])\nexcept SystemExit as e:\n    assert e.code == 2\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'imported too early'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "did you mean temperature" in done.stderr


@pytest.mark.parametrize(
    "arms,message",
    [
        (["bogus"], "'bogus' is not a named arm"),
        (["fixed:seed=5"], "set by train for every step"),
        (["tracin:flip_sign=maybe"], "flip_sign = 'maybe'"),
        (["fixed", "fixed"], "arm names must differ"),
    ],
)
def test_a_bad_arm_is_answered_before_torch_loads(arms, message):
    code = (
        "import sys, grpo_debug.__main__ as m\n"
        f"argv = ['train', '--steps', '1', '--json', 'out.json'] + [x for a in {arms!r} for x in ('--arm', a)]\n"
        "try:\n    m.main(argv)\nexcept SystemExit as e:\n    assert e.code == 2\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'imported too early'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


def test_cli_prints_a_report_and_writes_every_number(tmp_path):
    out = tmp_path / "step.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_debug",
            "step",
            "--set",
            "num_prompts=2",
            "num_generations=2",
            "eval_prompts=2",
            "eval_samples=2",
            "mask=drop_eos_and_pad",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        "differs from the fixed preset: mask=drop_eos_and_pad" in proc.stdout and "frac_reward_zero_std" in proc.stdout
    )
    data = json.loads(out.read_text())
    assert {"reward", "reward_std", "frac_reward_zero_std", "kl", "grad_norm", "completions/mean_length"} <= set(
        data["metrics"]
    )
    assert len(data["completions"]) == 4


def test_per_prompt_loop_generation_scores_like_one_call():
    """The manual-step analysis's loop (one generate per prompt) gives the same kind of rollout: sampler and recomputed
    log-probs agree, each group has its own prompt."""
    cfg = StepConfig(num_prompts=2, num_generations=3, generation="loop")
    run = GRPOStep(cfg).run(cfg, until="logprobs")
    assert run.rollout.num_samples == 6 and len(set(run.rollout.prompts)) == 2
    assert run.logprobs.max_sampler_gap < 1e-4


def test_per_sample_table_has_a_total_reward_on_every_row_of_a_mixed_batch(step):
    from grpo_debug.ui.tables import per_sample

    run = step.run(SMALL, until="loss")
    table = per_sample(run, wide=True)
    tasks = {p[:2] for p in run.rollout.prompts}
    assert tasks == {"P:", "A:"}, "the check needs both tasks in the batch"
    assert table["reward"].notna().all()
    assert table["reward"].tolist() == pytest.approx(run.rewards.total.tolist())
    assert "rewards/reward" in table and "rewards/best_move" in table
    assert list(per_sample(run).columns) == ["group", "completion", "reward", "advantage", "loss_share"]


@pytest.mark.parametrize("preset", ["fixed", "trl"])
def test_cli_runs_each_preset_and_reports_its_sampler_gap(tmp_path, preset):
    out = tmp_path / "step.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_debug",
            "step",
            "--preset",
            preset,
            "--set",
            "num_prompts=2",
            "num_generations=2",
            "eval_prompts=2",
            "eval_samples=2",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"preset: {preset}" in proc.stdout
    data = json.loads(out.read_text())
    gap = data["metrics"]["logps/max_sampler_gap"]
    assert data["config"]["loss_type"] == ("dapo" if preset == "trl" else "grpo")
    assert (gap > 1.0) if preset == "trl" else (gap < 1e-4)  # TRL's scoring shifts the left-padded rows


def test_every_run_is_a_new_frozen_run_and_a_later_run_leaves_it_alone(step):
    import dataclasses

    a = step.run(SMALL, until="loss")
    loss_a, logps_a = a.loss.loss.clone(), a.logprobs.policy.clone()
    b = step.run(SMALL.replace(beta=0.3, mask="all_positions"), until="loss")
    assert a is not b and step.run(SMALL, until="loss") is not a
    assert b.rollout is a.rollout and b.rerun == ("logprobs", "rewards", "advantages", "loss")  # shared, not copied
    assert torch.equal(a.loss.loss, loss_a) and torch.equal(a.logprobs.policy, logps_a)
    assert a.config == SMALL and b.config.beta == 0.3
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.loss = None
    side = step.run(SMALL.replace(beta=0.5), until="loss", remember=False)
    assert step.result.config != side.config  # a side run leaves the step's current run as it was


@pytest.mark.parametrize(
    "args,message",
    [
        (["step", "--set", "max_new_tokens=300"], "the model 256 positions, so at most"),
        (
            ["train", "--steps", "1", "--arm", "fixed", "--eval-prompts", "100000", "--json", "OUT"],
            "--eval-prompts 100000",
        ),
        (
            [
                "train",
                "--steps",
                "1",
                "--arm",
                "fixed",
                "--set",
                "task=policy",
                "--train-prompts",
                "100000",
                "--json",
                "OUT",
            ],
            "--train-prompts 100000",
        ),
        (
            ["train", "--steps", "0", "--arm", "fixed", "--json", "OUT"],
            "--steps, --seeds and --eval-every must be at least 1",
        ),
        (["step", "--threads", "0"], "--threads 0"),
    ],
)
def test_bad_command_lines_are_refused_with_the_field_named(args, message, tmp_path):
    args = [str(tmp_path / "out.json") if a == "OUT" else a for a in args]
    done = subprocess.run([sys.executable, "-m", "grpo_debug", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and message in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "pair",
    [
        "seed=18446744073709551616",
        "epsilon_high=1e308",
        "learning_rate=1e30",
        "entropy_coef=-1e30",
        "temperature=nan",
        "model=",
        "std_floor=3.4e38",  # found by the dashboard fuzz test: a RuntimeError deep in the advantages
        "beta=1e31",
    ],
)
def test_values_that_overflow_later_are_refused_when_the_config_is_built(pair):
    with pytest.raises(ValueError, match=pair.split("=")[0]):
        StepConfig(**parse_overrides([pair]))
