"""Checked exercises for the student's path, as CS336's assignment checks its GRPO helpers: the student writes a
function in a notebook cell, and a checker calls it on random and edge-case inputs, compares it with the library's
and says in one sentence what is wrong.

    check_advantages(group_advantages)          # 04: rewards (B*G,), G -> advantages (B*G,)
    check_clipped_objective(clipped_objective)  # 05: per-token loss of the clipped objective with its KL term
    check_normaliser(grpo_normaliser)           # 05: per-token losses and the mask -> TRL's "grpo" loss
    check_grpo_step(grpo_step)                  # 06: sample, score, advantages, loss, backward, AdamW
    run_student_loop(grpo_step)                 # 06: that step as a loop on 4 prompts, per seed; a t interval

Each returns a line saying what it checked where the function passes, and raises `ExerciseFailed` (an
AssertionError) with the first problem found where it does not. The stored notebooks hold solutions; `make
exercises` writes copies with each solution cell emptied (`tests/test_exercises.py` shows every checker rejects a
typical wrong answer with its sentence and accepts the solution).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .advantages import compute_advantages
from .loss import per_token_kl

TOLERANCE = 1e-5


class ExerciseFailed(AssertionError):
    """A student's function that does not do what the exercise asks: the message says what, in a sentence."""


def _close(mine: torch.Tensor, reference: torch.Tensor) -> bool:
    return mine.shape == reference.shape and bool(torch.allclose(mine, reference, atol=TOLERANCE, rtol=TOLERANCE))


def _called(fn, what: str, *args) -> torch.Tensor:
    try:
        out = fn(*args)
    except NotImplementedError:
        raise ExerciseFailed(f"{what}: not written yet (it raises NotImplementedError)") from None
    if not isinstance(out, torch.Tensor):
        raise ExerciseFailed(f"{what} returned {type(out).__name__}, not a torch.Tensor")
    return out.detach().float()


# ---------------------------------------------------------------- 04: the group advantage


def advantage_cases(seed: int = 0) -> list[tuple[str, torch.Tensor, int]]:
    """(what, rewards, G): a group whose rewards are all equal, random groups, a clean +-1 group, G = 2."""
    g = torch.Generator().manual_seed(seed)
    return [
        ("a group whose 4 rewards are equal, beside one that varies", torch.tensor([1.0, 1, 1, 1, 0, 1, 0, 1]), 4),
        ("4 random groups of 8", torch.randn(32, generator=g), 8),
        ("a clean +-1 group", torch.tensor([1.0, -1, 1, -1]), 4),
        ("rewards in the thousands, G = 2", 1000 * torch.randn(6, generator=g), 2),
    ]


def check_advantages(fn) -> str:
    """`fn(rewards, G)`: each reward minus its group's mean, divided by its group's std (torch's default, n - 1)
    plus 1e-4, as TRL's default scale_rewards="group"."""
    for what, rewards, G in advantage_cases():
        mine = _called(fn, f"your function on {what}", rewards.clone(), G)
        reference = compute_advantages(rewards, G)
        if mine.shape != reference.shape:
            raise ExerciseFailed(
                f"on {what} your advantages have shape {tuple(mine.shape)}, not {tuple(rewards.shape)}"
            )
        if not torch.isfinite(mine).all():
            raise ExerciseFailed(f"on {what} your advantages are not all finite: a group of equal rewards has std 0; "
                                 "add 1e-4 to the std, as TRL does")  # fmt: skip
        if _close(mine, reference):
            continue
        grouped = mine.view(-1, G)
        if grouped.mean(1).abs().max() > 1e-4:
            raise ExerciseFailed(f"on {what} your advantages are not zero-mean within a group: did you subtract each "
                                 "group's own mean (rewards.view(-1, G).mean(1)), not the batch's?")  # fmt: skip
        centred = rewards.view(-1, G) - rewards.view(-1, G).mean(1, keepdim=True)
        population = (centred / (rewards.view(-1, G).std(1, unbiased=False, keepdim=True) + 1e-4)).flatten()
        if _close(mine, population):
            raise ExerciseFailed(f"on {what} you divided by the population std (n); TRL divides by torch's default "
                                 "std, with n - 1 (unbiased)")  # fmt: skip
        if _close(mine, (centred / rewards.view(-1, G).std(1, keepdim=True)).flatten()):
            raise ExerciseFailed(f"on {what} you divided by the std alone: add 1e-4 to it, as TRL does (a group of "
                                 "equal rewards has std 0)")  # fmt: skip
        if _close(mine, centred.flatten()):
            raise ExerciseFailed(f"on {what} your advantages are centred but not scaled: divide by the group's std "
                                 "plus 1e-4 (scale_rewards='none' is Dr. GRPO's choice, not TRL's default)")  # fmt: skip
        raise ExerciseFailed(f"on {what} your advantages differ from TRL's by up to "
                             f"{(mine - reference).abs().max():.3g}: (r - group mean) / (group std + 1e-4)")  # fmt: skip
    return "check_advantages: passed (random groups, a group of equal rewards, a clean +-1 group, G = 2)"


# ---------------------------------------------------------------- 05: the clipped objective and its KL term


def objective_cases(seed: int = 0) -> list[tuple[str, dict]]:
    """(what, inputs): tokens with ratios on both sides of the clip for A > 0 and A < 0, and beta 0 and > 0."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(4, 6, generator=g) * 3
    shift = torch.tensor([-0.5, -0.25, -0.1, 0.0, 0.1, 0.5])  # ratios from 0.61 to 1.65: both sides of [0.8, 1.2]
    ref = old + 0.1 * torch.randn(4, 6, generator=g)
    A = torch.tensor([[1.5], [-1.5], [0.5], [-0.5]])
    base = dict(logps=old + shift, old_logps=old, advantages=A, ref_logps=ref, epsilon=0.2, beta=0.04)
    return [
        ("ratios on both sides of the clip, A > 0 and A < 0, beta 0.04", base),
        ("the same without the KL term (beta 0)", {**base, "beta": 0.0}),
        ("the ratio exactly 1 (on-policy)", {**base, "logps": old.clone()}),
    ]


def clipped_objective_reference(logps, old_logps, advantages, ref_logps, epsilon: float, beta: float) -> torch.Tensor:
    """(N, C) the per-token loss: -min(r A, clip(r, 1 - eps, 1 + eps) A) + beta k3, r = exp(logp - logp_old)."""
    ratio = torch.exp(logps - old_logps)
    policy = -torch.min(ratio * advantages, torch.clamp(ratio, 1 - epsilon, 1 + epsilon) * advantages)
    return policy + beta * per_token_kl(logps, ref_logps, estimator="k3")


def check_clipped_objective(fn) -> str:
    """`fn(logps, old_logps, advantages, ref_logps, epsilon, beta)` -> (N, C) the per-token loss to minimise."""
    for what, inputs in objective_cases():
        mine = _called(
            fn, f"your objective on {what}", *(v.clone() if torch.is_tensor(v) else v for v in inputs.values())
        )
        reference = clipped_objective_reference(**inputs)
        if _close(mine, reference):
            continue
        if _close(mine, -reference):
            raise ExerciseFailed(f"on {what} your loss has the wrong sign: the objective is maximised, so the loss "
                                 "to minimise is its negative")  # fmt: skip
        unclipped = -torch.exp(inputs["logps"] - inputs["old_logps"]) * inputs["advantages"] + inputs[
            "beta"
        ] * per_token_kl(inputs["logps"], inputs["ref_logps"], estimator="k3")
        if _close(mine, unclipped):
            raise ExerciseFailed(f"on {what} your loss is not clipped: take min(r A, clip(r, 1 - eps, 1 + eps) A)")
        no_kl = clipped_objective_reference(**{**inputs, "beta": 0.0})
        if inputs["beta"] and _close(mine, no_kl):
            raise ExerciseFailed(f"on {what} your loss leaves out the KL term: add beta * k3, k3 = exp(ref - logp) - "
                                 "(ref - logp) - 1")  # fmt: skip
        ratio = torch.exp(inputs["logps"] - inputs["old_logps"])
        clipped_max = -torch.max(ratio * inputs["advantages"], torch.clamp(ratio, 0.8, 1.2) * inputs["advantages"])
        if _close(mine - (reference - no_kl), clipped_max):
            raise ExerciseFailed(f"on {what} you took the max of the two terms: the clipped objective is the min "
                                 "(the pessimistic bound), which for A < 0 stops a ratio from falling below 1 - eps")  # fmt: skip
        worst = (mine - reference).abs().max() if mine.shape == reference.shape else float("nan")
        raise ExerciseFailed(f"on {what} your per-token loss differs from the clipped objective's by up to {worst:.3g}"
                             f" (shape {tuple(mine.shape)}, expected {tuple(reference.shape)})")  # fmt: skip
    return "check_clipped_objective: passed (both sides of the clip for A > 0 and A < 0, beta 0 and 0.04, ratio 1)"


# ---------------------------------------------------------------- 05: one normaliser


def normaliser_cases(seed: int = 0) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    losses = torch.randn(4, 6, generator=g)
    lengths = torch.tensor([6, 3, 1, 5])
    mask = (torch.arange(6)[None] < lengths[:, None]).float()
    return [
        ("completions of 6, 3, 1 and 5 tokens", losses, mask),
        ("the padding holding large values the mask must hide", losses + 100 * (1 - mask), mask),
    ]


def grpo_normaliser_reference(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """TRL's loss_type="grpo": each completion's mean over its own tokens, then the mean over completions."""
    return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()


def check_normaliser(fn) -> str:
    """`fn(per_token (N, C), mask (N, C))` -> the scalar loss of TRL's loss_type="grpo"."""
    for what, losses, mask in normaliser_cases():
        mine = _called(fn, f"your normaliser on {what}", losses.clone(), mask.clone())
        reference = grpo_normaliser_reference(losses, mask)
        if mine.numel() != 1:
            raise ExerciseFailed(f"on {what} your loss has shape {tuple(mine.shape)}: it is one number")
        mine = mine.reshape(())
        if _close(mine, reference):
            continue
        if _close(mine, (losses * mask).sum() / mask.sum()):
            raise ExerciseFailed(f"on {what} you divided by all the batch's tokens at once (that is 'bnpo'/'dapo'): "
                                 "'grpo' averages each completion over its own tokens first")  # fmt: skip
        if _close(mine, losses.mean(-1).mean()):
            raise ExerciseFailed(f"on {what} your mean counts the padding: multiply by the mask and divide by each "
                                 "completion's own token count")  # fmt: skip
        raise ExerciseFailed(
            f"on {what} your loss is {mine.item():.6g}, the 'grpo' normaliser's {reference.item():.6g}"
        )
    return "check_normaliser: passed (completions of other lengths, padding the mask must hide)"


# ---------------------------------------------------------------- 06: one GRPO step in plain torch

STEP_PROMPTS = ("P: 8/8/8/8/8/8/8/K6 w - - 0 1 M: ", "P: k7/8/8/8/8/8/8/7K b - - 0 1 M: ")  # two lengths: padded


def tiny_policy(seed: int = 0):
    """(model, tokenizer): a 1-layer GPT-2 of width 32, random weights, on the bundled model's tokenizer."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    from .files import DEFAULT_MODEL_DIR

    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR)
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=128, n_embd=32, n_layer=1, n_head=2,
                        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                        pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    return GPT2LMHeadModel(config).eval(), tokenizer


def completion_mean_logps(model, tokenizer, prompts: list[str], completions: list[str], temperature: float):
    """(N,) each completion's mean token log-prob given its prompt, at `temperature` (0 for an empty completion)."""
    out = []
    with torch.no_grad():
        for prompt, completion in zip(prompts, completions):
            p, c = tokenizer(prompt)["input_ids"], tokenizer(completion)["input_ids"]
            if not c:
                out.append(0.0)
                continue
            logits = model(torch.tensor([p + c])).logits[0, len(p) - 1 : -1] / temperature
            out.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(c)[:, None]).mean().item())
    return torch.tensor(out)


def _step_called(fn, what: str, reward, G: int, seed: int):
    """The student's step run once on a fresh tiny policy with `reward(prompt, completion)`: (model before,
    model after, what the reward function saw (prompts, completions), what it returned, what `fn` returned)."""
    import copy

    model, tokenizer = tiny_policy(seed)
    before = copy.deepcopy(model)
    seen: dict[str, list] = {}

    def reward_fn(prompts, completions, **kwargs):
        seen["prompts"], seen["completions"] = list(prompts), list(completions)
        seen["returned"] = [reward(p, c) for p, c in zip(prompts, completions)]
        return list(seen["returned"])

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    torch.manual_seed(seed)
    rewards = _called(fn, what, model, tokenizer, optimizer, list(STEP_PROMPTS), reward_fn, G, 1.0, 8)
    return before, model, tokenizer, seen, rewards


def _moved(before, after) -> float:
    return max((a - b).abs().max().item() for a, b in zip(after.parameters(), before.parameters()))


def check_grpo_step(fn) -> str:
    """`fn(model, tokenizer, optimizer, prompts, reward_fn, G, temperature, max_new_tokens)` -> the (B*G,) rewards,
    after one on-policy GRPO step (no KL term): sample G completions per prompt, score them with `reward_fn` (TRL's
    calling convention), group advantages, the loss, backward, `optimizer.step()`. Checked on a tiny random GPT-2:
    the reward function's arguments, groups of equal rewards (no move), and the step's direction."""
    G = 4
    first = STEP_PROMPTS[0]
    what = "your step, with every group's rewards equal (1 in one group, 0 in the other)"
    before, after, _, seen, rewards = _step_called(fn, what, lambda p, c: float(p == first), G, seed=0)
    if "prompts" not in seen:
        raise ExerciseFailed("your step never called reward_fn: score the completions with reward_fn(prompts, "
                             "completions)")  # fmt: skip
    expected = [p for p in STEP_PROMPTS for _ in range(G)]
    if len(seen["completions"]) != len(expected):
        raise ExerciseFailed(f"your reward function got {len(seen['completions'])} completions: it scores B x G = "
                             f"{len(expected)}, G for each prompt")  # fmt: skip
    if seen["prompts"] != expected:
        raise ExerciseFailed("the prompts your reward function got are not each prompt repeated G times in a row: "
                             "generate's num_return_sequences puts a prompt's G completions next to each other")  # fmt: skip
    if not all(isinstance(c, str) for c in seen["completions"]):
        raise ExerciseFailed("your reward function got token ids, not texts: decode the completions "
                             "(tokenizer.batch_decode(..., skip_special_tokens=True))")  # fmt: skip
    returned = torch.tensor(seen["returned"])
    if rewards.shape != returned.shape or not torch.equal(rewards, returned):
        raise ExerciseFailed(f"your step returned {tuple(rewards.shape)} values that are not the rewards "
                             f"reward_fn gave ({tuple(returned.shape)})")  # fmt: skip
    if (moved := _moved(before, after)) != 0:
        raise ExerciseFailed(f"{what}, moved a weight by {moved:.3g}: a group whose rewards are all equal carries no "
                             "signal, so its advantages are 0 (did you subtract each group's own mean?), and with "
                             "no KL term nothing else sends a gradient")  # fmt: skip
    what = "your step, with a reward that varies within each group (a completion's length in characters)"
    before, after, tokenizer, seen, rewards = _step_called(fn, what, lambda p, c: float(len(c)), G, seed=1)
    if _moved(before, after) == 0:
        raise ExerciseFailed(f"{what}, moved no weight: call loss.backward() and then optimizer.step()")
    advantages = compute_advantages(rewards, G)
    change = [completion_mean_logps(m, tokenizer, seen["prompts"], seen["completions"], 1.0) for m in (before, after)]
    pushed = float((advantages * (change[1] - change[0])).sum())
    if pushed <= 0:
        raise ExerciseFailed(f"{what}: the step lowered the log-probability of the completions with a positive "
                             f"advantage against the others (sum of A x its change {pushed:+.3g}); the loss to "
                             "minimise is -A x ratio, whose gradient is -A grad log pi")  # fmt: skip
    return ("check_grpo_step: passed (B x G completions scored in groups, equal rewards move nothing, the step "
            "raises the log-probability of completions with a positive advantage)")  # fmt: skip


# ---------------------------------------------------------------- 06: the student's step, run as a loop


def summed_reward(task):
    """The task's reward functions as one TRL-style `reward_fn(prompts, completions)` -> list[float]: each
    function's score times its weight, summed as TRL sums them (a None score, a function that does not apply,
    left out)."""

    def reward_fn(prompts, completions, **kwargs):
        scores = [f(prompts=prompts, completions=completions) for f in task.reward_funcs]
        return [sum(w * s for w, s in zip(task.weights, row) if s is not None) for row in zip(*scores)]

    return reward_fn


@dataclass(frozen=True)
class StudentLoop:
    """`run_student_loop`'s result: per seed, the mean reward on the loop's prompts before and after its steps."""

    steps: int
    lr: float
    start: list[float]
    end: list[float]

    @property
    def change(self) -> list[float]:
        return [e - s for s, e in zip(self.start, self.end)]

    @property
    def ci(self) -> tuple[float, float]:
        """The 95% t interval of the mean change over the seeds (the seed is the unit); the mean itself where every
        seed changed alike."""
        import numpy as np
        import scipy.stats

        mean, sem = np.mean(self.change), scipy.stats.sem(self.change)
        return (mean, mean) if sem == 0 else scipy.stats.t.interval(0.95, len(self.change) - 1, loc=mean, scale=sem)

    def summary(self) -> str:
        import numpy as np

        low, high = self.ci
        return (f"change over {len(self.change)} seeds: {np.mean(self.change):+.2f}, 95% t interval [{low:+.2f}, "
                f"{high:+.2f}]: {'above 0, your loop learns' if low > 0 else 'not above 0'}")  # fmt: skip


def run_student_loop(grpo_step, steps: int = 6, seeds: int = 4, lr: float = 1e-3, *, prompts: int = 4,
                     samples: int = 16, G: int = 8, temperature: float = 0.7, max_new_tokens: int = 40,
                     task="policy", load=None, show: bool = True) -> StudentLoop:  # fmt: skip
    """The student's `grpo_step` run `steps` times from the model's start with AdamW at `lr`, on the first
    `prompts` training prompts of `task` (a Task or a registered name), once per seed (seeds 0..seeds-1, each from a fresh model). Before and
    after, the mean reward (`summed_reward`) of `samples` completions per prompt, sampled at `temperature` with
    seed 10_000 + seed: the same draws before and after. `load()` -> (model, tokenizer), a fresh model in eval mode
    (None: the bundled model). With `show`, a line per seed as it ends, then `StudentLoop.summary`. Raises
    ExerciseFailed where the step is not written or does not return the B x G rewards."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .files import DEFAULT_MODEL
    from .task import as_task

    the_task = as_task(task)
    loop_prompts = the_task.prompts("train", prompts)
    reward_fn = summed_reward(the_task)
    if load is None:
        tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL)

        def load():
            return AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL).eval(), tokenizer  # eval: dropout off (02)

    def reward_on_the_prompts(model, tokenizer, seed: int) -> float:
        torch.manual_seed(seed)
        enc = tokenizer(loop_prompts, return_tensors="pt", padding=True)
        with torch.no_grad():
            seqs = model.generate(**enc, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                                  max_new_tokens=max_new_tokens, num_return_sequences=samples,
                                  pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        texts = tokenizer.batch_decode(seqs[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        return sum(reward_fn([p for p in loop_prompts for _ in range(samples)], texts)) / len(texts)

    start, end = [], []
    for seed in range(seeds):
        model, tokenizer = load()
        start.append(reward_on_the_prompts(model, tokenizer, 10_000 + seed))
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        torch.manual_seed(seed)
        for _ in range(steps):
            rewards = _called(grpo_step, "your step", model, tokenizer, optimizer, loop_prompts, reward_fn, G,
                              temperature, max_new_tokens)  # fmt: skip
            if rewards.shape != (len(loop_prompts) * G,):
                raise ExerciseFailed(f"your step returned shape {tuple(rewards.shape)}: it returns the B x G = "
                                     f"{len(loop_prompts) * G} rewards")  # fmt: skip
        end.append(reward_on_the_prompts(model, tokenizer, 10_000 + seed))
        if show:
            print(f"seed {seed}: reward on the {len(loop_prompts)} prompts {start[-1]:+.2f} -> "
                  f"{end[-1]:+.2f} after {steps} steps", flush=True)  # fmt: skip
    loop = StudentLoop(steps, lr, start, end)
    if show:
        print(loop.summary())
    return loop


# ---------------------------------------------------------------- the student's copies


def emptied(source: str) -> str:
    """A solution cell's code with each top-level function's body replaced by `raise NotImplementedError` (its
    signature and docstring kept): what the student starts from."""
    import ast

    tree = ast.parse(source)
    lines = source.splitlines()
    out, last = [], 0
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        first = node.body[0]
        keep_to = first.end_lineno if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) else None
        body_start = keep_to if keep_to is not None else first.lineno - 1
        indent = " " * (first.col_offset)
        out += lines[last:body_start]
        out.append(f'{indent}raise NotImplementedError("your code here")')
        last = node.end_lineno
    out += lines[last:]
    return "\n".join(out) + ("\n" if source.endswith("\n") else "")


def student_copy(notebook: str, folder: str) -> str:
    """`notebook` (.ipynb) written into `folder` with every cell tagged "solution" emptied (`emptied`) and every
    output cleared; the copy's path."""
    import json
    from pathlib import Path

    nb = json.loads(Path(notebook).read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        cell["outputs"], cell["execution_count"] = [], None
        if "solution" in cell.get("metadata", {}).get("tags", []):
            cell["source"] = emptied("".join(cell["source"])).splitlines(keepends=True)
    out = Path(folder) / Path(notebook).name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return str(out)


if __name__ == "__main__":  # `make exercises`: python -m grpo_debug.exercises OUT_FOLDER NOTEBOOK.ipynb ...
    import sys

    for path in sys.argv[2:]:
        print(student_copy(path, sys.argv[1]))
