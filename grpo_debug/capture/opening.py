"""A captured TRL step opened as a `GRPOStep`: its batch the cached rollout, its GRPOConfig the config, its
weights the policy, its reward functions (yours, or the stored rewards replayed), and as its update phase the
trainer's own step (`replay.captured_update`: its micro-batches and its optimizer, restored) where it can be.

    step = open_capture("captures/step-2", task=[my_reward, other_reward])
    step.run(until="update")            # every phase on the trainer's own batch
"""

from __future__ import annotations

import dataclasses

from ..config import StepConfig
from ..step import GRPOStep
from ..task import register_task
from .reading import captured_models, captured_rollout, captured_task, config_from_capture, load_capture
from .replay import captured_update
from .saved_weights import saved_start


def open_capture(path, task=None, **changes) -> GRPOStep:
    """A step whose cached rollout is a step captured from a TRL run (`grpo_debug.capture`), under
    `config_from_capture` plus `changes` (not rollout fields: the capture's rollout is the trainer's).
    `task`: the run's reward functions (a list, "file.py:name") or a task plug-in (a registered name or a
    Task), for the phases that sample new completions; without it the stored rewards are replayed."""
    capture = load_capture(path)
    cfg = config_from_capture(capture, **changes)
    as_captured = config_from_capture(capture)
    changed = [
        f.name
        for f in dataclasses.fields(StepConfig)
        if StepConfig.phase_of(f.name) == "rollout" and getattr(cfg, f.name) != getattr(as_captured, f.name)
    ]
    if changed:
        raise ValueError(f"{changed} are rollout fields: a capture's rollout is the trainer's, fixed")
    loaded, beta_zero = captured_models(capture)
    task = captured_task(capture, loaded.tokenizer, task)
    register_task(task.name, lambda: task)
    policy = capture.meta["policy"]
    start = None if policy.get("adapter") else saved_start(loaded.policy, capture.path / policy["folder"])
    return GRPOStep(
        cfg,
        task,
        loaded,
        capture=capture,
        rollout=captured_rollout(capture, loaded.tokenizer),
        at_reference=beta_zero,
        update_phase=captured_update,
        start=start,  # the weights before the step, read back from the capture's files: no copy held
    )
