"""A figure's title states its takeaway, computed from what it draws: true on any step, not only the bundled one."""

import matplotlib.pyplot as plt
import torch

from grpo_debug.rewards import Rewards
from grpo_debug.ui import plots


def title_of(fig) -> str:
    text = fig._suptitle.get_text() if fig._suptitle else fig.axes[0].get_title()
    plt.close(fig)
    return text


def test_a_group_with_an_unscorable_completion_counts_as_one_reward_as_the_advantages_count_it():
    total = torch.tensor([1.0, 1.0, float("nan"), 1.0, 0.0, 1.0, 0.5, 0.5])  # groups of 4: one NaN, one spread
    rewards = Rewards(total=total, components={}, errors=[], seconds=0.0)
    assert title_of(plots.rewards_per_group(rewards, 4)).startswith("1 of 2 groups"), "the NaN group was not counted"


def test_phases_that_took_no_time_keep_the_plain_title():
    assert title_of(plots.time_per_phase({"rollout": 0.0, "loss": 0.0})) == "seconds per phase"
    assert "loss takes 75%" in title_of(plots.time_per_phase({"rollout": 1.0, "loss": 3.0}))


def test_gradient_norms_name_each_kind_of_sample_only_where_there_is_one():
    norms, advantages = torch.tensor([0.1, 0.2, 0.3, 0.4]), torch.tensor([1.0, -1.0, 0.5, -0.5])
    assert (
        title_of(plots.per_sample_grad_norms(norms, advantages)) == "4 samples with a non-zero advantage: median 0.25"
    )
    zero = torch.tensor([0.0, 0.0, 0.5, -0.5])
    assert title_of(plots.per_sample_grad_norms(norms, zero)).splitlines()[0].startswith("2 samples with advantage 0")
