"""What the loss sends back into the model, beside its value: d loss / d logp per token (not 0 where the loss
value is), the policy term's value at ratio 1 from the advantages and lengths alone, the gradient one
token gets from each loss type as its ratio moves, and the tables notebook 05 reads: the loss types at ratio 1,
the clip case by case, and one token's terms as the engine computes them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pandas as pd
import torch

from ..config import StepConfig
from ..logprobs import TokenLogProbs
from ..loss import batch_loss, compute_loss, loss_weights
from ..specs import loss_spec_of, sampler_correction_of
from ..step import GRPOStep, StepRun

TOKEN_LEVEL = ("grpo", "bnpo", "dr_grpo", "dapo")  # the normalisers of a per-token loss


def gradient_of_loss_wrt_logps(run: StepRun, cfg: StepConfig) -> torch.Tensor:
    """(N, C) d loss / d logp per token of the batch's loss under `cfg` (`loss.batch_loss`, the sampler
    correction included): what the backward pass sends into the model, even when the loss is ~0."""
    logps = run.logprobs.policy.clone().requires_grad_(True)
    spec, correction = loss_spec_of(cfg), sampler_correction_of(cfg)
    loss = batch_loss(spec, correction, run.logprobs, run.advantages.values, run.rollout.sampler_logps, logps).loss
    (grad,) = torch.autograd.grad(loss, logps)
    return grad


def loss_value_at_ratio_one(run: StepRun) -> float:
    """The policy term's value at ratio 1 from the advantages and lengths alone: -sum_i A_i * w_i, with w_i
    the total weight the loss type gives sample i's tokens (grpo: 1/N, so ~0 for centred advantages;
    bnpo/dapo: T_i / sum T; dr_grpo: T_i / (N * max_completion_length))."""

    weights = loss_weights(run.logprobs.mask, run.config.loss_type, run.config.max_new_tokens).sum(-1)
    return -(run.advantages.values * weights).sum().item()


def token_gradient_curves(loss_types: list[str], ratios: torch.Tensor, **spec) -> dict[str, dict[str, np.ndarray]]:
    """d loss / d logp that one token receives from each loss type at each ratio pi / pi_old, for A = +1 and
    A = -1: a batch of one-token sequences with old_logp = 0 and logp = log(ratio), one per ratio, the
    normalisation (1 / number of sequences) undone. The policy term alone: no reference, so beta is 0."""
    out = {}
    old = torch.zeros(len(ratios), 1)
    for loss_type in loss_types:
        out[loss_type] = {}
        for sign, value in (("A = +1", 1.0), ("A = -1", -1.0)):
            logps = torch.log(ratios).unsqueeze(1).clone().requires_grad_(True)
            loss = compute_loss(
                logps,
                old,
                None,
                torch.full((len(ratios),), value),
                torch.ones_like(old),
                **{**spec, "loss_type": loss_type, "beta": 0.0},
            ).loss
            (grad,) = torch.autograd.grad(loss, logps)
            out[loss_type][sign] = (grad[:, 0] * len(ratios)).numpy()
    return out


def loss_types_at_ratio_one(
    step: GRPOStep,
    cfg: StepConfig,
    by_hand: Callable[[str], float] | None = None,
    loss_types: tuple[str, ...] = (*TOKEN_LEVEL, "reinforce_sum", "reinforce_mean"),
) -> pd.DataFrame:
    """One row per loss type, each on `cfg`'s rollout and log-probs (ratio 1): the engine's `loss` and
    `loss/policy`, the norm of d loss / d logp (`gradient_of_loss_wrt_logps`), `by_hand(loss_type)` (the
    normaliser written out) and -sum A_i w_i (`loss_value_at_ratio_one`); the last two NaN for REINFORCE, and
    `by hand` NaN for a loss type `by_hand` does not handle yet (it raises KeyError or NotImplementedError)."""
    base = step.run(cfg, until="loss")
    rows = {}
    for loss_type in loss_types:
        run = step.run(base.config.replace(loss_type=loss_type), until="loss", base=base, remember=False)
        token_level = loss_type in TOKEN_LEVEL
        rows[loss_type] = {
            "loss": run.loss.loss.item(),
            "loss/policy": run.loss.policy_loss.item(),
            "|d loss / d logp|": gradient_of_loss_wrt_logps(run, run.config).norm().item(),
            "by hand": _or_nan(by_hand, loss_type) if by_hand is not None and token_level else float("nan"),
            "-sum A_i w_i": loss_value_at_ratio_one(run) if token_level else float("nan"),
        }
    return pd.DataFrame.from_dict(rows, orient="index")


def _or_nan(fn: Callable[[str], float], loss_type: str) -> float:
    """fn(loss_type), or NaN where fn does not handle that loss type (a student's normaliser, part written)."""
    try:
        return fn(loss_type)
    except (KeyError, NotImplementedError):
        return float("nan")


def clip_cases(
    per_token_loss: Callable[..., torch.Tensor],
    epsilon: float = 0.2,
    ratios: tuple[float, ...] = (0.7, 1.0, 1.3),
    advantages: tuple[float, ...] = (1.0, -1.0),
) -> pd.DataFrame:
    """d l / d log pi_theta of one token at each advantage A and ratio rho, one row per pair: which side of
    [1 - epsilon, 1 + epsilon] rho is on and which term the min takes. `per_token_loss(logp, old, ref, A, beta,
    eps_low, eps_high)` (notebook 05's exercise 2) is called on (1, 1) tensors: log pi_old = 0, log pi_theta =
    log rho, beta = 0 (the reference at pi_theta's log-prob)."""
    rows = []
    for A in advantages:
        for rho in ratios:
            logp = torch.log(torch.tensor([[rho]])).requires_grad_(True)
            loss = per_token_loss(logp, torch.zeros(1, 1), logp.detach(), torch.tensor([[A]]), 0.0, epsilon, epsilon)
            (grad,) = torch.autograd.grad(loss.sum(), logp)
            clipped = min(max(rho, 1 - epsilon), 1 + epsilon)
            side = "below 1 - eps" if rho < 1 - epsilon else ("above 1 + eps" if rho > 1 + epsilon else "inside")
            takes = "rho A" if rho * A <= clipped * A else "clip(rho) A: a constant"
            rows.append({"A": A, "rho": rho, "rho is": side, "the min takes": takes, "d l / d log pi": grad.item()})
    return pd.DataFrame(rows)


def one_token_from_engine(
    cfg: StepConfig,
    lp: TokenLogProbs,
    advantages: torch.Tensor,
    logps_by_pass: dict[str, torch.Tensor],
    loss_type: str,
    i: int,
    t: int,
) -> dict[str, dict[str, torch.Tensor]]:
    """Token (i, t)'s terms as `compute_loss` computes them under `cfg`'s loss with `loss_type`, the batch one
    micro-batch, for each pass's (N, C) log-probs of pi_theta (pi_old's and the reference's: `lp`'s; advantages
    (N,)): rho, beta k3, l_it, its share of the loss under `loss_type` (`loss_weights`), and d loss / d logp."""
    spec = dataclasses.replace(
        loss_spec_of(cfg), loss_type=loss_type, gradient_accumulation_steps=1, steps_per_generation=1
    )
    weight = loss_weights(lp.mask, loss_type, cfg.max_new_tokens)[i, t]
    out = {}
    for name, logps in logps_by_pass.items():
        logps = logps.clone().requires_grad_(True)
        loss = compute_loss(
            logps, lp.policy, lp.reference, advantages, lp.mask, entropies=lp.entropies, **spec.kwargs()
        )
        (grad,) = torch.autograd.grad(loss.loss, logps)
        l_it = loss.per_token_loss[i, t]
        out[name] = {
            "rho": loss.ratio[i, t],
            "beta k3": cfg.beta * loss.per_token_kl[i, t],
            "l_it": l_it,
            f"share ({loss_type})": l_it * weight,
            f"d loss / d logp ({loss_type})": grad[i, t],
        }
    return out
