"""A step's numbers under TRL's metric names where TRL logs the same quantity (and this suite's own under
its names): what the CLI reports, the train loop records, and a replay compares with the trainer's log."""

from __future__ import annotations

import torch

from ..logprobs import completion_mask
from ..sampler import kept_mass, mismatch_metrics
from ..step import StepRun
from ..update import StepResult


def metrics(run: StepRun) -> dict[str, float]:
    """The step's numbers under TRL's metric names where TRL logs the same quantity, phase by phase (a phase
    not run has none)."""
    out: dict[str, float] = {}
    if run.rollout is not None:
        out.update(rollout_metrics(run.rollout))
    if run.logprobs is not None:
        out.update(logprob_metrics(run.logprobs, run.rollout))
    if run.rewards is not None:
        out.update({f"rewards/{k}/mean": torch.nanmean(v).item() for k, v in run.rewards.components.items()})
    if run.advantages is not None:
        adv = run.advantages
        out.update(
            {
                "reward": adv.reward,
                "reward_std": adv.reward_std,
                "frac_reward_zero_std": adv.frac_reward_zero_std,
                "advantages/max_abs": adv.max_abs_advantage,
                "advantages/phantom_groups": float(len(adv.phantom_groups)),
            }
        )
    if run.loss is not None:
        loss = run.loss
        out.update({"loss": loss.loss.item(), "loss/policy": loss.policy_loss.item(), "loss/kl": loss.kl_loss.item()})
        out.update(loss.metrics)
    if run.update is not None:
        out.update(update_metrics(run.update))
    if run.evaluation is not None:
        ev = run.evaluation
        out.update(
            {
                "eval/reward_before": ev.before.reward,
                "eval/reward_after": ev.after.reward,
                "eval/delta": ev.delta,
                "eval/delta_ci_low": ev.ci_low,
                "eval/delta_ci_high": ev.ci_high,
            }
        )
    out.update({f"time/{phase}_s": timing.seconds for phase, timing in run.timings.items()})
    return out


def rollout_metrics(r) -> dict[str, float]:
    lengths = r.completion_lengths.float()
    return {
        "completions/mean_length": lengths.mean().item(),
        "completions/min_length": lengths.min().item(),
        "completions/max_length": lengths.max().item(),
        "completions/clipped_ratio": 1 - r.finished.float().mean().item(),
        "identical_groups": float(len(r.identical_groups)),
    }


def logprob_metrics(lp, r) -> dict[str, float]:
    """The scoring's gaps; with the rollout, the sampler's log-probs against the recomputed ones, as verl
    measures them."""
    out = {"logps/max_sampler_gap": lp.max_sampler_gap, "logps/top_p_gap": lp.top_p_gap, "logps/eos_kept": lp.eos_kept}
    if r is not None:
        sampled = completion_mask(r, "keep_first_eos")
        out.update(mismatch_metrics(lp.policy, r.sampler_logps, sampled))
        out["logps/kept_mass_mean"] = kept_mass(r)[sampled.bool()].mean().item()
    return out


def update_metrics(upd: StepResult) -> dict[str, float]:
    """grad_norm and the update's size; what TRL logs over the optimizer steps of this generation (every
    micro-batch's metrics averaged, as TRL's log does with logging_steps = those steps), and the same per pass
    under `iteration_k/`."""
    out = {"grad_norm": upd.grad_norm, "update_norm": upd.update_norm, "optimizer_steps": float(upd.optimizer_steps)}
    keys = upd.iterations[0].metrics.keys()
    for k in keys:
        out[k] = sum(it.metrics[k] for it in upd.iterations) / len(upd.iterations)
    for i, it in enumerate(upd.iterations, start=1):
        out.update({f"iteration_{i}/{k}": v for k, v in it.metrics.items()})
        out[f"iteration_{i}/grad_norm"] = it.grad_norms[0]
    if len(upd.per_sample_grad_norms):
        out["per_sample_grad_norm/max"] = upd.per_sample_grad_norms.max().item()
    return out
