"""Scoring completions: the per-token log-prob (and entropy) of each completion token under a model, one
forward over prompt + completion. Each pitfall is one field of `Scoring`: the temperature left out, dropout
on while scoring, no position_ids on left-padded rows, bfloat16, and a gather that reads every token from
the first position. `logprobs.compute_logprobs` applies these to a whole rollout, for the policy and the
reference; `fast/scoring.py` is the same forward with less work, tested equal.
"""

from __future__ import annotations

import dataclasses
import inspect
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from transformers.generation.logits_process import MinPLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from .choices import GATHERS, SUPPORTS
from .model import at_precision

if TYPE_CHECKING:
    from .rollout import Rollout


@dataclass(frozen=True)
class Scoring:
    """How completions are scored. `temperature=None` scores at T=1 whatever the sampler used."""

    temperature: float | None
    position_ids: bool = True
    dropout: bool = False
    dtype: str = "float32"
    gather: str = "per_position"
    mask: str = "keep_first_eos"
    mask_truncated_completions: bool = False  # TRL's option: completions with no EOS get no loss
    support: str = "full_vocabulary"  # or "sampler_support": renormalised over what top_k/top_p/min_p keep
    top_k: int = 0  # the sampler's truncation, read when support == "sampler_support"
    top_p: float = 1.0
    min_p: float | None = None

    @property
    def score_after_eos(self) -> bool:
        """Whether the columns after the EOS are scored (only a mask that counts them needs them)."""
        return self.mask == "all_positions"

    def without_dropout(self) -> Scoring:
        return dataclasses.replace(self, dropout=False)


@contextmanager
def _mode(model, train: bool):
    was = model.training
    model.train(train)
    try:
        yield
    finally:
        model.train(was)


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(N, L) position of each token counted over the attended ones, as `generate` numbers a left-padded row."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def model_inputs(rollout: Rollout, position_ids: bool) -> dict[str, torch.Tensor]:
    """(N, P + C) prompt + completion ids and mask; position_ids counted from the mask, as `generate` does."""
    input_ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
    attention_mask = torch.cat([rollout.prompt_mask, torch.ones_like(rollout.completion_ids)], dim=1)
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if position_ids:
        inputs["position_ids"] = positions_from_mask(attention_mask)
    return inputs


def completion_logits(model, rollout: Rollout, scoring: Scoring) -> torch.Tensor:
    """(N, C, V) logits that score the completion: position t predicts token t + 1, so the C completion
    tokens are scored by positions P-1 ... P+C-2."""
    if scoring.dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {scoring.dtype!r}")
    P, C = rollout.prompt_ids.shape[1], rollout.completion_ids.shape[1]
    inputs = model_inputs(rollout, scoring.position_ids)
    with _mode(model, scoring.dropout), at_precision(scoring.dtype, "trainer", inputs["input_ids"].device.type):
        if keeps_logits(model) and not torch.is_grad_enabled():  # the last C + 1 positions: the same numbers
            return model(**inputs, logits_to_keep=C + 1).logits[:, :-1]  # in a fraction of the memory
        # with a gradient, every position's logits: the backward's sums, and so the update's digits, stay as they were
        return model(**inputs).logits[:, P - 1 : P + C - 1]


def keeps_logits(model) -> bool:
    """Whether the model's forward takes `logits_to_keep` (transformers' causal LMs: the LM head on the last
    positions only); a peft model or an adapter-disabled view asks its base model."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "logits_to_keep" in inspect.signature(base.forward).parameters


def truncating_warpers(top_k: int | None, top_p: float | None, min_p: float | None) -> list:
    """transformers' warpers for a sampler's top_k, top_p and min_p, in `generate`'s order; none for a setting that
    is off (0, None, or top_p 1)."""
    warpers = [TopKLogitsWarper(top_k)] if top_k else []
    warpers += [TopPLogitsWarper(top_p)] if top_p is not None and top_p < 1 else []
    return warpers + ([MinPLogitsWarper(min_p)] if min_p else [])


def within_sampler_support(logits: torch.Tensor, scoring: Scoring, chosen: torch.Tensor | None = None) -> torch.Tensor:
    """(N, C, V) tempered logits with every token the sampler's top_k, top_p and min_p drop (transformers' own
    warpers, in `generate`'s order) set to -inf, so that a softmax renormalises over the kept ones; the
    `chosen` (N, C) tokens, which the sampler did keep, stay even where float rounding would drop them."""
    with torch.no_grad():
        kept = logits.detach().reshape(-1, logits.shape[-1])
        for warper in truncating_warpers(scoring.top_k, scoring.top_p, scoring.min_p):
            kept = warper(None, kept)
        dropped = kept.isneginf().view_as(logits)
        if chosen is not None:
            dropped.scatter_(-1, chosen.unsqueeze(-1), False)
    return logits.masked_fill(dropped, float("-inf"))


def _tempered(logits: torch.Tensor, scoring: Scoring, chosen: torch.Tensor | None = None) -> torch.Tensor:
    logits = logits.float()
    if scoring.temperature is not None:
        logits = logits / scoring.temperature
    if scoring.support == "sampler_support":
        logits = within_sampler_support(logits, scoring, chosen)
    elif scoring.support != "full_vocabulary":
        raise ValueError(f"support must be one of {SUPPORTS}, got {scoring.support!r}")
    return logits


def token_logps(logits: torch.Tensor, completion_ids: torch.Tensor, scoring: Scoring) -> torch.Tensor:
    """(N, C) log-prob of each completion token from its (N, C, V) logits: at the scoring temperature, over
    the full vocabulary or over the sampler's support (`scoring.support`)."""
    logps = _tempered(logits, scoring, completion_ids).log_softmax(-1)
    if scoring.gather == "per_position":
        return logps.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    if scoring.gather == "first_position":  # lp.gather(1, tokens.unsqueeze(0)) on one sequence reads row 0 only
        return logps[:, :1, :].expand_as(logps).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    raise ValueError(f"gather must be one of {GATHERS}, got {scoring.gather!r}")


def next_token_logps(logits: torch.Tensor, scoring: Scoring) -> torch.Tensor:
    """(N, C, V) log-probs of every vocabulary token at each scored position, tempered as `scoring` says."""
    return _tempered(logits, scoring).log_softmax(-1)


def token_entropies(logits: torch.Tensor, scoring: Scoring, grad: bool = False) -> torch.Tensor:
    """(N, C) entropy -sum_v p log p of each position's next-token distribution (TRL's `entropy`); no
    gradient unless `grad` (only an entropy bonus needs one)."""
    with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
        logps = _tempered(logits, scoring).log_softmax(-1)
        return -(logps.exp() * logps.masked_fill(logps.isneginf(), 0.0)).sum(-1)  # a dropped token adds 0


def per_token_logps_and_entropies(
    model, rollout: Rollout, scoring: Scoring, entropy_grad: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, C) log-prob of each completion token and (N, C) entropy at its position, one forward over
    prompt + completion; the log-probs are differentiable when called with grad enabled."""
    logits = completion_logits(model, rollout, scoring)
    return token_logps(logits, rollout.completion_ids, scoring), token_entropies(logits, scoring, entropy_grad)


def per_token_logps(model, rollout: Rollout, scoring: Scoring) -> torch.Tensor:
    """(N, C) log-prob of each completion token (`per_token_logps_and_entropies` without the entropies)."""
    return token_logps(completion_logits(model, rollout, scoring), rollout.completion_ids, scoring)
