"""A step's numbers under TRL's metric names where TRL logs the same quantity (and this suite's own under
its names): what the CLI reports, the train loop records, and a replay compares with the trainer's log."""

from __future__ import annotations

import torch

from .logprobs import completion_mask
from .sampler import kept_mass, mismatch_metrics
from .step import StepRun
from .update import StepResult


def metrics(run: StepRun) -> dict[str, float]:
    """The step's numbers under TRL's metric names where TRL logs the same quantity."""
    out: dict[str, float] = {}
    r, lp, adv, loss, upd = run.rollout, run.logprobs, run.advantages, run.loss, run.update
    if r is not None:
        lengths = r.completion_lengths.float()
        out.update(
            {
                "completions/mean_length": lengths.mean().item(),
                "completions/min_length": lengths.min().item(),
                "completions/max_length": lengths.max().item(),
                "completions/clipped_ratio": 1 - r.finished.float().mean().item(),
                "identical_groups": float(len(r.identical_groups)),
            }
        )
    if lp is not None:
        out.update(
            {
                "logps/max_sampler_gap": lp.max_sampler_gap,
                "logps/top_p_gap": lp.top_p_gap,
                "logps/eos_kept": lp.eos_kept,
            }
        )
        if r is not None:  # the sampler's log-probs against the recomputed ones, as verl measures them
            sampled = completion_mask(r, "keep_first_eos")
            out.update(mismatch_metrics(lp.policy, r.sampler_logps, sampled))
            out["logps/kept_mass_mean"] = kept_mass(r)[sampled.bool()].mean().item()
    if run.rewards is not None:
        for name, values in run.rewards.components.items():
            out[f"rewards/{name}/mean"] = torch.nanmean(values).item()
    if adv is not None:
        out.update(
            {
                "reward": adv.reward,
                "reward_std": adv.reward_std,
                "frac_reward_zero_std": adv.frac_reward_zero_std,
                "advantages/max_abs": adv.max_abs_advantage,
                "advantages/phantom_groups": float(len(adv.phantom_groups)),
            }
        )
    if loss is not None:
        out.update(
            {
                "loss": loss.loss.item(),
                "loss/policy": loss.policy_loss.item(),
                "loss/kl": loss.kl_loss.item(),
                **loss.metrics,
            }
        )
    if upd is not None:
        out.update(
            {"grad_norm": upd.grad_norm, "update_norm": upd.update_norm, "optimizer_steps": float(upd.optimizer_steps)}
        )
        out.update(update_metrics(upd))
        if len(upd.per_sample_grad_norms):
            out["per_sample_grad_norm/max"] = upd.per_sample_grad_norms.max().item()
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
    for phase, timing in run.timings.items():
        out[f"time/{phase}_s"] = timing.seconds
    return out


def update_metrics(upd: StepResult) -> dict[str, float]:
    """What TRL logs over the optimizer steps of this generation (every micro-batch's metrics averaged, as
    TRL's log does with logging_steps = those steps), and the same per pass under `iteration_k/`."""
    out = {}
    keys = upd.iterations[0].metrics.keys()
    for k in keys:
        out[k] = sum(it.metrics[k] for it in upd.iterations) / len(upd.iterations)
    for i, it in enumerate(upd.iterations, start=1):
        out.update({f"iteration_{i}/{k}": v for k, v in it.metrics.items()})
        out[f"iteration_{i}/grad_norm"] = it.grad_norms[0]
    return out
