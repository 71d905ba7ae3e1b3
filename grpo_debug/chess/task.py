"""The step's prompt sets, named by what they are for and disjoint by construction.

  train       the prompts of the GRPO step: P: from `policy_prompts`, A: from the end of `env_eval`
  validation  the pool TracIn's separate validation sets are sampled from (random, top-k)
  test        held-out prompts for every reward measured after an update (phase 7, selection experiments)

`env_eval` and `policy_eval` are cut into fixed slices so that a number measured on `test` never saw a
validation or training prompt. `task` is 'policy' (P:), 'env' (A:) or 'mixed' (alternating P:, A:).
"""

from __future__ import annotations

from .data import env_example, load_split, policy_example

TASKS = ("policy", "env", "mixed")
PROMPT_SETS = ("train", "validation", "test")
TEST_SLICE = slice(0, 256)  # of policy_eval and env_eval
VALIDATION_SLICE = slice(256, 512)
TRAIN_ENV_FIRST = 512  # env_eval[512:] reversed are the A: training prompts


def _pools(prompt_set: str) -> tuple[list[str], list[str]]:
    if prompt_set == "train":
        policy = [policy_example(r)[0] for r in load_split("policy_prompts")]
        env = [env_example(r)[0] for r in load_split("env_eval")[TRAIN_ENV_FIRST:][::-1]]
    elif prompt_set in ("validation", "test"):
        part = VALIDATION_SLICE if prompt_set == "validation" else TEST_SLICE
        policy = [policy_example(r)[0] for r in load_split("policy_eval")[part]]
        env = [env_example(r)[0] for r in load_split("env_eval")[part]]
    else:
        raise ValueError(f"prompt set must be one of {PROMPT_SETS}, got {prompt_set!r}")
    return policy, env


def prompts(prompt_set: str, task: str, n: int) -> list[str]:
    """The first `n` prompts of `prompt_set` for `task` (mixed alternates P: and A:)."""
    policy, env = _pools(prompt_set)
    pools = {"policy": policy, "env": env, "mixed": [p for pair in zip(policy, env) for p in pair]}
    if task not in pools:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if not 0 < n <= len(pools[task]):
        raise ValueError(f"{n} {prompt_set} prompts asked for; the {task} {prompt_set} set has {len(pools[task])}")
    return pools[task][:n]
