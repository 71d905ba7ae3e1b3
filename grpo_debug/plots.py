"""Every matplotlib figure of the suite. Each function takes phase results and returns the Figure,
closed in pyplot so that a notebook shows it exactly once: as the cell's value."""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
import numpy as np
import torch

from .advantages import Advantages
from .evaluation import Evaluation
from .logprobs import TokenLogProbs
from .loss import KL_ESTIMATORS, per_token_kl
from .rewards import Rewards


def _done(fig):
    fig.tight_layout()
    plt.close(fig)
    return fig


def rewards_per_group(rewards: Rewards, num_generations: int, title: str = "rewards per group"):
    values = rewards.total.view(-1, num_generations).numpy()
    fig, ax = plt.subplots(figsize=(7, 3))
    for b, row in enumerate(values):
        ax.scatter(np.full(len(row), b), row, alpha=0.6, s=18)
        ax.hlines(row.mean(), b - 0.3, b + 0.3, color="k")
    ax.set(xlabel="prompt (group)", ylabel="reward", title=title)
    return _done(fig)


def advantages_bars(adv: Advantages, num_generations: int, title: str = "advantages"):
    values = adv.values.numpy()
    fig, ax = plt.subplots(figsize=(7, 3))
    colors = ["tab:red" if (i // num_generations) in adv.phantom_groups else
              "tab:gray" if (i // num_generations) in adv.zero_std_groups else "tab:blue" for i in range(len(values))]
    ax.bar(np.arange(len(values)), values, color=colors)
    for b in range(1, len(values) // num_generations):
        ax.axvline(b * num_generations - 0.5, color="k", lw=0.5)
    ax.set(xlabel="sample (grey: zero-std group, red: phantom group)", ylabel="advantage", title=title)
    return _done(fig)


def logprob_gap_heatmap(logprobs: TokenLogProbs, title: str = "|sampler - recomputed| per token"):
    gap = logprobs.sampler_gap.numpy()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    im = ax.imshow(gap, aspect="auto", cmap="magma", vmin=0, vmax=max(gap.max(), 1e-6))
    ax.set(xlabel="completion token", ylabel="sample", title=title)
    fig.colorbar(im, ax=ax, label="nats")
    return _done(fig)


def gap_by_toggle(gaps: dict[str, float], title: str = "max |sampler - recomputed| log-prob"):
    names = list(gaps)
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.barh(names, [max(gaps[n], 1e-8) for n in names], color=["tab:green" if gaps[n] < 1e-4 else "tab:red" for n in names])
    ax.set_xscale("log")
    ax.axvline(1e-4, color="k", ls="--", lw=0.8)
    ax.set(xlabel="nats (log scale; dashed: 1e-4)", title=title)
    return _done(fig)


def kl_per_token(logps: torch.Tensor, ref_logps: torch.Tensor, mask: torch.Tensor, sample: int = 0,
                 title: str = "per-token KL estimates"):
    length = int(mask[sample].sum())
    fig, ax = plt.subplots(figsize=(8, 3))
    for estimator in KL_ESTIMATORS:
        values = per_token_kl(logps[sample:sample + 1], ref_logps[sample:sample + 1], None, estimator)[0, :length]
        ax.plot(values.numpy(), label=estimator, marker=".", lw=1)
    ax.set(xlabel="completion token", ylabel="estimate", title=title)
    ax.legend()
    return _done(fig)


def per_sample_grad_norms(norms: torch.Tensor, advantages: torch.Tensor, title: str = "per-sample gradient norms"):
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.scatter(advantages.numpy(), norms.numpy(), s=16)
    ax.set(xlabel="advantage", ylabel="||grad of sample's loss share||", title=title)
    return _done(fig)


def eval_before_after(evaluation: Evaluation, title: str = "held-out reward, paired seeds"):
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3), gridspec_kw={"width_ratios": [2, 1]})
    before, after = evaluation.before.per_prompt.numpy(), evaluation.after.per_prompt.numpy()
    for b, a in zip(before, after):
        ax1.plot([0, 1], [b, a], color="tab:gray", alpha=0.5)
    ax1.set(xticks=[0, 1], xticklabels=["before", "after"], ylabel="mean reward per prompt", title=title)
    ax2.errorbar([0], [evaluation.delta], yerr=[[evaluation.delta - evaluation.ci_low], [evaluation.ci_high - evaluation.delta]],
                 fmt="o", capsize=6)
    ax2.axhline(0, color="k", lw=0.8)
    ax2.set(xticks=[], ylabel="after - before (95% CI)")
    return _done(fig)


def time_per_phase(timings: dict[str, float], title: str = "seconds per phase"):
    fig, ax = plt.subplots(figsize=(7, 2.8))
    ax.barh(list(timings), list(timings.values()))
    ax.set(xlabel="seconds", title=title)
    return _done(fig)


def influence_histograms(panels: dict[str, np.ndarray], bins: int = 30, title: str = "influence"):
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 2.8), sharey=True)
    for ax, (name, values) in zip(np.atleast_1d(axes), panels.items()):
        ax.hist(values, bins=bins)
        ax.axvline(0, color="k", lw=0.8)
        ax.set_title(textwrap.fill(name, 36), fontsize=8)
    fig.suptitle(title)
    return _done(fig)


def sign_scatter(experiments: dict, title: str = "predicted vs measured change of L_val"):
    """experiments: name -> SignExperiment."""
    fig, axes = plt.subplots(1, len(experiments), figsize=(4 * len(experiments), 3.2))
    for ax, (name, e) in zip(np.atleast_1d(axes), experiments.items()):
        ax.scatter(e.predicted.numpy(), e.measured.numpy(), s=14)
        lim = float(max(e.predicted.abs().max(), e.measured.abs().max()))
        ax.plot([-lim, lim], [-lim, lim], color="k", lw=0.6)
        ax.set(xlabel="predicted: -lr * influence", ylabel="measured", title=f"{name}\nSpearman {e.spearman:.2f}, "
               f"sign agreement {e.sign_agreement:.0%}")
    fig.suptitle(title)
    return _done(fig)


def selection_results(results: list, title: str = "one update on the selected samples"):
    """results: SelectionResult list. Change of L_val, and of the held-out reward with its interval."""
    names = [r.strategy for r in results]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3))
    left.bar(names, [r.val_loss_after - r.val_loss_before for r in results])
    left.axhline(0, color="k", lw=0.8)
    left.set(ylabel="change of L_val (lower: helped)")
    deltas = np.array([r.reward_after - r.reward_before for r in results])
    errors = np.array([[d - r.reward_ci_low, r.reward_ci_high - d] for d, r in zip(deltas, results)]).T
    right.bar(names, deltas, yerr=errors.clip(min=0), capsize=3)
    right.axhline(0, color="k", lw=0.8)
    right.set(ylabel="change of held-out reward")
    for ax in (left, right):
        ax.tick_params(axis="x", rotation=30, labelsize=8)
    fig.suptitle(title)
    return _done(fig)
