"""The numbers of each step, as a capture callback records them: what a step being recorded collects, the metrics
TRL appended during it (averaged as TRL logs them with logging_steps=1), the run's course step by step whatever
logging_steps is, and what TRL itself logged (capture.json's `step_metrics`, `logged`, `logged_history`)."""

from __future__ import annotations

import math

import torch

from .trainer_state import LOGGED_KL_STEPS, is_history_key, jsonable, logged_history, logged_kl
from .trl_step import mean_like_trl_log


def new_record(step: int) -> dict:
    """What a step being recorded collects as it trains."""
    return {"step": step, "weights": None, "trigger": None, "micro_batches": [], "rng": [], "scored": [],
            "losses": [], "grad_norm": None}  # fmt: skip


def metric_marks(metrics: dict[str, list]) -> dict[str, tuple[int, int]]:
    """The identity and length of each of the trainer's metric lists, at a step's start (`new_metrics`)."""
    return {k: (id(v), len(v)) for k, v in metrics.items()}


def new_metrics(metrics: dict[str, list], marks: dict[str, tuple[int, int]]) -> dict[str, list]:
    """Each metric's values TRL appended since the step began (`marks`, `metric_marks` then)."""
    out = {}
    for key, values in metrics.items():
        same, length = marks.get(key, (id(values), 0))
        new = values[length:] if same == id(values) else values  # TRL replaces num_tokens' list
        if new:
            out[key] = new
    return out


def step_metrics(trainer, capture: dict, new: dict[str, list]) -> dict:
    """Step k's own numbers, as TRL logs them with logging_steps=1: the loss (the micro-batches' sum, the mean
    over processes: every process gathers), grad_norm, and each metric TRL appended during the step (`new`),
    averaged."""
    out = {key: mean_like_trl_log([float(v) for v in values]) for key, values in new.items()}
    loss = torch.tensor([float(sum(capture["losses"]))], device=trainer.accelerator.device)
    out["loss"] = trainer.accelerator.gather(loss).mean().item()
    if capture["grad_norm"] is not None:
        out["grad_norm"] = capture["grad_norm"]
    return out


def remember_step(course: list[dict], step: int, new: dict[str, list]) -> list[dict]:
    """`course` with step `step`'s own numbers added: this process's mean of each history key (`is_history_key`)
    TRL appended during the step (what TRL would log with logging_steps=1), the last LOGGED_KL_STEPS steps."""
    values = {k: mean_like_trl_log([float(v) for v in vs]) for k, vs in new.items() if is_history_key(k) and vs}
    record = {"step": step, **{k: v for k, v in values.items() if v is not None and math.isfinite(v)}}
    return [*course, record][-LOGGED_KL_STEPS:]


def logged_fields(step: int, logs: dict | None, state, course: list[dict] = ()) -> dict:
    """capture.json's record of TRL's log: what TRL logged at the step (`logged`, None where it did not log it)
    and how many steps its numbers average (`logged_window`), the kl it logged up to the step, and the run's course
    (`logged_history`): TRL's log where it logged every step, else the callback's own record of each step."""
    history = state.log_history  # TRL's log of this step is in it already (appended before on_log)
    trl_course = logged_history(history)
    kept = {"logged_kl": logged_kl(history), "logged_history": trl_course if len(trl_course) >= len(course) else course}
    if not logs or "loss" not in logs:
        return {"logged": None, **kept}
    earlier = [h["step"] for h in history[:-1] if "loss" in h]
    return {"logged": jsonable(dict(logs)), "logged_window": step - max(earlier + [0]), **kept}
