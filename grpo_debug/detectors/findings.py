"""What every detector returns and reads: a `Finding`, from `StepFacts`. Severity: `problem` (the step cannot
learn what it should), `warning` (it learns something else, or much less), `info` (worth knowing, by design),
`absent`."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..step import StepRun

SEVERITIES = ("problem", "warning", "info", "absent")
LOUD = ("problem", "warning")  # what a run should act on; info is by design, or worth knowing


@dataclass(frozen=True)
class Finding:
    id: str
    severity: str
    summary: str  # one line, with the numbers that decided it
    evidence: dict = field(default_factory=dict)
    effect: dict | None = None  # what flipping its toggle on this step does to the update (`counterfactual`)
    symptom_of: tuple[str, ...] = ()  # the causes whose fix clears it (`chain.differential`): no fix of its own
    clears: tuple[str, ...] = ()  # a cause: the loud findings its fix cleared in the differential
    fixed_with: tuple[tuple[str, object], ...] = ()  # a cause: the config changes the differential fixed it with
    learning: dict | None = None  # its fix followed for a few steps against the run (`horizon.compare`)


@dataclass(frozen=True)
class StepFacts:
    """What the detectors read, measured once on the step."""

    run: StepRun  # up to the update, under the step's own config
    reward_weights: tuple[float, ...]
    absolute_positions: bool
    left_padded: bool
    dropout_sources: tuple[str, ...]
    dropout_gap: float | None  # max |logp - logp'| over two train-mode scorings of the same tokens; None: not run
    sampler_metrics: dict[str, float] | None  # verl's sampler-vs-trainer metrics; None: no sampler log-probs
    kept_mass: torch.Tensor | None  # (N, C) mass top_p/top_k/min_p kept at each scored token; None: no truncation
    kl_against_exact: dict[str, float] | None  # the KL estimator against the exact KL (`exact_kl`); None: beta 0
    weight_norm: float  # ||theta|| before the step, over the trained parameters (a tied embedding counted once)
    uses_vllm: bool = False  # the run sampled with vLLM (a capture's use_vllm): vLLM's settings apply to it
    step_kl: float | None = None  # KL(before || after) per scored token that the update made (`moved_kl`)
    logged_kl: float | None = None  # the kl TRL logged at the captured step (k3 to the reference), if any
    kl_history: tuple[tuple[int, float], ...] = ()  # (step, kl) TRL logged up to the captured step, oldest first
    reward_probes: dict | None = None  # {function: probes.RewardProbe}; None: the functions are not at hand
    logged_history: tuple[dict, ...] = ()  # what TRL logged at each step up to the captured one, oldest first
    logged_rewards: dict[str, tuple] | None = None  # the trainer's rewards of these very completions, per function
    # (None: a reward the function did not give), where the step recomputed them with the user's functions
    parameters: dict | None = None  # the trainable tensors and what the update moved (`facts.parameters_moved`)


def _finding(id: str, severity: str, summary: str, **evidence) -> Finding:
    return Finding(id, severity, summary, evidence)


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return (x * mask).sum().item() / max(mask.sum().item(), 1.0)


def _groups(values: torch.Tensor, G: int) -> torch.Tensor:
    return values.view(-1, G)
