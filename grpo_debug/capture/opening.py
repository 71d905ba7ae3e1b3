"""A captured TRL step opened as a `GRPOStep`: its batch the cached rollout, its GRPOConfig the config, its
weights the policy, its reward functions (yours, or the stored rewards replayed), and as its update phase the
trainer's own step (`replay.captured_update`: its micro-batches and its optimizer, restored) where it can be.

    step = open_capture("captures/step-2", task=[my_reward, other_reward])
    step.run(until="update")            # every phase on the trainer's own batch
"""

from __future__ import annotations

import dataclasses

from ..config import StepConfig, rollout_fields_refused
from ..model import mixed_halves_problem, pick_device, pick_dtype
from ..step import GRPOStep
from ..task import register_task
from .captured_config import config_from_capture
from .captured_inputs import captured_models, captured_rollout
from .captured_task import captured_task
from .reading import load_capture
from .replay import captured_update
from .saved_weights import saved_start


def open_capture(path, task=None, *, device=None, weights_dtype=None, **changes) -> GRPOStep:
    """A step whose cached rollout is a step captured from a TRL run (`grpo_debug.capture`), under
    `config_from_capture` plus `changes` (not rollout fields: the capture's rollout is the trainer's).
    `task`: the run's reward functions (a list, "file.py:name") or a task plug-in (a registered name or a
    Task), for the phases that sample new completions; without it the stored rewards are replayed.
    `device` ("cpu", "cuda", "cuda:1"; None: the GPU where torch sees one, else the CPU): where the models and the step's tensors live, moved there
    once; `weights_dtype` ("float32", "bfloat16", "float16"; None: as saved, the run's own): the weights' dtype (the
    config's `dtype`, a change like any other, is the precision the step scores at)."""
    where, cast = pick_device(device), pick_dtype(weights_dtype)
    capture = load_capture(path)
    cfg = config_from_capture(capture, **changes)
    as_captured = config_from_capture(capture)
    changed = [
        f.name
        for f in dataclasses.fields(StepConfig)
        if StepConfig.phase_of(f.name) == "rollout" and getattr(cfg, f.name) != getattr(as_captured, f.name)
    ]
    if changed:
        raise ValueError(rollout_fields_refused(changed))
    problem = mixed_halves_problem(where, weights_dtype, cfg)
    if problem:
        raise ValueError(problem)
    loaded, beta_zero = captured_models(capture)
    loaded.to(where, cast)
    capture = on_device(capture, where)
    task = captured_task(capture, loaded.tokenizer, task)
    register_task(task.name, lambda: task)
    policy = capture.meta["policy"]
    start = None if policy.get("adapter") else saved_start(loaded.policy, capture.path / policy["folder"])
    return GRPOStep(
        cfg,
        task,
        loaded,
        capture=capture,
        rollout=captured_rollout(capture, loaded.tokenizer),  # from the batch, already moved
        at_reference=beta_zero,
        update_phase=captured_update,
        start=start,  # the weights before the step, read back from the capture's files: no copy held
    )


KEPT_ON_CPU = ("rng_states",)  # torch.set_rng_state reads a CPU byte tensor


def on_device(capture, device):
    """The capture with its batch's tensors on `device` (the random states it recorded stay on the CPU)."""
    if all(v.device == device for k, v in capture.batch.items() if k not in KEPT_ON_CPU):
        return capture
    batch = {k: v if k in KEPT_ON_CPU else v.to(device) for k, v in capture.batch.items()}
    return dataclasses.replace(capture, batch=batch)
