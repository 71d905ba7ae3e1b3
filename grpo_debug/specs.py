"""A `StepConfig` turned into the phases' arguments: the one place that reads the config for them. The phase
functions (rollout, logprobs, rewards, advantages, loss, update, evaluation) take tensors, a model and these
plain specs; code that re-runs parts of a step on its own (TracIn, the selection experiments) takes them
bundled in a `StepSpecs`. (`trl_bridge.py` is the other reader of a whole config: it translates it for TRL.)"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from .config import StepConfig
from .evaluation import EvalSampling
from .logprobs import TokenLogProbs
from .loss import LossBreakdown, LossSpec, compute_loss
from .rollout import Rollout
from .sampler import sampler_importance_ratio, sampler_metrics
from .scoring import Scoring
from .speed import Kernels, kernels
from .update import Optimization


def scoring_of(cfg: StepConfig) -> Scoring:
    return Scoring(
        temperature=cfg.temperature if cfg.logprob_temperature else None,
        position_ids=cfg.position_ids,
        dropout=cfg.dropout,
        dtype=cfg.dtype,
        gather=cfg.gather,
        mask=cfg.mask,
        mask_truncated_completions=cfg.mask_truncated_completions,
        support=cfg.logprob_support,
        top_k=cfg.top_k,
        top_p=cfg.top_p,
        min_p=cfg.min_p,
    )


def loss_spec_of(cfg: StepConfig) -> LossSpec:
    """Every LossSpec field is the StepConfig field of the same name, but max_completion_length
    (max_new_tokens) and steps_per_generation (resolved: None means gradient_accumulation_steps)."""
    names = [
        f.name for f in dataclasses.fields(LossSpec) if f.name not in ("max_completion_length", "steps_per_generation")
    ]
    return LossSpec(
        **{k: getattr(cfg, k) for k in names},
        max_completion_length=cfg.max_new_tokens,
        steps_per_generation=cfg.micro_batches,
    )


def needs_old_logps(cfg: StepConfig) -> bool:
    """TRL computes pi_old's log-probs at generation time when some optimizer step on this batch is not the
    first (gradient_accumulation_steps % (steps_per_generation * num_iterations) != 0), or to correct for
    the sampler; otherwise every micro-batch's own detached log-probs stand in and the ratio is exactly 1."""
    return (
        cfg.gradient_accumulation_steps % (cfg.micro_batches * cfg.num_iterations) != 0
        or cfg.vllm_importance_sampling_correction
    )


def optimization_of(cfg: StepConfig) -> Optimization:
    return Optimization(learning_rate=cfg.learning_rate, weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm)


def eval_sampling_of(cfg: StepConfig, samples: int | None = None) -> EvalSampling:
    """The evaluation's sampling: the rollout's settings, `samples` (default `eval_samples`) per prompt."""
    return EvalSampling(
        samples=samples or cfg.eval_samples,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=cfg.top_k,
        min_p=cfg.min_p,
        max_new_tokens=cfg.max_new_tokens,
        seed=cfg.seed,
        generate=kernels(cfg.fast).generate,
    )


@dataclass(frozen=True)
class StepSpecs:
    """Every phase argument a re-run of part of the step needs, in one value."""

    scoring: Scoring
    loss: LossSpec
    optimization: Optimization
    kernels: Kernels  # readable or fast (`speed.kernels`)
    sampling: EvalSampling  # a held-out evaluation's
    seed: int
    bootstrap: int  # resamples of a bootstrap interval


def specs_of(cfg: StepConfig) -> StepSpecs:
    return StepSpecs(
        scoring=scoring_of(cfg),
        loss=loss_spec_of(cfg),
        optimization=optimization_of(cfg),
        kernels=kernels(cfg.fast),
        sampling=eval_sampling_of(cfg),
        seed=cfg.seed,
        bootstrap=cfg.bootstrap,
    )


def sampler_correction(cfg: StepConfig, rollout: Rollout, lp: TokenLogProbs) -> tuple[torch.Tensor | None, dict]:
    """TRL's vLLM importance-sampling ratio pi_old / pi_sampler and its sampling/* metrics, the rollout's
    own sampler log-probs (temperature and top_p applied, as vLLM's processed log-probs) standing in for
    vLLM's; (None, {}) when the correction is off."""
    if not cfg.vllm_importance_sampling_correction:
        return None, {}
    ratio = sampler_importance_ratio(
        lp.policy,
        rollout.sampler_logps,
        lp.mask,
        cfg.vllm_importance_sampling_mode,
        cfg.vllm_importance_sampling_clip_min,
        cfg.vllm_importance_sampling_clip_max,
    )
    return ratio, sampler_metrics(lp.policy, rollout.sampler_logps, lp.mask, ratio)


def update_context(cfg: StepConfig, rollout: Rollout, lp: TokenLogProbs) -> dict:
    """The tensors `update` takes besides the rollout: pi_old's log-probs (or None) and the sampler's."""
    corrected = cfg.vllm_importance_sampling_correction
    return dict(
        old_logps=lp.policy if needs_old_logps(cfg) else None,
        sampler_ratio=sampler_correction(cfg, rollout, lp)[0],
        sampler_logps=rollout.sampler_logps if corrected else None,
    )


def batch_loss(
    cfg: StepConfig, rollout: Rollout, lp: TokenLogProbs, advantages: torch.Tensor, logps: torch.Tensor | None = None
) -> LossBreakdown:
    """The loss of the whole batch at the weights that scored it (the first micro-batch's view when S = 1).
    `logps`: the (N, C) log-probs to differentiate it against (default `lp.policy`: the same values)."""
    ratio, sampling = sampler_correction(cfg, rollout, lp)
    corrected = cfg.vllm_importance_sampling_correction
    spec = dataclasses.replace(loss_spec_of(cfg), gradient_accumulation_steps=1, steps_per_generation=1)
    breakdown = compute_loss(
        lp.policy if logps is None else logps,
        lp.policy,
        lp.reference,
        advantages,
        lp.mask,
        entropies=lp.entropies,
        sampler_logps=rollout.sampler_logps if corrected else None,
        sampler_ratio=ratio,
        **spec.kwargs(),
    )
    return dataclasses.replace(breakdown, metrics={**breakdown.metrics, **sampling}, sampler_ratio=ratio)
