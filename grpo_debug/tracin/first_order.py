"""First-order checks of TracIn (a check of the Taylor expansion, nothing more): for every training sample, a
predicted change of L_val against the change measured after a real step on that sample alone, the weights
restored in between. Real steps ("step kinds"):
  sgd           theta -= lr * g_i                                  (TracIn's own assumption)
  adamw         clip, then one AdamW step from a fresh state       (what update.py does)
  adamw_batch   the same from the state after an AdamW step on the batch gradient
Predictions ("scores"): tracin <g_val, g_i>; adam / adam_batch <g_val, U(clip(g_i); state)>
(tracin/optimizer.py). Predicted change = -lr * score.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..logprobs import TokenLogProbs
from ..loss import loss_weights
from ..rollout import Rollout
from ..stats import spearman
from .influence import (
    ValidationSet,
    per_sample_train_gradients,
    validation_gradient,
    validation_loss_value,
)
from .optimizer import BETAS, EPS, AdamState, optimizer_influence, sample, warmed_state
from .specs import StepSpecs

STEP_KINDS = ("sgd", "adamw", "adamw_batch")
SCORES = ("tracin", "adam", "adam_batch", "adam_trainer")  # adam_trainer: from a capture's optimizer state


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
    model, val: ValidationSet, spec: StepSpecs, kind: str, val_grad: dict, length: float, draws: int = 4, seed: int = 0
) -> float:
    """The largest |change of L_val| after `draws` random steps of `length` orthogonal to grad L_val: steps
    with no first-order effect, so what they measure is float32 noise of L_val (and a little curvature)."""
    params = list(val_grad)
    base = validation_loss_value(model, val, spec, kind)
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
        worst = max(worst, abs(validation_loss_value(model, val, spec, kind) - base))
        with torch.no_grad():
            for p, b in zip(params, before):
                p.copy_(b)
    return worst


def _sum_over_samples(grads: dict) -> dict:
    return {p: g.sum(0) for p, g in grads.items()}


def single_sample_changes(
    model, train_grads: dict, val: ValidationSet, spec: StepSpecs, kind: str, step: str, lr: float
) -> torch.Tensor:
    """(N,) L_val after one real `step` (STEP_KINDS) on sample i alone minus L_val before; train_grads
    {param: (N, *shape)}. The AdamW steps are torch's own optimizer, as update.py builds it."""
    params = list(train_grads)
    base = validation_loss_value(model, val, spec, kind)
    before = [p.detach().clone() for p in params]
    warm = None
    if step == "adamw_batch":
        warm = warmed_state(params, _sum_over_samples(train_grads), "batch", spec.optimization.max_grad_norm)
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
            _adamw_step(params, sample(train_grads, i), lr, spec, warm)
        changes.append(validation_loss_value(model, val, spec, kind) - base)
        with torch.no_grad():
            for p, b in zip(params, before):
                p.copy_(b)
    return torch.tensor(changes)


def _adamw_step(params, grads: dict, lr: float, spec: StepSpecs, warm=None) -> None:
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=spec.optimization.weight_decay, betas=BETAS, eps=EPS)
    if warm is not None:
        for p in params:
            optimizer.state[p] = {
                "step": torch.tensor(float(warm.step)),
                "exp_avg": warm.exp_avg[p].clone(),
                "exp_avg_sq": warm.exp_avg_sq[p].clone(),
            }
    for p in params:
        p.grad = grads[p].clone()
    if spec.optimization.max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(params, spec.optimization.max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def scores_for(
    train_grads: dict, val_grad: dict, spec: StepSpecs, score: str, trainer: AdamState | None = None
) -> torch.Tensor:
    """(N,) one of SCORES for materialised per-sample gradients {param: (N, *shape)}; "adam_trainer" steps from
    `trainer`, the run's own Adam moments (`optimizer.optimizer_state_of`)."""
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
        list(train_grads),
        _sum_over_samples(train_grads),
        {"adam": "fresh", "adam_batch": "batch", "adam_trainer": "trainer"}[score],
        spec.optimization.max_grad_norm,
        trainer,
    )
    return optimizer_influence(train_grads, val_grad, state, spec.optimization.max_grad_norm)


def first_order_checks(
    model,
    rollout: Rollout,
    logprobs: TokenLogProbs,
    advantages: torch.Tensor,
    spec: StepSpecs,
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
    lr = spec.optimization.learning_rate
    lrs = {"sgd": 1e-3, "adamw": lr, "adamw_batch": lr, **(lrs or {})}
    train_grads = per_sample_train_gradients(model, rollout, logprobs, advantages, spec).gradients()
    _, val_grad = validation_gradient(model, val, spec, kind)
    longest = (
        lrs["sgd"] * torch.sqrt(sum(g.double().flatten(1).pow(2).sum(1) for g in train_grads.values())).max().item()
    )
    noise = evaluation_noise(model, val, spec, kind, val_grad, longest)
    decay = sum((val_grad[p].double() * p.detach().double()).sum() for p in train_grads).item()
    steps = list(dict.fromkeys(k for _, k in pairs))
    needed = dict.fromkeys([s for s, _ in pairs] + [OWN_SCORE[k] for k in steps])
    scores = {s: scores_for(train_grads, val_grad, spec, s) for s in needed}
    measured = {k: single_sample_changes(model, train_grads, val, spec, kind, k, lrs[k]) for k in steps}

    def predicted(score: str, step: str) -> torch.Tensor:
        weight_decay = (
            spec.optimization.weight_decay * decay if step != "sgd" else 0.0
        )  # AdamW also shrinks theta by lr * wd
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
    spec: StepSpecs,
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
    weights = loss_weights(mask, spec.loss.loss_type, spec.loss.max_completion_length)
    factor = (
        loss_weights(mask[keep], spec.loss.loss_type, spec.loss.max_completion_length).sum() / weights[keep].sum()
    ).item()
    state = warmed_state(list(g_sum), g_sum, "fresh", spec.optimization.max_grad_norm)
    scores = optimizer_influence(
        {p: (factor * g).unsqueeze(0) for p, g in g_sum.items()}, val_grad, state, spec.optimization.max_grad_norm
    )
    return -lr * scores.item()
