"""Phase 2, log-probs: per-token log-probs of the sampled completions under policy and reference.

Each pitfall of the seeds is one argument: temperature left out (seed 004), the completion mask
(seed 004 drops the EOS; with pad == eos a value-based mask cannot tell them apart), dropout on
while scoring, no position_ids on left-padded rows, bfloat16, and the seed-003 gather.
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from .config import GATHERS, MASKS, StepConfig
from .rollout import ROWS_PER_PASS, Rollout, row_chunks
from .shared_prompt import shared_prompt_cache


@dataclass
class TokenLogProbs:
    policy: torch.Tensor  # (N, C) detached: the "old" log-probs of the step
    reference: torch.Tensor  # (N, C)
    mask: torch.Tensor  # (N, C) float, 1 on scored completion tokens
    sampler_gap: torch.Tensor  # (N, C) |sampler (temperature only) - recomputed policy| on the TRL mask
    max_sampler_gap: float
    top_p_gap: float  # max |sampler with top_p - sampler temperature-only|: what no recomputation removes
    eos_kept: float  # fraction of finished completions whose EOS is inside the mask
    seconds: float

    def rows(self, index: torch.Tensor | list[int]) -> "TokenLogProbs":
        """The same samples as `Rollout.rows(index)`."""
        index = torch.as_tensor(index).flatten()
        return dataclasses.replace(self, policy=self.policy[index], reference=self.reference[index],
                                   mask=self.mask[index], sampler_gap=self.sampler_gap[index])


def completion_mask(rollout: Rollout, mode: str = "keep_first_eos") -> torch.Tensor:
    """(N, C) float: which completion tokens count.

    keep_first_eos    positions up to and including the first EOS, from the lengths (TRL's mask).
    drop_eos_and_pad  positions before the first EOS, and no token equal to the pad id (seed 004's fix):
                      the EOS is dropped, and with pad == eos a value mask drops every EOS the model
                      produced anyway; the model is never taught to stop.
    all_positions     every position, PAD after the EOS included.
    """
    ids = rollout.completion_ids
    positions = torch.arange(ids.shape[1]).unsqueeze(0)
    if mode == "keep_first_eos":
        return (positions < rollout.completion_lengths.unsqueeze(1)).float()
    if mode == "drop_eos_and_pad":
        is_eos = ids == rollout.eos_token_id
        first_eos = torch.where(is_eos.any(1), is_eos.int().argmax(1), ids.shape[1])
        return ((positions < first_eos.unsqueeze(1)) & (ids != rollout.pad_token_id)).float()
    if mode == "all_positions":
        return torch.ones_like(ids, dtype=torch.float)
    raise ValueError(f"mask must be one of {MASKS}, got {mode!r}")


@contextmanager
def _mode(model, train: bool):
    was = model.training
    model.train(train)
    try:
        yield
    finally:
        model.train(was)


def _trim(rollout: Rollout, left: bool, right: bool) -> tuple[Rollout, int]:
    """Drop columns that no scored number depends on: left padding every row shares (only when
    position_ids are passed, else the padding shifts positions: that is the pitfall) and completion
    columns after every row's EOS (only when the mask zeroes them). Returns the rollout and the
    number of completion columns dropped on the right."""
    first = int(rollout.prompt_mask.any(0).int().argmax()) if left else 0
    width = int(rollout.completion_lengths.max()) if right else rollout.completion_ids.shape[1]
    trimmed = dataclasses.replace(rollout, prompt_ids=rollout.prompt_ids[:, first:],
                                  prompt_mask=rollout.prompt_mask[:, first:],
                                  completion_ids=rollout.completion_ids[:, :width])
    return trimmed, rollout.completion_ids.shape[1] - width


def _prompt_is_shared(model, rollout: Rollout, position_ids: bool, dtype: str) -> bool:
    """No-grad scoring of rows that all share one prompt (a group) in float32 without dropout."""
    ids, mask = rollout.prompt_ids, rollout.prompt_mask
    return (not torch.is_grad_enabled() and not model.training and position_ids and dtype == "float32"
            and ids.shape[0] > 1 and ids.shape[1] > 1 and bool((ids == ids[:1]).all()) and bool((mask == mask[:1]).all()))


def _logits_after_shared_prompt(model, kwargs: dict, rollout: Rollout, P: int, C: int) -> torch.Tensor:
    """The prompt's keys and values computed once for the group, as the rollout does: the same logits
    (to float rounding) for a fraction of the work when prompts are longer than completions."""
    cache = shared_prompt_cache(model, rollout.prompt_ids[:1], rollout.prompt_mask[:1], rollout.num_samples, C)
    return model(input_ids=kwargs["input_ids"][:, P - 1:P + C - 1], attention_mask=kwargs["attention_mask"][:, :P + C - 1],
                 position_ids=kwargs["position_ids"][:, P - 1:P + C - 1], past_key_values=cache, use_cache=True).logits


def per_token_logps(model, rollout: Rollout, *, temperature: float | None, position_ids: bool = True,
                    dropout: bool = False, dtype: str = "float32", gather: str = "per_position",
                    score_after_eos: bool = False) -> torch.Tensor:
    """(N, C) log-prob of each completion token; differentiable when called with grad enabled.

    The logits at position t predict token t+1, so the completion's C tokens are scored by the logits
    of positions P-1 ... P+C-2. Padding nothing depends on is not fed to the model (23% fewer tokens
    on the mixed task); `score_after_eos` keeps the columns after the EOS (a mask that counts PAD).
    """
    rollout, dropped = _trim(rollout, left=position_ids, right=not score_after_eos)
    input_ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
    attention_mask = torch.cat([rollout.prompt_mask, torch.ones_like(rollout.completion_ids)], dim=1)
    kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if position_ids:
        kwargs["position_ids"] = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {dtype!r}")
    P, C = rollout.prompt_ids.shape[1], rollout.completion_ids.shape[1]
    with _mode(model, dropout), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
        if _prompt_is_shared(model, rollout, position_ids, dtype):
            logits = _logits_after_shared_prompt(model, kwargs, rollout, P, C)
        else:
            logits = model(**kwargs).logits[:, P - 1:P + C - 1]
    logits = logits.float()
    if temperature is not None:
        logits = logits / temperature
    logps = logits.log_softmax(-1)
    if gather == "per_position":
        chosen = logps.gather(-1, rollout.completion_ids.unsqueeze(-1)).squeeze(-1)
    elif gather == "first_position":  # seed 003: lp.gather(1, tokens.unsqueeze(0)) reads every token from row 0
        chosen = logps[:, :1, :].expand(-1, C, -1).gather(-1, rollout.completion_ids.unsqueeze(-1)).squeeze(-1)
    else:
        raise ValueError(f"gather must be one of {GATHERS}, got {gather!r}")
    return torch.nn.functional.pad(chosen, (0, dropped))


def chunked_logps(model, rollout: Rollout, **kwargs) -> torch.Tensor:
    """`per_token_logps` a few rows at a time (no grad), cut along groups so that each piece shares its prompt."""
    G = rollout.num_generations
    size = G if 1 < G <= ROWS_PER_PASS else ROWS_PER_PASS
    return torch.cat([per_token_logps(model, rollout.rows(rows), **kwargs) for rows in row_chunks(rollout.num_samples, size)])


def scoring_kwargs(cfg: StepConfig) -> dict:
    return {"temperature": cfg.temperature if cfg.logprob_temperature else None, "position_ids": cfg.position_ids,
            "dropout": cfg.dropout, "dtype": cfg.dtype, "gather": cfg.gather, "score_after_eos": cfg.mask == "all_positions"}


def compute_logprobs(policy, reference, rollout: Rollout, cfg: StepConfig, seed: int = 0,
                     reference_is_policy: bool = False, scored: TokenLogProbs | None = None) -> TokenLogProbs:
    """Policy scored as `cfg` says; the reference always in eval mode, as TRL keeps it (no dropout).

    `reference_is_policy=True` (step 0: the reference is a frozen copy of these very weights) reuses the
    policy's log-probs for the reference when dropout is off: the same weights on the same inputs give
    the same numbers, so the second forward is skipped. `scored`: log-probs of this rollout scored with
    the same `scoring_kwargs` (only the mask changed), reused without any forward.
    """
    start = time.perf_counter()
    torch.manual_seed(seed)  # dropout masks, when dropout is on
    kwargs = scoring_kwargs(cfg)
    with torch.no_grad():
        if scored is not None:
            policy_logps, reference_logps = scored.policy, scored.reference
        else:
            policy_logps = chunked_logps(policy, rollout, **kwargs)
            if reference_is_policy and not cfg.dropout:
                reference_logps = policy_logps.clone()
            else:
                reference_logps = chunked_logps(reference, rollout, **{**kwargs, "dropout": False})
    mask = completion_mask(rollout, cfg.mask)
    trl_mask = completion_mask(rollout, "keep_first_eos")
    gap = (rollout.sampler_logps_temperature_only - policy_logps).abs() * trl_mask
    top_p_gap = ((rollout.sampler_logps - rollout.sampler_logps_temperature_only).abs() * trl_mask).max()
    eos_positions = (rollout.completion_lengths - 1).unsqueeze(1)
    eos_in_mask = mask.gather(1, eos_positions).squeeze(1)[rollout.finished]
    return TokenLogProbs(policy=policy_logps, reference=reference_logps, mask=mask, sampler_gap=gap,
                         max_sampler_gap=gap.max().item(), top_p_gap=top_p_gap.item(),
                         eos_kept=eos_in_mask.mean().item() if len(eos_in_mask) else float("nan"),
                         seconds=time.perf_counter() - start)
