"""RookWorld as a grpo-debug task: the prompt sets and the `rookworld` reward function.

Prompt sets, named by what they are for and disjoint by construction:
  train       the prompts of the GRPO step: P: from `policy_prompts`, A: from the end of `env_eval`
  validation  the pool TracIn's separate validation sets are sampled from (random, top-k)
  test        held-out prompts for every reward measured after an update (phase 7, selection experiments)
`env_eval` and `policy_eval` are cut into fixed slices so that a number measured on `test` never saw a
validation or training prompt. The mode is 'policy' (P:), 'env' (A:) or 'mixed' (alternating P:, A:);
each is a registered task of that name (`grpo_debug.task`).

The reward: one function, `rookworld`, the total of `rewards.RewardScorer` (P: and A: prompts alike), with
every component of the score in its `details` (best_move, candidates, evals, format for P:; fen,
reward, terminated, truncated, format for A:; NaN where a component is the other task's).
"""

from __future__ import annotations

import functools

from ..task import PROMPT_SETS, Task
from .data import env_example, load_split, policy_example
from .rewards import RewardScorer

MODES = ("policy", "env", "mixed")
TEST_SLICE = slice(0, 256)  # of policy_eval and env_eval
VALIDATION_SLICE = slice(256, 512)
TRAIN_ENV_FIRST = 512  # env_eval[512:] reversed are the A: training prompts


@functools.cache
def _pools(prompt_set: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if prompt_set == "train":
        policy = [policy_example(r)[0] for r in load_split("policy_prompts")]
        env = [env_example(r)[0] for r in load_split("env_eval")[TRAIN_ENV_FIRST:][::-1]]
    elif prompt_set in ("validation", "test"):
        part = VALIDATION_SLICE if prompt_set == "validation" else TEST_SLICE
        policy = [policy_example(r)[0] for r in load_split("policy_eval")[part]]
        env = [env_example(r)[0] for r in load_split("env_eval")[part]]
    else:
        raise ValueError(f"prompt set must be one of {PROMPT_SETS}, got {prompt_set!r}")
    return tuple(policy), tuple(env)


def rookworld_prompts(prompt_set: str, mode: str, n: int) -> list[str]:
    """The first `n` prompts of `prompt_set` for `mode` (mixed alternates P: and A:)."""
    policy, env = _pools(prompt_set)
    pools = {"policy": policy, "env": env, "mixed": tuple(p for pair in zip(policy, env) for p in pair)}
    if mode not in pools:
        raise ValueError(f"task must be one of {MODES}, got {mode!r}")
    if not 0 < n <= len(pools[mode]):
        raise ValueError(f"{n} {prompt_set} prompts asked for; the {mode} {prompt_set} set has {len(pools[mode])}")
    return list(pools[mode][:n])


class RookWorldReward:
    """A TRL reward function, `f(prompts, completions, **kwargs) -> list[float]`: the RookWorld total reward
    of each completion, with one ground-truth lookup per distinct prompt (`RewardScorer.score_group`)."""

    __name__ = "rookworld"  # TRL's name for it: rewards/rookworld/mean

    def __init__(self, scorer: RewardScorer | None = None):
        self._scorer = scorer

    @property
    def scorer(self) -> RewardScorer:
        if self._scorer is None:
            self._scorer = bundled_scorer()
        return self._scorer

    def __call__(self, prompts: list[str], completions: list[str], **kwargs) -> list[float]:
        return self.details(prompts, completions)[0]

    def details(self, prompts: list[str], completions: list[str]):
        """(totals, components {name: one value per completion, NaN where it does not apply}, errors)."""
        scores = [None] * len(completions)
        for prompt in dict.fromkeys(prompts):
            rows = [i for i, p in enumerate(prompts) if p == prompt]
            for i, score in zip(rows, self.scorer.score_group(prompt, [completions[i] for i in rows])):
                scores[i] = score
        names = list(dict.fromkeys(name for s in scores for name in s.components))
        components = {name: [s.components.get(name, float("nan")) for s in scores] for name in names}
        return [s.total for s in scores], components, [s.error for s in scores]


@functools.cache
def bundled_scorer() -> RewardScorer:
    """One scorer over the bundled ground truth, shared by the three chess tasks (live analyses cached once)."""
    return RewardScorer.bundled()


def rookworld_task(mode: str = "mixed", scorer: RewardScorer | None = None) -> Task:
    """The chess task of `mode`; `scorer` defaults to the shared bundled one."""
    if mode not in MODES:
        raise ValueError(f"task must be one of {MODES}, got {mode!r}")

    def prompts(prompt_set: str, n: int) -> list[str]:
        return rookworld_prompts(prompt_set, mode, n)

    return Task(name=mode, prompts=prompts, reward_funcs=(RookWorldReward(scorer),))


def rookworld_task_policy() -> Task:
    return rookworld_task("policy")


def rookworld_task_env() -> Task:
    return rookworld_task("env")


def rookworld_task_mixed() -> Task:
    return rookworld_task("mixed")
