"""Each present finding's switch flipped on the step itself (the same completions and weights, as the dashboard
does): what it does to loss, grad_norm, the update's direction and size, d loss / d logp and, where the task has
held-out prompts, the held-out reward after one step, paired with the update as run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..detectors.findings import Finding
from ..evaluation import EvalSide
from ..pitfalls import PITFALLS
from ..rollout import Sampling
from ..show.loss_gradients import gradient_of_loss_wrt_logps
from ..stats import prompt_interval, verdict
from ..step import GRPOStep, StepRun
from .facts import detect, facts_of, held_out_side, update_vector

NO_GRADIENT = 1e-12  # a grad_norm at or below this is no gradient: float rounding of a zero loss
COSMETIC = 0.01  # a flip whose update keeps a cosine above 1 - this, and grad_norm within this share, is cosmetic


REMOVES_GRADIENT = 0.01  # a flip that leaves less than this share of grad_norm and of the update takes it away


@dataclass(frozen=True)
class HeldOut:
    """The held-out reward after the step's update as run (`as_run`), which each flip's is paired with:
    same prompts, same sampling seeds, the config's sampling; `level` is each flip's interval level (the
    family of flips, Bonferroni)."""

    prompts: list[str]
    as_run: EvalSide
    sampling: Sampling
    level: float


def counterfactual(
    step: GRPOStep,
    base: StepRun,
    base_update: torch.Tensor,
    field: str,
    value,
    held_out: HeldOut | None = None,
    detected: dict | None = None,
    moved_kl_as_run: float | None = None,
) -> dict:
    """The step's update with `field` set to `value` against the update as run: loss, grad_norm, the cosine
    between the two updates (theta_after - theta_before) and their norms (both stepped by the same optimizer,
    on a capture the trainer's: Adam divides a constant gradient scale out), the share of d loss / d logp that moved
    (sum |g' - g| / sum |g| over every token) and, given `held_out`, the held-out reward after each update,
    paired by prompt (Student's t over prompts: one step, one seed, so it speaks of these two updates only).
    `detected` (a dict): every detector's finding on the flipped step is stored in it under `change_key`, and the
    KL each update moved the policy by on the step's completions (`moved_kl`: `moved_kl_as_run` and the flip's)."""
    try:
        flipped = step.run(base.config.replace(**{field: value}), until="update", base=base, remember=False)
    except ValueError as e:
        return {"toggle": {field: value}, "error": str(e)}
    moved = update_vector(step)
    cosine = torch.nn.functional.cosine_similarity(moved, base_update, dim=0).item()
    g0 = gradient_of_loss_wrt_logps(base, base.config)
    g1 = gradient_of_loss_wrt_logps(flipped, flipped.config)
    dlogp_moved = (g1 - g0).abs().sum().item() / max(g0.abs().sum().item(), 1e-30) if g0.shape == g1.shape else None
    grad_change = abs(flipped.update.grad_norm - base.update.grad_norm) / max(base.update.grad_norm, 1e-30)
    reward = _held_out_effect(step, held_out) if held_out else None
    flipped_kl = None
    if detected is not None:
        facts = facts_of(step, flipped)
        detected[change_key({field: value})] = {f.id: f for f in detect(facts)}
        flipped_kl = facts.step_kl
    step.restore_policy()
    # no gradient with the flip or without it: whatever the update does (the trainer's momentum alone) the flip
    # cannot show in it; an effect not seen here is not measured, never "none"
    measurable = max(base.update.grad_norm, flipped.update.grad_norm) > NO_GRADIENT
    removes = (
        measurable
        and (  # the gradient and the update both gone (Adam turns a merely smaller gradient into a full step)
            flipped.update.grad_norm <= REMOVES_GRADIENT * base.update.grad_norm
            and moved.norm().item() <= REMOVES_GRADIENT * base_update.norm().item()
        )
    )
    resampled = None if measurable or step.stored_rewards else resampled_effect(step, base.config, field, value)
    return {
        "toggle": {field: value},
        "resampled": resampled,
        "loss": [base.update.loss, flipped.update.loss],
        "grad_norm": [base.update.grad_norm, flipped.update.grad_norm],
        "update_cosine": cosine,
        "update_norm": [base_update.norm().item(), moved.norm().item()],
        "moved_kl": [moved_kl_as_run, flipped_kl],
        "dlogp_moved": dlogp_moved,
        "cosmetic": measurable and cosine >= 1 - COSMETIC and grad_change <= COSMETIC,
        "measurable": measurable,
        "removes_gradient": removes,
        "held_out_reward": reward,
    }


RESAMPLE_SEEDS = 3  # fresh draws tried for a step with a gradient, where the step's own has none either way


def resampled_effect(step: GRPOStep, config, field: str, value, seeds: int = RESAMPLE_SEEDS) -> dict | None:
    """A flip with no gradient on its step either way measured where it can show: the step's prompts sampled anew
    from its start weights (a capture's: the trainer's optimizer as captured, `horizon.take_trainers_optimizer`),
    at the first of `seeds` fresh seeds whose update has a gradient with the flip or without it, both arms on the
    same completions where the flip does not change how the step samples. {"seed", "grad_norm", "update_cosine",
    "update_norm", "cosmetic"}; None where no draw had a gradient (the policy's groups all agree: nothing to flip)."""
    from .horizon import _seed, take_trainers_optimizer

    def update_of(cfg, base: StepRun):
        with step.trial():
            if step.capture is not None:
                take_trainers_optimizer(step, cfg)
            torch.manual_seed(cfg.seed)
            run = step.run(cfg, until="update", base=base, remember=False)
            return run, update_vector(step)

    for s in range(seeds):
        at = config.replace(seed=_seed(10_000 + s, 0))  # seeds no continuation of the horizon draws
        try:
            as_run, before = update_of(at, StepRun(at))
            kept = dataclasses.replace(as_run, update=None, evaluation=None)  # its completions; the update taken anew
            flipped, after = update_of(at.replace(**{field: value}), kept)
        except ValueError:  # the step cannot sample anew with this config
            return None
        norms = [as_run.update.grad_norm, flipped.update.grad_norm]
        if max(norms) > NO_GRADIENT:
            cosine = torch.nn.functional.cosine_similarity(after, before, dim=0).item()
            change = abs(norms[1] - norms[0]) / max(norms[0], 1e-30)
            return {"seed": at.seed, "grad_norm": norms, "update_cosine": cosine,
                    "update_norm": [before.norm().item(), after.norm().item()],
                    "cosmetic": cosine >= 1 - COSMETIC and change <= COSMETIC}  # fmt: skip
    return None


def change_key(changes: dict) -> tuple:
    return tuple(sorted(changes.items(), key=lambda kv: kv[0]))


def _held_out_effect(step: GRPOStep, held_out: HeldOut) -> dict:
    flipped = held_out_side(step, held_out.sampling, held_out.prompts)
    paired = prompt_interval(flipped.per_prompt - held_out.as_run.per_prompt, held_out.level)
    return {
        "as_run": held_out.as_run.reward,
        "flipped": flipped.reward,
        "difference": paired.as_dict(),
        "verdict": verdict(paired, "held-out reward with the flip"),
        "completions_changed": sum(a != b for a, b in zip(flipped.completions, held_out.as_run.completions)),
        "prompts": len(held_out.prompts),
        "samples_per_prompt": held_out.sampling.num_generations,
    }


def _flippable(f: Finding, config, vllm: bool = False) -> bool:
    """A present finding whose switch is not yet set; vLLM's switches only on a run that sampled with vLLM."""
    toggle = PITFALLS[f.id].toggle
    if toggle is None or f.severity == "absent" or getattr(config, toggle[0]) == toggle[1]:
        return False
    return vllm or not toggle[0].startswith("vllm_")
