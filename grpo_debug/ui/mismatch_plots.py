"""Figures of the sampler against the trainer (notebook 05c): each sequence's importance ratio against its
length, with the cap of TRL's sequence correction modes drawn. Each function returns the Figure, closed in
pyplot so that a notebook shows it once."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from ..sampler import SequenceRatios, outside_cap

TRL_4772_DRIFT = 0.012  # nats per token, TRL issue #4772: over ~100 tokens a sequence ratio near e^1.2


def sequence_ratio_vs_length(
    panels: dict[str, SequenceRatios],
    clip_max: float | None = 3.0,
    clip_min: float | None = None,
    reference_drift: float = TRL_4772_DRIFT,
    title: str = "sequence ratio prod pi_trainer / pi_sampler against completion length",
):
    """One panel per setting: each completion (a dot; red where its ratio leaves [clip_min, clip_max], the
    sequences TRL's sequence_mask zeroes and sequence_truncate clamps), the cap, the measured drift's curve
    exp(d x length) with the band exp(d x length +- 2 s sqrt(length)) of a random walk of per-token log-ratios
    (d, s: the panel's mean and spread per token), and #4772's steady 0.012 nats per token. The legend sits
    below the panels, off the data."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.6), squeeze=False, sharey=True)
    for ax, (name, r) in zip(axes[0], panels.items()):
        lengths, ratio = r.lengths.numpy(), np.exp(r.log_ratio.numpy())
        out = outside_cap(r, clip_min, clip_max).numpy()
        ax.scatter(lengths[~out], ratio[~out], s=14, alpha=0.6, color="C0", label="a completion, inside the cap")
        ax.scatter(lengths[out], ratio[out], s=18, alpha=0.8, color="C3", label="outside: masked / truncated")
        grid = np.linspace(1, max(lengths.max(), 1), 100)
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
                ax.axhline(bound, color="C3", ls=":", lw=1.2, label="cap (vllm_importance_sampling_clip_*)")
        ax.set(
            yscale="log",
            xlabel="completion length (scored tokens)",
            title=f"{name}\nd = {r.token_drift:+.4f}, s = {r.token_spread:.3f} nats/token",
        )
        ax.title.set_fontsize(9)
    axes[0][0].set_ylabel("sequence ratio (log scale)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    seen = dict(zip(labels, handles))
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.legend(seen.values(), seen.keys(), loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3, fontsize=8)
    plt.close(fig)
    return fig
