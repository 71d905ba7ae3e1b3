"""Whether a finding that began after the KL jumped was there before it. Time (`onsets`) marks every group without
signal, every completion cut, every reward function flat from the step the KL jumped as the jump's consequence;
a defect of the run's own (groups of two on a yes/no reward, a max_completion_length shorter than the answers, a
reward that ignores the completion) was there from the start and only looks the same once the policy broke. The
intervention undoes the updates: the step's prompts are sampled anew from the weights the run began from (TRL's
reference, beta > 0) at the run's own settings, the user's reward functions scoring them, and each such finding
is measured there by its detector's own levels:

    findings = before_the_jump(step, findings)

A finding loud at the start is a cause again, its severity from what the start shows (a function named only if
it is flat there too); one quiet there stays the jump's consequence, and says what the start showed. Where the jump
left no group with signal, the advantages the step cannot show are read from the start's draws (`large_advantages`). A collapse of
the entropy is measured the same way, on the step's own completions (`collapse_at_start`): the start scores them,
and where it was as sure of them, no update made the collapse. Without a start at hand (beta = 0: TRL keeps no
reference, the policy's copy is the captured weights) or without reward functions for new completions (a capture's
stored rewards), the findings stay as time marked them.
"""

from __future__ import annotations

import dataclasses

import torch

from ..advantages import advantages_of, groups_without_signal, summarize_advantages
from ..detectors.detectors import (
    ENTROPY_COLLAPSE,
    LARGE_ADVANTAGE_PROBLEM,
    LARGE_ADVANTAGE_WARNING,
    NO_SIGNAL_WARNING,
    TRUNCATED_PROBLEM,
    TRUNCATED_WARNING,
    _constant_within_groups,
    advantage_severity,
)
from ..detectors.findings import LOUD, Finding, _masked_mean
from ..logprobs import chunked_logps
from ..specs import scoring_of
from ..step import GRPOStep, StepRun
from .onsets import UPSTREAM
from .resampled import NO_SIGNAL_PROBLEM, sampled_anew

START_DRAWS = 4  # batches of the step's prompts sampled at the start: the run's shares, not one draw's
MEASURED_THERE = ("zero_std_groups", "truncation", "constant_reward")


@dataclasses.dataclass(frozen=True)
class AtStart:
    """The step's prompts sampled START_DRAWS times from the run's starting weights, as the run samples."""

    groups_without_signal: float  # share of groups whose rewards are all equal
    cut: float  # share of completions that hit max_completion_length without an EOS
    flat_functions: tuple[str, ...]  # reward functions constant within every group of every draw
    functions: int  # how many reward functions the run has
    groups: int
    max_abs_advantage: float = 0.0  # the largest |advantage| of any draw, scaled as the run scales them


def sample_at_start(step: GRPOStep, draws: int = START_DRAWS) -> AtStart:
    """`AtStart` from the reference's weights (`resampled.sampled_anew`, seeds as its draws): the policy is swapped
    for the reference while sampling and scoring only (no update runs), then put back. The readable sampler: the fast
    one reaches into the model's attention layers (`fast.shared_prompt`), which a LoRA reference (the policy with its
    adapters off, `capture.lora.AdapterDisabled`) does not hold as its own."""
    G = step.cfg.num_generations

    def read(run: StepRun) -> tuple[torch.Tensor, torch.Tensor, set[str], float]:
        without = groups_without_signal(summarize_advantages(run.rewards.total.float().cpu(), G))
        flat = {n for n, v in run.rewards.per_function.items() if _constant_within_groups(v.cpu(), G)}
        advantages = advantages_of(run.config, run.rewards, step.task.weights)  # scaled as the run scales them
        return without, (~run.rollout.finished).float().cpu(), flat, advantages.max_abs_advantage

    drawn = sampled_anew(step, step.cfg.replace(fast=False), draws, read, policy=step.loaded.reference)
    withouts, cuts, flats, largest = zip(*drawn)
    w, flat = torch.cat(withouts).float(), set.intersection(*flats)
    return AtStart(
        groups_without_signal=w.mean().item(),
        cut=torch.cat(cuts).mean().item(),
        flat_functions=tuple(n for n in step.task.reward_names if n in flat),
        functions=len(step.task.reward_names),
        groups=len(w),
        max_abs_advantage=max(largest),
    )


def severity_at_start(id: str, start: AtStart) -> tuple[str, str]:
    """(severity at the start by the detector's own levels, what the start showed), for one of MEASURED_THERE."""
    if id == "zero_std_groups":
        share = start.groups_without_signal
        said = f"{share:.0%} of {start.groups} groups without signal"
        return ("problem" if share >= NO_SIGNAL_PROBLEM else "warning" if share >= NO_SIGNAL_WARNING else "info"), said
    if id == "truncation":
        said = f"{start.cut:.0%} of completions cut"
        return ("problem" if start.cut >= TRUNCATED_PROBLEM else "warning" if start.cut >= TRUNCATED_WARNING
                else "info"), said  # fmt: skip
    flat = start.flat_functions
    said = f"{', '.join(flat)} flat within every group" if flat else "every reward function varied within some group"
    return ("problem" if flat and len(flat) == start.functions else "warning" if flat else "info"), said


def marked_by_the_jump(f: Finding) -> bool:
    """A finding time marked as the consequence of a jump in the KL (`onsets.after_onsets`)."""
    onset = f.evidence.get("onset") if f.evidence else None
    return bool(onset) and f.id in MEASURED_THERE and set(f.symptom_of) <= set(UPSTREAM) and onset["after"] in UPSTREAM


def before_the_jump(step: GRPOStep, findings: list[Finding]) -> list[Finding]:
    """Each finding time marked as the KL jump's consequence, measured at the run's start (`sample_at_start`, once
    for all of them): loud there, a cause again; quiet there, the jump's consequence, as marked."""
    marked = [f for f in findings if marked_by_the_jump(f)]
    if not marked or step.at_reference or step.loaded.reference is None or step.stored_rewards:
        return findings
    start = sample_at_start(step)
    measured = {f.id for f in marked}
    out = []
    for f in findings:
        if f.id not in measured:
            out.append(f)
            continue
        severity, said = severity_at_start(f.id, start)
        evidence = {**f.evidence, "at_start": {**dataclasses.asdict(start), "severity": severity}}
        if severity == "info":
            out.append(dataclasses.replace(f, summary=f"{f.summary}; at the weights the run began from: {said}",
                                           evidence=evidence))  # fmt: skip
            continue
        began = f.evidence["onset"]["after"]
        summary = f"{f.summary}; yet at the weights the run began from (its reference): {said}: there before {began}"
        if f.id == "constant_reward":
            evidence["named"] = list(start.flat_functions)
        out.append(dataclasses.replace(f, severity=severity, summary=summary, symptom_of=(), evidence=evidence))
    if any(f.id == "zero_std_groups" and f.severity == "problem" for f in marked):
        out = [advantages_at_start(f, start) if f.id == "large_advantages" else f for f in out]
    return out


def advantages_at_start(f: Finding, start: AtStart) -> Finding:
    """large_advantages, blind on a step whose every advantage the jump made 0, measured on the start's draws by
    its own levels (stranger tuning seed 598: rewards x1000 under scale_rewards='none', every reward 0 after
    learning_rate 0.02 broke the policy; max |A| 800 at the start): loud there, a cause of its own."""
    a = start.max_abs_advantage
    severity = advantage_severity(a)
    if f.severity in LOUD or severity == "absent":
        return f
    said = (f"every advantage of this step is 0 (no group with signal since the KL jumped), yet at the weights the "
            f"run began from (its reference), sampled as the run samples: max |A| {a:.3g}, past "
            f"{LARGE_ADVANTAGE_WARNING if severity == 'warning' else LARGE_ADVANTAGE_PROBLEM:g}: the rewards' units "
            f"set the step (scale_rewards={f.evidence.get('scale_rewards')!r})")  # fmt: skip
    evidence = {**f.evidence, "at_start": {**dataclasses.asdict(start), "severity": severity}}
    return dataclasses.replace(f, severity=severity, summary=said, symptom_of=(), evidence=evidence)


def entropies_now_and_at_start(step: GRPOStep, run: StepRun) -> tuple[float, float]:
    """Mean token entropy of the step's own completions under the policy and under the weights the run began from
    (TRL's reference), the same tokens at the run's temperature, dropout off in both: the updates undone, the draw
    kept (the logged history compares other batches)."""
    scoring, mask = scoring_of(run.config).without_dropout(), run.logprobs.mask
    step.restore_policy()
    now = chunked_logps(step.policy, run.rollout, scoring)[1]
    start = chunked_logps(step.loaded.reference, run.rollout, scoring)[1]
    return _masked_mean(now, mask), _masked_mean(start, mask)


def collapse_at_start(step: GRPOStep, run: StepRun, findings: list[Finding]) -> list[Finding]:
    """A loud entropy_collapse measured on its own completions at the run's start: as sure there (below
    ENTROPY_COLLAPSE), the model's own, info; else the updates lowered it, and it says from what."""
    loud = [f for f in findings if f.id == "entropy_collapse" and f.severity in LOUD]
    if not loud or step.at_reference or step.loaded.reference is None:
        return findings
    now, start = entropies_now_and_at_start(step, run)
    out = []
    for f in findings:
        if f.id != "entropy_collapse":
            out.append(f)
            continue
        evidence = {**f.evidence, "same_completions": {"now": now, "at_start": start}}
        if start < ENTROPY_COLLAPSE:
            said = (f"; at the weights the run began from (its reference) the same completions score {start:.3g} "
                    f"nats (now {now:.3g}): as sure before any update, no collapse the run made")  # fmt: skip
            out.append(dataclasses.replace(f, severity="info", summary=f.summary + said, evidence=evidence))
        else:
            said = f"; the same completions at the weights the run began from: {start:.3g} nats, now {now:.3g}"
            out.append(dataclasses.replace(f, summary=f.summary + said, evidence=evidence))
    return out
