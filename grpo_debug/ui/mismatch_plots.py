"""Figures of the sampler against the trainer (notebook 05c): each sequence's importance ratio against its
length, with the cap of TRL's sequence correction modes drawn. Each function returns the Figure, closed in
pyplot so that a notebook shows it once."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import NullFormatter

from ..sampler import SequenceRatios, outside_cap
from .plots import refuse_unlabelled

TRL_4772_DRIFT = 0.012  # nats per token, TRL issue #4772: over ~100 tokens a sequence ratio near e^1.2


def _plain_log_ticks(ax, extra: list[float]) -> None:
    """Ticks of a log axis at its powers of ten and at `extra` values (the cap), written plainly (0.33, 1, 3)."""
    low, high = ax.get_ylim()
    decades = [10.0**k for k in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)]
    ticks = sorted({t for t in decades + extra if low <= t <= high})
    ax.set_yticks(ticks, [f"{t:.2g}" for t in ticks])
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylim(low, high)


def sequence_ratio_vs_length(
    panels: dict[str, SequenceRatios],
    clip_max: float | None = 3.0,
    clip_min: float | None = None,
    reference_drift: float = TRL_4772_DRIFT,
    up_to: int = 0,
    title: str = "sequence ratio prod pi_trainer / pi_sampler against completion length",
):
    """One panel per setting: each completion (a dot; red where its ratio leaves [clip_min, clip_max], the
    sequences TRL's sequence_mask zeroes and sequence_truncate clamps), the cap, the measured drift's curve
    exp(d x length) with the band exp(d x length +- 2 s sqrt(length)) of a random walk of per-token log-ratios
    (d, s: the panel's mean and spread per token), and #4772's steady 0.012 nats per token, drawn up to the
    longest completion or `up_to` tokens (a completion budget). The legend sits below the panels, off the data."""
    ncols = min(len(panels), 2)
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.4 * nrows), squeeze=False)
    axes = axes.flatten()
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    for ax, (name, r) in zip(axes, panels.items()):
        _ratio_panel(ax, name, r, clip_min, clip_max, reference_drift, up_to)
    for ax in axes[: len(panels)]:  # each panel has its own scale: each names it
        ax.set_ylabel("sequence ratio (log scale)")
    handles, labels = axes[0].get_legend_handles_labels()
    seen = dict(zip(labels, handles))
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.legend(seen.values(), seen.keys(), loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3, fontsize=8)
    refuse_unlabelled(fig, title)
    plt.close(fig)
    return fig


def _ratio_panel(ax, name: str, r: SequenceRatios, clip_min, clip_max, reference_drift: float, up_to: int) -> None:
    """One setting's panel of `sequence_ratio_vs_length`."""
    lengths, ratio = r.lengths.numpy(), np.exp(r.log_ratio.numpy())
    out = outside_cap(r, clip_min, clip_max).numpy()
    ax.scatter(lengths[~out], ratio[~out], s=14, alpha=0.6, color="C0", label="a completion, inside the cap")
    ax.scatter(lengths[out], ratio[out], s=18, alpha=0.8, color="C3", label="outside: masked / truncated")
    grid = np.linspace(1, max(lengths.max(), up_to, 1), 100)
    ax.plot(grid, np.exp(r.token_drift * grid), color="k", lw=1, label="exp(d x length), d: measured drift")
    walk = 2 * r.token_spread * np.sqrt(grid)
    ax.fill_between(
        grid,
        np.exp(r.token_drift * grid - walk),
        np.exp(r.token_drift * grid + walk),
        color="grey",
        alpha=0.2,
        label="+- 2 s sqrt(length): a random walk",
    )
    ax.plot(
        grid,
        np.exp(reference_drift * grid),
        color="C1",
        ls="--",
        lw=1,
        label=f"TRL #4772: {reference_drift} nats per token",
    )
    for bound in (clip_max, clip_min):
        if bound is not None:
            ax.axhline(bound, color="C3", ls=":", lw=1.2, label="cap: clip_min, clip_max")
    ax.set(
        yscale="log",
        xlabel="completion length (scored tokens)",
        title=f"{name}\nd = {r.token_drift:+.2g}, s = {r.token_spread:.2g} nats per token",
    )
    ax.title.set_fontsize(9)
    _plain_log_ticks(ax, [b for b in (clip_min, clip_max) if b is not None])
