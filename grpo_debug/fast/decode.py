"""Sampling G completions per prompt from a GPT-2 with a decode loop written out, the fast twin of `generate`.

`generate_per_prompt` (shared_prompt.py) already reads each prompt once per group; what it leaves is transformers'
work around the model at every token: the causal mask rebuilt, the static cache's index copies, the attention
dispatch, the stopping criteria. On the bundled model at 8 prompts x 8 samples that was most of the rollout. Here
one token of every sample is:

    h = wte[token] + wpe[position]                                  (N, E)   N = B*G samples
    per block:  q, k, v = c_attn(ln_1(h))                           (N, H, D) each; k, v appended to the sample's own
                scores = [q . prompt keys of its group, q . its own keys] * scaling, -inf on the prompt's padding
                h += c_proj(softmax(scores) @ [prompt values; own values])
                h += mlp(ln_2(h))
    logits = lm_head(ln_f(h))                                       (N, V)

then sampled exactly as `generate` samples: the same warpers in the same order (temperature, top_k, top_p, min_p),
softmax, one `torch.multinomial` over all N rows, PAD once a row has produced its EOS, stop when every row has or
after `max_new_tokens`. The tokens drawn match `generate`'s (the logits to float rounding:
tests/test_fast_paths.py). Any other model, a generation config that asks for more processors than these, or
dropout on: `generate_per_prompt` as before.

A group whose G samples have all ended is no longer computed (`drop_ended_groups`): in a batch that mixes short
and long answers that is a third of the row-steps. Its rows still take part in the multinomial, with logits and
scores 0 (a uniform draw, replaced by PAD), so that the random stream, and every other row's token, is
`generate`'s: the multinomial draws one exponential per row and vocabulary entry whatever the probabilities.
The scores and logits of an ended row are PAD positions, which the rollout sets to 0 (`rollout.cut_after_eos`).
"""

from __future__ import annotations

import torch
from transformers.generation import GenerateDecoderOnlyOutput, LogitsProcessorList, TemperatureLogitsWarper

from ..scoring import positions_from_mask, truncating_warpers
from .shared_prompt import generate_per_prompt, with_cache

# the model's generation-config entries this loop reproduces (the sampling ones come in as arguments); any other
# entry it sets (a repetition penalty, a bad-words list, a minimum length...) sends the call to `generate`
PLAIN_GENERATION_CONFIG = {
    "bos_token_id", "eos_token_id", "pad_token_id", "transformers_version", "_from_model_config",
    "do_sample", "temperature", "top_p", "top_k", "min_p", "max_length", "max_new_tokens", "use_cache",
    "output_attentions", "output_hidden_states", "output_scores", "output_logits", "return_dict_in_generate",
}  # fmt: skip


def decodes_by_hand(model) -> bool:
    """A float32 GPT-2 in eval mode, outside autocast, whose generation config asks for nothing beyond
    `PLAIN_GENERATION_CONFIG`."""
    if getattr(model.config, "model_type", None) != "gpt2" or model.training or model.config.add_cross_attention:
        return False
    if model.dtype != torch.float32 or torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda"):
        return False
    if model.config._attn_implementation not in ("sdpa", "eager") or model.config.reorder_and_upcast_attn:
        return False
    return set(model.generation_config.to_diff_dict()) <= PLAIN_GENERATION_CONFIG


def warpers(temperature: float | None, top_k: int | None, top_p: float | None, min_p: float | None):
    """What `generate` applies to the logits before sampling, for these settings, in its order (a min_p of 0, which
    `generate` applies, keeps every token: left out)."""
    tempered = [TemperatureLogitsWarper(temperature)] if temperature is not None and temperature != 1.0 else []
    return LogitsProcessorList(tempered + truncating_warpers(top_k, top_p, min_p))


@torch.no_grad()
def prompt_keys_values(model, input_ids: torch.Tensor, attention_mask: torch.Tensor):
    """Each block's (keys, values) of the (B, P) left-padded prompts, each (B, H, P, D), and the last position's
    logits (B, V): one forward, each prompt once."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=positions_from_mask(attention_mask),
        **with_cache(model, cache),
        use_cache=True,
        logits_to_keep=1,
    )
    return [(layer.keys, layer.values) for layer in cache.layers], out.logits[:, -1]


def start_decoding(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, copies: int, max_new_tokens: int):
    """What `one_token` reads, for (B, P) left-padded prompts of `copies` samples each: the prompts' keys (transposed)
    and values per block, empty buffers for the samples' own, the prompt's padding bias (N, 1, P), the first new
    token's position (N,), and the first token's logits (N, V) (the prompt's last position)."""
    B, P = input_ids.shape
    N, H = B * copies, model.config.n_head
    prompt_kv, logits = prompt_keys_values(model, input_ids, attention_mask)
    prompt_kv = [(keys.transpose(-1, -2).contiguous(), values) for keys, values in prompt_kv]
    D = prompt_kv[0][1].shape[-1]
    own_kv = [(logits.new_empty(N, H, D, max_new_tokens), logits.new_empty(N, H, max_new_tokens, D))
              for _ in prompt_kv]  # fmt: skip
    prompt_bias = torch.zeros(B, P, dtype=logits.dtype).masked_fill(attention_mask == 0, float("-inf"))
    prompt_bias = prompt_bias.repeat_interleave(copies, 0).unsqueeze(1)
    positions = attention_mask.sum(-1).repeat_interleave(copies, 0)
    return prompt_kv, own_kv, prompt_bias, positions, logits.repeat_interleave(copies, 0)


def one_token(model, tokens, positions, prompt_kv, own_kv, t: int, prompt_bias, copies: int) -> torch.Tensor:
    """(N,) tokens at (N,) positions -> (N, V) next-token logits; writes their keys and values at column `t` of
    `own_kv`. Per block, `prompt_kv`: keys transposed (B, H, D, P) and values (B, H, P, D), one row per group;
    `own_kv`: keys transposed (N, H, D, T) and values (N, H, T, D) (keys stored transposed: the product reads them
    in place, where a transposed slice would be copied). `prompt_bias`: (N, 1, P), 0 on a prompt token, -inf on its
    padding."""
    tr = model.transformer
    N, E = tokens.shape[0], model.config.n_embd
    H = model.config.n_head
    D, B = E // H, N // copies
    h = tr.wte(tokens) + tr.wpe(positions)
    for block, (pk, pv), (ok, ov) in zip(tr.h, prompt_kv, own_kv):
        q, k, v = block.attn.c_attn(block.ln_1(h)).view(N, 3, H, D).unbind(1)
        ok[..., t], ov[:, :, t] = k, v
        P = pk.shape[-1]
        on_prompt = (q.view(B, copies, H, D).transpose(1, 2) @ pk).transpose(1, 2)  # (B, G, H, P)
        on_own = (q.unsqueeze(2) @ ok[..., : t + 1]).squeeze(2)  # (N, H, t+1)
        scores = torch.cat([on_prompt.reshape(N, H, P) * block.attn.scaling + prompt_bias,
                            on_own * block.attn.scaling], -1)  # fmt: skip
        probs = scores.softmax(-1)
        by_group = probs[..., :P].reshape(B, copies, H, P).transpose(1, 2).contiguous()  # (B, H, G, P)
        from_prompt = (by_group @ pv).transpose(1, 2).reshape(N, H, D)
        from_own = (probs[..., P:].unsqueeze(2) @ ov[:, :, : t + 1]).squeeze(2)
        h = h + block.attn.c_proj((from_prompt + from_own).reshape(N, E))
        h = h + block.mlp(block.ln_2(h))
    return model.lm_head(tr.ln_f(h))


def drop_ended_groups(unfinished: torch.Tensor, groups: torch.Tensor, copies: int, state: tuple):
    """The decode state (`prompt_kv`, `own_kv`, `prompt_bias`, `positions`) of the `groups` still computed, cut to
    those with a sample not ended ((N,) `unfinished` over the full batch): their ids (g,), their rows in the full batch
    (g * copies,) and their state; as it was where none ended."""
    kept = unfinished.view(-1, copies)[groups].bool().any(1)
    rows = (groups[:, None] * copies + torch.arange(copies)).flatten()
    if kept.all():
        return groups, rows, state
    prompt_kv, own_kv, prompt_bias, positions = state
    rows_kept = kept.repeat_interleave(copies)
    prompt_kv = [(keys[kept], values[kept]) for keys, values in prompt_kv]
    own_kv = [(keys[rows_kept], values[rows_kept]) for keys, values in own_kv]
    return groups[kept], rows[rows_kept], (prompt_kv, own_kv, prompt_bias[rows_kept], positions[rows_kept])


def on_all_rows(values: torch.Tensor, rows: torch.Tensor, n: int) -> torch.Tensor:
    """(len(rows), V) values of `rows` as (n, V), 0 on the other rows."""
    return values if len(rows) == n else values.new_zeros(n, values.shape[-1]).index_copy_(0, rows, values)


@torch.no_grad()
def decode_per_prompt(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    copies: int,
    max_new_tokens: int,
    *,
    pad_token_id: int,
    eos_token_id: int,
    do_sample: bool = True,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    output_scores: bool = False,
    output_logits: bool = False,
    return_dict_in_generate: bool = False,
):
    """`generate_per_prompt`'s result (sequences (B*G, P + T), rows grouped by prompt; with `return_dict_in_generate`
    the processed scores and raw logits per step) from the loop written out, where `decodes_by_hand(model)`."""
    chosen = (temperature, top_k, top_p)  # None: `generate` would take the model's own (top_k 50 by default)
    if not (do_sample and decodes_by_hand(model)) or any(x is None for x in chosen):
        return generate_per_prompt(
            model, input_ids, attention_mask, copies, max_new_tokens, pad_token_id=pad_token_id,
            eos_token_id=eos_token_id, do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
            min_p=min_p, output_scores=output_scores, output_logits=output_logits,
            return_dict_in_generate=return_dict_in_generate,
        )  # fmt: skip
    prompt_kv, own_kv, prompt_bias, positions, logits = start_decoding(
        model, input_ids, attention_mask, copies, max_new_tokens
    )
    state = (prompt_kv, own_kv, prompt_bias, positions)  # of the groups still computed: one sample not ended
    process = warpers(temperature, top_k, top_p, min_p)
    sequences = input_ids.repeat_interleave(copies, 0)
    N = sequences.shape[0]
    unfinished, groups, rows = torch.ones(N, dtype=torch.long), torch.arange(input_ids.shape[0]), torch.arange(N)
    scores, raw, tokens = [], [], None  # tokens: the last drawn, fed at the next step
    for t in range(max_new_tokens):
        if tokens is not None:
            prompt_kv, own_kv, prompt_bias, positions = state
            live = one_token(model, tokens[rows], positions + t - 1, prompt_kv, own_kv, t - 1, prompt_bias, copies)
            logits = on_all_rows(live, rows, N)
        next_logits = logits.to(dtype=torch.float32, copy=True)
        next_scores = on_all_rows(process(sequences[rows], next_logits[rows]), rows, N)
        scores.append(next_scores)
        raw.append(next_logits)
        tokens = torch.multinomial(torch.softmax(next_scores, -1), num_samples=1).squeeze(1)
        tokens = tokens * unfinished + pad_token_id * (1 - unfinished)
        sequences = torch.cat([sequences, tokens[:, None]], -1)
        unfinished = unfinished & (tokens != eos_token_id).long()
        if unfinished.max() == 0:
            break
        groups, rows, state = drop_ended_groups(unfinished, groups, copies, state)
    if not return_dict_in_generate:
        return sequences
    return GenerateDecoderOnlyOutput(
        sequences=sequences,
        scores=tuple(scores) if output_scores else None,
        logits=tuple(raw) if output_logits else None,
    )
