"""The doctor's figures, one function per figure, each from the report alone (its `exhibits`: the step's own
numbers, and each finding's flip and horizon): the page (`ui.doctor_page`), `doctor --png DIR` and notebook
10_doctor draw them with these functions. Each returns the Figure, closed in pyplot, its axes labelled
(`plots._done`).

    figures = figures_of(report)            # {"1-position_ids-evidence": Figure, "1-position_ids-horizon": ...}
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import MaxNLocator

from ..choices import grpo_config_changes
from ..detectors.findings import LOUD, Finding
from ..doctor.report import applied_fix
from ..show.text import visible
from ..stats import seed_interval
from .plots import _done

AS_RUN, FIXED = "#777777", "#1565c0"
SIZE = (7.2, 2.6)


def plain(text) -> str:
    """A run's own text (a reward function's name) as matplotlib should draw it: control characters shown as their
    escapes, and `$` drawn as a dollar, never read as mathtext."""
    return visible(str(text)).replace("$", r"\$")


def _values(rows) -> np.ndarray:
    return np.array([[np.nan if v is None else v for v in row] for row in rows], dtype=float)


def token_gap(exhibits: dict, title: str | None = None):
    """The scoring's per-token gap |log pi_sampler - log pi_trainer| by completion position: median, 90th
    percentile and largest over the completions (a scoring pitfall shows as a gap far above float rounding)."""
    gap = exhibits["token_gap"]
    fig, ax = plt.subplots(figsize=SIZE)
    if gap["position"]:
        x = np.array(gap["position"])
        floor = 1e-8  # a log axis: an exact 0 drawn at its floor
        ax.fill_between(x, np.maximum(gap["median"], floor), np.maximum(gap["p90"], floor), color=FIXED, alpha=0.2,
                        label="median to 90th percentile")  # fmt: skip
        ax.plot(x, np.maximum(gap["median"], floor), color=FIXED, lw=1.2, label="median")
        ax.plot(x, np.maximum(gap["max"], floor), color="#c62828", lw=0.8, label="largest")
        ax.axhline(1e-4, color="k", ls="--", lw=0.7, label="1e-4: float rounding")
        ax.set_yscale("log")
        worst = max(gap["max"])
        title = title or f"sampler vs trainer log-prob per token: largest gap {worst:.3g} nats"
    ax.set(xlabel="completion token position", ylabel="|log-prob gap| (nats)", title=title or "no scored token")
    return _done(fig, legend_from=ax if gap["position"] else None)


def group_rewards(exhibits: dict, title: str | None = None):
    """Each group's rewards (dots, its mean a bar) and each completion's advantage: a group whose rewards are all
    equal has advantage 0 (no signal); a tiny spread scaled to unit advantages is a phantom."""
    rewards, advantages = _values(exhibits["rewards"]), _values(exhibits["advantages"])
    fig, (left, right) = plt.subplots(1, 2, figsize=SIZE)
    for b, (row, adv) in enumerate(zip(rewards, advantages)):
        flat = np.nanstd(row) == 0 if np.isfinite(row).any() else True
        left.scatter(np.full(len(row), b), row, s=14, alpha=0.7, color=AS_RUN if flat else FIXED)
        right.scatter(np.full(len(adv), b), adv, s=14, alpha=0.7, color=AS_RUN if flat else FIXED)
    same = sum(bool(np.isfinite(r).any() and np.nanstd(r) == 0) for r in rewards)
    left.set(xlabel="group (prompt)", ylabel="reward", title="rewards (grey: all equal)")
    right.set(xlabel="group (prompt)", ylabel="advantage", title="advantages")
    right.axhline(0, color="k", lw=0.5)
    fig.suptitle(title or f"{same} of {len(rewards)} groups give every completion the same reward", fontsize=10)
    return _done(fig)


def lengths_against_cap(exhibits: dict, title: str | None = None):
    """Each completion's length against the cap (max_completion_length): those that reach it without an EOS are
    truncated."""
    lengths, cap = np.array(exhibits["lengths"]), exhibits["max_completion_length"]
    cut = ~np.array(exhibits["finished"], dtype=bool)
    fig, ax = plt.subplots(figsize=SIZE)
    bins = np.linspace(0, max(cap, int(lengths.max(initial=1))) + 1, 30)
    ax.hist([lengths[~cut], lengths[cut]], bins=bins, stacked=True, color=[FIXED, "#c62828"],
            label=["ended with EOS", "cut at the cap (no EOS)"])  # fmt: skip
    ax.axvline(cap, color="k", ls="--", lw=0.8, label=f"max_completion_length = {cap}")
    title = title or f"{cut.sum()} of {len(lengths)} completions cut at the cap"
    ax.set(xlabel="completion length (tokens)", ylabel="completions", title=title)
    return _done(fig, legend_from=ax)


def reward_against_length(exhibits: dict, probes: dict | None = None, title: str | None = None):
    """Each completion's reward against its length, per reward function; `probes` (the length_reward finding's
    `probed`): what each function paid when the same text was padded, as measured by calling it."""
    lengths = np.array(exhibits["lengths"])
    functions = exhibits["reward_functions"] or {"reward": [v for row in exhibits["rewards"] for v in row]}
    fig, ax = plt.subplots(figsize=SIZE)
    for name, values in functions.items():
        said = plain(name)
        if probes and isinstance(probes.get(name), dict) and "rise_padded" in probes[name]:
            said += f" (padded: {probes[name]['rise_padded']:+.3g})"
        ax.scatter(lengths, [np.nan if v is None else v for v in values], s=12, alpha=0.6, label=said)
    ax.set(xlabel="completion length (tokens)", ylabel="reward", title=title or "reward against length")
    return _done(fig, legend_from=ax)


HISTORY = ("kl", "grad_norm", "learning_rate", "reward", "completions/clipped_ratio")


def logged_history(exhibits: dict, title: str | None = None):
    """What TRL logged at each step up to the captured one (its own names), one panel per quantity logged."""
    history = exhibits["logged_history"]
    names = [n for n in HISTORY if any(n in h for h in history)][:3]
    fig, axes = plt.subplots(1, len(names), figsize=SIZE, squeeze=False)
    for ax, name in zip(axes[0], names):
        points = [(h["step"], h[name]) for h in history if name in h and h[name] is not None]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", ms=3, color=FIXED)
        ax.set(xlabel="step", ylabel=name)
    fig.suptitle(title or f"what TRL logged over {len(history)} steps before the capture", fontsize=10)
    return _done(fig)


def _band(ax, series: list[list[float]], colour: str, label: str, level: float) -> None:
    """Each seed a thin line, their mean a thick one inside its interval over seeds at `level`."""
    values = np.array(series, dtype=float)
    x = np.arange(1, values.shape[1] + 1)
    for row in values:
        ax.plot(x, row, color=colour, lw=0.6, alpha=0.5)
    intervals = [seed_interval(values[:, k], level) for k in range(values.shape[1])]
    low = [np.nan if i.ci_low is None else i.ci_low for i in intervals]
    high = [np.nan if i.ci_high is None else i.ci_high for i in intervals]
    ax.fill_between(x, low, high, color=colour, alpha=0.15)
    ax.plot(x, values.mean(0), color=colour, lw=2, label=label)


def horizon_arms(learning: dict, fix: str, level: float = 0.95, title: str | None = None):
    """The fixed arm against the run continued alike over the horizon's K steps: each step's batch reward and the
    KL to the start, each seed a thin line, the mean with its interval over seeds (Student's t, at `level`)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=SIZE)
    for key, colour, label in (("as_run", AS_RUN, "the run continued"), ("fixed", FIXED, f"with {plain(fix)}")):
        _band(left, learning["rewards_by_seed"][key], colour, label, level)
        if learning.get("kl_by_seed"):
            _band(right, learning["kl_by_seed"][key], colour, label, level)
    left.set(xlabel="step of the horizon", ylabel="batch reward")
    right.set(xlabel="step of the horizon", ylabel="KL to the start (nats/token)")
    for ax in (left, right):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps 1..K, not 1.2 or 1.4
    d = learning["difference"]
    said = f"{d['mean']:+.3g} [{d['ci_low']:+.3g}, {d['ci_high']:+.3g}]" if d["ci_low"] is not None else "no interval"
    measured = learning.get("measured", "batch reward of steps 2..K")
    fig.suptitle(title or f"{len(learning['seeds'])} seeds, {measured}: fix - run {said}", fontsize=10)
    return _done(fig, legend_from=left)


# which figure shows a finding's evidence, by finding id; any other finding: the group rewards and advantages
SCORING = ("position_ids", "dropout", "temperature", "sampler_mismatch", "precision", "sampler_truncation",
           "sequence_ratio_sum", "kl_estimator")  # fmt: skip
LENGTHS = ("truncation", "loss_normaliser", "eos_masked")
HISTORIED = ("kl_blowup", "update_size", "grad_clipped", "kl_off", "entropy_collapse")


def evidence_figure(f: Finding, exhibits: dict):
    """The figure of a finding's evidence: the per-token gap for a scoring pitfall, completion lengths against
    the cap for truncation, reward against length for a length-paying reward, the logged history for the KL or the
    learning rate (where TRL logged steps before the capture), else the group rewards and advantages."""
    if f.id in SCORING and exhibits["token_gap"]["position"]:
        return token_gap(exhibits)
    if f.id in LENGTHS and exhibits["lengths"]:
        return lengths_against_cap(exhibits)
    if f.id == "length_reward":
        return reward_against_length(exhibits, f.evidence.get("probed"))
    if f.id in HISTORIED and len(exhibits["logged_history"]) > 1:
        return logged_history(exhibits)
    return group_rewards(exhibits)


def carded(report) -> list[Finding]:
    """The findings that get a card, with their figures: the causes at warning or above; where there is none, the
    findings at info that are no symptom."""
    causes = report.causes("warning")
    return causes or [f for f in report.present("info") if not f.symptom_of and f.severity not in LOUD]


def fix_words(f: Finding) -> str:
    """The fix the doctor applied (the one its horizon followed), as config changes: in GRPOConfig's names where it
    is a GRPOConfig setting (`max_completion_length=32`), else the engine's (`position_ids=True`)."""
    changes = dict(applied_fix(f))
    return ", ".join(f"{k}={v}" for k, v in (grpo_config_changes(changes) or changes).items()) or "the fix"


def figures_of(report) -> dict:
    """{name: Figure} of every card's evidence and horizon, named `<rank>-<finding>-evidence|horizon`."""
    out = {}
    level = (report.horizon or {}).get("level", 0.95)
    for k, f in enumerate(carded(report), start=1):
        if report.exhibits is not None:
            out[f"{k}-{f.id}-evidence"] = evidence_figure(f, report.exhibits)
        if f.learning:
            out[f"{k}-{f.id}-horizon"] = horizon_arms(f.learning, fix_words(f), level)
    return out
