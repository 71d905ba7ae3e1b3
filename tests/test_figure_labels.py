"""Every figure the suite draws says what its axes hold (`ui.plots.unlabelled_axes`, run by every figure
function before it returns): nbval's run of every notebook checks each figure it draws; here, the rule itself."""

import matplotlib.pyplot as plt
import pytest

from grpo_debug.ui.plots import _done, unlabelled_axes


def test_an_axis_is_labelled_by_its_label_its_grid_line_or_words_on_its_ticks():
    fig, axes = plt.subplots(2, 2)
    for ax in axes.flat:
        ax.plot([0, 1], [1, 2])
    axes[1, 0].set_xlabel("step")
    axes[1, 1].set_xlabel("step")
    axes[0, 0].set_ylabel("reward")
    axes[1, 0].set_ylabel("kl (nats per token)")
    assert unlabelled_axes(fig) == [], "a panel whose column has an x label and row a y label is labelled"
    axes[1, 0].set_ylabel("")
    assert unlabelled_axes(fig) == ["panel 2 ('untitled') has no y label", "panel 3 ('untitled') has no y label"]
    axes[1, 0].set_yticks([0, 1], ["fixed", "trl"])
    assert unlabelled_axes(fig) == ["panel 3 ('untitled') has no y label"], "words on the ticks name the axis"
    plt.close(fig)


def test_a_figure_function_refuses_an_unlabelled_axis_in_one_line():
    fig, ax = plt.subplots()
    ax.set_title("loss")
    ax.plot([0, 1], [1, 2])
    ax.set_ylabel("loss")
    with pytest.raises(ValueError, match="panel 0 \\('loss'\\) has no x label"):
        _done(fig)
    ax.set_xlabel("step")
    assert _done(fig) is fig
