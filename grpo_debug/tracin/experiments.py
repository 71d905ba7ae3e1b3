"""The experiments that check what TracIn claims, each under an explicit optimizer.

1. First-order checks (a check of the Taylor expansion, nothing more): for every training sample, a
   predicted change of L_val against the change measured after a real step on that sample alone, the
   weights restored in between. Real steps ("step kinds"):
     sgd           theta -= lr * g_i                                  (TracIn's own assumption)
     adamw         clip, then one AdamW step from a fresh state       (what update.py does)
     adamw_batch   the same from the state after an AdamW step on the batch gradient
   Predictions ("scores"): tracin <g_val, g_i>; adam / adam_batch <g_val, U(clip(g_i); state)>
   (tracin/optimizer.py). Predicted change = -lr * score.
2. Selection: keep the samples a strategy selects, take one step (SGD or the step's AdamW) on them only,
   then measure L_val and the held-out reward on the 'test' prompts (paired sampling seeds, bootstrap
   95% interval over prompts). "influence<0" is what "influence>0" keeps under the TracIn-sign report's flipped sign:
   comparing the two settles the sign on the quantity the seed cares about, the reward.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from ..config import StepConfig
from ..evaluation import eval_prompts as test_prompts
from ..evaluation import eval_side
from ..logprobs import TokenLogProbs
from ..loss import loss_weights
from ..rollout import Rollout, row_chunks
from ..specs import loss_spec_of, optimization_of, scoring_of
from ..stats import prompt_bootstrap, spearman
from ..update import DROPOUT_SEED, chunk_loss, update
from .influence import (
    ValidationSet,
    influence_scores,
    per_sample_train_gradients,
    signs,
    validation_gradient,
    validation_loss_value,
)
from .optimizer import BETAS, EPS, adam_direction, clip_by_total_norm, optimizer_influence, sample, warmed_state

STEP_KINDS = ("sgd", "adamw", "adamw_batch")
SCORES = ("tracin", "adam", "adam_batch")
OPTIMIZERS = ("sgd", "adamw")
SELECTIONS = ("all", "influence>0", "influence<0", "top_half", "bottom_half", "random_half")


@dataclass(frozen=True)
class FirstOrderCheck:
    score: str  # what made the prediction (SCORES)
    step: str  # the real single-sample step measured (STEP_KINDS)
    lr: float
    predicted: torch.Tensor  # (N,) -lr * score_i
    measured: torch.Tensor  # (N,) L_val after the step on sample i alone, minus L_val before
    spearman: float
    sign_agreement: float  # fraction of moved samples where predicted and measured have the same sign
    moved: int  # samples whose step changes L_val measurably, over which the two statistics are taken
    noise_floor: float  # `evaluation_noise`: a change below it is not resolved


OWN_SCORE = {"sgd": "tracin", "adamw": "adam", "adamw_batch": "adam_batch"}  # each step kind's first-order score


def resolvable(own_prediction: torch.Tensor, noise_floor: float) -> torch.Tensor:
    """(N,) bool: samples whose step, by its own optimizer's first-order prediction, changes L_val by more
    than the evaluation noise (a zero-advantage sample's step is 0 under SGD and a fresh AdamW)."""
    return own_prediction.abs() > max(noise_floor, 1e-4 * own_prediction.abs().max().item())


def compare(
    score: str,
    step: str,
    lr: float,
    predicted: torch.Tensor,
    measured: torch.Tensor,
    moved: torch.Tensor,
    noise_floor: float = 0.0,
) -> FirstOrderCheck:
    """Spearman and sign agreement of predicted against measured changes over the `moved` samples."""
    agree = (torch.sign(predicted[moved]) == torch.sign(measured[moved])).float().mean().item()
    return FirstOrderCheck(
        score,
        step,
        lr,
        predicted,
        measured,
        spearman(predicted[moved], measured[moved]),
        agree,
        int(moved.sum()),
        noise_floor,
    )


def evaluation_noise(
    model, val: ValidationSet, cfg: StepConfig, kind: str, val_grad: dict, length: float, draws: int = 4, seed: int = 0
) -> float:
    """The largest |change of L_val| after `draws` random steps of `length` orthogonal to grad L_val: steps
    with no first-order effect, so what they measure is float32 noise of L_val (and a little curvature)."""
    params = list(val_grad)
    base = validation_loss_value(model, val, cfg, kind)
    before = [p.detach().clone() for p in params]
    g_norm2 = sum(val_grad[p].double().pow(2).sum() for p in params)
    worst = 0.0
    for k in range(draws):
        gen = torch.Generator().manual_seed(seed + k)
        d = {p: torch.randn(p.shape, generator=gen, dtype=torch.float64) for p in params}
        along = sum((d[p] * val_grad[p].double()).sum() for p in params) / g_norm2
        d = {p: d[p] - along * val_grad[p].double() for p in params}
        scale = length / torch.sqrt(sum(t.pow(2).sum() for t in d.values()))
        with torch.no_grad():
            for p in params:
                p.add_((scale * d[p]).to(p.dtype))
        worst = max(worst, abs(validation_loss_value(model, val, cfg, kind) - base))
        with torch.no_grad():
            for p, b in zip(params, before):
                p.copy_(b)
    return worst


def _sum_over_samples(grads: dict) -> dict:
    return {p: g.sum(0) for p, g in grads.items()}


def single_sample_changes(
    model, train_grads: dict, val: ValidationSet, cfg: StepConfig, kind: str, step: str, lr: float
) -> torch.Tensor:
    """(N,) L_val after one real `step` (STEP_KINDS) on sample i alone minus L_val before; train_grads
    {param: (N, *shape)}. The AdamW steps are torch's own optimizer, as update.py builds it."""
    params = list(train_grads)
    base = validation_loss_value(model, val, cfg, kind)
    before = [p.detach().clone() for p in params]
    warm = None
    if step == "adamw_batch":
        warm = warmed_state(params, _sum_over_samples(train_grads), "batch", cfg.max_grad_norm)
    elif step not in STEP_KINDS:
        raise ValueError(f"step must be one of {STEP_KINDS}, got {step!r}")
    changes = []
    for i in range(len(next(iter(train_grads.values())))):
        if warm is None and all(not g[i].any() for g in train_grads.values()):
            changes.append(0.0)  # no gradient: SGD and a fresh AdamW leave every weight where it is
            continue
        if step == "sgd":
            with torch.no_grad():
                for p in params:
                    p.sub_(lr * train_grads[p][i])
        else:
            _adamw_step(params, sample(train_grads, i), lr, cfg, warm)
        changes.append(validation_loss_value(model, val, cfg, kind) - base)
        with torch.no_grad():
            for p, b in zip(params, before):
                p.copy_(b)
    return torch.tensor(changes)


def _adamw_step(params, grads: dict, lr: float, cfg: StepConfig, warm=None) -> None:
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=cfg.weight_decay, betas=BETAS, eps=EPS)
    if warm is not None:
        for p in params:
            optimizer.state[p] = {
                "step": torch.tensor(float(warm.step)),
                "exp_avg": warm.exp_avg[p].clone(),
                "exp_avg_sq": warm.exp_avg_sq[p].clone(),
            }
    for p in params:
        p.grad = grads[p].clone()
    if cfg.max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def scores_for(train_grads: dict, val_grad: dict, cfg: StepConfig, score: str) -> torch.Tensor:
    """(N,) one of SCORES for materialised per-sample gradients {param: (N, *shape)}."""
    if score == "tracin":
        return torch.stack(
            [
                sum((g[i].double() * val_grad[p].double()).sum() for p, g in train_grads.items())
                for i in range(len(next(iter(train_grads.values()))))
            ]
        )
    if score not in SCORES:
        raise ValueError(f"score must be one of {SCORES}, got {score!r}")
    state = warmed_state(
        list(train_grads), _sum_over_samples(train_grads), "fresh" if score == "adam" else "batch", cfg.max_grad_norm
    )
    return optimizer_influence(train_grads, val_grad, state, cfg.max_grad_norm)


def first_order_checks(
    model,
    rollout: Rollout,
    logprobs: TokenLogProbs,
    advantages: torch.Tensor,
    cfg: StepConfig,
    val: ValidationSet,
    kind: str = "seqloss-lastadv",
    lrs: dict | None = None,
    pairs=(
        ("tracin", "sgd"),
        ("tracin", "adamw"),
        ("adam", "adamw"),
        ("tracin", "adamw_batch"),
        ("adam_batch", "adamw_batch"),
    ),
) -> list[FirstOrderCheck]:
    """Each (score, step kind) pair's predicted against measured changes. `lrs`: step kind -> lr
    (default: 1e-3 for SGD, small enough for the first-order term to dominate; the step's own lr for AdamW).
    The statistics of a step kind are taken over the samples whose step is `resolvable` (by the step's own
    first-order score, against `evaluation_noise` for a step as long as the longest SGD step), the same
    samples for every score compared with that step kind."""
    lrs = {"sgd": 1e-3, "adamw": cfg.learning_rate, "adamw_batch": cfg.learning_rate, **(lrs or {})}
    train_grads = per_sample_train_gradients(model, rollout, logprobs, advantages, cfg).gradients()
    _, val_grad = validation_gradient(model, val, cfg, kind)
    longest = (
        lrs["sgd"] * torch.sqrt(sum(g.double().flatten(1).pow(2).sum(1) for g in train_grads.values())).max().item()
    )
    noise = evaluation_noise(model, val, cfg, kind, val_grad, longest)
    decay = sum((val_grad[p].double() * p.detach().double()).sum() for p in train_grads).item()
    steps = list(dict.fromkeys(k for _, k in pairs))
    needed = dict.fromkeys([s for s, _ in pairs] + [OWN_SCORE[k] for k in steps])
    scores = {s: scores_for(train_grads, val_grad, cfg, s) for s in needed}
    measured = {k: single_sample_changes(model, train_grads, val, cfg, kind, k, lrs[k]) for k in steps}

    def predicted(score: str, step: str) -> torch.Tensor:
        weight_decay = cfg.weight_decay * decay if step != "sgd" else 0.0  # AdamW also shrinks theta by lr * wd
        return -lrs[step] * (scores[score].float() + weight_decay)

    moved = {k: resolvable(predicted(OWN_SCORE[k], k), noise) for k in steps}
    return [
        compare(score, step, lrs[step], predicted(score, step), measured[step], moved[step], noise)
        for score, step in pairs
    ]


def predicted_subset_change(
    train_grads: dict,
    val_grad: dict,
    keep: torch.Tensor,
    mask: torch.Tensor,
    cfg: StepConfig,
    optimizer: str,
    lr: float,
) -> float:
    """First-order change of L_val for the step `selection_experiment` takes on the kept samples.
    sgd: -lr * sum of their TracIn scores (their batch shares). adamw: `update` normalises the subset's loss
    on its own (a uniform factor on the batch shares), clips, then a fresh AdamW: -lr * <g_val, U(clip(g_S))>.
    train_grads {param: (N, *shape)}, mask (N, T)."""
    if not len(keep):
        return 0.0
    g_sum = {p: g[keep].sum(0) for p, g in train_grads.items()}
    if optimizer == "sgd":
        return -lr * sum((g_sum[p].double() * val_grad[p].double()).sum() for p in g_sum).item()
    weights = loss_weights(mask, cfg.loss_type, cfg.max_new_tokens)
    factor = (loss_weights(mask[keep], cfg.loss_type, cfg.max_new_tokens).sum() / weights[keep].sum()).item()
    state = warmed_state(list(g_sum), g_sum, "fresh", cfg.max_grad_norm)
    scores = optimizer_influence(
        {p: (factor * g).unsqueeze(0) for p, g in g_sum.items()}, val_grad, state, cfg.max_grad_norm
    )
    return -lr * scores.item()


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
    model, rollout: Rollout, logprobs: TokenLogProbs, advantages: torch.Tensor, cfg: StepConfig, keep: torch.Tensor
) -> dict:
    """{param: sum of the kept samples' gradients of their shares of the BATCH loss}, 8 rows at a time."""
    params = [p for p in model.parameters() if p.requires_grad]
    weights = loss_weights(logprobs.mask, cfg.loss_type, cfg.max_new_tokens)
    grads = [torch.zeros_like(p) for p in params]
    torch.manual_seed(DROPOUT_SEED)
    for rows in row_chunks(len(keep)):
        share = chunk_loss(
            model,
            rollout,
            logprobs,
            advantages,
            scoring_of(cfg),
            loss_spec_of(cfg),
            keep[rows].tolist(),
            weights,
            cfg.fast,
        )
        for g, d in zip(grads, torch.autograd.grad(share, params)):
            g += d
    return dict(zip(params, grads))


def matched_sgd_lr(
    model, rollout: Rollout, logprobs: TokenLogProbs, advantages: torch.Tensor, cfg: StepConfig
) -> float:
    """The SGD lr whose step on the whole batch is as long as the step's AdamW step: a fair comparison
    (at AdamW's lr, SGD would barely move)."""
    g = batch_share_gradient(model, rollout, logprobs, advantages, cfg, torch.arange(rollout.num_samples))
    state = warmed_state(list(g), g, "fresh", cfg.max_grad_norm)
    adam = adam_direction(clip_by_total_norm(g, cfg.max_grad_norm), state)
    norm = lambda d: torch.sqrt(sum(t.double().pow(2).sum() for t in d.values())).item()
    return cfg.learning_rate * norm(adam) / norm(g)


def held_out_baseline(model, tokenizer, task, cfg: StepConfig, eval_prompts: int = 16):
    """EvalSide of `model` on the task's first `eval_prompts` test prompts (sampling settings of `cfg`)."""

    return eval_side(model, tokenizer, test_prompts(task, eval_prompts), cfg.replace(eval_prompts=eval_prompts), task)


def selection_experiment(
    model,
    run,
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
    produced) only, then L_val and the test-prompt reward against the same model before (`baseline`: an
    EvalSide of `held_out_baseline` on the same prompts, to share across calls). adamw: `update.update` on
    the subset (clip + a fresh AdamW, the step's lr). sgd: the kept samples' shares of the batch loss, lr
    `sgd_lr` (default `matched_sgd_lr`). The weights are restored after each strategy."""

    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    cfg = run.config.replace(per_sample_grad_norms=False, eval_prompts=eval_prompts)
    saved = copy.deepcopy(model.state_dict())
    evaluate = lambda: held_out_baseline(model, tokenizer, task, cfg, eval_prompts)
    try:
        before = baseline if baseline is not None else evaluate()
        prompts = len(test_prompts(task, eval_prompts))
        if len(before.per_prompt) != prompts:
            raise ValueError(f"baseline has {len(before.per_prompt)} prompts, the experiment {prompts}")
        lr = (
            cfg.learning_rate
            if optimizer == "adamw"
            else sgd_lr or matched_sgd_lr(model, run.rollout, run.logprobs, run.advantages.values, cfg)
        )
        loss_before = validation_loss_value(model, val, cfg, kind)
        results = []
        for strategy in strategies:
            keep = select(scores, strategy, cfg.seed)
            step_on_selection(model, run, keep, optimizer, lr, cfg)
            after = evaluate() if len(keep) else before
            results.append(
                selection_result(
                    strategy,
                    optimizer,
                    lr,
                    keep,
                    val,
                    cfg,
                    before,
                    after,
                    loss_before,
                    validation_loss_value(model, val, cfg, kind),
                )
            )
            model.load_state_dict(saved)
        return results
    finally:
        model.load_state_dict(saved)


def step_on_selection(model, run, keep: torch.Tensor, optimizer: str, lr: float, cfg: StepConfig) -> None:
    """One step on the kept samples of `run` only (none kept: no step). adamw: `update.update` on the subset;
    sgd: minus lr times the kept samples' gradients of their shares of the batch loss."""

    r, lp, adv = run.rollout, run.logprobs, run.advantages.values
    if not len(keep):
        return
    if optimizer == "adamw":
        update(
            model,
            r.rows(keep),
            lp.rows(keep),
            adv[keep],
            scoring_of(cfg),
            loss_spec_of(cfg),
            optimization_of(cfg),
            per_sample_grad_norms=False,
            fast=cfg.fast,
        )
        return
    grads = batch_share_gradient(model, r, lp, adv, cfg, keep)
    with torch.no_grad():
        for p, g in grads.items():
            p.sub_(lr * g)


def selection_result(
    strategy: str,
    optimizer: str,
    lr: float,
    keep: torch.Tensor,
    val: ValidationSet,
    cfg: StepConfig,
    before,
    after,
    loss_before: float,
    loss_after: float,
) -> SelectionResult:
    """The paired reward change over the test prompts (bootstrap interval) next to L_val before and after."""
    diffs = after.per_prompt - before.per_prompt
    low, high = prompt_bootstrap(diffs, cfg.bootstrap, cfg.seed)
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


def influence_of_batch(model, run, cfg: StepConfig, val: ValidationSet, kind: str = "seqloss-lastadv") -> torch.Tensor:
    """(N,) TracIn scores of the step's batch against `val` (the usual path, factored, nothing built)."""
    train = per_sample_train_gradients(model, run.rollout, run.logprobs, run.advantages.values, cfg)
    return influence_scores(train, validation_gradient(model, val, cfg, kind)[1])
