"""Influence through the optimizer's update map, as LESS (Xia et al. 2024) does for Adam.

TracIn's -lr * <g_val, g_i> is the first-order change of L_val for an SGD step on sample i. The step's
optimizer (update.py) clips the total gradient norm to `max_grad_norm`, then takes one AdamW step, so
the step on sample i is -lr * U(clip(g_i); state) and its first-order change of L_val is
-lr * <g_val, U(clip(g_i); state)>: the optimizer-aware influence. With torch's AdamW (bias-corrected):
  m' = b1 m + (1 - b1) g,  v' = b2 v + (1 - b2) g^2,  t' = t + 1
  U  = (m' / (1 - b1^t')) / (sqrt(v' / (1 - b2^t')) + eps)
Three states:
  fresh    m = v = 0, t = 0: what update.py builds for every step. U = g / (|g| + eps) per coordinate, about
           sign(g): every coordinate with a gradient moves by lr, whatever the gradient's size.
  batch    the state after one such step on the (clipped) batch gradient g_B: m = (1 - b1) g_B,
           v = (1 - b2) g_B^2, t = 1. LESS warms Adam with a short training run and takes m and v from its
           checkpoint; here the warm-up is the step itself, the state a second step would start from.
  trainer  a real run's moments: the trainer's AdamW as a capture holds it before the step
           (`trainer_adam_state`: `optimizer_state_of` the optimizer the capture rebuilds), its betas and eps.
U is not linear in g: every g_i is built (fine for the bundled model; not for 124M parameters).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ADAM_STATES = ("fresh", "batch", "trainer")
BETAS = (0.9, 0.999)  # torch.optim.AdamW's defaults, which update.py uses
EPS = 1e-8

Grads = dict  # {parameter: tensor of the parameter's shape}


@dataclass(frozen=True)
class AdamState:
    exp_avg: Grads  # m, per parameter
    exp_avg_sq: Grads  # v, per parameter
    step: int
    betas: tuple[float, float] = BETAS
    eps: float = EPS


def fresh_state(params) -> AdamState:
    return AdamState({p: torch.zeros_like(p) for p in params}, {p: torch.zeros_like(p) for p in params}, 0)


def clip_by_total_norm(grads: Grads, max_norm: float) -> Grads:
    """What torch.nn.utils.clip_grad_norm_ does to the gradients (max_norm <= 0: no clipping, as update.py)."""
    if max_norm <= 0:
        return grads
    total = torch.sqrt(sum(g.double().pow(2).sum() for g in grads.values())).item()
    scale = min(1.0, max_norm / (total + 1e-6))
    return {p: g * scale for p, g in grads.items()}


def adam_moments(grads: Grads, state: AdamState) -> AdamState:
    """The state after one step on `grads` (the state's betas)."""
    b1, b2 = state.betas
    return AdamState(
        {p: b1 * state.exp_avg[p] + (1 - b1) * g for p, g in grads.items()},
        {p: b2 * state.exp_avg_sq[p] + (1 - b2) * g * g for p, g in grads.items()},
        state.step + 1,
        state.betas,
        state.eps,
    )


def adam_direction(grads: Grads, state: AdamState) -> Grads:
    """U(g; state): the AdamW step on `grads` from `state`, per unit of lr (weight decay 0), to be subtracted."""
    new = adam_moments(grads, state)
    c1, c2 = 1 - state.betas[0] ** new.step, 1 - state.betas[1] ** new.step
    return {p: (new.exp_avg[p] / c1) / ((new.exp_avg_sq[p] / c2).sqrt() + state.eps) for p in grads}


def optimizer_state_of(optimizer: torch.optim.Optimizer, params) -> AdamState:
    """A torch Adam/AdamW's moments for `params` (the trainer's, rebuilt from a capture), with its betas and eps;
    a parameter it holds no state for yet starts at zero (its first step)."""
    group = optimizer.param_groups[0]
    exp_avg, exp_avg_sq, steps = {}, {}, set()
    for p in params:
        entry = optimizer.state.get(p, {})
        exp_avg[p] = entry["exp_avg"].detach().clone() if "exp_avg" in entry else torch.zeros_like(p)
        exp_avg_sq[p] = entry["exp_avg_sq"].detach().clone() if "exp_avg_sq" in entry else torch.zeros_like(p)
        steps.add(int(entry["step"]) if "step" in entry else 0)
    if len(steps) > 1:
        raise ValueError(f"the optimizer's parameters are at different steps {sorted(steps)}: not one Adam state")
    return AdamState(exp_avg, exp_avg_sq, steps.pop() if steps else 0, tuple(group["betas"]), group["eps"])


def trainer_adam_state(step, cfg=None) -> AdamState | None:
    """A capture's own Adam moments before its step (`step`: an opened capture), on `step.policy`'s trained
    parameters, for `first_order.scores_for(..., "adam_trainer", trainer=...)`; None where the capture holds no
    optimizer the replay rebuilds (then only the fresh and batch-warmed states exist)."""
    from ..capture import optimizer_state
    from ..capture.captured_config import config_from_capture
    from ..capture.replay import starting_optimizer

    capture = step.capture
    if optimizer_state.rebuild_problem(capture.meta.get("optimizer")) is not None:
        return None
    optimizer, _, _ = starting_optimizer(capture, step.policy, cfg or step.cfg, config_from_capture(capture))
    return optimizer_state_of(optimizer, [p for p in step.policy.parameters() if p.requires_grad])


def warmed_state(
    params, batch_grads: Grads, warm: str, max_grad_norm: float, trainer: AdamState | None = None
) -> AdamState:
    """The Adam state the optimizer-aware influence starts from (`ADAM_STATES`; "trainer": `trainer`)."""
    if warm not in ADAM_STATES:
        raise ValueError(f"Adam state must be one of {ADAM_STATES}, got {warm!r}")
    if warm == "trainer":
        if trainer is None:
            raise ValueError("the 'trainer' Adam state needs the trainer's optimizer (a capture that holds it)")
        return trainer
    state = fresh_state(params)
    return state if warm == "fresh" else adam_moments(clip_by_total_norm(batch_grads, max_grad_norm), state)


def sample(grads: dict, i: int) -> Grads:
    """Sample i's gradient from {param: (N, *shape)}."""
    return {p: g[i] for p, g in grads.items()}


def optimizer_influence(train_grads: dict, val_grad: Grads, state: AdamState, max_grad_norm: float) -> torch.Tensor:
    """(N,) <g_val, U(clip(g_i); state)> for train_grads {param: (N, *shape)} (materialised per-sample
    gradients): the first-order change of L_val per unit lr, negated, of one AdamW step on sample i."""
    n = len(next(iter(train_grads.values())))
    scores = []
    for i in range(n):
        direction = adam_direction(clip_by_total_norm(sample(train_grads, i), max_grad_norm), state)
        scores.append(sum((direction[p].double() * val_grad[p].double()).sum() for p in direction).item())
    return torch.tensor(scores)
