"""pandas tables of a step: per sample, and variants of the config side by side on the same rollout."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..config import StepConfig
from ..loss import compute_loss, loss_weights
from ..metrics import metrics
from ..specs import loss_spec_of
from ..step import GRPOStep, StepRun


def per_sample(run: StepRun) -> pd.DataFrame:
    """One row per completion: its group, text, total reward, reward components (`rewards/<name>`, TRL's
    prefix, so that no component can overwrite the total), advantage, log-prob and loss share."""
    r, lp = run.rollout, run.logprobs
    rows = {
        "group": [i // r.num_generations for i in range(r.num_samples)],
        "completion": [c if len(c) <= 60 else c[:57] + "..." for c in r.completions],
        "length": r.completion_lengths.tolist(),
    }
    if run.rewards is not None:
        rows["reward"] = run.rewards.total.tolist()
        rows.update({f"rewards/{name}": values.tolist() for name, values in run.rewards.components.items()})
    if run.advantages is not None:
        rows["advantage"] = run.advantages.values.tolist()
    if lp is not None:
        rows["seq_logp"] = (lp.policy * lp.mask).sum(1).tolist()
        rows["entropy"] = ((lp.entropies * lp.mask).sum(1) / lp.mask.sum(1).clamp(min=1)).tolist()
        rows["max_sampler_gap"] = lp.sampler_gap.max(1).values.tolist()
    if run.loss is not None:
        rows["loss_share"] = run.loss.per_sample_loss.tolist()
    if run.update is not None and len(run.update.per_sample_grad_norms):
        rows["grad_norm"] = run.update.per_sample_grad_norms.tolist()
    return pd.DataFrame(rows)


def compare_variants(
    step: GRPOStep,
    variants: dict[str, dict],
    base: StepConfig | None = None,
    until: str = "loss",
    columns: list[str] | None = None,
) -> pd.DataFrame:
    """Each variant (a dict of StepConfig changes) run from the same base run (its cached rollout); one row
    per variant. The step's current run stays the base run."""
    base_run = step.run(base or step.cfg, until=until)
    rows = {}
    for name, changes in variants.items():
        run = step.run(base_run.config.replace(**changes), until=until, base=base_run, remember=False)
        values = {k: v for k, v in metrics(run).items() if not k.startswith("time/")}
        rows[name] = {k: values.get(k, float("nan")) for k in columns} if columns else values
    return pd.DataFrame.from_dict(rows, orient="index")


def gradient_of_loss_wrt_logps(run: StepRun, cfg: StepConfig) -> torch.Tensor:
    """d loss / d logp per token: what the backward pass sends into the model, even when the loss is ~0."""
    lp = run.logprobs
    logps = lp.policy.clone().requires_grad_(True)
    loss = compute_loss(
        logps,
        lp.policy,
        lp.reference,
        run.advantages.values,
        lp.mask,
        entropies=lp.entropies,
        **loss_spec_of(cfg).kwargs(),
    ).loss
    (grad,) = torch.autograd.grad(loss, logps)
    return grad


def loss_value_at_ratio_one(run: StepRun) -> float:
    """The policy term's value at ratio 1 from the advantages and lengths alone: -sum_i A_i * w_i, with w_i
    the total weight the loss type gives sample i's tokens (grpo: 1/N, so ~0 for centred advantages;
    bnpo/dapo: T_i / sum T; dr_grpo: T_i / (N * max_completion_length))."""

    weights = loss_weights(run.logprobs.mask, run.config.loss_type, run.config.max_new_tokens).sum(-1)
    return -(run.advantages.values * weights).sum().item()


def marked_completions(
    run: StepRun, flags: torch.Tensor, tokenizer, samples: list[int], left: str = "«", right: str = "»"
) -> pd.DataFrame:
    """Each chosen completion's text with the flagged tokens ((N, C) bool, e.g. an iteration's `clipped`)
    between `left` and `right`, and its advantage and number of flagged tokens."""
    r = run.rollout
    rows = {}
    for i in samples:
        length = int(r.completion_lengths[i])
        pieces = [tokenizer.decode([t]) for t in r.completion_ids[i, :length].tolist()]
        text = "".join(f"{left}{p}{right}" if flags[i, k] else p for k, p in enumerate(pieces))
        rows[i] = {
            "advantage": run.advantages.values[i].item(),
            "flagged": int(flags[i, :length].sum()),
            "completion": text,
        }
    return pd.DataFrame.from_dict(rows, orient="index")


def token_gradient_curves(loss_types: list[str], ratios: torch.Tensor, **spec) -> dict[str, dict[str, np.ndarray]]:
    """d loss / d logp that one token receives from each loss type at each ratio pi / pi_old, for A = +1 and
    A = -1: a batch of one-token sequences with old_logp = 0 and logp = log(ratio), one per ratio, the
    normalisation (1 / number of sequences) undone."""
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
                **{**spec, "loss_type": loss_type},
            ).loss
            (grad,) = torch.autograd.grad(loss, logps)
            out[loss_type][sign] = (grad[:, 0] * len(ratios)).numpy()
    return out
