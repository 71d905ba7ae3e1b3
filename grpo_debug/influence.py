"""TracIn influence of each training sample on a validation loss, and the experiment that settles its sign.

influence_i = <grad L_train_i, grad L_val>. Gradient descent on sample i with step lr changes the
validation loss by about -lr * influence_i (first order), so influence > 0 means "a step on i lowers
L_val": it helps, whatever the sign convention inside L_val, as long as L_val is a loss to minimise.
Seed 000 flips the sign of `-seq_logprob * advantage` and calls it a fix; `sign_experiment` measures
the prediction against real single-sample SGD steps, so the claim is checked, not argued.

Validation losses (per sequence, averaged):
  seqloss-lastadv   -seq_logprob * advantage     (advantages of the validation samples' own groups)
  seqloss-reward    -seq_logprob * reward        (seed 001: no contrast when every reward is high)
With `val = train batch` (PPO's step_part_I) every score contains the sample's own term
<g_i, g_i> / N_val >= 0 (its own share of L_val), which biases scores upward, most at small batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .logprobs import TokenLogProbs, per_token_logps, scoring_kwargs
from .config import StepConfig
from .per_sample import PerSampleGradients, SampleGradients
from .rollout import Rollout, row_chunks
from .loss import loss_weights
from .update import chunk_loss

VAL_LOSSES = ("seqloss-lastadv", "seqloss-reward")


def validation_loss(logps: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor, rewards: torch.Tensor,
                    kind: str = "seqloss-lastadv", flip_sign: bool = False) -> torch.Tensor:
    """Per-sequence validation losses (N,); their mean is L_val. `flip_sign` is the seed-000 "fix"."""
    seq_logp = (logps * mask).sum(-1)
    if kind == "seqloss-lastadv":
        per_seq = -seq_logp * advantages
    elif kind == "seqloss-reward":
        per_seq = -seq_logp * rewards
    else:
        raise ValueError(f"validation loss must be one of {VAL_LOSSES}, got {kind!r}")
    return -per_seq if flip_sign else per_seq


@dataclass
class ValidationSet:
    rollout: Rollout
    logprobs: TokenLogProbs
    advantages: torch.Tensor
    rewards: torch.Tensor


VAL_SOURCES = ("same_batch", "random", "topk")


def validation_set(step, source: str = "same_batch", size: int = 64) -> ValidationSet:
    """same_batch: the training batch itself (PPO's step_part_I). random: `size` fresh samples on held-out
    prompts, advantages within their groups. topk: the `size` best of 2 x size fresh samples, advantages
    normalised over the selected set as one group (seed 000/001: all good samples, no contrast)."""
    from .advantages import compute_advantages
    from .evaluation import eval_prompts
    from .logprobs import compute_logprobs
    from .rewards import compute_rewards
    from .rollout import rollout
    run, cfg = step.result, step.cfg
    if source == "same_batch":
        return ValidationSet(run.rollout, run.logprobs, run.advantages.values, run.rewards.total)
    pool = size * (2 if source == "topk" else 1)
    if source not in VAL_SOURCES or pool % cfg.num_generations:
        raise ValueError(f"source must be one of {VAL_SOURCES} and size a multiple of G={cfg.num_generations}")
    val_cfg = cfg.replace(seed=cfg.seed + 1)
    prompts = eval_prompts(cfg.task, pool // cfg.num_generations)
    r = rollout(step.policy, step.loaded.tokenizer, val_cfg, prompts)
    rewards = compute_rewards(r.prompts, r.completions, r.num_generations, step.scorer).total
    if source == "random":
        advantages = compute_advantages(rewards, cfg.num_generations, cfg.scale_rewards)
    else:
        keep = rewards.argsort(descending=True)[:size].sort().values
        r, rewards = r.rows(keep), rewards[keep]
        advantages = compute_advantages(rewards, size, cfg.scale_rewards)
    logprobs = compute_logprobs(step.policy, step.loaded.reference, r, cfg, reference_is_policy=True)
    return ValidationSet(r, logprobs, advantages, rewards)


def _val_share(model, val: ValidationSet, cfg: StepConfig, kind: str, rows: list[int], flip_sign: bool = False):
    """These rows' share of L_val (the mean over all N_val sequences)."""
    logps = per_token_logps(model, val.rollout.rows(rows), **scoring_kwargs(cfg))
    per_seq = validation_loss(logps, val.logprobs.mask[rows], val.advantages[rows], val.rewards[rows], kind, flip_sign)
    return per_seq.sum() / val.rollout.num_samples


def validation_gradient(model, val: ValidationSet, cfg: StepConfig, kind: str, flip_sign: bool = False):
    """(L_val, {param: dL_val/dparam}) with the model scored as `cfg` says, 8 rows at a time."""
    params = [p for p in model.parameters() if p.requires_grad]
    total, grads = 0.0, [torch.zeros_like(p) for p in params]
    torch.manual_seed(0)
    for rows in row_chunks(val.rollout.num_samples):
        share = _val_share(model, val, cfg, kind, rows, flip_sign)
        total += share.item()
        for g, d in zip(grads, torch.autograd.grad(share, params)):
            g += d
    return total, dict(zip(params, grads))


def self_terms(model, train: SampleGradients, val: ValidationSet, cfg: StepConfig, kind: str) -> torch.Tensor:
    """Same-batch only: (N,) each sample's inner product with its OWN share of L_val's gradient,
    <g_train_i, grad(val_loss_i) / N>: the part of influence_i that says "a step on i helps i"."""
    chunks = []
    torch.manual_seed(0)
    for rows in row_chunks(val.rollout.num_samples):
        hooks = PerSampleGradients(model)
        with hooks.capture():
            _val_share(model, val, cfg, kind, rows).backward()
        chunks.append(hooks.factors())
    model.zero_grad(set_to_none=True)
    return train.inner(SampleGradients(chunks)).float()


def per_sample_train_gradients(model, rollout: Rollout, logprobs: TokenLogProbs, advantages: torch.Tensor,
                               cfg: StepConfig) -> SampleGradients:
    """Each sample's gradient of its share of the GRPO loss, factored, one backward per 8 rows."""
    weights = loss_weights(logprobs.mask, cfg.loss_type, cfg.max_new_tokens)
    chunks = []
    torch.manual_seed(0)
    for rows in row_chunks(rollout.num_samples):
        hooks = PerSampleGradients(model)
        with hooks.capture():
            chunk_loss(model, rollout, logprobs, advantages, cfg, rows, weights).backward()
        chunks.append(hooks.factors())
    model.zero_grad(set_to_none=True)
    return SampleGradients(chunks)


def influence_scores(train: SampleGradients, val_grad: dict) -> torch.Tensor:
    """(N,) <g_train_i, g_val> over the parameters both cover, without building any g_train_i."""
    return train.dot(val_grad).float()


@dataclass
class SignExperiment:
    predicted: torch.Tensor  # (N,) -lr * influence_i
    measured: torch.Tensor  # (N,) L_val after one SGD step on sample i alone, minus L_val before
    spearman: float
    sign_agreement: float  # fraction of moved samples where predicted and measured have the same sign
    lr: float
    moved: int  # samples with a non-zero gradient, over which the two statistics are taken


def _spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    ra, rb = a.argsort().argsort().double(), b.argsort().argsort().double()
    return torch.corrcoef(torch.stack([ra, rb]))[0, 1].item()


def sign_experiment(model, rollout: Rollout, logprobs: TokenLogProbs, advantages: torch.Tensor, cfg: StepConfig,
                    val: ValidationSet, kind: str = "seqloss-lastadv", flip_sign: bool = False,
                    lr: float = 1e-3) -> SignExperiment:
    """For each sample: predicted change of L_val (-lr * influence) against a real SGD step on it alone.

    The measured L_val always uses the unflipped loss (the quantity we want to go down); `flip_sign`
    only changes the influence used for the prediction, which is what the seed-000 "fix" changes.
    """
    train = per_sample_train_gradients(model, rollout, logprobs, advantages, cfg)
    _, val_grad = validation_gradient(model, val, cfg, kind, flip_sign)
    predicted = -lr * influence_scores(train, val_grad)
    train_grads = train.gradients()
    params = list(train_grads)

    def val_loss() -> float:
        with torch.no_grad():
            torch.manual_seed(0)
            return sum(_val_share(model, val, cfg, kind, rows).item() for rows in row_chunks(val.rollout.num_samples))

    base = val_loss()
    before = [p.detach().clone() for p in params]
    measured = []
    with torch.no_grad():
        for i in range(rollout.num_samples):
            for p in params:
                p.sub_(lr * train_grads[p][i])
            measured.append(val_loss() - base)
            for p, b in zip(params, before):
                p.copy_(b)
    measured = torch.tensor(measured)
    # a sample with a (near-)zero gradient (advantage ~0, no KL) takes no measurable step: a change below
    # 1e-4 of the largest predicted one is float32 noise in L_val, so it is left out of both statistics
    moved = predicted.abs() > 1e-4 * predicted.abs().max()
    agree = (torch.sign(predicted[moved]) == torch.sign(measured[moved])).float().mean().item()
    return SignExperiment(predicted, measured, _spearman(predicted[moved], measured[moved]), agree, lr,
                          int(moved.sum()))
