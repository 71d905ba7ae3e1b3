"""The weak models of `stranger_corpus.py`: a character-level tokenizer, a 2-layer GPT-2, Qwen2 or Llama of small
hidden size, and a short supervised warm-up on the task's prompt -> answer lines that stops once the model answers
right about as often as the run drew (a user's half-trained model: right sometimes, wrong often).

The warm-up is plain torch (Adam on the answer tokens, the prompt masked), so that no TRL or grpo_debug code shapes
the model the corpus judges them on. The accuracy it reports is sampled at temperature 1, one answer per prompt, as
a GRPO group samples.
"""

from __future__ import annotations

import dataclasses
import random
import string
from dataclasses import dataclass
from pathlib import Path

import torch

EOS, PAD = "<|endoftext|>", "<pad>"
# every character a prompt, an answer or a chat turn can hold: the tokenizer maps each to one token
CHARACTERS = string.digits + string.ascii_lowercase + "W +-?<>/=.,"
CHAT_ROLES = ("<|user|>", "<|assistant|>", "<|end|>")
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + '<|end|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
MAX_POSITIONS = 640  # a prompt and TRL's default max_completion_length (512) fit


@dataclass(frozen=True)
class ModelSpec:
    """The model a run trains: its shape, its dropout (in its config: TRL leaves it on unless disable_dropout),
    LoRA or not, and the sampled accuracy its warm-up stops at."""

    arch: str  # gpt2 | qwen2 | llama
    hidden: int
    heads: int
    dropout: float
    lora: bool
    target_accuracy: float


def build_tokenizer(chat: bool):
    """One token per character (CHARACTERS), EOS doubling as BOS, a pad token of its own, left padding (TRL's);
    `chat`: the role markers as special tokens and a chat template that ends on the assistant's marker."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {EOS: 0, PAD: 1, **{ch: i + 2 for i, ch in enumerate(CHARACTERS)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token=PAD))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=EOS,
        bos_token=EOS,
        pad_token=PAD,
        model_input_names=["input_ids", "attention_mask"],
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    if chat:
        tokenizer.add_special_tokens({"additional_special_tokens": list(CHAT_ROLES)})
        tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(spec: ModelSpec, vocab_size: int, seed: int):
    """A randomly initialised 2-layer model of `spec`'s architecture: GPT-2 (absolute positions, dropout in three
    places) or a rotary Qwen2 / Llama (attention dropout, a config field their attention reads)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    ids = dict(bos_token_id=0, eos_token_id=0, pad_token_id=1, vocab_size=vocab_size)
    if spec.arch == "gpt2":
        d = spec.dropout
        config = GPT2Config(n_layer=2, n_embd=spec.hidden, n_head=spec.heads, n_positions=MAX_POSITIONS,
                            resid_pdrop=d, embd_pdrop=d, attn_pdrop=d, **ids)  # fmt: skip
        return GPT2LMHeadModel(config)
    config_class, model_class = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[
        spec.arch
    ]
    config = config_class(
        hidden_size=spec.hidden,
        intermediate_size=2 * spec.hidden,
        num_hidden_layers=2,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.heads,
        max_position_embeddings=MAX_POSITIONS,
        attention_dropout=spec.dropout,
        **ids,
    )
    return model_class(config)


def prompt_text(tokenizer, question: str, chat: bool) -> str:
    """The text the model continues: the question, or in a chat run the template's rendering of it (as TRL's)."""
    if not chat:
        return question
    messages = [{"role": "user", "content": question}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def _encoded(tokenizer, lines: list[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids + EOS) per line, each tokenized alone as TRL tokenizes a prompt."""
    return [
        (tokenizer(p, add_special_tokens=False)["input_ids"], tokenizer(a, add_special_tokens=False)["input_ids"] + [0])
        for p, a in lines
    ]


def _batch(pairs: list[tuple[list[int], list[int]]]) -> dict[str, torch.Tensor]:
    """Right-padded inputs (positions start at 0 on every row) with the loss on the answer tokens alone."""
    width = max(len(p) + len(a) for p, a in pairs)
    ids = torch.full((len(pairs), width), 1)
    labels = torch.full((len(pairs), width), -100)
    mask = torch.zeros((len(pairs), width), dtype=torch.long)
    for row, (p, a) in enumerate(pairs):
        n = len(p) + len(a)
        ids[row, :n] = torch.tensor(p + a)
        labels[row, len(p) : n] = torch.tensor(a)
        mask[row, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


@torch.no_grad()
def sampled_answers(model, prompts: list[list[int]], max_new: int, generator: torch.Generator) -> list[list[int]]:
    """One completion per prompt at temperature 1 over the whole vocabulary, stopped at EOS. Prompts of one length
    are sampled together, so no row is padded (a padded GPT-2 row would sit at shifted positions)."""
    model.eval()
    out: list[list[int] | None] = [None] * len(prompts)
    for length in sorted({len(p) for p in prompts}):
        rows = [i for i, p in enumerate(prompts) if len(p) == length]
        x = torch.tensor([prompts[i] for i in rows])
        done = torch.zeros(len(rows), dtype=torch.bool)
        for _ in range(max_new):
            probs = model(input_ids=x, attention_mask=torch.ones_like(x)).logits[:, -1].float().softmax(-1)
            nxt = torch.multinomial(probs, 1, generator=generator).squeeze(1).masked_fill(done, 0)
            x = torch.cat([x, nxt[:, None]], 1)
            done |= nxt == 0
            if done.all():
                break
        for k, i in enumerate(rows):
            new = x[k, length:].tolist()
            out[i] = new[: new.index(0)] if 0 in new else new
    model.train()
    return out


def accuracy(model, tokenizer, lines: list[tuple[str, str]], generator: torch.Generator) -> float:
    """The share of lines whose sampled answer is the line's answer, exactly."""
    encoded = _encoded(tokenizer, lines)
    longest = max(len(a) for _, a in encoded)
    answers = sampled_answers(model, [p for p, _ in encoded], longest + 2, generator)
    return sum(ids == a[:-1] for ids, (_, a) in zip(answers, encoded)) / len(lines)


@dataclass(frozen=True)
class Warmup:
    steps: int
    accuracy: float  # sampled after the last step, two answers per line of the pool
    seconds: float


def warm_up(model, tokenizer, lines: list[tuple[str, str]], target: float, seed: int, max_steps: int = 1500) -> Warmup:
    """Adam on batches of 32 lines until the sampled accuracy (checked every 25 steps from step 50) reaches
    `target`, or `max_steps`: a model that knows the task's shape and some of its answers."""
    import time

    start = time.perf_counter()
    rng, generator = random.Random(seed), torch.Generator().manual_seed(seed)
    encoded = _encoded(tokenizer, lines)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    step = 0
    while step < max_steps:
        step += 1
        loss = model(**_batch(rng.choices(encoded, k=32))).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step >= 50 and step % 25 == 0 and accuracy(model, tokenizer, lines, generator) >= target:
            break
    final = accuracy(model, tokenizer, lines + lines, generator)
    return Warmup(step, final, time.perf_counter() - start)


def main() -> None:
    """`python stranger_models.py RUN_FOLDER [MAX_STEPS]`: the run's model/ from its spec.json (its model, its
    question -> answer lines, its seed), on one thread; prints the warm-up's numbers (JSON).

    The warm-up reads the tokenizer back from the folder first, as TRL will: transformers picks the tokenizer class
    from the model's config, and for a Qwen2 config that is Qwen2Tokenizer, whose byte-level pre-tokenizer drops
    the character-level vocabulary's spaces. The model learns the prompts as the run will feed them."""
    import json
    import sys

    from transformers import AutoTokenizer

    torch.set_num_threads(1)
    folder = Path(sys.argv[1])
    spec = json.loads((folder / "spec.json").read_text())
    chat, model_spec = spec["task"]["chat"], ModelSpec(**spec["model"])
    written = build_tokenizer(chat)
    model = build_model(model_spec, len(written), spec["seed"])
    model.config.save_pretrained(folder / "model")
    written.save_pretrained(folder / "model")
    tokenizer = AutoTokenizer.from_pretrained(folder / "model")
    lines = [(prompt_text(tokenizer, q, chat), a) for q, a in spec["lines"]]
    max_steps = int(sys.argv[2]) if len(sys.argv) > 2 else 1500
    warmup = warm_up(model, tokenizer, lines, model_spec.target_accuracy, spec["seed"], max_steps)
    model.save_pretrained(folder / "model")
    print(json.dumps({**dataclasses.asdict(warmup), "tokenizer": type(tokenizer).__name__}))


if __name__ == "__main__":
    main()
