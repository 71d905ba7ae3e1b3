"""A user's GRPO script with one planted defect, for the doctor's tests: a plain GRPOConfig (TRL's defaults but the
batch shape and `use_cpu`), a model in a relative folder, the user's own reward functions, one captured step.

    python planted_train.py DEFECT OUT [DEFECT OUT ...]

DEFECT: one of DEFECTS below ("clean" plants nothing) or of USER_RUNS; several runs in one process pay its imports once,
each seeded alike, whatever ran before it.
"""

import sys

from datasets import Dataset
from transformers import set_seed
from trl import GRPOConfig, GRPOTrainer

from grpo_debug.capture import CaptureCallback


def text(completion) -> str:
    return completion if isinstance(completion, str) else completion[-1]["content"]


def digits(completions, **kwargs):
    """The share of digits in the completion: graded, unrelated to its length."""
    return [sum(ch.isdigit() for ch in text(c)) / max(len(text(c)), 1) for c in completions]


def always_one(completions, **kwargs):
    """A format check every completion passes: the same reward everywhere."""
    return [1.0 for _ in completions]


def longer(completions, **kwargs):
    """A reward that pays for length."""
    return [len(text(c)) / 40 for c in completions]


def vowels_x1000(completions, **kwargs):
    """A graded reward on another scale: 1000 times the share of vowels (unrelated to length)."""
    return [1000 * sum(ch in "aeiou" for ch in text(c)) / max(len(text(c)), 1) for c in completions]


def digits_or_none(completions, **kwargs):
    """The share of digits, but None (does not apply) for every completion of odd length: about half."""
    return [None if len(text(c)) % 2 else sum(ch.isdigit() for ch in text(c)) / max(len(text(c)), 1)
            for c in completions]  # fmt: skip


def starts_low(completions, **kwargs):
    """Binary and rare: 1 when the completion starts with 1 or 2."""
    return [1.0 if text(c)[:1] in ("1", "2") else 0.0 for c in completions]


SAME_LENGTH = [f"What is {a}+{b}? " for a, b in [(1, 2), (3, 4), (5, 6), (7, 1), (2, 2), (9, 0), (4, 4), (6, 3)]]
MIXED_LENGTH = [f"What is {a}+{b}? " for a, b in [(1, 2), (13, 4), (5, 61), (7, 1), (22, 2), (9, 0), (4, 44), (6, 3)]]

# defect -> (model folder, reward functions, GRPOConfig changes, prompts)
DEFECTS = {
    "clean": ("llama", [digits], {}, SAME_LENGTH),
    "constant_reward": ("llama", [digits, always_one], {}, SAME_LENGTH),
    "top_p": ("llama", [digits], {"top_p": 0.8}, SAME_LENGTH),
    "attention_dropout": ("qwen2-dropout", [digits], {}, SAME_LENGTH),
    "position_ids": ("gpt2", [digits], {"disable_dropout": True}, MIXED_LENGTH),
    "short_completions": ("llama", [digits], {"max_completion_length": 4}, SAME_LENGTH),
    "length_reward": ("llama", [longer], {}, SAME_LENGTH),
    "binary_pairs": ("llama", [starts_low], {"num_generations": 2}, SAME_LENGTH),
    # a learning rate that breaks the model in two steps (captured at the third), with a KL term that logs it
    "learning_rate": ("llama", [digits], {"learning_rate": 0.1, "beta": 0.04, "max_steps": 3}, SAME_LENGTH),
    "reward_1000x": ("llama", [digits, vowels_x1000], {"scale_rewards": "none"}, SAME_LENGTH),
    "dr_grpo": ("llama", [digits], {"loss_type": "dr_grpo", "max_completion_length": 256}, SAME_LENGTH),
    "reward_none_half": ("llama", [digits_or_none], {}, SAME_LENGTH),
}

# two defects at once: each must be named, the causes above their symptoms
DOUBLE_DEFECTS = {
    "top_p+constant_reward": ("llama", [digits, always_one], {"top_p": 0.8}, SAME_LENGTH),
    "position_ids+short_completions": (
        "gpt2",
        [digits],
        {"disable_dropout": True, "max_completion_length": 4},
        MIXED_LENGTH,
    ),  # fmt: skip
    "attention_dropout+length_reward": ("qwen2-dropout", [longer], {}, SAME_LENGTH),
    "learning_rate+attention_dropout": (
        "qwen2-dropout",
        [digits],
        {"learning_rate": 0.1, "beta": 0.04, "max_steps": 3},
        SAME_LENGTH,
    ),  # fmt: skip
}

# nothing planted, and nothing may be said above info: other shapes of a clean run
CLEAN_RUNS = {
    "clean_gpt2_fixed": ("gpt2", [digits], {"disable_dropout": True, "_positions": True}, MIXED_LENGTH),
    "clean_lora": ("llama", [digits], {"_lora": True}, SAME_LENGTH),
    "clean_conversational": ("llama-chat", [digits], {}, [[{"role": "user", "content": p}] for p in SAME_LENGTH]),
}

# Nothing planted, other shapes of run a user brings: TRL's defaults on GPT-2 (its dropout stays on), a
# conversational run (message-list prompts through the chat template), two passes over micro-batches.
USER_RUNS = {
    "gpt2_defaults": ("gpt2", [digits], {}, SAME_LENGTH),
    "conversational": ("llama-chat", [digits], {}, [[{"role": "user", "content": p}] for p in SAME_LENGTH]),
    "two_passes": ("llama", [digits], {"num_iterations": 2, "gradient_accumulation_steps": 2}, SAME_LENGTH),
}


def train(defect: str, out: str) -> None:
    """One planted run, trained one step and its step captured in OUT/captures."""
    set_seed(42)  # every run starts where a fresh process would (GRPOConfig's seed), whatever ran before it
    model, reward_funcs, changes, prompts = {**DEFECTS, **DOUBLE_DEFECTS, **CLEAN_RUNS, **USER_RUNS}[defect]
    changes = dict(changes)
    lora, positions = changes.pop("_lora", False), changes.pop("_positions", False)
    args = GRPOConfig(
        **{
            "output_dir": out,
            "per_device_train_batch_size": 16,
            "num_generations": 4,
            "max_completion_length": 40,
            "max_steps": 1,
            "report_to": "none",
            "use_cpu": True,
            **changes,
        }
    )
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    trainer_class = GRPOTrainer
    if positions:
        from grpo_debug.capture.trl_bridge import PositionIdsGRPOTrainer as trainer_class
    trainer = trainer_class(
        model=model,
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": prompts * 2 * args.max_steps}),
        peft_config=peft_config,
    )
    trainer.add_callback(CaptureCallback(f"{out}/captures", steps=[args.max_steps]))
    trainer.train()


if __name__ == "__main__":
    pairs = sys.argv[1:]
    if not pairs or len(pairs) % 2:
        sys.exit("usage: python planted_train.py DEFECT OUT [DEFECT OUT ...]")
    for defect, out in zip(pairs[::2], pairs[1::2]):  # one process for many runs: its imports paid once
        print(f"planted run {defect}", file=sys.stderr, flush=True)
        train(defect, out)
