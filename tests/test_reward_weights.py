"""TRL's reward_weights read where a reward function's contribution is judged: a function weighted 0 that pays for
length, or gives None, is named as weighted 0 and does not make a warning (TRL multiplies its rewards by 0, and a
None of it by 0 is skipped alike). On the bundled step's facts, with the probes and weights set as a run's would be."""

import dataclasses

import pytest

from grpo_debug.config import StepConfig
from grpo_debug.detectors.detectors import bad_reward, length_reward
from grpo_debug.detectors.probes import RewardProbe
from grpo_debug.doctor.facts import examine
from grpo_debug.step import GRPOStep


@pytest.fixture(scope="module")
def facts():
    step = GRPOStep(StepConfig(num_prompts=2, num_generations=4, max_new_tokens=16))
    return examine(step)[0]


def paying(name: str) -> RewardProbe:
    """A probe that saw the function rise on every completion made longer, content kept."""
    return RewardProbe(name, rise_padded=1.0, raised_padded=1.0, rise_repeated=1.0, raised_repeated=1.0, spread=0.1,
                       varies_across_completions=True)  # fmt: skip


def test_a_function_that_pays_for_length_warns_unless_it_is_weighted_0(facts):
    names = list(facts.run.rewards.per_function)
    probes = {n: paying(n) for n in names}
    paid = length_reward(dataclasses.replace(facts, reward_probes=probes))
    assert paid.severity == "warning" and paid.evidence["paid"] == names, paid
    silenced = length_reward(dataclasses.replace(facts, reward_probes=probes, reward_weights=(0.0,) * len(names)))
    assert silenced.severity == "info" and silenced.evidence["weighted_zero"] == names, silenced
    assert "weighted 0" in silenced.summary, silenced.summary


def test_none_rewards_of_a_function_weighted_0_make_no_warning(facts):
    name = next(iter(facts.run.rewards.per_function))
    values = facts.run.rewards.per_function[name].clone()
    values[: len(values) // 2] = float("nan")  # half the rows None
    rewards = dataclasses.replace(facts.run.rewards, per_function={**facts.run.rewards.per_function, name: values})
    run = dataclasses.replace(facts.run, rewards=rewards)
    weights = tuple(0.0 if n == name else w for n, w in zip(rewards.per_function, facts.reward_weights))
    loud = bad_reward(dataclasses.replace(facts, run=run))
    assert loud.severity == "warning", loud
    quiet = bad_reward(dataclasses.replace(facts, run=run, reward_weights=weights))
    assert quiet.severity == "info" and quiet.evidence["weighted_zero"] == [name], quiet
    assert f"{name} weighted 0" in quiet.summary, quiet.summary
