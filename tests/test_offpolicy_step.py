"""The off-policy regime on the bundled model: inner iterations, micro-batches, the null step."""

import json
import subprocess
import sys

import pytest
import torch

from grpo_debug.config import StepConfig
from grpo_debug.show.diagnostics import null_step
from grpo_debug.step import GRPOStep

SMALL = StepConfig(
    num_prompts=2,
    num_generations=4,
    max_new_tokens=40,
    eval_prompts=2,
    eval_samples=1,
    bootstrap=100,
    per_sample_grad_norms=False,
)
CLIP_KEYS = ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio/high_max")


@pytest.fixture(scope="module")
def step():
    s = GRPOStep(SMALL)
    s.run(until="advantages")
    return s


def _cli(tmp_path, *settings):
    out = tmp_path / "out.json"
    small = [
        "num_prompts=2",
        "num_generations=4",
        "max_new_tokens=40",
        "eval_prompts=2",
        "eval_samples=1",
        "bootstrap=100",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_debug", "step", "--set", *small, *settings, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text())["metrics"]


@pytest.mark.slow  # `make test-slow`: a step command in a fresh process
def test_cli_second_iteration_clips_and_logs_entropy(tmp_path):
    two = _cli(tmp_path, "num_iterations=2")
    assert two["clip_ratio/region_mean"] > 0 and two["iteration_2/clip_ratio/region_mean"] > 0
    assert two["iteration_1/clip_ratio/region_mean"] == 0
    assert two["entropy"] > 0 and two["optimizer_steps"] == 2
    one = _cli(tmp_path, "num_iterations=1")
    assert all(one[k] == 0 for k in CLIP_KEYS), {k: one[k] for k in CLIP_KEYS}
    assert one["entropy"] > 0


def test_one_iteration_is_exactly_on_policy(step):
    """mu = 1, S = GA: no old log-probs, each micro-batch's own stand in: the ratio is exactly 1, even with dropout on."""
    for cfg in (SMALL, SMALL.replace(dropout=True, gradient_accumulation_steps=2)):
        it = step.run(cfg, until="update", remember=False).update.iterations[0]
        assert torch.equal(it.ratio[it.trained.bool()], torch.ones(int(it.trained.sum())))


def test_dapo_is_invariant_to_micro_batching_and_bnpo_is_not(step):
    """dapo divides every micro-batch by the generation batch's tokens (TRL's num_items_in_batch), so two
    micro-batches accumulate to the one-batch gradient; bnpo divides each by its own token count."""

    def grad_norm(loss_type, S):
        cfg = SMALL.replace(loss_type=loss_type, beta=0.0, gradient_accumulation_steps=S, max_grad_norm=0.0)
        return step.run(cfg, until="update", remember=False).update.grad_norm

    assert grad_norm("dapo", 2) == pytest.approx(grad_norm("dapo", 1), rel=1e-4)
    assert grad_norm("bnpo", 1) == pytest.approx(grad_norm("dapo", 1), rel=1e-5)
    mask = step.result.logprobs.mask
    assert mask[:4].sum() != mask[4:].sum()  # unequal micro-batches: the normalisers differ
    assert abs(grad_norm("bnpo", 2) / grad_norm("dapo", 2) - 1) > 1e-3


def test_steps_per_generation_gives_several_optimizer_steps_and_moves_the_ratio(step):
    cfg = SMALL.replace(steps_per_generation=2, gradient_accumulation_steps=1)
    run = step.run(cfg, until="update", remember=False)
    assert run.update.optimizer_steps == 2 and len(run.update.iterations[0].grad_norms) == 2
    it = run.update.iterations[0]
    second = it.ratio[4:][it.trained[4:].bool()]
    assert (second - 1).abs().max() > 1e-3  # the second micro-batch is scored after the first step
    first = it.ratio[:4][it.trained[:4].bool()]
    assert (first - 1).abs().max() < 1e-4  # the first only by numerics (old from the no-grad fast scoring)


def test_null_step_floor_and_a_failure_above_it(step):
    table = null_step(step, {"fixed": {}, "readable": {"fast": False}, "dropout on": {"dropout": True}})
    floor = table.loc["fixed", "pass 2: max |log ratio|"]
    assert floor < 1e-4 and table.loc["fixed", "pass 2: clip_ratio/region_mean"] == 0
    assert table.loc["readable", "pass 2: max |log ratio|"] == 0  # the same readable code twice: bit-identical
    assert table.loc["dropout on", "pass 2: max |log ratio|"] > 1e4 * max(floor, 1e-7)
    assert (table["update_norm"] == 0).all()
