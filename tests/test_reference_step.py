"""The reference step (one function, top to bottom) and GRPOStep.run compute the same numbers."""

import pytest
import torch

from grpo_debug.config import StepConfig
from grpo_debug.model import load_model
from grpo_debug.reference_step import grpo_step
from grpo_debug.step import GRPOStep
from grpo_debug.task import load_task

SMALL = dict(num_prompts=2, num_generations=4, eval_prompts=2, eval_samples=2)


def both(cfg: StepConfig):
    step = GRPOStep(cfg)
    cached = step.run(cfg, until="update")
    loaded, task = load_model(cfg.model), load_task(cfg.task)
    reference = grpo_step(
        loaded.policy, loaded.reference, loaded.tokenizer, task.prompts("train", cfg.num_prompts), task, cfg
    )
    return step, cached, loaded, reference


def weights(model) -> list[torch.Tensor]:
    return [p.detach() for p in model.parameters()]


@pytest.mark.parametrize(
    "cfg",
    [
        StepConfig(**SMALL, fast=False),
        StepConfig.preset("trl", **SMALL, fast=False, num_iterations=2, steps_per_generation=2, beta=0.04),
        StepConfig(**SMALL, fast=False, vllm_importance_sampling_correction=True, top_p=0.9),
    ],
    ids=["fixed", "trl mu 2 S 2 beta", "sampler correction, top_p"],
)
def test_grpo_step_run_equals_the_reference_step_bit_for_bit(cfg):
    step, cached, loaded, reference = both(cfg)
    assert cached.rollout.completions == reference.rollout.completions
    for name in ("policy", "reference", "mask", "entropies"):
        assert torch.equal(getattr(cached.logprobs, name), getattr(reference.logprobs, name)), name
    assert torch.equal(cached.rewards.total, reference.rewards.total)
    assert torch.equal(cached.advantages.values, reference.advantages.values)
    assert torch.equal(cached.loss.loss, reference.loss.loss) and cached.loss.metrics == reference.loss.metrics
    assert cached.update.grad_norm == reference.update.grad_norm
    assert [it.losses for it in cached.update.iterations] == [it.losses for it in reference.update.iterations]
    assert all(torch.equal(a, b) for a, b in zip(weights(step.policy), weights(loaded.policy)))


def test_the_fast_paths_give_the_reference_steps_numbers_to_float_rounding():
    cfg = StepConfig(**SMALL)
    assert cfg.fast
    step, cached, loaded, reference = both(cfg)
    assert cached.rollout.completions == reference.rollout.completions
    torch.testing.assert_close(cached.logprobs.policy, reference.logprobs.policy, atol=1e-4, rtol=0)
    torch.testing.assert_close(cached.loss.loss, reference.loss.loss, atol=1e-5, rtol=1e-4)
    assert cached.update.grad_norm == pytest.approx(reference.update.grad_norm, rel=1e-3)
    for a, b in zip(weights(step.policy), weights(loaded.policy)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
