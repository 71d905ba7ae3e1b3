"""Interventions on the user's reward functions: each function called again on the step's own completions with one
thing about them changed, to see what it pays for. A correlation cannot tell a reward that pays for length from one
that pays for correct answers that happen to be longer; changing the length alone, content kept, can.

    probes = probe_rewards(task, prompts, completions, G)
    probes["closeness"].paid_for_length   # False: appending whitespace or repeating the last word did not raise it
    probes["always_one"].ignores_completion   # True: one value per prompt whatever the completion
    probes["parsed_or_none"].none_moved       # 0.5: half the rows turned None or back with one space appended

`prompts`: (N,) each completion's prompt; `completions`: (N,) texts, G consecutive ones per prompt. A function that
raises or returns a non-number on a changed completion counts as not moved by that change (the step's own rewards
were scored already: a probe never stops the diagnosis).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..rewards import call_reward
from ..task import Task

PAD = " " * 8  # eight spaces appended: the completion longer, its content the same
SPACE = " "  # one space appended: the same content, its length's parity changed
PAID_SHARE = 0.5  # a change that raises the reward of more than half the completions it scores...
PAID_SPREAD = 0.1  # ...by at least a tenth of the function's within-group spread on average pays for length


@dataclass(frozen=True)
class RewardProbe:
    """What one reward function did when the completions changed in one respect."""

    name: str
    rise_padded: float  # mean reward change with whitespace appended (content kept, characters added)
    raised_padded: float  # share of scored completions whose reward rose with it
    rise_repeated: float  # the same with the last word repeated (words added)
    raised_repeated: float
    spread: float  # the function's mean within-group std on the step's own completions (its signal's scale)
    varies_across_completions: bool | None  # some prompt got two values from different completions (own, another
    # group's, or its own changed); None: one value for every completion and change tried, so it cannot tell a
    # function that ignores the completion from one that nothing in this batch earns
    none_moved: float = 0.0  # share of the completions whose reward turned None, or from None to a number, with
    # whitespace appended (one space or PAD): content kept, so "does not apply" came from the text's form
    rescored_moved: float = 0.0  # share of the completions whose reward changed when the same batch was scored again
    reordered_moved: float = 0.0  # ...when the batch was scored in reverse order (each row's reward put back)

    @property
    def paid_for_length(self) -> bool:
        scale = max(self.spread, 1e-6)
        return any(
            raised > PAID_SHARE and rise >= PAID_SPREAD * scale
            for rise, raised in ((self.rise_padded, self.raised_padded), (self.rise_repeated, self.raised_repeated))
        )

    @property
    def ignores_completion(self) -> bool:
        return self.varies_across_completions is False

    def as_dict(self) -> dict:
        return {
            "rise_padded": self.rise_padded,
            "raised_padded": self.raised_padded,
            "rise_repeated": self.rise_repeated,
            "raised_repeated": self.raised_repeated,
            "spread": self.spread,
            "paid_for_length": self.paid_for_length,
            "ignores_completion": self.ignores_completion,
            "none_moved": self.none_moved,
            "rescored_moved": self.rescored_moved,
            "reordered_moved": self.reordered_moved,
        }

    @property
    def not_own(self) -> bool:
        """Its scores are not the completions' own: the same completions, scored again or in another order, got
        other scores."""
        return self.rescored_moved > 0 or self.reordered_moved > 0


def padded(text: str) -> str:
    return text + PAD


def repeated(text: str) -> str:
    """The completion with its last word said once more (the whole text where it has no word)."""
    words = text.split()
    return f"{text} {words[-1]}" if words else text + text


def _scored(func, name: str, prompts: list[str], completions: list[str]) -> torch.Tensor:
    """(N,) the function's rewards, NaN where it gives none (or fails on the changed text)."""
    try:
        return call_reward(func, name, prompts, completions)[0]
    except ValueError:  # the user's function failed on a changed completion: no evidence from it
        return torch.full((len(completions),), float("nan"))


def _rise(before: torch.Tensor, after: torch.Tensor) -> tuple[float, float]:
    """(mean change, share that rose) over the completions both score."""
    both = ~(before.isnan() | after.isnan())
    if not bool(both.any()):
        return 0.0, 0.0
    change = (after - before)[both]
    return change.mean().item(), (change > 1e-9).float().mean().item()


def _moved(before: torch.Tensor, after: torch.Tensor) -> bool:
    """Whether a change of the completions changed any reward (a None turning into a number counts)."""
    return bool(((before - after).abs() > 1e-9).any() or (before.isnan() != after.isnan()).any())


def _none_moved(own: torch.Tensor, *changed: torch.Tensor) -> float:
    """Share of the completions whose None-ness differs between `own` and any of the `changed` scorings."""
    moved = torch.zeros_like(own, dtype=torch.bool)
    for c in changed:
        moved |= own.isnan() != c.isnan()
    return moved.float().mean().item()


def _one_value(values: torch.Tensor) -> bool:
    seen = values[~values.isnan()]
    return len(seen) == 0 or (seen.max() - seen.min()).item() <= 1e-9


def _spread(values: torch.Tensor, G: int) -> float:
    groups = values.view(-1, G)
    stds = [g[~g.isnan()].std().item() for g in groups if int((~g.isnan()).sum()) > 1]
    stds = [s for s in stds if math.isfinite(s)]
    return sum(stds) / len(stds) if stds else 0.0


def _varies(own: torch.Tensor, borrowed: torch.Tensor, texts: list[str], G: int) -> bool | None:
    """Whether any prompt got two different values from its own G completions and the G borrowed from the next
    group (`texts`: those 2G per prompt, in that order); None where no prompt saw two different texts."""
    both = torch.cat([own.view(-1, G), borrowed.view(-1, G)], dim=1)
    told = False
    for k, row in enumerate(both):
        scored = ~row.isnan()
        if len({t for t, s in zip(texts[2 * G * k : 2 * G * (k + 1)], scored.tolist()) if s}) < 2:
            continue
        told = True
        seen = row[scored]
        if (seen.max() - seen.min()).item() > 0:
            return True
    return False if told else None


def _changed(a: torch.Tensor, b: torch.Tensor) -> float:
    """Share of the rows whose score differs between two scorings of the same completions (a None against a number
    counts; float rounding of 1e-6 of the scale does not)."""
    scale = 1.0 + torch.cat([a, b]).nan_to_num(0.0).abs().max().item()
    moved = ((a - b).abs() > 1e-6 * scale) | (a.isnan() != b.isnan())
    return moved.float().mean().item() if len(a) else 0.0


def _reordered(func, name: str, prompts: list[str], completions: list[str]) -> torch.Tensor:
    """The function's rewards with the batch given in reverse order, each put back on its own row."""
    back = _scored(func, name, prompts[::-1], completions[::-1])
    return back.flip(0)


def probe_rewards(task: Task, prompts: list[str], completions: list[str], G: int) -> dict[str, RewardProbe]:
    """Every reward function of `task` probed on the step's completions: scored twice as they are and once in reverse
    order (are its scores the completions' own?), with whitespace appended, with the last word repeated, with one
    space appended (does a None come and go with the text's form?), and each prompt paired with the next prompt's
    completions (does it read the completion at all?)."""
    n = len(completions)
    borrowed = [completions[(i + G) % n] for i in range(n)]
    texts = [t for k in range(n // G) for t in completions[k * G : (k + 1) * G] + borrowed[k * G : (k + 1) * G]]
    probes = {}
    for name, func in zip(task.reward_names, task.reward_funcs):
        own = _scored(func, name, prompts, completions)
        padded_scores = _scored(func, name, prompts, [padded(c) for c in completions])
        repeated_scores = _scored(func, name, prompts, [repeated(c) for c in completions])
        spaced = _scored(func, name, prompts, [c + SPACE for c in completions])
        rise_p, raised_p = _rise(own, padded_scores)
        rise_r, raised_r = _rise(own, repeated_scores)
        varies = _varies(own, _scored(func, name, prompts, borrowed), texts, G)
        if _moved(own, padded_scores) or _moved(own, repeated_scores):
            varies = True  # the same completion changed scores otherwise: it reads the completion
        elif varies is False and _one_value(own):
            varies = None  # one value everywhere: ignoring the completion and nothing earning look alike
        none_moved = _none_moved(own, padded_scores, spaced)
        rescored = _changed(own, _scored(func, name, prompts, completions))
        reordered = _changed(own, _reordered(func, name, prompts, completions))
        probes[name] = RewardProbe(
            name, rise_p, raised_p, rise_r, raised_r, _spread(own, G), varies, none_moved, rescored, reordered
        )
    return probes
