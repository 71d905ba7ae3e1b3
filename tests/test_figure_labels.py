"""Every figure the suite draws says what its axes hold (`ui.plots.unlabelled_axes`, run by every figure
function before it returns): nbval's run of every notebook checks each figure it draws; here, the rule itself."""

import matplotlib.pyplot as plt
import pytest

from grpo_debug.ui.plots import _done, _grid, unlabelled_axes


def test_an_axis_is_labelled_by_its_label_a_panel_it_shares_it_with_or_words_on_its_ticks():
    fig, axes = plt.subplots(2, 2, sharey="row")
    for ax in axes.flat:
        ax.plot([0, 1], [1, 2])
        ax.set_xlabel("step")
    axes[0, 0].set_ylabel("reward")
    axes[1, 0].set_ylabel("kl (nats per token)")
    assert unlabelled_axes(fig) == [], "a panel that shares its y axis with a labelled one is labelled"
    axes[1, 0].set_ylabel("")
    assert unlabelled_axes(fig) == ["panel 2 ('untitled') has no y label"], "the inner panel shows no scale"
    axes[1, 0].set_yticks([0, 1], ["fixed", "trl"])
    assert unlabelled_axes(fig) == [], "words on the ticks name the axis"
    plt.close(fig)


def test_an_unshared_neighbour_a_twin_and_a_colorbar_each_need_their_own_label():
    fig, (left, right) = plt.subplots(1, 2)
    for ax in (left, right):
        ax.plot([0, 1], [1, 2])
        ax.set_xlabel("step")
    left.set_ylabel("reward")
    assert unlabelled_axes(fig) == ["panel 1 ('untitled') has no y label"], "its own scale: its own label"
    right.set_ylabel("kl")
    twin = right.twinx()
    twin.plot([0, 1], [5, 9])
    assert unlabelled_axes(fig) == ["panel 2 ('untitled') has no y label"], "a twin axis is not its host's"
    plt.close(fig)
    fig, ax = plt.subplots()
    image = ax.imshow([[1, 2], [3, 4]])
    ax.set(xlabel="token", ylabel="sample")
    bar = fig.colorbar(image, ax=ax)
    assert unlabelled_axes(fig) == ["colorbar 0 has no label"]
    bar.set_label("nats")
    assert unlabelled_axes(fig) == []
    plt.close(fig)


def test_a_grid_with_an_empty_cell_keeps_the_scale_of_the_column_above_it():
    fig, axes = _grid(7, ncols=4, sharex=True, sharey=True)
    for ax in axes:
        ax.plot([0, 1], [1, 2])
    fig.canvas.draw()
    ticked = [any(t.get_visible() and t.get_text() for t in ax.get_xticklabels()) for ax in axes]
    assert ticked == [False, False, False, True, True, True, True], "the panel above the empty cell shows its x scale"
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
