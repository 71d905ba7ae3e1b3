import pytest

from grpo_debug.prompts import PROMPT_SETS, TASKS, prompts


def _all(prompt_set):
    return {task: prompts(prompt_set, task, len(_pool_size(prompt_set, task))) for task in ("policy", "env")}


def _pool_size(prompt_set, task):
    with pytest.raises(ValueError, match="set has") as e:
        prompts(prompt_set, task, 10**6)
    return range(int(str(e.value).rsplit(" ", 1)[1]))


def test_prompt_sets_are_disjoint_and_nonempty():
    sets = {name: set(p for task_prompts in _all(name).values() for p in task_prompts) for name in PROMPT_SETS}
    for name, values in sets.items():
        assert len(values) >= 64, name
    assert not sets["train"] & sets["validation"]
    assert not sets["train"] & sets["test"]
    assert not sets["validation"] & sets["test"]


def test_mixed_alternates_tasks_and_bad_arguments_are_named():
    mixed = prompts("test", "mixed", 6)
    assert [p[:2] for p in mixed] == ["P:", "A:"] * 3
    assert mixed[0::2] == prompts("test", "policy", 3) and mixed[1::2] == prompts("test", "env", 3)
    with pytest.raises(ValueError, match="prompt set"):
        prompts("holdout", "mixed", 2)
    with pytest.raises(ValueError, match="task"):
        prompts("test", "chess", 2)
    with pytest.raises(ValueError, match="0 test prompts"):
        prompts("test", "policy", 0)
    assert set(TASKS) == {"policy", "env", "mixed"}
