"""Selection by influence: keep the samples a strategy selects, take one step (SGD or the step's AdamW) on them
only, then measure L_val and the held-out reward on the 'test' prompts (paired sampling seeds, bootstrap 95%
interval over prompts). "influence<0" is what "influence>0" keeps under the TracIn-sign report's flipped
sign: comparing the two settles the sign on the quantity the report cares about, the reward.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from ..choices import SELECTIONS
from ..evaluation import eval_prompts as test_prompts
from ..evaluation import eval_side
from ..logprobs import TokenLogProbs
from ..loss import Batch, Normalisation, loss_weights
from ..rollout import Rollout, row_chunks
from ..stats import prompt_bootstrap
from ..update import DROPOUT_SEED, scored_rows_loss, update
from .influence import (
    ValidationSet,
    influence_scores,
    per_sample_train_gradients,
    signs,
    validation_gradient,
    validation_loss_value,
)
from .optimizer import adam_direction, clip_by_total_norm, warmed_state
from .specs import StepSpecs

OPTIMIZERS = ("sgd", "adamw")


def select(scores: torch.Tensor, strategy: str, seed: int = 0) -> torch.Tensor:
    """Indices (sorted) of the training samples a strategy keeps; signs follow `influence.signs`
    (|score| within the tolerance counts as 0, neither > 0 nor < 0)."""
    n, order = len(scores), scores.argsort(descending=True)
    if strategy == "all":
        keep = torch.arange(n)
    elif strategy in ("influence>0", "influence<0"):
        keep = (signs(scores) == (1 if strategy == "influence>0" else -1)).nonzero().flatten()
    elif strategy == "top_half":
        keep = order[: n // 2]
    elif strategy == "bottom_half":
        keep = order[n - n // 2 :]
    elif strategy == "random_half":
        keep = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[: n // 2]
    else:
        raise ValueError(f"selection must be one of {SELECTIONS}, got {strategy!r}")
    return keep.sort().values


@dataclass(frozen=True)
class SelectionResult:
    strategy: str
    optimizer: str  # OPTIMIZERS: "adamw" is update.py's step; "sgd" plain SGD at `lr`
    lr: float
    selected: tuple[int, ...]  # training sample indices
    val_set: str  # the validation set behind the scores and L_val, e.g. "random 64 (validation prompts)"
    val_loss_before: float
    val_loss_after: float
    reward_prompts: str  # the named prompt set the rewards are measured on: always "test"
    reward_before: float  # mean reward on the test prompts, same sampling seeds before and after
    reward_after: float
    reward_delta: float  # mean over prompts of the paired change
    reward_ci_low: float  # 95% bootstrap interval of the paired change, over prompts
    reward_ci_high: float
    reward_after_per_prompt: tuple[float, ...]  # mean reward of each test prompt after the step (paired seeds)


def batch_share_gradient(
    model, rollout: Rollout, logprobs: TokenLogProbs, advantages: torch.Tensor, spec: StepSpecs, keep: torch.Tensor
) -> dict:
    """{param: sum of the kept samples' gradients of their shares of the BATCH loss}, 8 rows at a time."""
    params = [p for p in model.parameters() if p.requires_grad]
    weights = loss_weights(logprobs.mask, spec.loss.loss_type, spec.loss.max_completion_length)
    grads = [torch.zeros_like(p) for p in params]
    batch, norm = Batch(rollout, logprobs, advantages), Normalisation(weights)
    torch.manual_seed(DROPOUT_SEED)
    for rows in row_chunks(len(keep)):
        kept = keep[rows].tolist()
        share = scored_rows_loss(model, batch, spec.scoring, spec.loss, norm, kept, spec.kernels.score)[0]
        for g, d in zip(grads, torch.autograd.grad(share, params)):
            g += d
    return dict(zip(params, grads))


def matched_sgd_lr(
    model, rollout: Rollout, logprobs: TokenLogProbs, advantages: torch.Tensor, spec: StepSpecs
) -> float:
    """The SGD lr whose step on the whole batch is as long as the step's AdamW step: a fair comparison
    (at AdamW's lr, SGD would barely move)."""
    g = batch_share_gradient(model, rollout, logprobs, advantages, spec, torch.arange(rollout.num_samples))
    max_norm = spec.optimization.max_grad_norm
    adam = adam_direction(clip_by_total_norm(g, max_norm), warmed_state(list(g), g, "fresh", max_norm))
    norm = lambda d: torch.sqrt(sum(t.double().pow(2).sum() for t in d.values())).item()
    return spec.optimization.learning_rate * norm(adam) / norm(g)


def held_out_baseline(model, tokenizer, task, spec: StepSpecs, eval_prompts: int = 16):
    """EvalSide of `model` on the task's first `eval_prompts` test prompts (sampling: `spec.sampling`)."""

    return eval_side(model, tokenizer, test_prompts(task, eval_prompts), spec.sampling, task, spec.kernels.generate)


def selection_experiment(
    model,
    run,
    spec: StepSpecs,
    tokenizer,
    task,
    val: ValidationSet,
    scores: torch.Tensor,
    kind: str = "seqloss-lastadv",
    strategies=SELECTIONS,
    optimizer: str = "adamw",
    sgd_lr: float | None = None,
    eval_prompts: int = 16,
    baseline=None,
) -> list[SelectionResult]:
    """For each strategy: one step of `model` on the selected samples of `run` (the StepRun `model`
    produced, `spec` its phase arguments: `specs.specs_of(run.config)`) only, then L_val and the test-prompt reward against the same model before (`baseline`: an
    EvalSide of `held_out_baseline` on the same prompts, to share across calls). adamw: `update.update` on
    the subset (clip + a fresh AdamW, the step's lr). sgd: the kept samples' shares of the batch loss, lr
    `sgd_lr` (default `matched_sgd_lr`). The weights are restored after each strategy."""

    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    saved = copy.deepcopy(model.state_dict())
    evaluate = lambda: held_out_baseline(model, tokenizer, task, spec, eval_prompts)
    try:
        before = baseline if baseline is not None else evaluate()
        prompts = len(test_prompts(task, eval_prompts))
        if len(before.per_prompt) != prompts:
            raise ValueError(f"baseline has {len(before.per_prompt)} prompts, the experiment {prompts}")
        lr = (
            spec.optimization.learning_rate
            if optimizer == "adamw"
            else sgd_lr or matched_sgd_lr(model, run.rollout, run.logprobs, run.advantages.values, spec)
        )
        loss_before = validation_loss_value(model, val, spec, kind)
        results = []
        for strategy in strategies:
            keep = select(scores, strategy, spec.seed)
            step_on_selection(model, run, keep, optimizer, lr, spec)
            after = evaluate() if len(keep) else before
            results.append(
                selection_result(
                    strategy,
                    optimizer,
                    lr,
                    keep,
                    val,
                    spec,
                    before,
                    after,
                    loss_before,
                    validation_loss_value(model, val, spec, kind),
                )
            )
            model.load_state_dict(saved)
        return results
    finally:
        model.load_state_dict(saved)


def step_on_selection(model, run, keep: torch.Tensor, optimizer: str, lr: float, spec: StepSpecs) -> None:
    """One step on the kept samples of `run` only (none kept: no step). adamw: `update.update` on the subset;
    sgd: minus lr times the kept samples' gradients of their shares of the batch loss."""

    r, lp, adv = run.rollout, run.logprobs, run.advantages.values
    if not len(keep):
        return
    if optimizer == "adamw":
        update(
            model,
            Batch(r.rows(keep), lp.rows(keep), adv[keep]),
            spec.scoring,
            spec.loss,
            spec.optimization,
            per_sample_grad_norms=False,
            score=spec.kernels.score,
        )
        return
    grads = batch_share_gradient(model, r, lp, adv, spec, keep)
    with torch.no_grad():
        for p, g in grads.items():
            p.sub_(lr * g)


def selection_result(
    strategy: str,
    optimizer: str,
    lr: float,
    keep: torch.Tensor,
    val: ValidationSet,
    spec: StepSpecs,
    before,
    after,
    loss_before: float,
    loss_after: float,
) -> SelectionResult:
    """The paired reward change over the test prompts (bootstrap interval) next to L_val before and after."""
    diffs = after.per_prompt - before.per_prompt
    low, high = prompt_bootstrap(diffs, spec.bootstrap, spec.seed)
    return SelectionResult(
        strategy,
        optimizer,
        lr,
        tuple(keep.tolist()),
        f"{val.name} ({val.prompt_set} prompts)",
        loss_before,
        loss_after,
        "test",
        before.reward,
        after.reward,
        diffs.mean().item(),
        low,
        high,
        tuple(after.per_prompt.tolist()),
    )


def paired_contrast(a: SelectionResult, b: SelectionResult, resamples: int = 1000, seed: int = 0):
    """(mean, 95% low, 95% high) of reward after a minus reward after b, paired over the same test prompts
    and sampling seeds: whether the two selections' steps differ beyond the sampling noise."""
    diffs = torch.tensor(a.reward_after_per_prompt) - torch.tensor(b.reward_after_per_prompt)
    return (diffs.mean().item(), *prompt_bootstrap(diffs, resamples, seed))


def influence_of_batch(model, run, spec: StepSpecs, val: ValidationSet, kind: str = "seqloss-lastadv") -> torch.Tensor:
    """(N,) TracIn scores of the step's batch against `val` (the usual path, factored, nothing built)."""
    train = per_sample_train_gradients(model, run.rollout, run.logprobs, run.advantages.values, spec)
    return influence_scores(train, validation_gradient(model, val, spec, kind)[1])
