"""The differential diagnosis: which loud findings are causes, and which are symptoms of them.

A loud finding (problem or warning) whose pitfall has a switch on the step is a candidate cause. Each round,
every candidate's fix is applied on the step (the same completions and weights, the earlier rounds' fixes kept)
and every detector runs again; the candidate whose fix quiets the most other loud findings is kept, the most
severe first where that ties; a candidate whose fix samples anew (a rollout field: a longer max_completion_length,
top_p 1.0) and leaves it as severe is no cause that fix removes (what it left is kept in its evidence,
`its_fix_leaves`). What its fix quieted is marked its symptom: no fix of its own. A finding that goes quiet only
once several causes are fixed is a symptom of all of them, unless the last one alone quiets it.
The rounds stop when no loud candidate is left, or after `ROUNDS`.

    findings, causes = differential(findings, toggles, detect_under)
    ranked = order(findings, causes, moves)

`detect_under(changes)`: every detector on the step with `changes` (config field -> value) applied, {id: Finding};
None where the step cannot take them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..config import PHASES, changes_sampling
from ..detectors.findings import LOUD, SEVERITIES, Finding

ROUNDS = 4

# the phase of the step each finding arises in (`config.PHASES`): what rollout samples, the rewards score, the
# advantages divide, the loss weighs and the update takes
ACTS_IN = {
    **dict.fromkeys(("truncation", "identical_groups", "sampler_truncation"), "rollout"),
    **dict.fromkeys(
        ("eos_masked", "temperature", "dropout", "position_ids", "sampler_mismatch", "precision", "entropy_collapse"),
        "logprobs",
    ),  # fmt: skip
    **dict.fromkeys(("bad_reward", "constant_reward", "dominant_reward", "length_reward"), "rewards"),
    **dict.fromkeys(("zero_std_groups", "advantage_scale", "large_advantages"), "advantages"),
    **dict.fromkeys(
        ("kl_off", "kl_estimator", "clip_inactive", "clip_saturated", "sequence_ratio_sum", "loss_normaliser"), "loss"
    ),  # fmt: skip
    **dict.fromkeys(("update_size", "grad_clipped", "kl_blowup"), "update"),
}

Detect = Callable[[dict], dict[str, Finding] | None]

# what a sampling fix changes by itself (the groups' signal): never read as a cause the fix revealed
SIGNAL_OF_THE_FIX = ("zero_std_groups", "identical_groups")


def loud(f: Finding) -> bool:
    return f.severity in LOUD


def quieted(before: dict[str, Finding], after: dict[str, Finding]) -> list[str]:
    """The findings loud in `before` and not in `after`."""
    return [i for i, f in before.items() if loud(f) and i in after and not loud(after[i])]


# (a fix, a finding it only dilutes): groups of 2G are less often one text than groups of G, yet the sampler is as
# narrow; which of the two is the cause is what each fix recovers (`narrowed.a_cause_of_its_own`; seed 510: 2G had
# "cleared" identical_groups at temperature 0.24, the sampling fix gives 36% of the groups a gradient, 2G 7%)
DILUTED = {("zero_std_groups", "identical_groups")}
SHARES = ("zero_std_groups", "identical_groups")  # findings that count groups: each cause's fix takes its own part


def cleared(fix: str, before: dict[str, Finding], after: dict[str, Finding], taken) -> list[str]:
    """The findings `fix` quieted that no earlier fix took (`taken`), itself and what it only dilutes aside."""
    return [j for j in quieted(before, after) if j != fix and j not in taken and (fix, j) not in DILUTED]


def differential(
    findings: list[Finding], toggles: dict[str, dict], detect_under: Detect, rounds: int = ROUNDS
) -> tuple[list[Finding], list[str]]:
    """`findings` (one per detector) with `clears` set on each cause the chain fixed and `symptom_of` on what
    those fixes quieted, and the causes in the order they were fixed. `toggles`: the finding ids that can be
    fixed on this step, each with the config changes its fix makes."""
    current = {f.id: f for f in findings}
    position = {f.id: k for k, f in enumerate(findings)}
    changes: dict = {}
    causes: list[str] = []
    clears: dict[str, tuple[str, ...]] = {}
    symptom_of: dict[str, tuple[str, ...]] = {}
    failed: dict[str, str] = {}
    revealed: dict[str, tuple[str, Finding]] = {}
    lowered: dict[str, tuple[str, Finding]] = {}
    for _ in range(rounds):
        candidates = [
            i for i in toggles if i not in causes and i not in symptom_of and i not in failed and loud(current[i])
        ]
        if not candidates:
            break
        after = {i: detect_under({**changes, **toggles[i]}) for i in candidates}
        candidates = [i for i in candidates if after[i] is not None]  # a fix the step refused
        for i in [
            i for i in candidates if changes_sampling(toggles[i]) and after[i][i].severity == current[i].severity
        ]:
            failed[i] = after[i][i].summary  # sampled anew, it is as severe: not what this fix removes
        candidates = [i for i in candidates if i not in failed]
        if not candidates:
            break
        others = {i: cleared(i, current, after[i], symptom_of) for i in candidates}
        cause = min(candidates, key=lambda i: (-len(others[i]), SEVERITIES.index(current[i].severity), position[i]))
        alone = detect_under(toggles[cause]) if changes else after[cause]
        for j in others[cause]:
            symptom_of[j] = (cause,) if alone is not None and not loud(alone[j]) else (*causes, cause)
        clears[cause] = tuple(others[cause])
        for j, g in after[cause].items():  # a share of the groups, loud still, less severe: the rest is its own
            if j in SHARES and j != cause and j not in symptom_of and j not in lowered and loud(g) and loud(current[j]):
                if SEVERITIES.index(g.severity) > SEVERITIES.index(current[j].severity):
                    lowered[j] = (cause, g)
        for j, g in after[cause].items():  # loud only with the fix (`diagnose._revealed`): behind the cause
            if g.evidence.get("revealed") and j not in revealed and j in current and not loud(current[j]):
                revealed[j] = (cause, g)
        causes.append(cause)
        changes.update(toggles[cause])
        current = after[cause]
    marked = [
        dataclasses.replace(
            f,
            clears=clears.get(f.id, ()),
            symptom_of=symptom_of.get(f.id, ()),
            fixed_with=tuple(toggles[f.id].items()) if f.id in causes else (),
            evidence={**f.evidence, "its_fix_leaves": failed[f.id]} if f.id in failed else f.evidence,
        )
        for f in findings
    ]
    marked = [lessened(f, *lowered[f.id]) if f.id in lowered and not f.symptom_of else f for f in marked]
    return [behind(f, *revealed[f.id]) if f.id in revealed and not loud(f) else f for f in marked], causes


def lessened(f: Finding, cause: str, left: Finding) -> Finding:
    """`f`, a share of the step's groups (SHARES), at the severity `cause`'s fix leaves it: the groups that fix gives
    a gradient were that cause's, the rest are f's own (every group without signal while every completion was cut;
    two thirds of them once the answers fit). A size (an update's KL, an advantage) is no sum of parts: not here."""
    said = f"{f.summary}; with {cause}'s fix it is a {left.severity}, the rest its own: {left.summary}"
    return dataclasses.replace(f, severity=left.severity, summary=said, evidence={**f.evidence, "lessened_by": cause})


def behind(f: Finding, cause: str, shown: Finding) -> Finding:
    """`f`, quiet on the step, as `cause`'s fix showed it: a cause hidden behind that one (rewards in the thousands
    whose groups were all one text), ranked after every cause the step itself shows."""
    said = f"{shown.summary}; hidden behind {cause}: only its fix, sampled anew, shows it"
    return dataclasses.replace(f, severity=shown.severity, summary=said, evidence={**shown.evidence, "behind": cause})


def order(
    findings: list[Finding], chained: list[str], moves: Callable[[Finding], float], gain: Callable = lambda f: None
) -> tuple[Finding, ...]:
    """Causes first, loud ones before the rest, a cause only a fix showed (`behind`) or whose severity is what a fix
    left (`lessened`) after every loud one the step itself shows, most severe first, the signal's loss
    (`signal_lost`: what the step learns, measured) first of its severity, a cause only the run's start
    shows (`at_start`: no fix of the step's own was tried on it) after those of its severity the step shows, then by
    what their fix did to learning over a few steps
    (`gain`, where it was followed and measured: larger first), then in the order the chain fixed them (`chained`,
    those whose fix cleared another finding), then by how far their flip moves the update (`moves`), then where in the step they act (`ACTS_IN`: an earlier
    phase can make a later one's finding, never the reverse); each symptom right after the last of its causes, a
    symptom's symptoms after it; nothing is left out."""

    def key(f: Finding):
        g = gain(f)
        return (
            f.severity not in LOUD,
            "behind" in f.evidence or "lessened_by" in f.evidence,  # a severity only a fix measured
            SEVERITIES.index(f.severity),
            f.id != "signal_lost",  # the stage where the step's learning signal is lost leads its severity
            "at_start" in f.evidence,
            (0, -g) if g is not None else (1, 0.0),
            chained.index(f.id) if f.id in chained and f.clears else len(chained),  # a fix that cleared nothing
            -moves(f),  # was chosen by the detectors' order alone: its place in the chain says nothing
            PHASES.index(ACTS_IN.get(f.id, "evaluation")),
        )

    out: list[Finding] = []

    def place(f: Finding) -> None:  # a symptom's own symptoms after it (seed 510: zero_std_groups behind a symptom)
        out.append(f)
        shown = {g.id for g in out}
        for s in findings:
            if s.id not in shown and f.id in s.symptom_of and set(s.symptom_of) <= shown:
                place(s)
                shown = {g.id for g in out}

    for f in sorted((f for f in findings if not f.symptom_of), key=key):
        place(f)
    placed = {g.id for g in out}
    return tuple(out) + tuple(f for f in findings if f.id not in placed)  # a cycle of symptoms is still reported
