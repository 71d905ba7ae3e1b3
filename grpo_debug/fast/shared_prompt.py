"""Sampling G completions of one prompt without paying for the prompt G times (`generate_per_prompt`).

The prompt's keys and values are computed once per prompt and repeated for its G samples
(`shared_prompt_cache`); while decoding, `attending_once_per_group` makes every attention layer read
those repeated prompt keys and values once per group instead of once per sample. On CPU both the
prefill of B*G copies of a prompt and the decode-step attention over them were bound by that repeated
work (a third, then two fifths of the rollout). The logits match the plain path to float rounding.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import AttentionInterface, StaticCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

from ..scoring import positions_from_mask

IMPLEMENTATION = "grpo_debug_shared_prompt"


def with_cache(model, cache) -> dict:
    """The keyword that hands `cache` to the model's forward and generate: `cache` where transformers takes
    it (5.24 renamed `past_key_values` in both and warns on the old name), `past_key_values` before."""
    return {"cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values": cache}


def shared_prompt_cache(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, copies: int, max_new_tokens: int
) -> StaticCache:
    """The prompts' keys and values (all but the last token, which `generate` feeds) computed once per
    prompt and repeated for each of its samples. A static cache because a growing one re-copies itself
    every token."""

    cache = StaticCache(config=model.config, max_cache_len=input_ids.shape[1] + max_new_tokens)
    positions = positions_from_mask(attention_mask)  # padding keys are masked
    model(
        input_ids=input_ids[:, :-1],
        attention_mask=attention_mask[:, :-1],
        position_ids=positions[:, :-1],
        **with_cache(model, cache),
        use_cache=True,
        logits_to_keep=1,
    )
    for layer in cache.layers:  # transformers' StaticLayer has no batch_repeat_interleave
        layer.keys = layer.keys.repeat_interleave(copies, 0)
        layer.values = layer.values.repeat_interleave(copies, 0)
        layer.batch_size *= copies
    return cache


def _grouped(x: torch.Tensor, copies: int) -> torch.Tensor:
    """(B*G, H, Q, X) -> (B, H, G*Q, X): a group's queries side by side."""
    NG, H, Q, X = x.shape
    return x.view(NG // copies, copies, H, Q, X).transpose(1, 2).reshape(NG // copies, H, copies * Q, X)


def _ungrouped(x: torch.Tensor, copies: int) -> torch.Tensor:
    B, H, GQ, X = x.shape
    return x.view(B, H, copies, GQ // copies, X).transpose(1, 2).reshape(B * copies, H, GQ // copies, X)


def shared_prompt_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """SDPA's result, with the first `prompt_len` keys and values read from one row per group."""
    shared = getattr(module, "_shared_prompt", None)
    if shared is None or attention_mask is None or attention_mask.dtype != torch.bool or dropout:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    prompt_len, copies = shared
    used = int(attention_mask.any(dim=(0, 1, 2)).nonzero()[-1]) + 1  # the static cache's filled length
    prompt_keys, prompt_values = key[::copies, :, :prompt_len], value[::copies, :, :prompt_len]
    on_prompt = _ungrouped(_grouped(query, copies) @ prompt_keys.transpose(-1, -2), copies)
    on_own = query @ key[:, :, prompt_len:used].transpose(-1, -2)
    scores = (torch.cat([on_prompt, on_own], -1) * scaling).masked_fill(~attention_mask[..., :used], float("-inf"))
    probs = scores.softmax(-1)
    out = _ungrouped(_grouped(probs[..., :prompt_len], copies) @ prompt_values, copies)
    out = out + probs[..., prompt_len:] @ value[:, :, prompt_len:used]
    return out.transpose(1, 2), None


AttentionInterface.register(IMPLEMENTATION, shared_prompt_attention)
AttentionMaskInterface.register(IMPLEMENTATION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


@contextmanager
def attending_once_per_group(model, prompt_len: int, copies: int) -> Iterator[None]:
    """While `generate` runs on a `shared_prompt_cache` whose first `prompt_len` positions are the prompts."""
    previous = model.config._attn_implementation
    if previous != "sdpa" or copies < 2:  # another implementation is the user's choice: leave it alone
        yield
        return
    layers = [m for m in model.modules() if type(m).__name__.endswith("Attention")]
    model.set_attn_implementation(IMPLEMENTATION)
    for layer in layers:
        layer._shared_prompt = (prompt_len, copies)
    try:
        yield
    finally:
        for layer in layers:
            del layer._shared_prompt
        model.set_attn_implementation(previous)


def generate_per_prompt(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, copies: int, max_new_tokens: int, **generate_kwargs
):
    """`model.generate` of `copies` samples per (left-padded) prompt, rows grouped by prompt, each prompt
    computed and read once."""
    cache = shared_prompt_cache(model, input_ids, attention_mask, copies, max_new_tokens)
    with attending_once_per_group(model, input_ids.shape[1] - 1, copies):
        return model.generate(
            input_ids=input_ids.repeat_interleave(copies, 0),
            attention_mask=attention_mask.repeat_interleave(copies, 0),
            **with_cache(model, cache),
            max_new_tokens=max_new_tokens,
            **generate_kwargs,
        )
