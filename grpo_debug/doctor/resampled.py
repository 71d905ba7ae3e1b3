"""Whether a step's groups without signal are the run's or this draw's. One batch of a few prompts is one draw: at
G = 7 and three prompts, two groups of equal rewards are often chance. The share the run meets is measured by
sampling the step's prompts anew from its weights with the user's reward functions, at twice the group size: each
group of 2G splits into two groups of G, independent draws as the run samples, and is one group of the fix (double
num_generations) besides. Severity comes from what the fix measurably gives:

    recovered = share without signal at G - share without signal at 2G       (the same draws, paired)

a warning where doubling G gives a gradient to RECOVERED_WARNING of the groups or more, or where the draw and the run
both meet half their groups without signal or more (NO_SIGNAL_WARNING, the detector's level, on the run's share, not
the draw's alone: a yes/no reward at G = 2 always reaches it); a draw below that level is lifted by what the fix gives
alone (prompts the run always or never solves are the task's, stranger tuning seeds 337, 345: no fix here); a
problem where it meets almost none with signal, or this draw none and the run half or more; else info: the draw's
share was chance.

    findings = signal_tested(step, findings)

Every draw that holds a group without signal is resampled, its severity info or loud: one batch of a few prompts
cannot tell the run's share (three of eight groups comes as often from a run at half; stranger tuning seed 562, G =
2 on a yes/no reward), in at most MAX_COMPLETIONS completions past MIN_DRAWS batches, and no more once two draws or
more decide the severity (`decided`: the same at every corner of the shares' 99% intervals; a step whose groups
nearly all carry a gradient stops there). Without reward functions for
new completions (a capture's stored rewards) nothing can be resampled: the finding stays as the one draw says, and
says so.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import TypeVar

import torch

from ..advantages import groups_without_signal, summarize_advantages
from ..config import StepConfig
from ..detectors.detectors import NO_SIGNAL_WARNING
from ..detectors.findings import LOUD, Finding
from ..stats import wilson_bounds
from ..step import GRPOStep, StepRun

RESAMPLED_GROUPS = 96  # groups of 2G sampled in all: the recovered share to about +-0.05
MIN_DRAWS, MAX_DRAWS = 4, 16
MIN_DECIDING_DRAWS, DECIDING_Z = 2, 2.576  # stop sampling once 2 draws or more decide the severity at 99%
MAX_COMPLETIONS = 1024  # past MIN_DRAWS, no more completions than this: the cost of a few of the step's rollouts
RECOVERED_WARNING = 0.25  # G = 2 on a yes/no reward at pass rate p recovers pq(1 + p^2 + q^2): 0.27 to 0.375 for p
# in 0.2..0.8; G = 4 at p = 0.5 recovers 0.117
NO_SIGNAL_PROBLEM = 0.95  # the run's groups nearly all without a gradient, whatever this draw held
SEED_OFFSET = 7919  # resamples never share the step's own seed
T = TypeVar("T")


def halves_and_whole(rewards: torch.Tensor, G: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B * 2G,) rewards sampled in groups of 2G -> ((B, 2) without signal as two groups of G each, (B,) as one group
    of 2G), as the detector counts a group without signal: the run's group size and the fix's, on the same
    completions."""
    as_run, as_fixed = summarize_advantages(rewards, G), summarize_advantages(rewards, 2 * G)
    return groups_without_signal(as_run).view(-1, 2), groups_without_signal(as_fixed)


def draws_for(groups: int, G: int) -> int:
    """How many batches of `groups` prompts at 2G to sample for RESAMPLED_GROUPS groups, within MAX_COMPLETIONS
    (a step of few prompts draws more): fixed by the batch's shape alone, so the same step gives the same numbers."""
    wanted = math.ceil(RESAMPLED_GROUPS / max(groups, 1))
    affordable = MAX_COMPLETIONS // max(2 * G * groups, 1)
    return max(MIN_DRAWS, min(MAX_DRAWS, wanted, affordable))


class NotAffordable(Exception):
    """The draws after the first would run past the diagnosis's budget (`sampled_anew`'s `holds`)."""


def sampled_anew(
    step: GRPOStep, cfg: StepConfig, draws: int, read: Callable[[StepRun], T], policy=None, holds=None, enough=None
) -> list[T]:
    """The step's prompts sampled `draws` times under `cfg` (seeds SEED_OFFSET + k past the step's), each run up to
    its rewards and kept as `read(run)`; `policy`: sampled from that model instead of the step's (the run's start,
    `at_start`), swapped in for the sampling only; `holds(seconds)`: whether the draws left fit in the time left,
    asked once the first is timed (NotAffordable where they do not: all draws or none, so that the same step gives
    the same numbers); `enough(kept)`: whether the draws kept so far decide what they are for (no more drawn). The
    caller's random state, the step and its policy are left as they were."""
    seed, loaded = step.cfg.seed, step.loaded
    device = next(loaded.policy.parameters()).device  # a LoRA reference is the policy with its adapters off
    step.restore_policy()
    with step.trial(), torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        if policy is not None:
            step.loaded = dataclasses.replace(loaded, policy=policy)
        try:
            out = []
            for k in range(draws):
                t0 = time.perf_counter()
                anew = cfg.replace(seed=seed + SEED_OFFSET + k)
                out.append(read(step.run(anew, until="rewards", base=StepRun(anew), remember=False)))
                if k == 0 and holds is not None and not holds((draws - 1) * (time.perf_counter() - t0)):
                    raise NotAffordable
                if enough is not None and k + 1 >= MIN_DECIDING_DRAWS and enough(out):
                    break
        finally:
            step.loaded = loaded  # before the trial puts the start's weights back into the policy
    return out


def shares(split: list[tuple[torch.Tensor, torch.Tensor]]) -> dict:
    """`halves_and_whole` of each draw -> {"share_at_G", "share_at_2G", "recovered", "draws", "groups"}."""
    h, w = torch.cat([h for h, _ in split]).float(), torch.cat([w for _, w in split]).float()
    at_G, at_2G = h.mean().item(), w.mean().item()
    return {"share_at_G": at_G, "share_at_2G": at_2G, "recovered": at_G - at_2G, "draws": len(split), "groups": len(w)}


def decided(split: list[tuple[torch.Tensor, torch.Tensor]], drawn: str) -> bool:
    """Whether the draws so far decide the severity: `severity_of` gives the same at every corner of the shares'
    intervals (Wilson's, at DECIDING_Z standard errors, over groups: a group's share of halves without signal and its
    recovered share are each in [0, 1]; a group of 2G without signal has none in its halves either)."""
    measured = shares(split)
    n = measured["groups"]
    at_G = wilson_bounds(measured["share_at_G"], n, DECIDING_Z)
    gained = wilson_bounds(max(measured["recovered"], 0.0), n, DECIDING_Z)
    corners = {severity_of({**measured, "share_at_G": a, "recovered": r}, drawn)[0] for a in at_G for r in gained}
    return len(corners) == 1


def resampled_signal(step: GRPOStep, draws: int, holds=None, drawn: str | None = None) -> dict:
    """The step's prompts sampled at 2G from its weights (`sampled_anew`), up to `draws` times, the user's reward
    functions scoring them: {"share_at_G", "share_at_2G", "recovered", "draws", "groups"}; where `drawn` (the one
    draw's severity) is given, no more once the draws decide the severity (`decided`). The caller's random state
    and the step are left as they were."""
    G = step.cfg.num_generations
    enough = None if drawn is None else (lambda split: decided(split, drawn))
    split = sampled_anew(step, step.cfg.replace(num_generations=2 * G), draws,
                         lambda run: halves_and_whole(run.rewards.total.float().cpu(), G), holds=holds,
                         enough=enough)  # fmt: skip
    return shares(split)


def severity_of(measured: dict, drawn: str) -> tuple[str, str]:
    """(severity, what the resample says) from `resampled_signal`'s measurement and the severity the step's own
    draw gave (`drawn`): the run's share decides whether the finding is the run's or the draw's chance."""
    at_G, at_2G, recovered = measured["share_at_G"], measured["share_at_2G"], measured["recovered"]
    said = (f"; resampled {measured['groups']} groups at 2G: {at_G:.0%} of groups of G without signal, "
            f"{at_2G:.0%} at 2G: doubling num_generations gives {recovered:.0%} of the groups a gradient")  # fmt: skip
    if at_G >= NO_SIGNAL_PROBLEM or (drawn == "problem" and at_G >= NO_SIGNAL_WARNING):
        return "problem", said + ": the run meets almost no group with a gradient"
    if recovered >= RECOVERED_WARNING:
        return "warning", said
    as_drawn = drawn in LOUD  # the run's share lifts a draw at the level alone; one below, only the fix's gain
    if at_G >= NO_SIGNAL_WARNING and as_drawn:  # the step learns from half its prompts or fewer
        return "warning", said + " (a cause above where completions are alike; else prompts always or never solved)"
    return "info", said + ": the share of this draw is chance"


def not_resampled(f: Finding, why: str) -> Finding:
    """zero_std_groups as its one draw says, saying why it was not resampled."""
    return dataclasses.replace(
        f, summary=f"{f.summary}; one draw ({why})", evidence={**f.evidence, "not_resampled": why}
    )


def signal_tested(step: GRPOStep, findings: list[Finding], holds=None) -> list[Finding]:
    """zero_std_groups, where its draw holds a group without signal and new completions can be scored, with its
    severity from the resample (a draw with none costs no rollout). `holds(seconds)`: whether that much time is left
    (the diagnosis's budget); where the resample does not fit, the one draw's severity stands and says so."""
    out = []
    for f in findings:
        if f.id != "zero_std_groups" or f.severity == "absent":
            out.append(f)
        elif step.stored_rewards and f.severity not in LOUD:
            out.append(f)
        elif step.stored_rewards:
            out.append(dataclasses.replace(f, summary=f.summary + "; one draw (pass --task to resample the run's)"))
        elif holds is not None and not holds(0.0):
            out.append(not_resampled(f, "the resample was cut for the budget"))
        else:
            try:
                draws = draws_for(f.evidence["of_groups"], step.cfg.num_generations)
                measured = resampled_signal(step, draws, holds, f.severity)
            except NotAffordable:
                out.append(not_resampled(f, "the resample was cut for the budget"))
                continue
            severity, said = severity_of(measured, f.severity)
            evidence = {**f.evidence, "resampled": measured}
            out.append(dataclasses.replace(f, severity=severity, summary=f.summary + said, evidence=evidence))
    return out


def recovered(f: Finding) -> float | None:
    """The share of groups a finding's fix, sampled anew, gives a gradient: zero_std_groups' num_generations doubled
    (`signal_tested`), identical_groups' TRL sampling (`narrowed.narrowing_tested`); None where it was not sampled."""
    drawn = (f.evidence or {}).get("resampled") or {}
    if "recovered" in drawn:
        return drawn["recovered"]
    if "as_run" in drawn and "fixed" in drawn:
        return drawn["as_run"]["without_signal"] - drawn["fixed"]["without_signal"]
    return None
