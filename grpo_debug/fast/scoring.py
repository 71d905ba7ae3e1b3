"""Fast log-prob scoring: the readable `logprobs.per_token_logps`, without the work no scored number
depends on. Tested equal to it (float rounding) in `tests/test_fast_paths.py`.

  - left padding every row shares is dropped (only when position_ids are passed: without them the
    padding shifts positions, and that is the pitfall being shown);
  - completion columns after every row's EOS are dropped (unless the mask counts them);
  - without gradients, rows that share one prompt (a group) compute it once and repeat its keys and
    values, as the rollout does;
  - with gradients (the update's twin, `per_token_logps_and_entropies_per_group`), each run of rows that share
    a prompt computes it once: its keys and values repeated for the group's samples, whose gradients sum back
    into the one prompt pass. Not under per-sample norms, whose layer hooks read one row per sample.
"""

from __future__ import annotations

import dataclasses

import torch
from transformers import DynamicCache

from ..scoring import completion_logits, keeps_logits, model_inputs, positions_from_mask, token_entropies, token_logps
from .shared_prompt import shared_prompt_cache, with_cache


def trim(rollout, left: bool, right: bool):
    """The rollout without shared left padding (`left`) and columns after every EOS (`right`), and the
    number of completion columns dropped on the right."""
    first = int(rollout.prompt_mask.any(0).int().argmax()) if left else 0
    width = int(rollout.completion_lengths.max()) if right else rollout.completion_ids.shape[1]
    trimmed = dataclasses.replace(
        rollout,
        prompt_ids=rollout.prompt_ids[:, first:],
        prompt_mask=rollout.prompt_mask[:, first:],
        completion_ids=rollout.completion_ids[:, :width],
    )
    return trimmed, rollout.completion_ids.shape[1] - width


def prompt_is_shared(model, rollout, scoring) -> bool:
    """No-grad, float32, dropout-free scoring of rows that all share one prompt, with position_ids."""
    ids = rollout.prompt_ids
    return (
        not torch.is_grad_enabled()
        and not scoring.dropout
        and scoring.position_ids
        and scoring.dtype == "float32"
        and ids.shape[0] > 1
        and ids.shape[1] > 1
        and rows_per_prompt(rollout) == ids.shape[0]
    )


def completion_logits_after_shared_prompt(model, rollout, model_inputs: dict) -> torch.Tensor:
    """(N, C, V) logits that score the completion, with the group's prompt computed once."""
    P, C, N = rollout.prompt_ids.shape[1], rollout.completion_ids.shape[1], rollout.num_samples
    cache = shared_prompt_cache(model, rollout.prompt_ids[:1], rollout.prompt_mask[:1], N, C)
    return completion_logits_after(model, model_inputs, P, C, cache)


def completion_logits_after(model, model_inputs: dict, P: int, C: int, cache) -> torch.Tensor:
    """(N, C, V) logits of the completion's positions P-1 ... P+C-2, the prompt's first P-1 held by `cache`."""
    return model(
        input_ids=model_inputs["input_ids"][:, P - 1 : P + C - 1],
        attention_mask=model_inputs["attention_mask"][:, : P + C - 1],
        position_ids=model_inputs["position_ids"][:, P - 1 : P + C - 1],
        **with_cache(model, cache),
        use_cache=True,
    ).logits


def rows_per_prompt(rollout) -> int:
    """k where the rows come in runs of k that share one prompt (ids and mask), every run alike; 1 otherwise."""
    ids, mask = rollout.prompt_ids, rollout.prompt_mask
    N = ids.shape[0]
    same = ((ids[1:] == ids[:-1]).all(1) & (mask[1:] == mask[:-1]).all(1)).tolist()  # row i + 1 as row i
    k = same.index(False) + 1 if False in same else N
    alike = N % k == 0 and all(same[i] for i in range(N - 1) if (i + 1) % k)  # each row as the one before, in its run
    return k if alike else 1


def completion_logits_per_group(model, rollout, model_inputs: dict, k: int) -> torch.Tensor:
    """(N, C, V) logits that score the completion, gradients flowing, each run of k rows' prompt computed once:
    its keys and values (all but the last prompt token) repeated for the k samples."""
    P, C = rollout.prompt_ids.shape[1], rollout.completion_ids.shape[1]
    prompt_ids, prompt_mask = rollout.prompt_ids[::k], rollout.prompt_mask[::k]
    cache = DynamicCache(config=model.config)
    model(
        input_ids=prompt_ids[:, :-1],
        attention_mask=prompt_mask[:, :-1],
        position_ids=positions_from_mask(prompt_mask)[:, :-1],
        **with_cache(model, cache),
        use_cache=True,
        logits_to_keep=1,
    )
    cache.batch_repeat_interleave(k)
    return completion_logits_after(model, model_inputs, P, C, cache)


def shares_with_grad(model, rollout, scoring) -> int:
    """k > 1 where a grad-enabled, float32, dropout-free scoring with position_ids may compute each run of k
    rows' prompt once; 1 otherwise."""
    plain = scoring.position_ids and scoring.dtype == "float32" and not scoring.dropout and not model.training
    own_forward = keeps_logits(model) and not hasattr(model, "get_base_model")  # a transformers model, no adapter
    if not (plain and own_forward and torch.is_grad_enabled() and rollout.prompt_ids.shape[1] > 1):
        return 1
    return rows_per_prompt(rollout)


def _trimmed_logits(model, rollout, scoring, per_group: bool = False):
    """(N, C', V) logits of the trimmed rollout, its completion ids, and the C - C' columns dropped on the right.
    `per_group`: with gradients too, each run of rows sharing a prompt computes it once."""
    trimmed, dropped = trim(rollout, left=scoring.position_ids, right=not scoring.score_after_eos)
    k = shares_with_grad(model, trimmed, scoring) if per_group else 1
    if prompt_is_shared(model, trimmed, scoring):
        logits = completion_logits_after_shared_prompt(model, trimmed, model_inputs(trimmed, scoring.position_ids))
    elif k > 1:
        logits = completion_logits_per_group(model, trimmed, model_inputs(trimmed, scoring.position_ids), k)
    else:
        logits = completion_logits(model, trimmed, scoring)
    return logits, trimmed.completion_ids, dropped


def _logps_and_entropies(model, rollout, scoring, entropy_grad: bool, per_group: bool):
    logits, ids, dropped = _trimmed_logits(model, rollout, scoring, per_group)
    pad = lambda x: torch.nn.functional.pad(x, (0, dropped))
    return pad(token_logps(logits, ids, scoring)), pad(token_entropies(logits, scoring, entropy_grad))


def per_token_logps_and_entropies_fast(model, rollout, scoring, entropy_grad: bool = False):
    """(N, C) log-probs and (N, C) entropies as `logprobs.per_token_logps_and_entropies`, for less work
    (the dropped columns after every EOS get 0)."""
    return _logps_and_entropies(model, rollout, scoring, entropy_grad, per_group=False)


def per_token_logps_and_entropies_per_group(model, rollout, scoring, entropy_grad: bool = False):
    """`per_token_logps_and_entropies_fast`, and with gradients each run of rows that share a prompt computes it
    once: the update's scoring where no per-sample norm is taken."""
    return _logps_and_entropies(model, rollout, scoring, entropy_grad, per_group=True)


def per_token_logps_fast(model, rollout, scoring) -> torch.Tensor:
    """(N, C) as `logprobs.per_token_logps(model, rollout, scoring)`, for less work."""
    logits, ids, dropped = _trimmed_logits(model, rollout, scoring)
    return torch.nn.functional.pad(token_logps(logits, ids, scoring), (0, dropped))
