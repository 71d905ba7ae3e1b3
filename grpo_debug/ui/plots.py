"""Every matplotlib figure of the suite. Each function takes phase results and returns the Figure,
closed in pyplot so that a notebook shows it exactly once: as the cell's value."""

from __future__ import annotations

import re
import textwrap

import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np
import torch

from ..advantages import Advantages, group_std
from ..evaluation import Evaluation
from ..logprobs import TokenLogProbs
from ..loss import KL_ESTIMATORS, per_token_kl
from ..rewards import Rewards
from ..stats import is_detected
from ..tracin.first_order import OWN_SCORE


def _text_labels(axis) -> bool:
    """Whether an axis names its ticks in words (a categorical axis): those name what it holds."""
    return any(re.search("[A-Za-z]{2}", t.get_text()) and "$" not in t.get_text() for t in axis.get_ticklabels())


def unlabelled_axes(fig) -> list[str]:
    """Each drawn panel's axis that says nothing of what it holds: no label on it, nor on a panel it shares that
    axis with, and no words on its ticks. An axis without tick labels shows no scale to name. A colorbar's long
    axis needs its own label."""
    fig.canvas.draw()  # tick labels exist once drawn
    drawn = [ax for ax in fig.axes if ax.get_visible() and ax.axison]
    panels = [ax for ax in drawn if not hasattr(ax, "_colorbar")]
    missing = [
        f"colorbar {i} has no label"
        for i, ax in enumerate(a for a in drawn if hasattr(a, "_colorbar"))
        if not (ax.yaxis if ax._colorbar.orientation == "vertical" else ax.xaxis).get_label_text()
    ]
    for i, ax in enumerate(panels):
        for name in ("x", "y"):
            axis = ax.xaxis if name == "x" else ax.yaxis
            shown = [t.get_text() for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]
            if not axis.get_visible() or not shown or _text_labels(axis) or axis.get_label_text():
                continue
            shared = (ax.get_shared_x_axes() if name == "x" else ax.get_shared_y_axes()).get_siblings(ax)
            if any(o is not ax and (o.xaxis if name == "x" else o.yaxis).get_label_text() for o in shared):
                continue
            missing.append(f"panel {i} ({ax.get_title() or 'untitled'!r}) has no {name} label")
    return missing


def refuse_unlabelled(fig, title: str) -> None:
    """A figure with an axis that says nothing of what it holds is a bug of the function that drew it: refused
    in one line (every figure function calls this, so nbval's run of every notebook checks every figure)."""
    missing = unlabelled_axes(fig)
    if missing:
        plt.close(fig)
        raise ValueError(f"figure {title!r}: {'; '.join(missing)}")


def _done(fig, legend_from=None, legend=None):
    """Lay the figure out, refusing an unlabelled axis (`refuse_unlabelled`); with `legend_from` (an axes) or
    `legend` (handles, labels), the legend goes to the right of every panel."""
    fig.tight_layout()
    refuse_unlabelled(fig, fig._suptitle.get_text() if fig._suptitle else "")
    if legend_from is not None or legend is not None:
        handles = legend if legend is not None else legend_from.get_legend_handles_labels()
        fig.legend(*handles, fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    plt.close(fig)
    return fig


def rewards_per_group(rewards: Rewards, num_generations: int, title: str | None = None):
    """Each group's rewards and their mean. None: the takeaway, how many groups give every completion one reward
    (a reward std of 0 as the advantages count it, an unscorable completion's NaN left out)."""
    values = rewards.total.view(-1, num_generations).numpy()
    if title is None:
        same = int(torch.isclose(group_std(rewards.total, num_generations), torch.tensor(0.0)).sum())
        title = f"{same} of {len(values)} groups: every completion gets the same reward (no signal)"
    fig, ax = plt.subplots(figsize=(7, 3))
    for b, row in enumerate(values):
        ax.scatter(np.full(len(row), b), row, alpha=0.6, s=18)
        ax.hlines(row.mean(), b - 0.3, b + 0.3, color="k")
    ax.set(xlabel="prompt (group)", ylabel="reward", title=title)
    return _done(fig)


def advantages_bars(adv: Advantages, num_generations: int, title: str = "advantages"):
    values = adv.values.numpy()
    fig, ax = plt.subplots(figsize=(7, 3))
    colors = ["tab:red" if (i // num_generations) in adv.phantom_groups else "tab:blue" for i in range(len(values))]
    for g in adv.zero_std_groups:  # their bars have height 0: shade the group instead
        ax.axvspan(g * num_generations - 0.5, (g + 1) * num_generations - 0.5, color="0.85", zorder=0)
    ax.bar(np.arange(len(values)), values, color=colors)
    for b in range(1, len(values) // num_generations):
        ax.axvline(b * num_generations - 0.5, color="k", lw=0.5)
    ax.set(xlabel="sample (shaded: zero-std group, advantage 0; red: phantom group)", ylabel="advantage", title=title)
    return _done(fig)


def advantages_takeaway(adv: Advantages, num_generations: int) -> str:
    """The title of `advantages_bars`, computed from what it draws: how many groups have reward std 0 (every
    advantage 0, shaded), and the phantom groups (red: a reward std under `advantages.PHANTOM_STD`, divided into
    full-size advantages) with their largest std and largest |advantage| (`adv.values`: B*G, groups of
    `num_generations`)."""
    red = adv.phantom_groups
    values = adv.values.view(-1, num_generations)
    note = (
        f"phantom groups {red} (red): reward std <= {adv.group_std[red].max():.2g}, yet |advantage| up to "
        f"{values[red].abs().max():.2g}"
        if red
        else "no phantom group (red)"
    )
    return (
        f"{len(adv.zero_std_groups)} of {len(adv.group_std)} groups: reward std 0, every advantage 0 (shaded)\n{note}"
    )


def logprob_gap_heatmap(logprobs: TokenLogProbs, title: str = "|sampler - recomputed| per token"):
    gap = logprobs.sampler_gap.numpy()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    im = ax.imshow(gap, aspect="auto", cmap="magma", vmin=0, vmax=max(gap.max(), 1e-6))
    ax.set(xlabel="completion token", ylabel="sample", title=title)
    fig.colorbar(im, ax=ax, label="nats")
    return _done(fig)


GAP_LINE = 1e-4  # nats (drawn dashed, "1e-4"): a sampler-trainer log-prob gap under it is float rounding


def gap_by_toggle(gaps: dict[str, float], title: str = "max |sampler - recomputed| log-prob"):
    names = list(gaps)
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.barh(
        names,
        [max(gaps[n], 1e-8) for n in names],
        color=["tab:green" if gaps[n] < GAP_LINE else "tab:red" for n in names],
    )
    ax.set_xscale("log")
    ax.axvline(GAP_LINE, color="k", ls="--", lw=0.8)
    ax.set(xlabel="nats (log scale; dashed: 1e-4)", title=title)
    return _done(fig)


def gap_takeaway(gaps: dict[str, float], base: str) -> str:
    """The title of a table of scoring variants' largest |sampler - recomputed| log-prob gaps ({row: nats}): where
    the row `base` (the step as run) stands against `GAP_LINE`, how many pitfall rows (every row but `base` and
    "every scoring fix on") lie above it, and the largest of them."""
    pitfalls = {name: gap for name, gap in gaps.items() if name not in (base, "every scoring fix on")}
    worst = max(pitfalls, key=pitfalls.get)
    side = "below" if gaps[base] < GAP_LINE else "above"
    above = sum(gap > GAP_LINE for gap in pitfalls.values())
    return (
        f"{base}: max gap {gaps[base]:.2g} nats, {side} the dashed 1e-4 line\n"
        f"{above} of {len(pitfalls)} pitfall rows above it; largest: {worst} ({pitfalls[worst]:.3g} nats)"
    )


def gaps_ranked(gaps: dict[str, float], base: str):
    """`gap_by_toggle` with its rows ranked, the largest gap on top, under `gap_takeaway`'s title."""
    return gap_by_toggle(dict(sorted(gaps.items(), key=lambda item: item[1])), title=gap_takeaway(gaps, base))


def kl_by_estimator(logps: torch.Tensor, ref_logps: torch.Tensor, mask: torch.Tensor, sample: int = 0) -> torch.Tensor:
    """(estimator, token): each of `KL_ESTIMATORS` on sample `sample`'s scored tokens (logps, ref_logps, mask: B x T)."""
    length = int(mask[sample].sum())
    rows = [
        per_token_kl(logps[sample : sample + 1], ref_logps[sample : sample + 1], None, e)[0, :length]
        for e in KL_ESTIMATORS
    ]
    return torch.stack(rows)


def kl_per_token(
    logps: torch.Tensor,
    ref_logps: torch.Tensor,
    mask: torch.Tensor,
    sample: int = 0,
    title: str | None = None,
    chosen: str | None = None,
):
    """Every estimator on one sample's tokens (`kl_by_estimator`); `chosen` (the loss's estimator) drawn thick.
    None: a title that names the sample."""
    title = title or f"per-token KL estimates, sample {sample}"
    fig, ax = plt.subplots(figsize=(8, 3))
    for estimator, values in zip(KL_ESTIMATORS, kl_by_estimator(logps, ref_logps, mask, sample)):
        label = f"{estimator} (this step's estimator)" if estimator == chosen else estimator
        ax.plot(values.numpy(), label=label, marker=".", lw=3 if estimator == chosen else 1)
    ax.set(xlabel=f"completion token of sample {sample}", ylabel="estimate", title=title)
    return _done(fig, legend_from=ax)  # beside the panel: inside, it sat on the spikes


def per_sample_grad_norms(norms: torch.Tensor, advantages: torch.Tensor, title: str | None = None):
    """Each sample's gradient norm against its advantage. None: the takeaway, the largest norm of the samples
    with advantage 0 and the median of the others."""
    if title is None:
        zero, lines = advantages == 0, []
        if zero.any():
            lines.append(f"{int(zero.sum())} samples with advantage 0: gradient norm at most {norms[zero].max():.2g}")
        if (~zero).any():
            lines.append(
                f"{int((~zero).sum())} samples with a non-zero advantage: median {norms[~zero].float().quantile(0.5):.2g}"
            )
        title = "\n".join(lines)
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.scatter(advantages.numpy(), norms.numpy(), s=16)
    ax.set(xlabel="advantage", ylabel="||grad of sample's loss share||", title=title)
    return _done(fig)


def eval_before_after(evaluation: Evaluation, title: str | None = None):
    """Each test prompt's reward before and after (paired seeds), and the change with its 95% interval. None: the
    takeaway, the change and whether its interval excludes 0."""
    delta, low, high = evaluation.delta, evaluation.ci_low, evaluation.ci_high
    if title is None:
        apart = "excludes 0: more than" if is_detected(low, high) else "includes 0: not told apart from"
        title = f"one step: held-out reward after - before {delta:+.4f} [{low:+.4f}, {high:+.4f}]\n"
        title += f"the 95% interval {apart} sampling noise"
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3), gridspec_kw={"width_ratios": [2, 1]})
    before, after = evaluation.before.per_prompt.numpy(), evaluation.after.per_prompt.numpy()
    for b, a in zip(before, after):
        ax1.plot([0, 1], [b, a], color="tab:gray", alpha=0.5)
    ax1.set(xticks=[0, 1], xticklabels=["before", "after"], ylabel="mean reward per prompt")
    ax1.set_title(f"{len(before)} test prompts, paired seeds", fontsize=9)
    ax2.errorbar([0], [delta], yerr=[[delta - low], [high - delta]], fmt="o", capsize=6)
    ax2.axhline(0, color="k", lw=0.8)
    ax2.set(xticks=[], ylabel="after - before (95% CI)")
    fig.suptitle(title, fontsize=11)
    return _done(fig)


def time_per_phase(timings: dict[str, float], title: str | None = None):
    """One bar per phase. None: the takeaway, the slowest phase's share of the step (where any phase took time)."""
    total = sum(timings.values())
    if title is None and total > 0:
        slowest = max(timings, key=timings.get)
        title = f"seconds per phase: {slowest} takes {timings[slowest] / total:.0%} of the step's {total:.1f} s"
    fig, ax = plt.subplots(figsize=(7, 2.8))
    ax.barh(list(timings), list(timings.values()))
    ax.set(xlabel="seconds", title=title or "seconds per phase")
    return _done(fig)


def _grid(n: int, ncols: int = 3, size=(3.6, 2.9), **shared):
    """At most `ncols` panels per row; unused axes hidden. Returns the figure and a flat list of n axes."""
    ncols = min(n, ncols)
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(size[0] * ncols, size[1] * nrows), squeeze=False, **shared)
    flat = list(axes.flat)
    for i in range(n, len(flat)):
        flat[i].set_visible(False)
        flat[i - ncols].xaxis.set_tick_params(labelbottom=True)  # the panel above an empty cell ends its column
    return fig, flat[:n]


def influence_histograms(panels: dict[str, np.ndarray], bins: int = 30, title: str = "influence", sharex: bool = False):
    """One histogram per name, at most three per row, counts on a shared axis; `sharex` where the panels'
    scores are on one scale (the same validation loss)."""
    fig, axes = _grid(len(panels), sharey=True, sharex=sharex)
    for ax, (name, values) in zip(axes, panels.items()):
        ax.hist(values, bins=bins)
        ax.axvline(0, color="k", lw=0.8)
        ax.set_title(textwrap.fill(name, 44), fontsize=9)
        ax.set_xlabel("influence", fontsize=8)
        ax.tick_params(labelsize=8)
    for ax in axes:
        if ax.get_subplotspec().is_first_col():
            ax.set_ylabel("training samples")
    fig.suptitle(title)
    return _done(fig)


def sign_scatter(checks: dict, title: str = "predicted vs measured change of L_val, one real step per sample"):
    """checks: name -> FirstOrderCheck (tracin.first_order). Where the score is the step's own first-order
    prediction the diagonal marks a perfect one; otherwise only the ranking and the signs can agree, and
    each axis keeps its own scale."""

    fig, axes = _grid(len(checks), size=(3.8, 3.4))
    for ax, (name, c) in zip(axes, checks.items()):
        ax.scatter(c.predicted.numpy(), c.measured.numpy(), s=14)
        if OWN_SCORE[c.step] == c.score:
            lim = float(max(c.predicted.abs().max(), c.measured.abs().max()))
            ax.plot([-lim, lim], [-lim, lim], color="k", lw=0.6)
        ax.axhline(0, color="grey", lw=0.4)
        ax.axvline(0, color="grey", lw=0.4)
        ax.set_xlabel(f"predicted: -lr x {c.score} score", fontsize=8)
        ax.set_ylabel(f"measured after a {c.step} step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.ticklabel_format(style="sci", scilimits=(-2, 3))  # -0.0006-0.0004... ran into each other: a 1e-4 offset
        ax.set_title(f"{name}\nSpearman {c.spearman:+.2f}, sign agreement {c.sign_agreement:.0%}", fontsize=9)
    fig.suptitle(title)
    return _done(fig)


def selection_results(results: list, title: str = "one step on the selected samples"):
    """results: SelectionResult list, one or both optimizers. Left: change of L_val; right: change of the
    reward on the test prompts with its 95% bootstrap interval. Bars side by side per optimizer."""
    strategies = list(dict.fromkeys(r.strategy for r in results))
    optimizers = list(dict.fromkeys(r.optimizer for r in results))
    by = {(r.strategy, r.optimizer): r for r in results}
    width = 0.8 / len(optimizers)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.4))
    x = np.arange(len(strategies))
    for k, opt in enumerate(optimizers):
        rs = [by.get((s, opt)) for s in strategies]
        pos = x + (k - (len(optimizers) - 1) / 2) * width
        left.bar(pos, [r.val_loss_after - r.val_loss_before if r else np.nan for r in rs], width, label=opt)
        deltas = np.array([r.reward_delta if r else np.nan for r in rs])
        errors = np.array(
            [[r.reward_delta - r.reward_ci_low, r.reward_ci_high - r.reward_delta] if r else [0, 0] for r in rs]
        ).T
        right.bar(pos, deltas, width, yerr=errors.clip(min=0), capsize=3, label=opt)
    left.set(ylabel="change of L_val (lower: helped)")
    right.set(ylabel=f"change of reward on {results[0].reward_prompts} prompts")
    for ax in (left, right):
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xticks(x, strategies, rotation=30, fontsize=8)
    fig.suptitle(f"{title}; validation: {results[0].val_set}", fontsize=10)
    return _done(fig, legend_from=left)  # beside the panels: inside, it covered bars and intervals


def reward_changes(rows: dict, title: str = "change of the test-prompt reward (95% bootstrap interval)"):
    """rows: label -> SelectionResult; one horizontal interval per row, zero marked."""
    labels = list(rows)
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(labels) + 1.2))
    for y, label in enumerate(labels):
        r = rows[label]
        ax.errorbar(
            [r.reward_delta],
            [y],
            xerr=[[r.reward_delta - r.reward_ci_low], [r.reward_ci_high - r.reward_delta]],
            fmt="o",
            capsize=4,
            color="tab:blue" if "influence>0" in r.strategy else "tab:red",
        )
    ax.axvline(0, color="k", lw=0.8)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set(xlabel=f"reward after - before, paired over {rows[labels[0]].reward_prompts} prompts", title=title)
    return _done(fig)


def ratio_histograms(
    ratios: dict[str, torch.Tensor],
    epsilon_low: float,
    epsilon_high: float,
    delta: float | None = None,
    bins: int = 40,
    title: str = "pi / pi_old per scored token",
):
    """One panel per pass: the per-token ratios (flattened, scored tokens only) on a log axis, the clip
    bounds 1 - epsilon_low and 1 + epsilon_high (and delta) drawn."""
    fig, axes = _grid(len(ratios), ncols=3, size=(4.2, 3.0))
    for ax, (name, values) in zip(axes, ratios.items()):
        logs = torch.log(values.clamp(min=1e-12)).numpy()
        low, high = min(logs.min(), np.log(1 - epsilon_low)), max(logs.max(), np.log(1 + epsilon_high))
        ax.hist(logs, bins=np.linspace(low, high, bins + 1), color="C0", alpha=0.8)  # on-policy: not 1e-7 wide
        ax.set_yscale("log")
        ax.axvline(np.log(1 - epsilon_low), color="C3", ls="--", lw=1, label="clip: 1 - eps_low, 1 + eps_high")
        ax.axvline(np.log(1 + epsilon_high), color="C3", ls="--", lw=1)
        if delta:
            ax.axvline(np.log(delta), color="C1", ls=":", lw=1.2, label="delta")
        ax.set(xlabel="log ratio", ylabel="tokens", title=name)
    fig.suptitle(title)
    return _done(fig, legend_from=axes[0])  # beside the panels: inside, it sat on a clip line


def gradient_by_ratio(
    curves: dict[str, dict[str, np.ndarray]],
    ratios: np.ndarray,
    epsilon_low: float,
    epsilon_high: float,
    title: str = "d loss / d logp of one token against its ratio",
):
    """`curves[loss_type][sign]`: the gradient one token receives at each ratio, sign "A = +1" or "A = -1"."""
    signs = list(next(iter(curves.values())))
    fig, axes = _grid(len(signs), ncols=2, size=(5.0, 3.4))
    for ax, sign in zip(axes, signs):
        for name, by_sign in curves.items():
            ax.plot(ratios, by_sign[sign], label=name, lw=1.5)
        for bound in (1 - epsilon_low, 1 + epsilon_high):
            ax.axvline(bound, color="grey", ls=":", lw=1, label="clip bounds" if bound < 1 else None)
        ax.axhline(0, color="k", lw=0.5)
        ax.set(xlabel="ratio pi / pi_old", ylabel="d loss / d logp", title=sign, xscale="log")
        ticks = [t for t in (0.3, 0.5, 0.8, 1, 1.25, 2, 3) if ratios.min() <= t <= ratios.max()]
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])  # matplotlib's 3x10^-1 and 4x10^-1 collided
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    fig.suptitle(title)
    return _done(fig, legend_from=axes[-1])


def sequence_vs_token_ratios(
    token_ratio: torch.Tensor,
    sequence_ratio: torch.Tensor,
    mask: torch.Tensor,
    rows: int = 16,
    title: str = "GSPO: one ratio per sequence against its tokens' ratios",
):
    """Each sequence's token ratios (dots) and its sequence ratio exp(mean log ratio) (a bar)."""
    fig, ax = plt.subplots(figsize=(9, 3.2))
    for i in range(min(rows, token_ratio.shape[0])):
        values = token_ratio[i][mask[i].bool()].numpy()
        ax.scatter(np.full(len(values), i), values, s=6, alpha=0.4, color="C0")
        ax.hlines(sequence_ratio[i].item(), i - 0.35, i + 0.35, color="C3", lw=2)
    ax.set(yscale="log", xlabel="sequence", ylabel="ratio", title=title)
    ax.scatter([], [], s=6, color="C0", label="token ratio")
    ax.plot([], [], color="C3", lw=2, label="sequence ratio")
    ax.legend(fontsize=8)
    return _done(fig)


def sampler_weights_by_mode(
    weights: dict[str, torch.Tensor], title: str = "importance-sampling weight pi_old / pi_sampler"
):
    """One histogram per correction mode (token modes: scored tokens; sequence modes: one per sequence)."""
    fig, axes = _grid(len(weights), ncols=4, size=(3.4, 2.8))
    for ax, (mode, values) in zip(axes, weights.items()):
        ax.hist(values.numpy(), bins=30, color="C2")
        ax.set(title=mode, xlabel="weight", ylabel="count", yscale="log")
    fig.suptitle(title)
    return _done(fig)


def token_entropies(
    entropies: torch.Tensor,
    mask: torch.Tensor,
    kept: torch.Tensor,
    samples: list[int],
    title: str = "entropy of the next-token distribution, per completion token",
):
    """Each chosen sample's per-token entropy; the tokens `kept` (e.g. the top-entropy mask) marked."""
    fig, ax = plt.subplots(figsize=(9, 3))
    for i in samples:
        length = int(mask[i].sum())
        (line,) = ax.plot(entropies[i, :length].numpy(), lw=1, label=f"sample {i}")
        marked = kept[i, :length].nonzero()[:, 0].numpy()
        ax.scatter(marked, entropies[i, marked].numpy(), color=line.get_color(), s=14)
    ax.set(xlabel="completion token", ylabel="entropy (nats)", title=title + " (dots: trained tokens)")
    ax.legend(fontsize=8)
    return _done(fig)


def _nan(value):
    return float("nan") if value is None else value


def training_curves(
    curves: dict[str, list[dict]],
    title: str = "per step, mean over seeds (band: 95% interval)",
    arms: list[str] | None = None,
):
    """curves: metric -> rows of `train.metric_curve` (arm, step, mean, low, high) for every arm; one panel
    per metric, one line per arm with its interval band (none where it is undefined: one seed). `arms` fixes
    each arm's colour (default: the order the arms first appear), so that two figures of one comparison colour
    an arm alike. A non-negative metric whose means span three decades or more gets a log axis, so that an arm's
    blow-up and the others' values are both visible; it starts at half the 5th percentile of the positive
    means, so that a few means at float noise (a KL of 1e-10 at the reference) do not stretch it. The legend sits outside the panels."""
    fig, axes = _grid(len(curves), ncols=3, size=(4.2, 3.0))
    order = dict.fromkeys([*(arms or []), *(r["arm"] for rows in curves.values() for r in rows)])
    color = {arm: f"C{i % 10}" for i, arm in enumerate(order)}  # one colour per arm in every panel
    for ax, (metric, rows) in zip(axes, curves.items()):
        for arm in dict.fromkeys(r["arm"] for r in rows):
            mine = [r for r in rows if r["arm"] == arm]
            steps = [r["step"] for r in mine]
            ax.plot(
                steps,
                [r["mean"] for r in mine],
                marker="o" if len(mine) < 8 else None,
                ms=3,
                lw=1.2,
                label=arm,
                color=color[arm],
            )
            ax.fill_between(
                steps,
                [_nan(r["low"]) for r in mine],
                [_nan(r["high"]) for r in mine],
                color=color[arm],
                alpha=0.15,
                lw=0,
            )
        means = [r["mean"] for r in rows if r["mean"] is not None]
        positive = sorted(m for m in means if m > 0)
        floor = positive[len(positive) // 20] if positive else 0.0  # the 5th percentile: below it, float noise
        if floor and min(means) >= -1e-6 * positive[-1] and positive[-1] / floor >= 1e3:
            ax.set_yscale("log", nonpositive="mask")
            ax.set_ylim(bottom=floor / 2)
        log = " (log axis)" if ax.get_yscale() == "log" else ""
        ax.set(title=metric + log, xlabel="step", ylabel=AXIS_NAMES.get(metric, metric))
    handles = {arm: h for ax in axes for h, arm in zip(*ax.get_legend_handles_labels())}
    fig.suptitle(title, fontsize=10)
    return _done(fig, legend=(list(handles.values()), list(handles)))


AXIS_NAMES = {  # a training metric's axis: what it holds and its unit
    "eval/reward": "held-out reward (mean per prompt)",
    "kl": "KL to the reference (nats/token)",
    "entropy": "entropy (nats/token)",
    "completions/mean_length": "completion length (tokens)",
    "logps/max_sampler_gap": "max |log-prob gap| (nats)",
    "grad_norm": "gradient norm",
    "reward": "training reward (batch mean)",
    "selected_fraction": "share of samples kept",
    "val_loss": "validation loss",
}


def held_out_by_seed(arms: dict[str, tuple], changes: dict[str, dict], steps: int, title: str):
    """Training runs' held-out reward at their start and after `steps` steps: one panel per arm, a grey line per
    seed (its mean over the test prompts) and their mean in colour (`arms`: arm -> ((seeds,) start, (seeds,) end));
    a last panel with each arm's change from its start and its interval (`changes`: arm -> a summary entry with
    mean, ci_low, ci_high, level)."""
    fig = plt.figure(figsize=(3.6 * (len(arms) + 1), 3.0))
    axes = [fig.add_subplot(1, len(arms) + 1, 1)]
    axes += [fig.add_subplot(1, len(arms) + 1, k + 1, sharey=axes[0]) for k in range(1, len(arms))]  # one scale
    axes.append(fig.add_subplot(1, len(arms) + 1, len(arms) + 1))
    for i, (ax, (arm, (start, end))) in enumerate(zip(axes, arms.items())):
        for a, b in zip(start.tolist(), end.tolist()):
            ax.plot([0, steps], [a, b], color="0.6", lw=0.8)
        ax.plot([0, steps], [float(start.mean()), float(end.mean())], color=f"C{i}", lw=2, marker="o")
        ax.set(xticks=[0, steps], xlabel="step", ylabel="held-out reward")
        ax.set_title(f"{arm}: {len(start)} seeds (grey), their mean", fontsize=9)
    last = axes[-1]
    for i, d in enumerate(changes.values()):
        error = [[d["mean"] - d["ci_low"]], [d["ci_high"] - d["mean"]]]
        last.errorbar([i], [d["mean"]], yerr=error, fmt="o", capsize=6, color=f"C{i}")
    last.axhline(0, color="k", lw=0.8)
    level = min(d["level"] for d in changes.values())
    last.set(xticks=list(range(len(changes))), xticklabels=list(changes), xlim=(-0.5, len(changes) - 0.5))
    last.set(ylabel=f"change ({100 * level:.2f}% interval)")
    last.set_title("each arm's change from its start, paired", fontsize=9)
    fig.suptitle(title, fontsize=10)
    return _done(fig)


def arm_panels(
    rows: list[dict], reference: str | None, ylabel: str, title: str = "held-out reward per arm (band: 95% interval)"
):
    """Small multiples: one panel per arm of `metric_curve` rows, the `reference` arm drawn in grey in each, so
    that no arm's band hides another's (None: rows of paired differences, `difference_curve`, with 0 marked).
    Panels share both axes."""
    arms = [a for a in dict.fromkeys(r["arm"] for r in rows) if a != reference]
    fig, axes = _grid(len(arms), ncols=4, size=(3.0, 2.4), sharex=True, sharey=True)

    def line(ax, arm: str, color: str) -> None:
        mine = [r for r in rows if r["arm"] == arm]
        steps = [r["step"] for r in mine]
        ax.plot(steps, [r["mean"] for r in mine], color=color, lw=1.2, marker="o", ms=3, label=arm)
        ax.fill_between(
            steps, [_nan(r["low"]) for r in mine], [_nan(r["high"]) for r in mine], color=color, alpha=0.15, lw=0
        )

    for i, (ax, arm) in enumerate(zip(axes, arms)):
        if reference is None:
            ax.axhline(0, color="k", lw=0.8)
        else:
            line(ax, reference, "0.55")
        line(ax, arm, f"C{i % 10}")
        ax.set_title(arm if reference is None else f"{arm} (grey: {reference})", fontsize=9)
        ax.tick_params(labelsize=8)
    for ax in axes:
        ax.set_xlabel("step", fontsize=8)
        if ax.get_subplotspec().is_first_col():  # a shared y axis: the panels to the right show no scale
            ax.set_ylabel(ylabel, fontsize=8)
    fig.suptitle(title, fontsize=10)
    return _done(fig)


def interval_rows(rows: dict[str, dict], xlabel: str, title: str):
    """rows: label -> {"mean", "ci_low", "ci_high"}; one horizontal interval per row, zero marked; an
    interval that excludes 0 in colour."""
    labels = list(rows)
    fig, ax = plt.subplots(figsize=(7.5, 0.42 * len(labels) + 1.3))
    for y, label in enumerate(labels):
        r = rows[label]
        if r["ci_low"] is None:  # no interval (one sample): the mean alone
            ax.plot([r["mean"]], [y], "o", color="tab:gray")
            continue
        detected = r["ci_low"] > 0 or r["ci_high"] < 0
        ax.errorbar(
            [r["mean"]],
            [y],
            xerr=[[r["mean"] - r["ci_low"]], [r["ci_high"] - r["mean"]]],
            fmt="o",
            capsize=4,
            color="tab:red" if detected else "tab:gray",
        )
    ax.axvline(0, color="k", lw=0.8)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set(xlabel=xlabel, title=title)
    return _done(fig)
