"""A second task with no chess in it, for tests/test_task_seam.py: "What is 3+4? " -> "7", on a tiny random GPT-2
with a character-level tokenizer. Nothing here imports grpo_debug.chess."""

from __future__ import annotations

import random
from pathlib import Path

from grpo_debug.task import PROMPT_SETS, Task

PAIRS = random.Random(0).sample([(a, b) for a in range(10) for b in range(10)], 100)
SETS = {"train": PAIRS[:40], "validation": PAIRS[40:70], "test": PAIRS[70:]}  # disjoint
WEIGHTS = (1.0, 0.5)
VOCAB = "0123456789+? Whatis"
EOS, PAD = "<|endoftext|>", "<pad>"


def arithmetic_prompts(prompt_set: str, n: int) -> list[str]:
    if prompt_set not in SETS:
        raise ValueError(f"prompt set must be one of {PROMPT_SETS}, got {prompt_set!r}")
    if not 0 < n <= len(SETS[prompt_set]):
        raise ValueError(
            f"{n} {prompt_set} prompts asked for; the arithmetic {prompt_set} set has {len(SETS[prompt_set])}"
        )
    return [f"What is {a}+{b}? " for a, b in SETS[prompt_set][:n]]


def answer(prompt: str) -> str:
    a, b = prompt[len("What is ") :].rstrip("? ").split("+")
    return str(int(a) + int(b))


class ExactAnswer:
    """1 if the completion is the sum, else 0; components `exact` and `length_error` for the tables."""

    __name__ = "exact_answer"

    def __call__(self, prompts, completions, **kwargs):
        return self.details(prompts, completions)[0]

    def details(self, prompts, completions):
        answers = [answer(p) for p in prompts]
        exact = [float(c.strip() == a) for c, a in zip(completions, answers)]
        length_error = [float(abs(len(c.strip()) - len(a))) for c, a in zip(completions, answers)]
        errors = ["" if c.strip().isdigit() else "not a number" for c in completions]
        return exact, {"exact": exact, "length_error": length_error}, errors


def format_reward(prompts, completions, **kwargs):
    """The share of digits in the answer; None (does not apply) for an empty answer. No `details`."""
    return [None if not c.strip() else sum(ch.isdigit() for ch in c.strip()) / len(c.strip()) for c in completions]


def arithmetic_task() -> Task:
    return Task("arithmetic", arithmetic_prompts, (ExactAnswer(), format_reward), WEIGHTS)


def expected_total(prompt: str, completion: str) -> float:
    """TRL's sum_then_normalize sum, by hand: weight * reward over the functions that returned a number."""
    values = [ExactAnswer()([prompt], [completion])[0], format_reward([prompt], [completion])[0]]
    return sum(w * v for w, v in zip(WEIGHTS, values) if v is not None)


def build_tiny_model(folder: Path, seed: int = 0) -> Path:
    """A randomly initialised 2-layer GPT-2 (n_embd 32) with a character-level tokenizer, saved to `folder`."""
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    vocab = {EOS: 0, PAD: 1, **{ch: i + 2 for i, ch in enumerate(dict.fromkeys(VOCAB))}}
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
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=len(vocab),
        n_layer=2,
        n_embd=32,
        n_head=2,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=1,
    )
    GPT2LMHeadModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + '<|end|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def build_tiny_llama(folder: Path, seed: int = 0, chat: bool = False) -> Path:
    """The same tokenizer with a randomly initialised 2-layer Llama (rotary positions: left padding cannot
    shift them), saved to `folder`. `chat`: the tokenizer also has a chat template, whose role markers are
    special tokens."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    build_tiny_model(folder, seed)  # the tokenizer (and a GPT-2 config, replaced below)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if chat:
        tokenizer.add_special_tokens({"additional_special_tokens": ["<|user|>", "<|assistant|>", "<|end|>"]})
        tokenizer.chat_template = CHAT_TEMPLATE
        tokenizer.save_pretrained(folder)
    return _with_random_weights(folder, seed, LlamaConfig, LlamaForCausalLM, vocab_size=len(tokenizer))


def conversational(func):
    """`func` as TRL calls it on a conversational dataset: prompts and completions are message lists."""

    def reward(prompts, completions, **kwargs):
        return func([p[-1]["content"] for p in prompts], [c[-1]["content"] for c in completions])

    reward.__name__ = getattr(func, "__name__", type(func).__name__)
    return reward


def build_tiny_qwen2(folder: Path, seed: int = 0, attention_dropout: float = 0.0) -> Path:
    """The same tokenizer with a randomly initialised 2-layer Qwen2 (rotary positions); `attention_dropout` is a
    config field its attention reads directly, with no `nn.Dropout` module."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    build_tiny_model(folder, seed)
    vocab_size = len(AutoTokenizer.from_pretrained(folder))
    return _with_random_weights(
        folder, seed, Qwen2Config, Qwen2ForCausalLM, vocab_size=vocab_size, attention_dropout=attention_dropout
    )


def _with_random_weights(folder: Path, seed: int, config_class, model_class, **config) -> Path:
    """`folder`'s weights and config replaced by a randomly initialised 2-layer rotary model of `model_class`
    (its tokenizer kept), the tiny shape every such test model shares."""
    import torch

    torch.manual_seed(seed)
    shape = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=1,
    )
    for old in folder.glob("*.safetensors"):
        old.unlink()
    model_class(config_class(**shape, **config)).save_pretrained(folder)
    return folder
