"""Findings that follow from another by construction, whatever the run: no fix needs trying to know it.

    findings = by_construction(findings)       # before time is read: groups of one text, None rewards
    findings = kl_of_the_same_rate(findings)   # after it: the KL the same learning rate built

G copies of one completion earn one reward from any reward function; a function that scored at most one completion
of every group (None on the rest) has nothing to vary within a group; a group whose only spread is a length-paying
function's is a sliver that function made; the KL from the reference at the step's start was built by the updates
the same learning rate made.
"""

from __future__ import annotations

import dataclasses

from ..detectors.detectors import NO_SIGNAL_WARNING
from ..detectors.findings import Finding
from .chain import loud


def by_construction(findings: list[Finding]) -> list[Finding]:
    return sliver_behind_paid_length(constant_behind_none(identical_behind_zero_std(findings)))


def identical_behind_zero_std(findings: list[Finding]) -> list[Finding]:
    """zero_std_groups a symptom of identical_groups where both are loud and the groups without signal that are not
    groups of one text fall short of its warning level: G copies of one completion earn one reward from any reward
    function, so those groups are equal by construction, and the share left is what zero_std_groups says alone. Not
    where identical_groups's fix, sampled anew, left zero_std_groups loud (`chain.lessened`): groups of one text then
    hid groups that stay without signal when they differ (num_generations 2 on a yes/no reward), and the intervention
    outranks the count (stranger tuning seed 878: every group one text at top_p 0.39; at TRL's sampling defaults 75%
    of the groups still without signal)."""
    by_id = {f.id: f for f in findings}
    zero, same = by_id.get("zero_std_groups"), by_id.get("identical_groups")
    if not (zero and same and loud(zero) and loud(same)) or zero.symptom_of or "groups" not in zero.evidence:
        return findings
    if zero.evidence.get("lessened_by") == same.id:  # the fix's measurement, not the count
        return findings
    left = set(zero.evidence["groups"]) - set(same.evidence["identical_groups"])
    share_left = len(left) / max(zero.evidence["of_groups"], 1)
    if share_left >= NO_SIGNAL_WARNING:
        return findings
    said = (
        f"; of its {len(zero.evidence['groups'])} groups, {len(zero.evidence['groups']) - len(left)} are groups "
        f"of one text (identical_groups), and the {share_left:.0%} left alone would not warn"
    )
    return [
        dataclasses.replace(f, symptom_of=("identical_groups",), summary=f.summary + said) if f.id == zero.id else f
        for f in findings
    ]


def constant_behind_none(findings: list[Finding]) -> list[Finding]:
    """constant_reward a symptom of bad_reward where both are loud and every function it names scored at most one
    completion of each group (None on the others): one value per group is no choice the function made."""
    by_id = {f.id: f for f in findings}
    constant, bad = by_id.get("constant_reward"), by_id.get("bad_reward")
    if not (constant and bad and loud(constant) and loud(bad)) or constant.symptom_of:
        return findings
    named = constant.evidence["named"]  # a loud constant_reward names its functions
    unscored = set(constant.evidence.get("unscored_within_groups", []))
    if not named or not set(named) <= unscored:
        return findings
    said = (f"; {', '.join(named)} scored at most one completion of every group (None on the rest): nothing within "
            "a group to vary, the Nones' doing (bad_reward)")  # fmt: skip
    return [
        dataclasses.replace(f, symptom_of=("bad_reward",), summary=f.summary + said) if f.id == constant.id else f
        for f in findings
    ]


def sliver_behind_paid_length(findings: list[Finding]) -> list[Finding]:
    """advantage_scale a symptom of length_reward where both are loud and every function that varies within the
    groups of a sliver's std is one that pays for length: without it those groups' rewards are equal, and no
    sliver is left to blow up."""
    by_id = {f.id: f for f in findings}
    scale, length = by_id.get("advantage_scale"), by_id.get("length_reward")
    if not (scale and length and loud(scale) and loud(length)) or scale.symptom_of:
        return findings
    slivers, paid = scale.evidence.get("sliver_functions") or [], length.evidence.get("paid") or []
    if not slivers or not set(slivers) <= set(paid):
        return findings
    said = f"; the slivers are {', '.join(slivers)}'s alone, which pays for length (length_reward)"
    return [
        dataclasses.replace(f, symptom_of=("length_reward",), summary=f.summary + said) if f.id == scale.id else f
        for f in findings
    ]


def kl_of_the_same_rate(findings: list[Finding]) -> list[Finding]:
    """kl_blowup a symptom of update_size where both are loud: the KL from the reference at the step's start was
    built by the earlier updates, and this step's update shows the learning rate that made them large."""
    by_id = {f.id: f for f in findings}
    size, kl = by_id.get("update_size"), by_id.get("kl_blowup")
    if not (size and kl and loud(size) and loud(kl)) or kl.symptom_of or size.symptom_of:
        return findings
    return [dataclasses.replace(f, symptom_of=("update_size",)) if f.id == "kl_blowup" else f for f in findings]
