"""The small tables of the student's path (grpo_debug.ui.tables: component_means, rollout_table,
components_by_group, within_group_spread, scored_cases, gradient_reach) on hand-made inputs."""

from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from grpo_debug.ui.tables import (
    FittedTable,
    component_means,
    components_by_group,
    gradient_reach,
    rollout_table,
    scored_cases,
    within_group_spread,
)


def test_component_means_say_what_each_scores_and_a_stranger_gets_a_dash():
    table = component_means({"best_move": -0.2, "my_reward": 0.5})
    assert isinstance(table, FittedTable) and list(table.index) == ["best_move", "my_reward"]
    assert table.loc["best_move", "mean"] == -0.2 and "rank" in table.loc["best_move", "what it scores"]
    assert table.loc["my_reward", "what it scores"] == "-"


def test_rollout_table_keeps_the_first_rows_of_the_first_groups():
    rollout = SimpleNamespace(
        num_generations=3,
        prompts=["P: a", "A: b", "P: c"],
        completion_lengths=torch.tensor([4, 5, 6, 7, 8, 9, 1, 2, 3]),
        finished=torch.tensor([True, False, True] * 3),
        completions=[f"completion {i} " + "x" * 100 for i in range(9)],
    )
    table = rollout_table(rollout, groups=2, per_group=2, width=12)
    assert list(table.index) == [0, 1, 3, 4], "rows 0, 1 of group 0 and rows 3, 4 of group 1"
    assert table["group"].tolist() == [0, 0, 1, 1] and table["task"].tolist() == ["P:", "P:", "A:", "A:"]
    assert table["length"].tolist() == [4, 5, 7, 8] and table["ended with EOS"].tolist() == [True, False, True, False]
    assert table["completion"][3] == "completion 3"
    assert len(rollout_table(rollout, groups=5, per_group=9)) == 9, "no more groups than the rollout has"


def test_components_by_group_drops_the_components_a_group_is_not_scored_on():
    nan = float("nan")
    table = pd.DataFrame(
        {
            "group": [0, 0, 1, 1, 2],
            "completion": ["M: a", "M: b", "fen a", "fen b", "M: c"],
            "reward": [0.5, -1.0, 0.9, 0.8, 0.1],
            "advantage": [1.0, -1.0, 0.5, -0.5, 0.0],
            "rewards/best_move": [1.0, -1.0, nan, nan, 0.0],
            "rewards/fen": [nan, nan, 0.9, 0.8, nan],
        }
    )
    policy, env = components_by_group(table, groups=2, rows=1)
    assert list(policy.columns) == ["completion", "reward", "rewards/best_move"] and list(policy.index) == [0]
    assert list(env.columns) == ["completion", "reward", "rewards/fen"] and list(env.index) == [2]
    assert len(components_by_group(table, groups=9)) == 3


def test_within_group_spread_is_a_share_and_a_shared_component_has_none():
    components = {
        "constant": torch.tensor([1.0, 1.0, 0.0, 0.0]),  # the same within each group: no share
        "varies": torch.tensor([1.0, -1.0, 0.0, 2.0]),  # squares about the group means: 1 + 1 + 1 + 1 = 4
        "little": torch.tensor([0.5, -0.5, float("nan"), 0.0]),  # 0.25 + 0.25 + 0 (NaN left out) = 0.5
    }
    shares = within_group_spread(components, group_size=2)
    assert list(shares) == ["varies", "little", "constant"], "largest first"
    assert shares["varies"] == pytest.approx(4 / 4.5) and shares["little"] == pytest.approx(0.5 / 4.5)
    assert shares["constant"] == 0.0
    assert within_group_spread({"flat": torch.ones(4)}, group_size=2) == {"flat": 0.0}, "no spread: no division"


def test_within_group_spread_weights_each_component_and_leaves_out_weight_0():
    components = {
        "heavy": torch.tensor([1.0, -1.0, 0.0, 0.0]),  # spread 2, weighted by 0.5: 2 * 0.25 = 0.5
        "light": torch.tensor([1.0, -1.0, 1.0, -1.0]),  # spread 4, weighted by 0.25: 4 * 0.0625 = 0.25
        "format": torch.tensor([1.0, 0.0, 1.0, 0.0]),  # weight 0: in no reward, left out
        "unlisted": torch.tensor([5.0, -5.0, 0.0, 0.0]),  # no weight: left out
    }
    shares = within_group_spread(components, group_size=2, weights={"heavy": 0.5, "light": 0.25, "format": 0.0})
    assert list(shares) == ["heavy", "light"], "only the weighted components, largest first"
    assert shares["heavy"] == pytest.approx(0.5 / 0.75) and shares["light"] == pytest.approx(0.25 / 0.75)
    unweighted = within_group_spread(components, group_size=2)
    assert unweighted["light"] > unweighted["heavy"] and "format" in unweighted, "no weights: every component as is"


def test_scored_cases_holds_each_component_and_the_total():
    from grpo_debug.chess.data import load_split, policy_example
    from grpo_debug.chess.engine import PositionAnalysis
    from grpo_debug.chess.rewards import score_policy

    record = load_split("policy_eval")[0]
    analysis, truth = PositionAnalysis.from_json(record), policy_example(record)[1]
    table = scored_cases(lambda text: score_policy(analysis, text), {"truth": truth, "garbage": "?? B:"})
    assert list(table.index) == ["truth", "garbage"] and "best_move" in table.columns
    assert table.loc["truth", "total"] == 1.0 and table.loc["garbage", "total"] == -1.0


def test_gradient_reach_counts_the_kept_tokens_that_get_a_gradient():
    sample = lambda index, advantage, gradient, mask: SimpleNamespace(
        index=index, advantage=advantage, values={"gradient": gradient, "mask": mask}
    )
    samples = [
        sample(0, 1.0, (-0.5, 0.25, 0.75), (1, 1, 0)),  # the masked token's gradient does not count
        sample(1, 0.0, (0.0, 0.0, 0.0), (1, 1, 1)),
        sample(2, -1.0, (0.0, 0.1, 0.0), (1, 1, 0)),
    ]
    reach = gradient_reach(samples)
    assert (reach.tokens, reach.smallest, reach.largest, reach.none, reach.advantages) == (3, 0.1, 0.5, [1], [0.0])
    assert reach.signal_tokens == 4, "the kept tokens of the samples with A != 0: 2 of sample 0, 2 of sample 2"
    assert str(reach) == (
        "3 kept tokens get |d loss / d logp| from 1.0e-01 to 5.0e-01 (samples with A != 0 keep 4); "
        "samples with none: [1], max |A| 0.0e+00"
    )
    assert gradient_reach(samples[1:2]).tokens == 0 and gradient_reach(samples[1:2]).largest == 0.0
