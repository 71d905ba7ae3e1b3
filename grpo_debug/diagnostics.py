"""Seed 002's questions answered from a step's numbers: is a loss of 0.0000 a failure? where does the time go?"""

from __future__ import annotations

from .step import StepRun


def triage_zero_loss(run: StepRun, tol: float = 1e-6) -> str:
    """Tell "loss ~0, normal" from the failures that also print 0.0000."""
    adv, lp, loss, upd = run.advantages, run.logprobs, run.loss, run.update
    if lp.mask.sum() == 0:
        return "FAILURE: no completion token is scored (empty mask): check the completion mask"
    if adv.frac_reward_zero_std == 1.0:
        return ("FAILURE: every group has identical rewards, so every advantage is 0 and there is no signal "
                "(frac_reward_zero_std = 1): make the reward graded, raise the temperature, or drop such groups")
    if (lp.policy * lp.mask).abs().sum() == 0:
        return "FAILURE: all log-probs are 0: the log-prob computation is broken"
    if abs(loss.loss.item()) < tol:
        grad = f"grad_norm = {upd.grad_norm:.3g}" if upd is not None else "run the update to see grad_norm"
        return (f"NORMAL: loss = {loss.loss.item():.2e} because the ratio is exactly 1 at step 0 and advantages "
                f"are centred per group; the gradient is not 0 ({grad}); "
                f"{adv.frac_reward_zero_std:.0%} of groups have zero reward std")
    return f"loss = {loss.loss.item():.4g}: not zero"
