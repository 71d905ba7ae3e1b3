"""A capture's rewards as a task: the stored values (`StoredReward`), or your own reward functions (`task=[f, g]`,
`task="my_rewards.py:funcs"`, or a registered task name), which can also score new completions; the captured texts
as the step shows them (`captured_texts`) and as it samples anew from them (`sampling_prompts`: the trainer's prompt
ids, a chat template's role markers included)."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

from ..rewards import StoredReward
from ..task import Task, callable_name, load_task, task_names
from .captured import Capture
from .columns import columns_by_prompt, trainer_keywords, with_columns, with_trainer_keywords


def task_name(capture: Capture) -> str:
    return f"capture:{capture.path.resolve()}"


def captured_texts(capture: Capture, tokenizer) -> tuple[list[str], list[str]]:
    """The B prompts and B*G completions as our rollout decodes them (special tokens removed). A completion is the
    text TRL gave the reward functions: under `mask_truncated_completions` TRL decodes before it masks, so a row
    whose mask it zeroed (no EOS: the whole row is the completion) is decoded whole, not as an empty string."""
    b, G = capture.batch, capture.meta["grpo_config"]["num_generations"]
    prompts = [
        tokenizer.decode(ids[m.bool()], skip_special_tokens=True)
        for ids, m in zip(b["prompt_ids"][::G], b["prompt_mask"][::G])
    ]
    completions = [
        tokenizer.decode(ids[m.bool()] if m.any() else ids, skip_special_tokens=True)
        for ids, m in zip(b["completion_ids"], b["completion_mask"])
    ]
    return prompts, completions


def sampling_prompts(capture: Capture, tokenizer, shown: list[str]) -> list[str]:
    """The B prompts as text the rollout's encoding (add_special_tokens=False) turns back into the trainer's prompt
    ids: each as `captured_texts` shows it where it does, else with special tokens kept (a chat template's role
    markers are special tokens, and without them a new completion would start from the bare question). Completions
    sampled anew start from the prompts the trainer sampled from."""
    b, G = capture.batch, capture.meta["grpo_config"]["num_generations"]
    texts = []
    for plain, ids, m in zip(shown, b["prompt_ids"][::G], b["prompt_mask"][::G]):
        ids = ids[m.bool()].tolist()
        same = tokenizer(plain, add_special_tokens=False)["input_ids"] == ids
        texts.append(plain if same else tokenizer.decode(ids, skip_special_tokens=False))
    return texts


def reward_functions(spec) -> list:
    """Your reward functions: a list of callables, or "file.py:name" naming one function or a list of them."""
    if callable(spec):
        return [spec]
    if isinstance(spec, (list, tuple)) and spec and all(callable(f) for f in spec):
        return list(spec)
    if isinstance(spec, str) and ".py:" in spec:
        file, _, name = spec.rpartition(":")
        if not Path(file).is_file():
            raise ValueError(f"task {spec!r}: no file {file}")
        from ..reward_process import functions

        return functions(file, name, f"task {spec!r}")  # imported once, in a process the command can stop
    raise ValueError(f"task must be a registered task name, a Task, reward functions or 'file.py:name', got {spec!r}")


def _as_messages(func, prompt_messages: dict[str, list]):
    """`func` called as TRL calls it in a conversational run: message lists, not strings."""

    def reward(prompts, completions, **kwargs):
        return func(
            prompts=[prompt_messages.get(p, [{"role": "user", "content": p}]) for p in prompts],
            completions=[[{"role": "assistant", "content": c}] for c in completions],
            **kwargs,
        )

    reward.__name__, reward.__wrapped__ = callable_name(func), func
    return reward


def captured_task(capture: Capture, tokenizer, rewards_from=None) -> Task:
    """The capture as a task: its train prompts are the captured prompts. Without `rewards_from` its reward
    functions replay the stored values (the captured completions only). With your task or reward functions, new
    completions (evaluation, validation sets) are rewarded too; a Task also brings its validation and test
    prompts. In a conversational capture, your functions get message lists, as TRL gave them."""
    prompts, completions = captured_texts(capture, tokenizer)
    anew = sampling_prompts(capture, tokenizer, prompts)
    names = list(capture.meta["rewards"])
    weights = [capture.meta["reward_weights"][name] for name in names]
    has_sets = isinstance(rewards_from, Task) or (isinstance(rewards_from, str) and ".py:" not in rewards_from)
    yours = _your_task(capture, rewards_from, anew, weights, shown=prompts)
    prompt_set = _prompt_sets(anew, yours, has_sets)
    if yours is None:
        funcs = tuple(_stored_rewards(capture, prompts, completions))
        return Task(task_name(capture), prompt_set, funcs, tuple(weights), held_out=False)
    theirs = list(yours.reward_weights or [1.0] * len(yours.reward_funcs))
    if list(yours.reward_names) != names or theirs != weights:
        raise ValueError(
            f"{yours.name!r} has the reward functions {list(yours.reward_names)} weighted {theirs}; "
            f"the captured run had {names} weighted {weights}: not the run's reward functions"
        )
    return Task(
        name=task_name(capture),
        prompts=prompt_set,
        reward_funcs=yours.reward_funcs,
        reward_weights=tuple(weights),
        held_out=has_sets and yours.held_out,
    )


def _your_task(
    capture: Capture, rewards_from, prompts: list[str], weights: list[float], shown: list[str]
) -> Task | None:
    """`rewards_from` as a Task: a registered task's name, a Task, or your reward functions (given message lists
    where the capture is conversational: the captured prompt's messages, whether the step shows it as `shown` or
    samples from it as `prompts`; and the dataset's columns the capture holds, as keywords); None without it."""
    if isinstance(rewards_from, str) and ".py:" not in rewards_from:
        try:
            return load_task(rewards_from)
        except ValueError:
            names = ", ".join(n for n in task_names() if not n.startswith("capture:"))
            raise ValueError(
                f"task {rewards_from!r} is neither a registered task ({names}) nor "
                "'file.py:NAME' naming your reward functions; pass the functions themselves "
                "(task=[f, g]) or register a Task (grpo_debug.task.register_task)"
            ) from None
    if isinstance(rewards_from, Task) or rewards_from is None:
        return rewards_from
    funcs = reward_functions(rewards_from)
    G = capture.meta["grpo_config"]["num_generations"]
    if capture.conversational:
        messages = {p: capture.meta["prompts"][i * G] for texts in (prompts, shown) for i, p in enumerate(texts)}
        funcs = [_as_messages(f, messages) for f in funcs]
    config = capture.meta["grpo_config"]
    keywords = trainer_keywords(int(capture.meta["step"]), config.get("max_steps"))
    funcs = [with_trainer_keywords(f, keywords) for f in funcs]
    columns = capture.meta.get("columns") or {}
    if columns:  # the dataset's columns, as TRL passes them: looked up by the prompt each completion answers
        by_prompt = columns_by_prompt(columns, [[a, b] for a, b in zip(prompts, shown)], G)
        funcs = [with_columns(f, by_prompt, list(columns)) for f in funcs]
    return Task(
        name="your reward functions",
        prompts=lambda s, n: prompts[:n],
        reward_funcs=tuple(funcs),
        reward_weights=tuple(weights),
    )


def _prompt_sets(prompts: list[str], yours: Task | None, has_sets: bool):
    """The captured task's prompt sets: the captured train prompts, your task's other sets where it has them,
    the train prompts repeated (said once) for your reward functions alone, else a clear refusal."""
    told = []

    def prompt_set(name: str, n: int) -> list[str]:
        if name == "train" and n <= len(prompts):
            return prompts[:n]
        if has_sets and name != "train":
            return yours.prompts(name, n)
        if yours is not None and name != "train":  # your reward functions, no prompt sets of yours
            if not told:
                told.append(name)
                warnings.warn(
                    f"the capture has no {name} prompts of its own: new completions are sampled on its "
                    f"{len(prompts)} train prompts, repeated (open it with a Task for separate sets)",
                    stacklevel=2,
                )
            return [prompts[i % len(prompts)] for i in range(n)]
        raise ValueError(
            f"a capture holds its own {len(prompts)} train prompts only, not {n} {name!r} prompts: to "
            "sample new completions on other prompts, open it with a task that has them, "
            "open_capture(path, task=NAME)"
        )

    return prompt_set


def _stored_rewards(capture: Capture, prompts: list[str], completions: list[str]) -> list[StoredReward]:
    """One reward function per captured reward, replaying its stored value of each (prompt, completion)."""
    G = capture.meta["grpo_config"]["num_generations"]
    funcs = []
    for name, values in capture.meta["rewards"].items():
        table = {
            (prompts[i // G], c): (None if v is None or (isinstance(v, float) and math.isnan(v)) else v)
            for i, (c, v) in enumerate(zip(completions, values))
        }
        funcs.append(StoredReward(name, table))
    return funcs
