"""The bundled chess task: disjoint named prompt sets, and the `rookworld` reward function as TRL calls it."""

import math

import pytest

from grpo_debug.chess.task import MODES, RookWorldReward, rookworld_prompts
from grpo_debug.task import PROMPT_SETS, load_task, task_names


def _all(prompt_set):
    return {mode: rookworld_prompts(prompt_set, mode, len(_pool_size(prompt_set, mode))) for mode in ("policy", "env")}


def _pool_size(prompt_set, mode):
    with pytest.raises(ValueError, match="set has") as e:
        rookworld_prompts(prompt_set, mode, 10**6)
    return range(int(str(e.value).rsplit(" ", 1)[1]))


def test_prompt_sets_are_disjoint_and_nonempty():
    sets = {name: set(p for mode_prompts in _all(name).values() for p in mode_prompts) for name in PROMPT_SETS}
    for name, values in sets.items():
        assert len(values) >= 64, name
    assert not sets["train"] & sets["validation"]
    assert not sets["train"] & sets["test"]
    assert not sets["validation"] & sets["test"]


def test_mixed_alternates_tasks_and_bad_arguments_are_named():
    mixed = rookworld_prompts("test", "mixed", 6)
    assert [p[:2] for p in mixed] == ["P:", "A:"] * 3
    assert mixed[0::2] == rookworld_prompts("test", "policy", 3) and mixed[1::2] == rookworld_prompts("test", "env", 3)
    with pytest.raises(ValueError, match="prompt set"):
        rookworld_prompts("holdout", "mixed", 2)
    with pytest.raises(ValueError, match="task"):
        rookworld_prompts("test", "chess", 2)
    with pytest.raises(ValueError, match="0 test prompts"):
        rookworld_prompts("test", "policy", 0)
    assert set(MODES) == {"policy", "env", "mixed"}


def test_registered_chess_tasks_give_the_same_prompts():
    assert {"policy", "env", "mixed"} <= set(task_names())
    for mode in MODES:
        task = load_task(mode)
        assert task.name == mode and load_task(mode) is task  # built once
        for prompt_set in PROMPT_SETS:
            assert task.prompts(prompt_set, 5) == rookworld_prompts(prompt_set, mode, 5)
    with pytest.raises(ValueError, match="holdout"):
        load_task("mixed").prompts("holdout", 2)
    with pytest.raises(ValueError, match="1000 train prompts"):
        load_task("policy").prompts("train", 1000)


def test_rookworld_reward_is_a_trl_reward_function_with_details(scorer):
    reward = RookWorldReward(scorer)
    prompts = load_task("mixed").prompts("test", 2)
    repeated = [prompts[0]] * 2 + [prompts[1]] * 2
    completions = ["M: e2e4 E: 0 B: e2e4", "garbage", "garbage", ""]
    totals = reward(prompts=repeated, completions=completions, completion_ids=None, trainer_state=None)
    assert totals == [scorer.score(p, c).total for p, c in zip(repeated, completions)]
    same, components, errors = reward.details(repeated, completions)
    assert same == totals and errors[1] and errors[3]
    assert list(components) == [
        "best_move",
        "candidates",
        "evals",
        "format",
        "fen",
        "reward",
        "terminated",
        "truncated",
    ]
    assert math.isnan(components["fen"][0]) and math.isnan(components["best_move"][2])
    assert components["format"] == [scorer.score(p, c).components["format"] for p, c in zip(repeated, completions)]
