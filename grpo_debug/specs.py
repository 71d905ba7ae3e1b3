"""A `StepConfig` turned into the phases' arguments: the one place that reads the config for them. The phase
functions (rollout, logprobs, rewards, advantages, loss, update, evaluation) take tensors, a model and these
plain specs; code that re-runs parts of a step on its own (TracIn, the selection experiments) takes them
bundled in a `tracin.specs.StepSpecs`. (`capture/trl_bridge.py` is the other reader of a whole config: it
translates it for TRL.)"""

from __future__ import annotations

import dataclasses

from .config import StepConfig
from .loss import LossSpec
from .rollout import Sampling
from .sampler import SamplerCorrection
from .scoring import Scoring
from .update import Optimization


def sampling_of(cfg: StepConfig) -> Sampling:
    return Sampling(
        num_generations=cfg.num_generations,
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=cfg.top_k,
        min_p=cfg.min_p,
        seed=cfg.seed,
        pad_with_eos=cfg.pad_with_eos,
        generation=cfg.generation,
        dropout=cfg.sample_dropout,
        dtype=cfg.sampler_dtype,
    )


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


def sampler_correction_of(cfg: StepConfig) -> SamplerCorrection | None:
    """Each SamplerCorrection field is the StepConfig field `vllm_importance_sampling_<name>`; None: off."""
    if not cfg.vllm_importance_sampling_correction:
        return None
    names = (f.name for f in dataclasses.fields(SamplerCorrection))
    return SamplerCorrection(**{k: getattr(cfg, f"vllm_importance_sampling_{k}") for k in names})


def optimization_of(cfg: StepConfig) -> Optimization:
    return Optimization(learning_rate=cfg.learning_rate, weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm)


def eval_sampling_of(cfg: StepConfig, samples: int | None = None) -> Sampling:
    """The evaluation's sampling: the rollout's, `samples` (default `eval_samples`) per prompt, in eval mode at
    float32 whatever the rollout's mode and precision (a held-out reward measures the policy, not its sampler)."""
    return dataclasses.replace(
        sampling_of(cfg), num_generations=samples or cfg.eval_samples, dropout=False, dtype="float32"
    )
