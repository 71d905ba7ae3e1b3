"""Phase 7, evaluation: mean reward on held-out prompts before and after the update, paired.

Both models sample with the same seeds on the same prompts, so the per-prompt difference isolates the
update; the confidence interval bootstraps prompts (the unit that was sampled), per component.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .rewards import compute_rewards
from .rollout import Sampling, generate_repeated, sample_completions
from .stats import prompt_bootstrap
from .task import Task, as_task

EVAL_SEED_OFFSET = 10_000  # evaluation samples with seeds apart from the rollout's


@dataclass(frozen=True)
class EvalSide:
    reward: float
    components: dict[str, float]
    per_prompt: torch.Tensor  # (B_eval,) mean reward of each prompt's samples
    completions: list[str]


@dataclass(frozen=True)
class Evaluation:
    before: EvalSide
    after: EvalSide
    delta: float  # after - before, mean over prompts
    ci_low: float  # 95% bootstrap interval of delta
    ci_high: float
    component_deltas: dict[str, float]
    seconds: float


def eval_prompts(task: Task | str, n: int) -> list[str]:
    """The task's held-out test prompts (`task.prompts("test", n)`): never a training or validation prompt."""
    return as_task(task).prompts("test", n)


def eval_side(
    model, tokenizer, prompts: list[str], sampling: Sampling, task: Task | str, generate=generate_repeated
) -> EvalSide:
    """`model`'s mean reward over `sampling.num_generations` completions of each prompt (`specs.eval_sampling_of`:
    the rollout's sampling, in eval mode at float32), seeds apart from the rollout's. `generate`: the readable
    `generate_repeated` or its fast twin."""
    if sampling.dropout or sampling.dtype != "float32":
        raise ValueError("an evaluation samples in eval mode at float32: use specs.eval_sampling_of(cfg)")
    n = sampling.num_generations
    completions = [
        c
        for group in sample_completions(
            model,
            tokenizer,
            prompts,
            n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            min_p=sampling.min_p,
            max_new_tokens=sampling.max_new_tokens,
            seed=sampling.seed + EVAL_SEED_OFFSET,
            progress=False,
            generate=generate,
        )
        for c in group
    ]
    rewards = compute_rewards(prompts, completions, n, task)
    per_prompt = rewards.total.view(-1, n).mean(1)
    components = {k: torch.nanmean(v).item() for k, v in rewards.components.items()}
    return EvalSide(per_prompt.mean().item(), components, per_prompt, completions)


def evaluate_pair(
    before_model,
    after_model,
    tokenizer,
    prompts: list[str],
    sampling: Sampling,
    task: Task | str,
    bootstrap: int,
    generate=generate_repeated,
) -> Evaluation:
    """Both models on the same prompts and sampling seeds; `bootstrap` resamples of the prompts for the interval."""
    start = time.perf_counter()
    before = eval_side(before_model, tokenizer, prompts, sampling, task, generate)
    after = eval_side(after_model, tokenizer, prompts, sampling, task, generate)
    diffs = after.per_prompt - before.per_prompt
    low, high = prompt_bootstrap(diffs, bootstrap, sampling.seed)
    return Evaluation(
        before=before,
        after=after,
        delta=diffs.mean().item(),
        ci_low=low,
        ci_high=high,
        component_deltas={k: after.components[k] - before.components[k] for k in before.components},
        seconds=time.perf_counter() - start,
    )
