"""The health of one optimizer step from what the trainer already computed: no forward pass, no copy of the
model. `FlightRecorder` calls these every step; each returns a `Signal` under the doctor's finding id, judged
with the doctor's own threshold (imported from `grpo_debug.detectors`, never restated here), so that a
step the recorder flags is one the doctor, opened on its capture, flags too.

Severities are the doctor's, folded to three: `problem` and `warning` as the doctor says; `ok` for its `info`
(worth knowing, by design) and `absent`. A run's page plots `value` against `warning_at` / `problem_at`.

Two signals need a run, which the doctor (one step) has not: a grad_norm spike (`grad_norm_spike`, against its
running median) and a collapse of the mean reward (`reward_collapse`); their thresholds are the recorder's
arguments, with their reasons in `FlightRecorder`'s docstring.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from ..detectors.detectors import (
    CLIP_SATURATED,
    ENTROPY_COLLAPSE,
    KL_BLOWUP_PROBLEM,
    KL_BLOWUP_WARNING,
    LENGTH_ALPHA,
    LENGTH_CORRELATION,
    NO_SIGNAL_WARNING,
    TRUNCATED_PROBLEM,
    TRUNCATED_WARNING,
    UPDATE_WARNING,
    paid_for_length,
)
from ..sampler import HEALTH, mismatch_metrics
from ..stats import within_group_correlation

SEVERITIES = ("ok", "warning", "problem")
# TRL appends these once per generation batch (`_generate_and_score_completions`): a step that a generation
# batch feeds after its first reads them from that batch
GENERATION_METRICS = ("reward", "reward_std", "frac_reward_zero_std", "num_tokens")
GENERATION_PREFIXES = ("rewards/", "completions/", "sampling/", "tools/")


@dataclass(frozen=True)
class Signal:
    id: str  # the doctor's finding id (catalogue.PITFALLS), or grad_norm_spike / reward_collapse
    severity: str  # ok, warning, problem
    value: float | None  # what was compared with the thresholds
    summary: str  # one line, with the number that decided it
    warning_at: float | None = None
    problem_at: float | None = None
    below: bool = False  # the value is bad below the thresholds (entropy), not above

    def as_json(self) -> dict:
        out = asdict(self)
        del out["id"]
        if out["value"] is not None and not math.isfinite(out["value"]):
            out["value"] = None
        return out


def rank(severity: str) -> int:
    return SEVERITIES.index(severity)


def is_generation_metric(name: str) -> bool:
    return name in GENERATION_METRICS or name.startswith(GENERATION_PREFIXES)


# ---- what a generation batch says (once per batch)


def within_group(values: torch.Tensor, G: int) -> torch.Tensor:
    """(N,) each value minus its group's mean; NaN (a function that does not apply) counts as 0, as the doctor
    counts it."""
    v = values.nan_to_num(0.0).view(-1, G)
    return (v - v.mean(1, keepdim=True)).flatten()


def completion_lengths(completion_ids: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """(N,) tokens each completion has: its mask's sum, or the full width for a row TRL masked whole
    (mask_truncated_completions: a row with no EOS ran to max_completion_length)."""
    length = completion_mask.sum(1).float()
    return torch.where(length > 0, length, float(completion_ids.shape[1]))


def generation_signals(rewards: dict[str, list], weights: dict[str, float], tensors: dict, G: int) -> dict:
    """What one generation batch says, in TRL's order of rows: the share of groups whose total reward is
    constant (TRL's isclose, as its frac_reward_zero_std), the reward functions constant within every group, each
    function's within-group correlation with the completion length (the doctor's length_reward), and the sampler
    against the trainer (verl's metrics) where the batch holds the sampler's log-probs."""
    per = {
        name: torch.tensor([math.nan if v is None else float(v) for v in values]) for name, values in rewards.items()
    }
    total = sum(weights[name] * v.nan_to_num(0.0) for name, v in per.items())
    group_std = total.view(-1, G).std(1, unbiased=True) if G > 1 else torch.zeros(len(total) // G)
    lengths = completion_lengths(tensors["completion_ids"], tensors["completion_mask"])
    tests = {name: within_group_correlation(v, lengths, G) for name, v in per.items()}
    out = {
        "groups_without_signal": torch.isclose(group_std, torch.zeros_like(group_std)).float().mean().item(),
        "constant_functions": [name for name, v in per.items() if within_group(v, G).abs().max().item() == 0],
        "functions": list(per),
        "length_correlation": {name: r for name, (r, _) in tests.items()},
        "length_p": {name: p for name, (_, p) in tests.items()},
        "sampler": None,
    }
    if "sampling_per_token_logps" in tensors and "old_per_token_logps" in tensors:
        out["sampler"] = mismatch_metrics(
            tensors["old_per_token_logps"], tensors["sampling_per_token_logps"], tensors["completion_mask"]
        )
    return out


# ---- one signal each, the doctor's threshold and severity


def zero_std_groups(share: float) -> Signal:
    """The doctor's zero_std_groups: every group without a gradient is a problem, half of them a warning."""
    severity = "problem" if share >= 1.0 else "warning" if share >= NO_SIGNAL_WARNING else "ok"
    summary = f"{share:.0%} of groups have equal rewards: no gradient from them"
    return Signal("zero_std_groups", severity, share, summary, NO_SIGNAL_WARNING, 1.0)


def constant_reward(constant: list[str], functions: list[str]) -> Signal:
    """The doctor's constant_reward: some functions constant within every group, a warning; all, a problem."""
    share = len(constant) / max(len(functions), 1)
    severity = "problem" if functions and len(constant) == len(functions) else "warning" if constant else "ok"
    summary = (
        f"{', '.join(constant)} constant within every group: {len(constant)} of {len(functions)} reward "
        "functions add nothing to any advantage"
        if constant
        else "every reward function varies within some group"
    )
    return Signal("constant_reward", severity, share, summary, 1 / max(len(functions), 1), 1.0)


def length_reward(correlations: dict[str, float], p_values: dict[str, float]) -> Signal:
    """The doctor's length_reward (`paid_for_length`): a reward function whose within-group correlation with the
    completion length reaches LENGTH_CORRELATION, its one-sided p-value Holm-adjusted over the functions at most
    LENGTH_ALPHA (a negative one is a length penalty: ok)."""
    if not correlations:
        return Signal("length_reward", "ok", None, "no reward function", LENGTH_CORRELATION)
    paid = paid_for_length({k: (r, p_values[k]) for k, r in correlations.items()})
    name = paid or max(correlations, key=correlations.get)
    r = correlations[name]
    summary = f"{name} against length: within-group r = {r:+.2f}, one-sided p = {p_values[name]:.2g}"
    if paid is None and r >= LENGTH_CORRELATION:
        summary += f": not significant after Holm at {LENGTH_ALPHA}"
    return Signal("length_reward", "warning" if paid else "ok", r, summary, LENGTH_CORRELATION)


def truncation(clipped_ratio: float | None) -> Signal:
    """The doctor's truncation, from TRL's completions/clipped_ratio (completions without an EOS)."""
    if clipped_ratio is None:
        return Signal("truncation", "ok", None, "TRL logged no completions/clipped_ratio", TRUNCATED_WARNING)
    severity = (
        "problem" if clipped_ratio >= TRUNCATED_PROBLEM else "warning" if clipped_ratio >= TRUNCATED_WARNING else "ok"
    )
    summary = f"{clipped_ratio:.0%} of completions hit max_completion_length without an EOS"
    return Signal("truncation", severity, clipped_ratio, summary, TRUNCATED_WARNING)


def entropy_collapse(entropy: float | None, first: float | None = None) -> Signal:
    """The doctor's entropy_collapse, from TRL's entropy (mean per loss token, nats): a fall below the level during
    the run. `first`: the entropy TRL logged at the run's first step (None: this is the first); an entropy as low
    there is the model's own sureness, not a collapse."""
    if entropy is None:
        return Signal("entropy_collapse", "ok", None, "TRL logged no entropy", ENTROPY_COLLAPSE, below=True)
    summary = f"mean token entropy {entropy:.3g} nats"
    fell = entropy < ENTROPY_COLLAPSE and first is not None and first >= ENTROPY_COLLAPSE
    if fell:
        summary += f"; it fell from {first:.3g}"
    elif entropy < ENTROPY_COLLAPSE:
        summary += f"; {'this is' if first is None else f'{first:.3g} at'} the run's first step: no fall"
    return Signal("entropy_collapse", "warning" if fell else "ok", entropy, summary, ENTROPY_COLLAPSE, below=True)


def clip_saturated(region_mean: float | None) -> Signal:
    """The doctor's clip_saturated, from TRL's clip_ratio/region_mean (the step's micro-batches averaged)."""
    if region_mean is None:
        return Signal("clip_saturated", "ok", None, "TRL logged no clip_ratio/region_mean", CLIP_SATURATED)
    severity = "warning" if region_mean >= CLIP_SATURATED else "ok"
    summary = f"{region_mean:.1%} of tokens clipped: their gradient is cut"
    return Signal("clip_saturated", severity, region_mean, summary, CLIP_SATURATED)


def kl_blowup(kl: float | None) -> Signal:
    """The doctor's kl_blowup, from TRL's logged kl (k3 to the reference, mean per token; logged where beta > 0)."""
    if kl is None:
        return Signal("kl_blowup", "ok", None, "TRL logged no kl (beta = 0)", KL_BLOWUP_WARNING, KL_BLOWUP_PROBLEM)
    severity = "problem" if kl >= KL_BLOWUP_PROBLEM else "warning" if kl >= KL_BLOWUP_WARNING else "ok"
    summary = f"kl to the reference {kl:.3g} nats per token"
    return Signal("kl_blowup", severity, kl, summary, KL_BLOWUP_WARNING, KL_BLOWUP_PROBLEM)


def sampler_mismatch(metrics: dict[str, float] | None) -> Signal | None:
    """The doctor's sampler_mismatch (verl's ranges, `sampler.HEALTH`); None where the batch holds no sampler
    log-probs (the trainer sampled with its own model)."""
    if metrics is None:
        return None
    bad = {k.split("/")[-1]: metrics[k] for k, (_, off) in HEALTH.items() if k in metrics and off(metrics[k])}
    summary = (
        "sampler vs trainer outside verl's ranges: " + ", ".join(f"{k} {v:.3g}" for k, v in bad.items())
        if bad
        else "verl's health check passes (token level)"
    )
    return Signal("sampler_mismatch", "warning" if bad else "ok", float(len(bad)), summary, 1.0)


def update_size(relative: float | None) -> Signal:
    """The doctor's update_size: ||delta theta|| / ||theta|| above UPDATE_WARNING. Known only once the optimizer
    stepped, so it is recorded but cannot trigger the capture of its own step."""
    if relative is None:
        return Signal("update_size", "ok", None, "not measured", UPDATE_WARNING)
    severity = "warning" if relative > UPDATE_WARNING else "ok"
    return Signal("update_size", severity, relative, f"the step moved the weights by {relative:.2g} of their norm",
                  UPDATE_WARNING)  # fmt: skip


# ---- signals of the run: the step against the steps before it


def grad_norm_spike(grad_norm: float | None, history: list[float], k: float, min_history: int) -> Signal:
    """grad_norm over the median of the last steps' (not this one's): above k, a spike."""
    if grad_norm is None or len(history) < min_history:
        return Signal("grad_norm_spike", "ok", None, f"fewer than {min_history} steps of history", k)
    typical = median(history)
    ratio = grad_norm / typical if typical > 0 else (math.inf if grad_norm > 0 else 1.0)
    severity = "warning" if ratio > k else "ok"
    summary = f"grad_norm {grad_norm:.3g} is {ratio:.2f}x the median {typical:.3g} of the last {len(history)} steps"
    return Signal("grad_norm_spike", severity, ratio, summary, k)


def reward_collapse(
    reward: float | None, rewards: list[float], stds: list[float], drop: float, min_history: int
) -> Signal:
    """The mean reward below the median of the last generation batches' by more than `drop` of their median
    reward_std (rewards have no fixed scale; their spread across the batch is the run's own unit)."""
    if reward is None or len(rewards) < min_history:
        return Signal("reward_collapse", "ok", None, f"fewer than {min_history} batches of history", drop)
    typical, spread = median(rewards), median(stds)
    fall = (typical - reward) / spread if spread > 0 else (math.inf if reward < typical else 0.0)
    severity = "warning" if fall > drop else "ok"
    summary = f"mean reward {reward:.3g} against the median {typical:.3g}: {fall:.2f} reward_std below it"
    return Signal("reward_collapse", severity, fall, summary, drop)


def median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


# ---- the budget of captures


def badness(reasons: list[dict]) -> tuple[int, int]:
    """How bad a triggered step is, for the budget: its worst severity, then how many signals fired."""
    return (max((rank(r["severity"]) for r in reasons), default=0), len(reasons))


def admit(first: list[int], last: tuple[int, tuple] | None, max_captures: int, bad: tuple) -> str | None:
    """Where a triggered step goes under `max_captures`: the first max_captures - 1 triggered steps are kept as
    they come ("first": a run's first problems explain the rest); the last place holds the worst of the steps
    after them ("last": it replaces the step there only if strictly worse, so an equal later one is dropped);
    None: not captured."""
    if len(first) < max_captures - 1:
        return "first"
    if last is None or bad > last[1]:
        return "last"
    return None
