"""The doctor: why a step does not learn, found, ranked and shown on the step itself.

    report = diagnose(step)   # a GRPOStep: the bundled one, or GRPOStep.from_capture(path, task)

1. `examine` runs the step up to its update under its own config and measures what the detectors need beside
   it (two train-mode scorings where dropout is on, the mass top_p/top_k kept, the weights' norm).
2. Every detector (`detectors.DETECTORS`, one pure function per pitfall of `catalogue.PITFALLS`) reads those
   facts and returns a finding.
3. Each present finding whose pitfall has a toggle is flipped on this very step (the cached rollout, as the
   dashboard does; `counterfactual`): what it does to loss, grad_norm, the update's direction and d loss / d logp.
4. Findings are ranked: severity first, then how far their flip moves the update. A flip that does not move
   the update marks its finding cosmetic.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from ..loss_gradients import gradient_of_loss_wrt_logps
from ..model import absolute_positions, dropout_sources
from ..sampler import mismatch_metrics
from ..scoring import per_token_logps
from ..specs import scoring_of
from ..step import GRPOStep, StepRun
from .catalogue import PITFALLS
from .detectors import DETECTORS, bad_reward
from .findings import SEVERITIES, Finding, StepFacts  # noqa: F401 (Finding: the type a report holds)

COSMETIC = 0.01  # a flip whose update keeps a cosine above 1 - this, and grad_norm within this share, is cosmetic


@dataclass(frozen=True)
class Report:
    findings: tuple[Finding, ...]  # ranked: most severe and most moving first
    config: dict
    seconds: float

    def present(self, at_least: str = "info") -> list[Finding]:
        """The findings at `at_least` or more severe."""
        return [f for f in self.findings if SEVERITIES.index(f.severity) <= SEVERITIES.index(at_least)]

    def to_json(self) -> dict:
        return {
            "findings": [_finding_json(f) for f in self.findings],
            "config": self.config,
            "seconds": self.seconds,
        }


def _finding_json(f: Finding) -> dict:
    p = PITFALLS[f.id]
    return {
        **dataclasses.asdict(f),
        "title": p.title,
        "fix": p.fix,
        "origin": p.origin,
        "teach": p.teach,
        "toggle": None if p.toggle is None else {"field": p.toggle[0], "value": p.toggle[1]},
    }


def _trained(step: GRPOStep):
    """(each trained parameter now, its value before the step): `named_parameters` lists a tied weight once."""
    return [(p.detach(), step.initial_state[name]) for name, p in step.policy.named_parameters() if p.requires_grad]


def update_vector(step: GRPOStep) -> torch.Tensor:
    """theta_after - theta_before over every trained parameter, flattened: what the last update did."""
    return torch.cat([(now - before).flatten() for now, before in _trained(step)])


def _dropout_gap(step: GRPOStep, run: StepRun) -> float | None:
    """max |logp - logp'| over two train-mode scorings of the same tokens (None: the step scores in eval mode)."""
    if not run.config.dropout:
        return None
    step.restore_policy()
    scoring = scoring_of(run.config)
    with torch.no_grad():
        first, second = (per_token_logps(step.policy, run.rollout, scoring) for _ in range(2))
    return ((first - second).abs() * run.logprobs.mask).max().item()


def _kept_mass(step: GRPOStep, run: StepRun) -> torch.Tensor | None:
    cfg = run.config
    if cfg.top_p >= 1.0 and cfg.top_k == 0 and not cfg.min_p:
        return None

    def scored_over(support: str) -> torch.Tensor:  # the run's own log-probs where it already scores so
        if cfg.logprob_support == support:
            return run.logprobs.policy
        return step.run(
            cfg.replace(logprob_support=support), until="logprobs", base=run, remember=False
        ).logprobs.policy

    return torch.exp(scored_over("full_vocabulary") - scored_over("sampler_support")) * run.logprobs.mask


def examine(step: GRPOStep) -> tuple[StepFacts, torch.Tensor | None]:
    """The step run up to its update under its own config, the facts the detectors read, and the update it made."""
    cfg = step.cfg.replace(per_sample_grad_norms=False)  # the same update, without the norms' extra work
    try:
        run = step.run(cfg, until="update")
    except ValueError as e:
        if "reward" not in str(e):
            raise
        run = step.run(cfg, until="logprobs")
        return _facts(step, run, reward_error=str(e)), None
    delta = update_vector(step)
    return _facts(step, run), delta


def _facts(step: GRPOStep, run: StepRun, reward_error: str = "") -> StepFacts:
    weight_norm = torch.cat([before.flatten().float() for _, before in _trained(step)]).norm().item()
    capture, r, lp = step.capture, run.rollout, run.logprobs
    sampler_known = capture is None or "sampling_per_token_logps" in capture.batch  # our sampler, or vLLM's
    return StepFacts(
        run=run,
        reward_weights=step.task.weights,
        absolute_positions=absolute_positions(step.policy),
        left_padded=bool((run.rollout.prompt_mask[:, 0] == 0).any()),
        dropout_sources=tuple(dropout_sources(step.policy)),
        dropout_gap=_dropout_gap(step, run),
        sampler_metrics=mismatch_metrics(lp.policy, r.sampler_logps_temperature_only, lp.mask)
        if sampler_known
        else None,
        kept_mass=_kept_mass(step, run),
        weight_norm=weight_norm,
        reward_error=reward_error,
    )


def counterfactual(step: GRPOStep, base: StepRun, base_update: torch.Tensor, field: str, value) -> dict:
    """The step's update with `field` set to `value` against the update as run: loss, grad_norm, the cosine
    between the two updates (theta_after - theta_before), and the share of d loss / d logp that moved
    (sum |g' - g| / sum |g| over every token)."""
    try:
        flipped = step.run(base.config.replace(**{field: value}), until="update", base=base, remember=False)
    except ValueError as e:
        return {"toggle": {field: value}, "error": str(e)}
    moved = update_vector(step)
    cosine = torch.nn.functional.cosine_similarity(moved, base_update, dim=0).item()
    g0 = gradient_of_loss_wrt_logps(base, base.config)
    g1 = gradient_of_loss_wrt_logps(flipped, flipped.config)
    dlogp_moved = (g1 - g0).abs().sum().item() / max(g0.abs().sum().item(), 1e-30) if g0.shape == g1.shape else None
    grad_change = abs(flipped.update.grad_norm - base.update.grad_norm) / max(base.update.grad_norm, 1e-30)
    step.restore_policy()
    return {
        "toggle": {field: value},
        "loss": [base.update.loss, flipped.update.loss],
        "grad_norm": [base.update.grad_norm, flipped.update.grad_norm],
        "update_cosine": cosine,
        "dlogp_moved": dlogp_moved,
        "cosmetic": cosine >= 1 - COSMETIC and grad_change <= COSMETIC,
    }


def _moves(f: Finding) -> float:
    """How far the finding's flip moves the update (1 - cosine); -1 where it was not flipped."""
    return 1 - f.effect["update_cosine"] if f.effect and "update_cosine" in f.effect else -1.0


def rank(findings: list[Finding]) -> tuple[Finding, ...]:
    return tuple(sorted(findings, key=lambda f: (SEVERITIES.index(f.severity), -_moves(f))))


def diagnose(step: GRPOStep, flip: bool = True) -> Report:
    """Every detector on the step, each present finding with a toggle flipped on it (`flip`), ranked."""
    start = time.perf_counter()
    facts, delta = examine(step)
    base = facts.run
    if facts.reward_error:
        findings = [bad_reward(facts)]
    else:
        findings = [detect(facts) for detect in DETECTORS]
    if flip and delta is not None:
        for i, f in enumerate(findings):
            toggle = PITFALLS[f.id].toggle
            if f.severity != "absent" and toggle and getattr(base.config, toggle[0]) != toggle[1]:
                findings[i] = dataclasses.replace(f, effect=counterfactual(step, base, delta, *toggle))
    step.restore_policy()
    return Report(rank(findings), base.config.settings(), time.perf_counter() - start)
