"""`diagnose`: every detector on the step, each cause flipped on it, the differential, and each cause's fix
followed over steps where it can be; the ranked report.
"""

from __future__ import annotations

import dataclasses
import time

from ..config import StepConfig
from ..pitfalls import PITFALLS
from ..specs import eval_sampling_of
from ..stats import bonferroni_level
from ..step import GRPOStep, StepRun
from .chain import differential
from .facts import detect, examine, facts_of, held_out_prompts
from .findings import LOUD, Finding
from .flips import HeldOut, _flippable, change_key, counterfactual
from .horizon import SEEDS, compare, continuations
from .report import Report, rank


def diagnose(
    step: GRPOStep, flip: bool = True, held_out: int | None = None, horizon: int = 0, horizon_seeds: int = SEEDS
) -> Report:
    """Every detector on the step, each present finding with a toggle flipped on it (`flip`), the differential,
    ranked. Where the task has held-out test prompts, each flip's one-step update is also scored on `held_out` of
    them (default: `HELD_OUT_PROMPTS`; 0: none) against the update as run. `horizon` K > 0: each cause's fix is
    followed for K steps on `horizon_seeds` seeds against the run continued alike (`horizon`), where the task's
    reward functions can score new completions."""
    task = step.task
    try:
        return _diagnose(step, flip, held_out, horizon, horizon_seeds)
    finally:
        step.task = task  # `examine` reads an infinite reward as None for the diagnosis alone


def _diagnose(step: GRPOStep, flip: bool, held_out: int | None, horizon: int, horizon_seeds: int) -> Report:
    start = time.perf_counter()
    prompts = held_out_prompts(step, held_out) if flip else []
    facts, delta, after = examine(step, prompts)
    base = facts.run
    findings = detect(facts)
    chained: list[str] = []
    if flip and delta is not None:
        flips = [i for i, f in enumerate(findings) if _flippable(f, base.config, facts.uses_vllm)]
        paired = after and HeldOut(prompts, after, eval_sampling_of(base.config), bonferroni_level(len(flips)))
        detected: dict[tuple, dict[str, Finding]] = {}
        for i in flips:
            toggle = PITFALLS[findings[i].id].toggle
            effect = counterfactual(step, base, delta, *toggle, paired, detected)
            findings[i] = dataclasses.replace(findings[i], effect=effect)
        fixes = {f.id: c for f in findings if (c := _fix_changes(step, f, base.config, facts.uses_vllm)) is not None}
        findings, chained = differential(findings, fixes, _detect_under(step, base, detected))
    step.restore_policy()
    followed = None
    if horizon > 0:
        findings, followed = _follow(
            step, findings, fixes if flip and delta is not None else {}, horizon, horizon_seeds
        )
    return Report(
        rank(findings, chained), base.config.settings(), time.perf_counter() - start, facts.uses_vllm, followed
    )


def _follow(step: GRPOStep, findings: list[Finding], fixes: dict, steps: int, seeds: int):
    """Each cause's fix followed for `steps` steps against the run (`horizon`); the findings with `learning` set,
    and what was done, or why nothing was (no reward functions for new completions, no fix to follow)."""
    if step.stored_rewards:
        why = "one-step effects only: the capture's stored rewards score its own completions, not new ones (--task)"
        return findings, {"steps": 0, "why": why}
    causes = [f for f in findings if f.id in fixes and not f.symptom_of]
    if not causes:
        return findings, {"steps": 0, "why": "no cause with a fix on this step to follow"}
    runs = range(seeds)
    as_run = continuations(step, {}, steps, runs)
    level = bonferroni_level(len(causes))
    learned = {f.id: compare(as_run, continuations(step, fixes[f.id], steps, runs), level) for f in causes}
    findings = [dataclasses.replace(f, learning=learned.get(f.id)) for f in findings]
    by_step = [sum(c.rewards[k] for c in as_run) / seeds for k in range(steps)]
    return findings, {"steps": steps, "seeds": seeds, "level": level, "as_run_rewards_by_step": by_step}


def _fix_changes(step: GRPOStep, f: Finding, config, vllm: bool) -> dict | None:
    """The config changes the differential fixes a loud finding with: its scaled field (`fix_scales`: a rollout
    field only where the step can sample anew, the bundled step; a capture's rollout is the trainer's), else its
    toggle and what the fix changes beside it (`fix_also`, rollout fields likewise). None: no fix on this step
    (no switch, already set, vLLM's on a run without vLLM, a flip refused, or one that takes the gradient away:
    it would clear findings by scoring nothing)."""
    p = PITFALLS[f.id]
    if f.severity not in LOUD:
        return None
    if p.fix_scales is not None:
        field, factor = p.fix_scales
        if step.capture is None or StepConfig.phase_of(field) != "rollout":
            value = getattr(config, field)
            return {field: type(value)(value * factor)}
    if not _flippable(f, config, vllm) or f.effect is None or "error" in f.effect or f.effect["removes_gradient"]:
        return None
    also = {k: v for k, v in p.fix_also if step.capture is None or StepConfig.phase_of(k) != "rollout"}
    return {p.toggle[0]: p.toggle[1], **also}


def _detect_under(step: GRPOStep, base: StepRun, detected: dict):
    """Every detector on the step with config changes applied (the same completions and weights, unless a
    change is a rollout field), remembered in `detected` by `change_key`; None where the step refuses them."""

    def detect_under(changes: dict) -> dict[str, Finding] | None:
        key = change_key(changes)
        if key not in detected:
            try:
                run = step.run(base.config.replace(**changes), until="update", base=base, remember=False)
            except ValueError:  # a fix this step cannot take (a length past the model's positions)
                detected[key] = None
            else:
                detected[key] = {f.id: f for f in detect(facts_of(step, run))}
            step.restore_policy()
        return detected[key]

    return detect_under
