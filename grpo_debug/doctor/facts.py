"""What the detectors read, measured once on a step: `examine` runs the step up to its update under its own config
and measures beside it what the detectors need (two train-mode scorings where dropout is on, the mass top_p/top_k
kept, the exact KL to the reference, the KL the update made, the weights' norm); `detect` runs every detector on
those facts.
"""

from __future__ import annotations

import dataclasses

import torch

from ..detectors.detectors import DETECTORS
from ..detectors.findings import Finding, StepFacts
from ..detectors.probes import probe_rewards
from ..detectors.signal_path import explained
from ..evaluation import EvalSide, eval_side
from ..logprobs import chunked_token_logps
from ..model import absolute_positions, dropout_sources
from ..rollout import Sampling
from ..sampler import mismatch_metrics
from ..scoring import completion_logits, next_token_logps, per_token_logps
from ..specs import eval_sampling_of, scoring_of
from ..speed import kernels
from ..step import GRPOStep, StepRun
from .exact_kl import at_reference, estimator_against_exact


def _trained(step: GRPOStep):
    """(each trained parameter now, its value before the step): `named_parameters` lists a tied weight once."""
    return [(p.detach(), step.initial_state[name]) for name, p in step.policy.named_parameters() if p.requires_grad]


def update_vector(step: GRPOStep) -> torch.Tensor:
    """theta_after - theta_before over every trained parameter, flattened: what the last update did."""
    return torch.cat([(now - before).flatten() for now, before in _trained(step)])


def _dropout_gap(step: GRPOStep, run: StepRun) -> float | None:
    """max |logp - logp'| over two train-mode scorings of the same tokens (None: the step scores in eval mode)."""
    if not run.config.dropout:
        return None
    step.restore_policy()
    scoring = scoring_of(run.config)
    with torch.no_grad():
        first, second = (per_token_logps(step.policy, run.rollout, scoring) for _ in range(2))
    return ((first - second).abs() * run.logprobs.mask).max().item()


def _kept_mass(step: GRPOStep, run: StepRun) -> torch.Tensor | None:
    cfg = run.config
    if cfg.top_p >= 1.0 and cfg.top_k == 0 and not cfg.min_p:
        return None

    def scored_over(support: str) -> torch.Tensor:  # the run's own log-probs where it already scores so
        if cfg.logprob_support == support:
            return run.logprobs.policy
        return step.run(
            cfg.replace(logprob_support=support), until="logprobs", base=run, remember=False
        ).logprobs.policy

    return torch.exp(scored_over("full_vocabulary") - scored_over("sampler_support")) * run.logprobs.mask


def _kl_against_exact(step: GRPOStep, run: StepRun) -> dict | None:
    """The run's KL estimator against the exact KL(pi || ref) over the full vocabulary (`exact_kl`); None at
    beta 0 (no reference, no KL term). At the reference (the first step) both are 0 by construction."""
    cfg = run.config
    if cfg.beta == 0:
        return None
    if step.at_reference:
        return at_reference()
    step.restore_policy()
    scoring = dataclasses.replace(scoring_of(cfg).without_dropout(), support="full_vocabulary")
    rollout = run.rollout

    def score_rows(rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            return tuple(
                next_token_logps(completion_logits(model, rollout.rows(rows), scoring), scoring)
                for model in (step.policy, step.loaded.reference)
            )

    return estimator_against_exact(score_rows, rollout.completion_ids, run.logprobs.mask, cfg.kl_estimator)


HELD_OUT_PROMPTS = 16  # per flip: ~4 s of sampling on the bundled model (4 samples each, the config's eval_samples)


def held_out_prompts(step: GRPOStep, n: int | None = None) -> list[str]:
    """The task's first `n` (default: HELD_OUT_PROMPTS, at most the config's eval_prompts) held-out test
    prompts; none where the task has no held-out set (a capture opened with your reward functions only, or
    its stored rewards)."""
    n = min(HELD_OUT_PROMPTS, step.cfg.eval_prompts) if n is None else n
    return step.task.prompts("test", n) if step.task.held_out and n > 0 else []


def held_out_side(step: GRPOStep, sampling: Sampling, prompts: list[str]) -> EvalSide | None:
    """The policy as it stands (after an update) on the held-out prompts, the same sampling seeds every time."""
    if not prompts:
        return None
    return eval_side(step.policy, step.loaded.tokenizer, prompts, sampling, step.task, kernels(step.cfg.fast).generate)


def examine(step: GRPOStep, prompts: list[str] = ()) -> tuple[StepFacts, torch.Tensor | None, EvalSide | None]:
    """The step run up to its update under its own config, the facts the detectors read, the update it made
    and the updated policy's reward on the held-out `prompts`."""
    cfg = step.cfg.replace(per_sample_grad_norms=False)  # the same update, without the norms' extra work
    try:
        run = step.run(cfg, until="update")
    except ValueError as e:
        if "an infinite reward" not in str(e):
            raise
        step.task = step.task.without_infinite()  # read as None, named by bad_reward; `diagnose` gives it back
        run = step.run(cfg, until="update")
    delta = update_vector(step)
    after = held_out_side(step, eval_sampling_of(cfg), list(prompts))
    return facts_of(step, run), delta, after


def moved_kl(step: GRPOStep, run: StepRun) -> float | None:
    """How far the update moved the policy on the step's own completions: KL(pi_before || pi_after) per scored
    token, k3 on the sampled tokens (E[rho - 1 - log rho], rho = pi_after / pi_before; dropout off; scored as the
    step's log-probs are, a group at a time, its prompt once where the step is fast); None where no update ran.
    Called while the policy holds the updated weights; leaves it at the step's start."""
    if run.update is None or not step.updated or not bool(run.logprobs.mask.any()):
        return None
    scoring, score = scoring_of(run.config).without_dropout(), kernels(run.config.fast).score_logps
    with torch.no_grad():
        after = chunked_token_logps(step.policy, run.rollout, scoring, score)
        step.restore_policy()
        before = chunked_token_logps(step.policy, run.rollout, scoring, score)
    return k3_per_token(after - before, run.logprobs.mask)


def k3_per_token(log_ratio: torch.Tensor, mask: torch.Tensor) -> float:
    """KL(pi_start || pi_now) per masked token from (N, C) log(pi_now / pi_start) on tokens sampled from pi_start:
    k3, E[rho - 1 - log rho] (the log-ratio clamped to +-20 so that a broken model gives a number, not inf)."""
    log_ratio = log_ratio.double().clamp(-20, 20)  # float64: float32's exp(x) - 1 - x is 0 for |x| below ~1e-4
    return ((torch.expm1(log_ratio) - log_ratio) * mask.double()).sum().item() / max(mask.sum().item(), 1.0)


def weight_norm_of(step: GRPOStep) -> float:
    """||theta|| at the step's start over the trained parameters (a tied embedding counted once)."""
    return torch.cat([before.flatten().float() for _, before in _trained(step)]).norm().item()


def facts_of(step: GRPOStep, run: StepRun) -> StepFacts:
    parameters = parameters_moved(step, run)  # before `moved_kl` puts the step's start back
    step_kl = moved_kl(step, run)
    weight_norm = weight_norm_of(step)
    capture, r, lp = step.capture, run.rollout, run.logprobs
    sampler_known = capture is None or "sampling_per_token_logps" in capture.batch  # our sampler, or vLLM's
    sampler_known = sampler_known and bool(lp.mask.any())  # a flip that masks every token scores none
    return StepFacts(
        run=run,
        reward_weights=step.task.weights,
        absolute_positions=absolute_positions(step.policy),
        left_padded=bool((run.rollout.prompt_mask[:, 0] == 0).any()),
        dropout_sources=tuple(dropout_sources(step.policy)),
        dropout_gap=_dropout_gap(step, run),
        sampler_metrics=mismatch_metrics(lp.policy, r.sampler_logps_temperature_only, lp.mask)
        if sampler_known
        else None,
        kept_mass=_kept_mass(step, run),
        kl_against_exact=_kl_against_exact(step, run),
        weight_norm=weight_norm,
        uses_vllm=uses_vllm(step),
        step_kl=step_kl,
        logged_kl=step.capture.step_metrics.get("kl") if step.capture is not None else None,
        kl_history=kl_history(step.capture) if step.capture is not None else (),
        reward_probes=_probes(step, run),
        logged_history=tuple(step.capture.logged_history) if step.capture is not None else (),
        logged_rewards=logged_rewards(step, run),
        parameters=parameters,
    )


def logged_rewards(step: GRPOStep, run: StepRun) -> dict[str, tuple] | None:
    """The rewards the trainer logged for the run's completions, per function, where the step recomputed them with
    the user's reward functions on the captured completions themselves; None otherwise (stored rewards, a bundled
    step, or completions sampled anew)."""
    capture = step.capture
    if capture is None or step.stored_rewards:
        return None
    captured = capture.batch["completion_ids"]
    ours = run.rollout.completion_ids
    if ours.shape != captured.shape or not torch.equal(ours.cpu(), captured.cpu()):
        return None
    return {name: tuple(values) for name, values in capture.meta["rewards"].items()}


def parameters_moved(step: GRPOStep, run: StepRun) -> dict:
    """The policy's parameter tensors: how many train, their share of the weights, and how many the run's update
    moved (None where no update ran; a tied weight counted once). Called while the policy holds the updated weights."""
    named = list(step.policy.named_parameters())
    trained = [(name, p) for name, p in named if p.requires_grad]
    moved = None
    if run.update is not None and step.updated:
        moved = int(sum(bool((p.detach() != step.initial_state[name]).any()) for name, p in trained))
    total = sum(p.numel() for _, p in named)
    return {
        "tensors": len(named),
        "trainable_tensors": len(trained),
        "moved_tensors": moved,
        "trainable_share": sum(p.numel() for _, p in trained) / max(total, 1),
        "adapter": any("lora_" in name for name, _ in trained),  # a peft adapter trains a small share by design
    }


def kl_history(capture) -> tuple[tuple[int, float], ...]:
    """The kl at each step before and at the captured one: what TRL logged where it logged every step, else the
    capture's own course of each step (TRL logs every logging_steps only: 10 by GRPOConfig's default)."""
    if capture.logged_kl:
        return tuple(capture.logged_kl)
    return tuple((int(h["step"]), float(h["kl"])) for h in capture.logged_history if "kl" in h)


# the probes of the last completions seen, with the task they were made with (kept alive, so that its id is not
# reused by another task): a flip on the same completions reuses them
_PROBED: dict[tuple, tuple] = {}


def _probes(step: GRPOStep, run: StepRun) -> dict | None:
    """The reward functions probed on the run's completions (`probes`); None where only stored rewards are at hand."""
    if step.stored_rewards:
        return None
    r = run.rollout
    prompts = [r.prompts[i // r.num_generations] for i in range(len(r.completions))]
    key = (id(step.task), tuple(prompts), tuple(r.completions))
    if key not in _PROBED:
        _PROBED.clear()
        _PROBED[key] = (step.task, probe_rewards(step.task, prompts, list(r.completions), r.num_generations))
    return _PROBED[key][1]


def uses_vllm(step: GRPOStep) -> bool:
    """Whether the run sampled with vLLM: a capture's `use_vllm`; the bundled step where its config stands for a
    vLLM run (its sampler correction on), else it samples with the trained model itself."""
    if step.capture is not None:
        return bool(step.capture.meta["grpo_config"].get("use_vllm"))
    return step.cfg.vllm_importance_sampling_correction


def detect(facts: StepFacts) -> list[Finding]:
    """Every detector on the facts, in catalogue order; the signal's path lost where a catalogued finding of the
    same stage is loud is that finding's (`signal_path.explained`)."""
    return explained([detector(facts) for detector in DETECTORS])
