"""The doctor: why a step does not learn, found, ranked and shown on the step itself.

    report = diagnose(step)   # a GRPOStep: the bundled one, or open_capture(path, task)

1. `examine` runs the step up to its update under its own config and measures what the detectors need beside
   it (two train-mode scorings where dropout is on, the mass top_p/top_k kept, the weights' norm).
2. Every detector (`detectors.DETECTORS`, one pure function per pitfall of `pitfalls.PITFALLS`) reads those
   facts and returns a finding.
3. Each present finding whose pitfall has a toggle is flipped on this very step (the cached rollout, as the
   dashboard does; `counterfactual`): what it does to loss, grad_norm, the update's direction and d loss / d logp.
4. The differential (`chain`): the loud causes are fixed on the step one after another and every detector runs
   again after each fix; what a fix quiets is marked a symptom of that cause.
5. Findings are ranked: causes first (severity, the chain's order, then how far their flip moves the update),
   each symptom after its cause. A flip that does not move the update marks its finding cosmetic; one that
   takes the gradient away removes the update rather than correcting it.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from ..config import StepConfig
from ..evaluation import EvalSide, eval_side
from ..model import absolute_positions, dropout_sources
from ..pitfalls import PITFALLS
from ..rollout import Sampling
from ..sampler import mismatch_metrics
from ..scoring import completion_logits, next_token_logps, per_token_logps
from ..show.loss_gradients import gradient_of_loss_wrt_logps
from ..specs import eval_sampling_of, scoring_of
from ..speed import kernels
from ..stats import bonferroni_level, prompt_interval, verdict
from ..step import GRPOStep, StepRun
from .chain import differential, order
from .detectors import DETECTORS, bad_reward
from .exact_kl import at_reference, estimator_against_exact
from .findings import SEVERITIES, Finding, StepFacts  # noqa: F401 (Finding: the type a report holds)
from .horizon import SEEDS, compare, continuations

COSMETIC = 0.01  # a flip whose update keeps a cosine above 1 - this, and grad_norm within this share, is cosmetic
REMOVES_GRADIENT = 0.01  # a flip that leaves less than this share of grad_norm takes the update away


@dataclass(frozen=True)
class Report:
    findings: tuple[Finding, ...]  # ranked: causes (most severe, then most moving) first, each symptom after its cause
    config: dict
    seconds: float
    uses_vllm: bool = False  # the run sampled with vLLM: vLLM's settings are advice that applies to it
    horizon: dict | None = None  # how the fixes were followed over steps (`horizon`), or why they were not

    def causes(self, at_least: str = "warning") -> list[Finding]:
        """The findings at `at_least` or more severe that are no symptom of another."""
        return [f for f in self.present(at_least) if not f.symptom_of]

    def present(self, at_least: str = "info") -> list[Finding]:
        """The findings at `at_least` or more severe."""
        return [f for f in self.findings if SEVERITIES.index(f.severity) <= SEVERITIES.index(at_least)]

    def to_json(self) -> dict:
        return {
            "findings": [_finding_json(f, self.uses_vllm) for f in self.findings],
            "config": self.config,
            "seconds": self.seconds,
            "uses_vllm": self.uses_vllm,
            "horizon": self.horizon,
        }


def fix_of(f: Finding, uses_vllm: bool) -> str:
    """The fix shown for a finding: none for a symptom (fix its causes) or an absent one; vLLM's settings only
    for a run that sampled with vLLM."""
    return "" if f.symptom_of or f.severity == "absent" else PITFALLS[f.id].fix_for(uses_vllm)


def _finding_json(f: Finding, uses_vllm: bool) -> dict:
    p = PITFALLS[f.id]
    return {
        **dataclasses.asdict(f),
        "title": p.title,
        "fix": fix_of(f, uses_vllm),
        "origin": p.origin,
        "teach": p.teach,
        "toggle": None if p.toggle is None else {"field": p.toggle[0], "value": p.toggle[1]},
    }


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


def _held_out(step: GRPOStep, sampling: Sampling, prompts: list[str]) -> EvalSide | None:
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
        if "reward" not in str(e):
            raise
        run = step.run(cfg, until="logprobs")
        return _facts(step, run, reward_error=str(e)), None, None
    delta = update_vector(step)
    after = _held_out(step, eval_sampling_of(cfg), list(prompts))
    return _facts(step, run), delta, after


def moved_kl(step: GRPOStep, run: StepRun) -> float | None:
    """How far the update moved the policy on the step's own completions: KL(pi_before || pi_after) per scored
    token, k3 on the sampled tokens (E[rho - 1 - log rho], rho = pi_after / pi_before; dropout off); None
    where no update ran. Called while the policy holds the updated weights; leaves it at the step's start."""
    if run.update is None or not step.updated or not bool(run.logprobs.mask.any()):
        return None
    scoring = scoring_of(run.config).without_dropout()
    with torch.no_grad():
        after = per_token_logps(step.policy, run.rollout, scoring)
        step.restore_policy()
        before = per_token_logps(step.policy, run.rollout, scoring)
    log_ratio = (after - before).clamp(-20, 20)
    k3 = torch.exp(log_ratio) - 1 - log_ratio
    mask = run.logprobs.mask
    return ((k3 * mask).sum() / mask.sum()).item()


def _facts(step: GRPOStep, run: StepRun, reward_error: str = "") -> StepFacts:
    step_kl = moved_kl(step, run)
    weight_norm = torch.cat([before.flatten().float() for _, before in _trained(step)]).norm().item()
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
        reward_error=reward_error,
        uses_vllm=uses_vllm(step),
        step_kl=step_kl,
        logged_kl=step.capture.step_metrics.get("kl") if step.capture is not None else None,
    )


def uses_vllm(step: GRPOStep) -> bool:
    """Whether the run sampled with vLLM: a capture's `use_vllm`; the bundled step where its config stands for a
    vLLM run (its sampler correction on), else it samples with the trained model itself."""
    if step.capture is not None:
        return bool(step.capture.meta["grpo_config"].get("use_vllm"))
    return step.cfg.vllm_importance_sampling_correction


def detect(facts: StepFacts) -> list[Finding]:
    """Every detector on the facts, in catalogue order; a step whose rewards were refused: `bad_reward` alone."""
    if facts.reward_error:
        return [bad_reward(facts)]
    return [detector(facts) for detector in DETECTORS]


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
) -> dict:
    """The step's update with `field` set to `value` against the update as run: loss, grad_norm, the cosine
    between the two updates (theta_after - theta_before) and their norms (both stepped by the same optimizer,
    on a capture the trainer's: Adam divides a constant gradient scale out), the share of d loss / d logp that moved
    (sum |g' - g| / sum |g| over every token) and, given `held_out`, the held-out reward after each update,
    paired by prompt (Student's t over prompts: one step, one seed, so it speaks of these two updates only).
    `detected` (a dict): every detector's finding on the flipped step is stored in it under `change_key`."""
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
    if detected is not None:
        detected[change_key({field: value})] = {f.id: f for f in detect(_facts(step, flipped))}
    step.restore_policy()
    removes = flipped.update.grad_norm <= REMOVES_GRADIENT * base.update.grad_norm
    return {
        "toggle": {field: value},
        "loss": [base.update.loss, flipped.update.loss],
        "grad_norm": [base.update.grad_norm, flipped.update.grad_norm],
        "update_cosine": cosine,
        "update_norm": [base_update.norm().item(), moved.norm().item()],
        "dlogp_moved": dlogp_moved,
        "cosmetic": cosine >= 1 - COSMETIC and grad_change <= COSMETIC,
        "removes_gradient": removes,
        "held_out_reward": reward,
    }


def change_key(changes: dict) -> tuple:
    return tuple(sorted(changes.items(), key=lambda kv: kv[0]))


def _held_out_effect(step: GRPOStep, held_out: HeldOut) -> dict:
    flipped = _held_out(step, held_out.sampling, held_out.prompts)
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


def _moves(f: Finding) -> float:
    """How far the finding's flip moves the update (1 - cosine); -1 where it was not flipped, or where the flip
    takes the gradient away (it deletes the update rather than correcting it)."""
    if not f.effect or "update_cosine" not in f.effect or f.effect.get("removes_gradient"):
        return -1.0
    return 1 - f.effect["update_cosine"]


def _gain(f: Finding) -> float | None:
    """What the finding's fix did to learning over the horizon (the fixed arm's batch reward minus the run's)."""
    return f.learning["difference"]["mean"] if f.learning else None


def rank(findings: list[Finding], chained: list[str] = ()) -> tuple[Finding, ...]:
    return order(list(findings), list(chained), _moves, _gain)


def _flippable(f: Finding, config, vllm: bool = False) -> bool:
    """A present finding whose switch is not yet set; vLLM's switches only on a run that sampled with vLLM."""
    toggle = PITFALLS[f.id].toggle
    if toggle is None or f.severity == "absent" or getattr(config, toggle[0]) == toggle[1]:
        return False
    return vllm or not toggle[0].startswith("vllm_")


def diagnose(
    step: GRPOStep, flip: bool = True, held_out: int | None = None, horizon: int = 0, horizon_seeds: int = SEEDS
) -> Report:
    """Every detector on the step, each present finding with a toggle flipped on it (`flip`), the differential,
    ranked. Where the task has held-out test prompts, each flip's one-step update is also scored on `held_out` of
    them (default: `HELD_OUT_PROMPTS`; 0: none) against the update as run. `horizon` K > 0: each cause's fix is
    followed for K steps on `horizon_seeds` seeds against the run continued alike (`horizon`), where the task's
    reward functions can score new completions."""
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
    if f.severity not in ("problem", "warning"):
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
                detected[key] = {f.id: f for f in detect(_facts(step, run))}
            step.restore_policy()
        return detected[key]

    return detect_under
