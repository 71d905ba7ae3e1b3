"""One GRPO step, top to bottom, in one function: no cache, no fast path, no widgets.

    rollout -> log-probs -> rewards -> advantages -> loss -> update

Each line calls one phase function with tensors and the plain specs `specs` reads from the config.
`GRPOStep.run` (step.py) computes the same numbers on the same seed (tests/test_reference_step.py) and
adds what the notebooks need: each phase's result kept, and only the phases a change touches re-run.
"""

from __future__ import annotations

from dataclasses import dataclass

from .advantages import Advantages, advantages_of
from .config import StepConfig
from .logprobs import TokenLogProbs, compute_logprobs
from .loss import LossBreakdown, batch_loss, batch_of
from .rewards import Rewards, compute_rewards
from .rollout import Rollout, rollout
from .specs import loss_spec_of, optimization_of, sampler_correction_of, sampling_of, scoring_of
from .task import Task
from .update import StepResult, update


@dataclass(frozen=True)
class ReferenceRun:
    rollout: Rollout  # B prompts x G completions, sampled by the policy
    logprobs: TokenLogProbs  # (B*G, C) per-token log-probs: policy, reference, mask
    rewards: Rewards  # (B*G,) total reward and its components
    advantages: Advantages  # (B*G,) group-normalised rewards
    loss: LossBreakdown  # the batch's loss at the weights that sampled it
    update: StepResult  # the optimizer steps taken; the policy's weights are changed in place


def grpo_step(policy, reference, tokenizer, prompts: list[str], task: Task, cfg: StepConfig) -> ReferenceRun:
    """One GRPO step of `policy` on `prompts` (the reference stays frozen), rewards from `task`'s functions. Each
    line is one phase; its comment names the notebook that opens it."""
    samples = rollout(policy, tokenizer, prompts, sampling_of(cfg))  # 01: G completions per prompt
    logprobs = compute_logprobs(policy, reference, samples, scoring_of(cfg))  # 02: log pi, log pi_ref per token
    rewards = compute_rewards(samples.prompts, samples.completions, cfg.num_generations, task)  # 03: a number each
    advantages = advantages_of(cfg, rewards, task.weights)  # 04: each reward against its group's
    spec, correction = loss_spec_of(cfg), sampler_correction_of(cfg)  # correction: None unless TRL's vLLM one is on
    loss = batch_loss(spec, correction, logprobs, advantages.values, samples.sampler_logps)  # 05: the objective
    batch = batch_of(samples, logprobs, advantages.values, spec, correction, cfg.num_iterations)
    mu, norms = cfg.num_iterations, cfg.per_sample_grad_norms  # mu: passes over the rollout (notebook 05b)
    result = update(  # 06: AdamW steps on the batch; the policy's weights change in place
        policy, batch, scoring_of(cfg), spec, optimization_of(cfg), num_iterations=mu, per_sample_grad_norms=norms
    )
    return ReferenceRun(samples, logprobs, rewards, advantages, loss, result)
