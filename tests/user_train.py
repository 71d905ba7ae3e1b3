"""A user's own GRPO script, as the README's "Debug your own TRL run" has it: a plain GRPOConfig (TRL's defaults
but for the batch shape), a model in a relative folder, two reward functions of their own, and the capture.

    python user_train.py OUT LOGGING_STEPS '{"num_iterations": 2, ...}'   (GRPOConfig changes, JSON)

`model` (a folder), `capture` (the steps; null: the same script without the callback, grpo_debug not
imported), `optimizer_state` (the callback's, default true), `chat` (message-list prompts), `mixed_lengths` (prompts of
different lengths, so left padding), `train_only` (a piece of a parameter name: the model is loaded by the script and
every other parameter frozen before the trainer is built), `answer_column` (the dataset holds each prompt's
`answer`, and a third reward, `correct`, reads it as TRL passes it), `judged` (the second reward a judge's noisy
score), `staged` (the second a curriculum reading TRL's trainer_state) and `flight` (the FlightRecorder records the
run instead of CaptureCallback) are read from the JSON too.
"""

import json
import sys

from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer


def text(completion) -> str:
    """A completion as TRL passes it: a string, or in a conversational run a list of messages."""
    return completion if isinstance(completion, str) else completion[-1]["content"]


def digits(completions, **kwargs):
    return [sum(ch.isdigit() for ch in text(c)) / max(len(text(c)), 1) for c in completions]


def short(completions, **kwargs):
    return [-len(text(c)) / 16 for c in completions]


def correct(prompts, completions, answer, **kwargs):
    """TRL's documented pattern: a dataset column arrives as a keyword, one value per completion."""
    return [float(str(a) in text(c)) for c, a in zip(completions, answer)]


def judged(completions, **kwargs):
    """A judge sampled at a temperature, as an API-based reward often is: each score partly chance."""
    import random

    return [sum(ch.isdigit() for ch in text(c)) / max(len(text(c)), 1) + random.random() for c in completions]


def staged(completions, trainer_state, log_metric, **kwargs):
    """A curriculum: shortness pays more as the run goes on (TRL passes its TrainerState and a metric logger)."""
    log_metric("staged/step", trainer_state.global_step)
    return [-(1 + trainer_state.global_step) * len(text(c)) / 16 for c in completions]


def rarely(completions, **kwargs):
    """A reward that answers for about one completion in sixteen, by the text alone (a parser that fails on most,
    returning None for them)."""
    import zlib

    return [sum(ch.isdigit() for ch in text(c)) / max(len(text(c)), 1) if zlib.crc32(text(c).encode()) % 16 == 0
            else None for c in completions]  # fmt: skip


REWARD_FUNCS = [digits, short]
RARELY_REWARD_FUNCS = [rarely]  # with `rarely`
STAGED_REWARD_FUNCS = [digits, staged]  # with `staged`
JUDGED_REWARD_FUNCS = [digits, judged]  # with `judged`
COLUMN_REWARD_FUNCS = [digits, short, correct]  # with `answer_column`

if __name__ == "__main__":
    out, logging_steps = sys.argv[1], int(sys.argv[2])
    changes = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    model = changes.pop("model", "my-model")
    steps = changes.pop("capture", [2])
    flight = changes.pop("flight", False)
    optimizer_state = changes.pop("optimizer_state", True)
    pairs = [(1, 2), (3, 4), (5, 6), (7, 1), (2, 2), (9, 0), (4, 4), (6, 3)]
    if changes.pop("mixed_lengths", False):  # every prompt of its own length: TRL left-pads the shorter ones
        pairs = [(1, 2), (13, 4), (15, 61), (7, 1001), (222, 444), (9, 100000), (4444, 4444), (66666, 3333)]
    prompts = [f"What is {a}+{b}? " for a, b in pairs]
    columns = {"prompt": prompts}
    reward_funcs = list(REWARD_FUNCS)
    if changes.pop("answer_column", False):
        columns["answer"] = [a + b for a, b in pairs]
        reward_funcs = list(COLUMN_REWARD_FUNCS)
    if changes.pop("judged", False):
        reward_funcs = list(JUDGED_REWARD_FUNCS)
    if changes.pop("staged", False):
        reward_funcs = list(STAGED_REWARD_FUNCS)
    if changes.pop("rarely", False):
        reward_funcs = list(RARELY_REWARD_FUNCS)
    train_only = changes.pop("train_only", None)
    if train_only is not None:  # part of the model trains: the rest frozen before the trainer is built
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model)
        for name, param in model.named_parameters():
            param.requires_grad = train_only in name
    if changes.pop("chat", False):  # a conversational dataset: the tokenizer's chat template applies
        columns["prompt"] = [[{"role": "user", "content": p}] for p in prompts]
    args = GRPOConfig(
        output_dir=out,
        per_device_train_batch_size=changes.pop("per_device_train_batch_size", 4),
        num_generations=4,
        max_completion_length=16,
        max_steps=changes.pop("max_steps", 2),
        report_to="none",
        use_cpu=True,
        logging_steps=logging_steps,
        **changes,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=reward_funcs, args=args, train_dataset=Dataset.from_dict(columns))
    if flight:  # the flight recorder instead: health every step, the steps that trigger captured
        from grpo_debug.capture import FlightRecorder

        trainer.add_callback(FlightRecorder(f"{out}/captures"))
    elif steps is not None:
        from grpo_debug.capture import CaptureCallback

        trainer.add_callback(CaptureCallback(f"{out}/captures", steps=steps, optimizer_state=optimizer_state))
    trainer.train()
    with open(f"{out}/log_history.json", "w") as f:
        json.dump(trainer.state.log_history, f, indent=1)
