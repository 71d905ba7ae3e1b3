"""The takeaway titles notebooks 02 and 04 draw their figures under, computed from what the figures draw."""

import matplotlib.pyplot as plt
import torch

from grpo_debug.advantages import summarize_advantages
from grpo_debug.ui import plots


def test_the_gap_title_names_the_base_row_and_the_largest_pitfall():
    gaps = {"every fix on": 2e-5, "every scoring fix on": 3e-5, "dropout on": 13.2, "EOS dropped": 2e-5}
    title = plots.gap_takeaway(gaps, "every fix on")
    assert title.startswith("every fix on: max gap 2e-05 nats, below the dashed 1e-4 line"), title
    assert title.endswith("1 of 2 pitfall rows above it; largest: dropout on (13.2 nats)"), title
    assert plots.gap_takeaway({"as captured": 0.5, "bfloat16": 0.1}, "as captured").split(",")[1].startswith(" above")


def test_the_ranked_gaps_put_the_largest_on_top():
    fig = plots.gaps_ranked({"base": 1e-5, "large": 20.0, "small": 0.1}, "base")
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    plt.close(fig)
    assert labels == ["base", "small", "large"], labels  # barh draws bottom up: the largest last, on top


def test_the_advantages_title_counts_zero_std_and_phantom_groups():
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.3, 0.3, 0.3001, 0.3, 1.0, -1.0, 1.0, -1.0])
    adv = summarize_advantages(rewards, 4)
    title = plots.advantages_takeaway(adv, 4)
    assert title.startswith("1 of 3 groups: reward std 0"), title
    assert "phantom groups [1] (red)" in title and title.endswith("up to 0.5"), title
    calm = summarize_advantages(torch.tensor([1.0, -1.0, 1.0, -1.0]), 4)
    assert plots.advantages_takeaway(calm, 4).endswith("no phantom group (red)")
