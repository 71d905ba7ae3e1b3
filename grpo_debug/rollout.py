"""Phase 1, rollout: B prompts x G sampled completions, with the sampler's own per-token log-probs."""

from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from tqdm import tqdm

from .model import at_precision


@dataclass(frozen=True)
class Rollout:
    prompts: list[str]  # B prompts; sample i belongs to prompt i // G
    completions: list[str]  # B*G decoded completions (special tokens removed)
    prompt_ids: torch.Tensor  # (B*G, P) left-padded
    prompt_mask: torch.Tensor  # (B*G, P)
    completion_ids: torch.Tensor  # (B*G, C) padded after the EOS with pad_token_id
    completion_lengths: torch.Tensor  # (B*G,) generated tokens, the first EOS included
    finished: torch.Tensor  # (B*G,) bool: an EOS was generated within max_new_tokens
    sampler_logps: torch.Tensor  # (B*G, C) log-prob of each sampled token under the sampler (temperature + top_p)
    sampler_logps_temperature_only: torch.Tensor  # (B*G, C) same, temperature only (what a recomputation can match)
    num_generations: int
    eos_token_id: int
    pad_token_id: int
    identical_groups: list[int]  # prompts whose G completions are all the same text
    seconds: float

    @property
    def num_samples(self) -> int:
        return len(self.completions)

    def group_of(self, sample: int) -> int:
        return sample // self.num_generations

    def rows(self, index: torch.Tensor | list[int]) -> Rollout:
        """Some samples of the rollout, each its own group of one (num_generations=1)."""
        index = torch.as_tensor(index).flatten()
        tensors = {name: getattr(self, name)[index] for name in TENSORS}
        return dataclasses.replace(
            self,
            **tensors,
            prompts=[self.prompts[self.group_of(i)] for i in index.tolist()],
            completions=[self.completions[i] for i in index.tolist()],
            num_generations=1,
            identical_groups=[],
        )


TENSORS = (
    "prompt_ids",
    "prompt_mask",
    "completion_ids",
    "completion_lengths",
    "finished",
    "sampler_logps",
    "sampler_logps_temperature_only",
)  # a Rollout's per-sample tensors

ROWS_PER_PASS = 8  # one 64-row forward+backward was ~2x slower on CPU than eight 8-row ones (memory-bound)


def row_chunks(n: int, size: int = ROWS_PER_PASS) -> list[list[int]]:
    return [list(range(start, min(start + size, n))) for start in range(0, n, size)]


def _lengths(completion_ids: torch.Tensor, eos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    is_eos = completion_ids == eos_id
    finished = is_eos.any(dim=1)
    first_eos = torch.where(finished, is_eos.int().argmax(dim=1), completion_ids.shape[1] - 1)
    return first_eos + 1, finished


@torch.no_grad()
def generate_repeated(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, copies: int, **generate_kwargs):
    """`model.generate` of `copies` samples per (left-padded) prompt, rows grouped by prompt: each prompt
    repeated `copies` times. The fast twins: `fast.decode.decode_per_prompt` (a GPT-2), else
    `fast.shared_prompt.generate_per_prompt`."""
    return model.generate(
        input_ids=input_ids.repeat_interleave(copies, 0),
        attention_mask=attention_mask.repeat_interleave(copies, 0),
        **generate_kwargs,
    )


def sample(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    num_generations: int,
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    pad_token_id: int,
    eos_token_id: int,
    top_k: int = 0,
    min_p: float | None = None,
    dtype: str = "float32",
    generate=generate_repeated,
):
    """`num_generations` samples of each left-padded prompt (B, P): one `generate` call on the prompts
    repeated G times, rows grouped by prompt. Returns the (B*G, P) prompt ids and mask, the (B*G, C)
    completion ids, and each sampled token's log-prob under the sampler (temperature, then top_k, top_p and
    min_p, which renormalise over the tokens they keep) and under the temperature alone (what a recomputation can match). `generate`: `generate_repeated`, or its fast
    twin that computes each prompt's keys and values once per group (`speed.kernels`). `dtype`: the sampler's
    precision (`at_precision`): its logits, hence the tokens drawn and their log-probs, carry that rounding."""
    G = num_generations
    input_ids, attention_mask = input_ids.repeat_interleave(G, 0), attention_mask.repeat_interleave(G, 0)
    kwargs = dict(
        max_new_tokens=max_new_tokens,
        do_sample=True,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        output_scores=True,
        output_logits=True,
        return_dict_in_generate=True,
    )
    with at_precision(dtype, "sampler", input_ids.device.type):
        out = generate(model, input_ids[::G], attention_mask[::G], G, **kwargs)
    completion_ids = out.sequences[:, input_ids.shape[1] :]
    chosen = completion_ids.unsqueeze(-1)
    scores = torch.stack(out.scores, dim=1).float()  # what was sampled from: / temperature, top_p -> -inf
    logits = torch.stack(out.logits, dim=1).float()  # raw
    sampler = scores.log_softmax(-1).gather(-1, chosen).squeeze(-1)
    temperature_only = (logits / temperature).log_softmax(-1).gather(-1, chosen).squeeze(-1)
    return input_ids, attention_mask, completion_ids, sampler, temperature_only


def _pad_right(tensors: list[torch.Tensor], value: float) -> torch.Tensor:
    width = max(t.shape[1] for t in tensors)
    return torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value) for t in tensors])


def _pad_left(tensors: list[torch.Tensor], value: int) -> torch.Tensor:
    width = max(t.shape[1] for t in tensors)
    return torch.cat([torch.nn.functional.pad(t, (width - t.shape[1], 0), value=value) for t in tensors])


@torch.no_grad()
def sample_completions(
    model,
    tokenizer,
    prompts: list[str],
    num_samples: int,
    *,
    temperature: float = 0.7,
    top_p: float = 0.95,
    max_new_tokens: int = 128,
    seed: int = 0,
    batch_prompts: int = 16,
    progress: bool = True,
    top_k: int = 0,
    min_p: float | None = None,
    generate=generate_repeated,
) -> list[list[str]]:
    """`num_samples` sampled completions per prompt, in one left-padded `generate` call per chunk (texts
    only: no scores kept, so it also fits a large vocabulary)."""
    was_training = model.training
    model.eval()
    tokenizer.padding_side = "left"
    out: list[list[str]] = []
    chunks = range(0, len(prompts), batch_prompts)
    for start in tqdm(chunks, desc="sampling", disable=not progress):
        torch.manual_seed(seed + start)
        chunk = prompts[start : start + batch_prompts]
        enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
        kwargs = dict(
            max_new_tokens=max_new_tokens,
            do_sample=True,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        generated = generate(model, enc["input_ids"], enc["attention_mask"], num_samples, **kwargs)
        texts = tokenizer.batch_decode(generated[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        out.extend(texts[i * num_samples : (i + 1) * num_samples] for i in range(len(chunk)))
    model.train(was_training)
    return out


@contextmanager
def eval_mode(model):
    """`model` in eval mode (no dropout) inside the block; its own mode back after."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def sample_batches(
    model, tokenizer, prompts: list[str], num_generations: int, generation: str, pad_id: int, **sampling
) -> list[tuple]:
    """One `sample` call for all prompts ("batched", KV cache) or one per prompt ("loop")."""
    batches = [prompts] if generation == "batched" else [[p] for p in prompts]
    parts = []
    for batch in batches:
        enc = tokenizer(batch, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
        parts.append(
            sample(
                model,
                enc["input_ids"],
                enc["attention_mask"],
                num_generations,
                pad_token_id=pad_id,
                eos_token_id=tokenizer.eos_token_id,
                **sampling,
            )
        )
    return parts


def cut_after_eos(parts: list[tuple], pad_id: int, eos_id: int):
    """The parts' completions padded to one width, every position after the first EOS set to PAD and its
    log-probs to 0. Returns completion ids, lengths, finished, sampler and temperature-only log-probs."""
    completion_ids = _pad_right([p[2] for p in parts], pad_id)
    lengths, finished = _lengths(completion_ids, eos_id)
    after_eos = torch.arange(completion_ids.shape[1], device=lengths.device).unsqueeze(0) >= lengths.unsqueeze(1)
    sampler = _pad_right([p[3] for p in parts], 0.0).masked_fill(after_eos, 0.0)
    temperature_only = _pad_right([p[4] for p in parts], 0.0).masked_fill(after_eos, 0.0)
    return completion_ids.masked_fill(after_eos, pad_id), lengths, finished, sampler, temperature_only


def identical_groups(completions: list[str], num_generations: int) -> list[int]:
    """Prompts whose G completions are all the same text (no reward contrast possible)."""
    G = num_generations
    return [b for b in range(len(completions) // G) if len(set(completions[b * G : (b + 1) * G])) == 1]


def check_positions(model, tokenizer, prompts: list[str], max_new_tokens: int) -> None:
    """Refuse, before sampling, a completion budget that runs past the model's positions (an absolute-position
    model indexes past its embedding table; a long budget is also slow for nothing)."""
    limit = getattr(model.config, "n_positions", None) or getattr(model.config, "max_position_embeddings", None)
    if limit is None:
        return
    longest = max(len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts)
    if longest + max_new_tokens > limit:
        raise ValueError(
            f"StepConfig.max_new_tokens = {max_new_tokens} is not allowed here: the longest prompt has "
            f"{longest} tokens and the model {limit} positions, so at most {limit - longest}"
        )


@dataclass(frozen=True)
class Sampling:
    """How the rollout samples (`specs.sampling_of` reads it from a StepConfig)."""

    num_generations: int  # G completions per prompt
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int  # 0: off
    min_p: float | None
    seed: int
    pad_with_eos: bool  # pad completions with EOS, as a GPT-2 tokenizer without a pad token does under TRL
    generation: str  # "batched": one left-padded `generate` call for all B*G samples; "loop": one per prompt
    dropout: bool  # sample in train mode, as TRL 1.16 generates with disable_dropout=False
    dtype: str  # the sampler's precision (`at_precision`), apart from the trainer's


def rollout(model, tokenizer, prompts: list[str], sampling: Sampling, generate=generate_repeated) -> Rollout:
    """Sample `sampling.num_generations` completions for each prompt, model in eval mode (train mode with
    `sampling.dropout`), seeded. `generate`: the readable `generate_repeated` or its fast twin."""
    s = sampling
    if s.generation not in ("batched", "loop"):
        raise ValueError(f"generation must be 'batched' or 'loop', got {s.generation!r}")
    pad_id = tokenizer.eos_token_id if s.pad_with_eos else tokenizer.pad_token_id
    tokenizer.padding_side = "left"
    with eval_mode(model):
        model.train(s.dropout)
        start = time.perf_counter()
        torch.manual_seed(s.seed)
        warpers = dict(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, min_p=s.min_p, dtype=s.dtype)
        parts = sample_batches(
            model,
            tokenizer,
            prompts,
            s.num_generations,
            s.generation,
            pad_id,
            max_new_tokens=s.max_new_tokens,
            **warpers,
            generate=generate,
        )
        seconds = time.perf_counter() - start
    completion_ids, lengths, finished, sampler, temperature_only = cut_after_eos(parts, pad_id, tokenizer.eos_token_id)
    completions = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    return Rollout(
        prompts=prompts,
        completions=completions,
        prompt_ids=_pad_left([p[0] for p in parts], tokenizer.pad_token_id),
        prompt_mask=_pad_left([p[1] for p in parts], 0),
        completion_ids=completion_ids,
        completion_lengths=lengths,
        finished=finished,
        sampler_logps=sampler,
        sampler_logps_temperature_only=temperature_only,
        num_generations=s.num_generations,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=pad_id,
        identical_groups=identical_groups(completions, s.num_generations),
        seconds=seconds,
    )
