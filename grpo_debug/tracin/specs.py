"""Every phase argument a re-run of part of the step needs (TracIn, the selection experiments), in one value,
with the kernels (readable or fast, `speed.kernels`) it runs them with."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import StepConfig
from ..loss import LossSpec
from ..rollout import Sampling
from ..sampler import SamplerCorrection
from ..scoring import Scoring
from ..specs import eval_sampling_of, loss_spec_of, optimization_of, sampler_correction_of, scoring_of
from ..speed import Kernels, kernels
from ..update import Optimization


@dataclass(frozen=True)
class StepSpecs:
    """Every phase argument a re-run of part of the step needs, in one value."""

    scoring: Scoring
    loss: LossSpec
    correction: SamplerCorrection | None  # the sampler correction (None: off)
    optimization: Optimization
    kernels: Kernels  # readable or fast (`speed.kernels`)
    sampling: Sampling  # a held-out evaluation's (`eval_sampling_of`)
    seed: int
    bootstrap: int  # resamples of a bootstrap interval


def specs_of(cfg: StepConfig) -> StepSpecs:
    return StepSpecs(
        scoring=scoring_of(cfg),
        loss=loss_spec_of(cfg),
        correction=sampler_correction_of(cfg),
        optimization=optimization_of(cfg),
        kernels=kernels(cfg.fast),
        sampling=eval_sampling_of(cfg),
        seed=cfg.seed,
        bootstrap=cfg.bootstrap,
    )
