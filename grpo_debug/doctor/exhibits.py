"""The step's own numbers that the report's figures draw (`grpo_debug.ui.report_figures`), kept with the report as
plain lists (strict JSON: an unscorable reward is None): each group's rewards and advantages, each completion's
length against the cap, each reward function's value per completion, the sampler-vs-trainer gap per token position
(its median, 90th percentile and largest value over the completions), and what TRL logged before the step.

    exhibits = exhibits_of(facts)
    exhibits["rewards"]      # [[r, ...] one list per group]
"""

from __future__ import annotations

import math

import torch

from ..detectors.findings import StepFacts


def _plain(values: torch.Tensor) -> list:
    """A tensor as (nested) lists of floats, None for what is not finite."""
    return [_plain(v) for v in values] if values.dim() else (v if math.isfinite(v := float(values)) else None)


def gap_by_position(gap: torch.Tensor, mask: torch.Tensor) -> dict:
    """The per-token |log pi_sampler - log pi_trainer| by completion position: at each position with a scored
    token, how many there are, their median, 90th percentile and largest value (nats)."""
    out = {"position": [], "tokens": [], "median": [], "p90": [], "max": []}
    for t in range(gap.shape[1]):
        scored = gap[:, t][mask[:, t] > 0].double()
        scored = scored[scored.isfinite()]
        if len(scored) == 0:
            continue
        out["position"].append(t)
        out["tokens"].append(len(scored))
        out["median"].append(scored.median().item())
        out["p90"].append(scored.quantile(0.9).item())
        out["max"].append(scored.max().item())
    return out


def exhibits_of(facts: StepFacts) -> dict:
    run = facts.run
    cfg, G = run.config, run.rollout.num_generations
    return {
        "num_generations": G,
        "rewards": _plain(run.rewards.total.view(-1, G)),
        "advantages": _plain(run.advantages.values.view(-1, G)),
        "reward_functions": {name: _plain(v) for name, v in run.rewards.components.items()},
        "lengths": run.rollout.completion_lengths.tolist(),
        "finished": run.rollout.finished.tolist(),
        "max_completion_length": cfg.max_new_tokens,
        "token_gap": gap_by_position(run.logprobs.sampler_gap, run.logprobs.mask),
        "logged_history": [dict(h) for h in facts.logged_history],
    }
