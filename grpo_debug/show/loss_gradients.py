"""What the loss sends back into the model, beside its value: d loss / d logp per token (not 0 where the loss
value is), the policy term's value at ratio 1 from the advantages and lengths alone, and the gradient one
token gets from each loss type as its ratio moves."""

from __future__ import annotations

import numpy as np
import torch

from ..config import StepConfig
from ..loss import batch_loss, compute_loss, loss_weights
from ..specs import loss_spec_of, sampler_correction_of
from ..step import StepRun


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
