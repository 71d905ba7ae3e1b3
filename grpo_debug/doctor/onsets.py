"""Time as evidence: when each finding began, from what TRL logged at every step before the captured one. A finding
that began after another did, and that no fix of its own clears, is ranked as that one's consequence (every
completion cut from the step after the KL jumped is the broken policy's, not max_completion_length's).

    onsets = onsets_of(history, config)      # {finding id: the first logged step past its threshold}
    findings = after_onsets(findings, chained, onsets)

`history`: [{"step": k, "kl": ..., "completions/clipped_ratio": ..., ...}] oldest first (`capture.logged_history`).
"""

from __future__ import annotations

import dataclasses

from ..detectors.detectors import (
    CLIPPED_WARNING,
    KL_BLOWUP_WARNING,
    NO_SIGNAL_WARNING,
    TRUNCATED_PROBLEM,
    TRUNCATED_WARNING,
)
from ..detectors.findings import Finding
from .chain import loud
from .construction import by_construction, kl_of_the_same_rate

REWARD_STD_GONE = 1e-6  # the batch's rewards all equal: no function varies any more

# finding id -> (what TRL logs, the level at which the finding begins): the detectors' own warning levels
SIGNALS = {
    "kl_blowup": ("kl", KL_BLOWUP_WARNING),
    "update_size": ("kl", KL_BLOWUP_WARNING),  # large updates show as the KL they leave behind
    "truncation": ("completions/clipped_ratio", TRUNCATED_WARNING),
    "zero_std_groups": ("frac_reward_zero_std", NO_SIGNAL_WARNING),
    "constant_reward": ("reward_std", -REWARD_STD_GONE),  # negative: the finding begins where the value falls to it
}
# a finding at problem begins where its value reached the problem's level: every group without signal from the step
# the KL jumped, though a draw had half of them at the first step
PROBLEM_LEVELS = {"zero_std_groups": 1.0, "truncation": TRUNCATED_PROBLEM}


def flat_from(history: list[dict], named: list[str]) -> int | None:
    """The first logged step from which every function in `named` logged a batch std of 0 (TRL's
    rewards/<name>/std), one of them having varied at an earlier logged step; None where TRL logged them at no step
    or they never varied."""
    keys = [f"rewards/{n}/std" for n in named]
    logged = [(h["step"], max(h[k] for k in keys)) for h in history if keys and all(k in h for k in keys)]
    crossed = next((k for k, (_, v) in enumerate(logged) if v <= REWARD_STD_GONE), None)
    return logged[crossed][0] if crossed else None


def onsets_of(
    history: list[dict], max_grad_norm: float | None, severities: dict[str, str] | None = None, flat: tuple = ()
) -> dict:
    """{finding id: the first logged step whose value reached the finding's level}, for the findings that began after
    the first logged step (one past its level from the start has no before to compare with). `severities` (finding id
    -> severity): a problem's level is PROBLEM_LEVELS' where it has one, else every level is the warning's. `flat`:
    the functions constant_reward names: it began where they went flat (`flat_from`), if TRL logged their spread.
    TRL logs step 1's KL before any update, the policy still the reference: what it logs there is scoring noise (the
    policy's dropout; stranger tuning seed 518: 0.34 at step 1, 5.3 at step 2), so the KL is counted from it."""
    signals = dict(SIGNALS)
    if max_grad_norm:
        signals["grad_clipped"] = ("grad_norm", CLIPPED_WARNING * max_grad_norm)
    for id, level in PROBLEM_LEVELS.items():
        if (severities or {}).get(id) == "problem":
            signals[id] = (signals[id][0], level)
    found = {}
    for id, (name, level) in signals.items():
        logged = [(h["step"], h[name]) for h in history if name in h]
        if name == "kl" and logged and logged[0][0] == 1:
            logged = [(k, v - logged[0][1]) for k, v in logged]  # moved since the reference: step 1's is noise
        crossed = next((k for k, (_, v) in enumerate(logged) if (v >= level if level >= 0 else v <= -level)), None)
        if crossed:  # past 0: there was a logged step below the level before it
            found[id] = logged[crossed][0]
    if "constant_reward" in found:  # the batch's rewards all equal, so every group's: TRL's isclose (atol 1e-8) can
        # log frac_reward_zero_std 0 on float noise (stranger tuning seed 518: reward_std 1.5e-8)
        found["zero_std_groups"] = min(found.get("zero_std_groups", found["constant_reward"]), found["constant_reward"])
    went_flat = flat_from(history, list(flat))
    if went_flat is not None:
        found["constant_reward"] = min(found.get("constant_reward", went_flat), went_flat)
    return found


# the KL logged at step k measures the updates up to step k - 1, and what step k samples comes from the same policy:
# a finding that begins at the step the KL jumped began after the updates that made the jump
UPSTREAM = ("update_size", "kl_blowup")


def after_onsets(findings: list[Finding], chained: list[str], onsets: dict[str, int]) -> list[Finding]:
    """Each loud finding that is no cause whose fix cleared others in the chain, nor a symptom already, and that
    began after another loud finding (or at the step the KL jumped: UPSTREAM), marked a symptom of the earliest such
    one, with when each began; the symptoms by construction first, and kl_blowup update_size's last (`construction`)."""
    findings = by_construction(findings)
    loud_at = {f.id: onsets[f.id] for f in findings if loud(f) and f.id in onsets}
    if len(loud_at) < 2:
        return kl_of_the_same_rate(findings)
    first = min(loud_at, key=lambda i: (loud_at[i], i not in UPSTREAM, i not in chained))
    out = []
    for f in findings:
        began = loud_at.get(f.id)
        later = began is not None and (began > loud_at[first] or (began == loud_at[first] and first in UPSTREAM))
        # a cause whose fix cleared others in the chain keeps its place
        later = later and f.id not in UPSTREAM and not f.clears and not f.symptom_of
        if later:
            when = {"began_at_step": loud_at[f.id], "after": first, "which_began_at_step": loud_at[first]}
            f = dataclasses.replace(
                f,
                symptom_of=(first,),
                summary=f"{f.summary}; it began at step {loud_at[f.id]}, after {first} at step {loud_at[first]}",
                evidence={**f.evidence, "onset": when},
            )
        out.append(f)
    return kl_of_the_same_rate(out)
