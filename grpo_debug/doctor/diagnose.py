"""`diagnose`: every detector on the step, each cause flipped on it, the differential, and each cause's fix
followed over steps where it can be; the ranked report.
"""

from __future__ import annotations

import dataclasses
import sys
import time

from tqdm.auto import tqdm

from ..config import StepConfig, changes_sampling
from ..detectors.detectors import NONE_WARNING
from ..detectors.findings import LOUD, SEVERITIES, Finding
from ..detectors.signal_path import LOST
from ..horizon_bounds import horizon_problem
from ..pitfalls import PITFALLS
from ..specs import eval_sampling_of
from ..stats import bonferroni_level
from ..step import GRPOStep, StepRun
from .at_start import before_the_jump, collapse_at_start
from .chain import SIGNAL_OF_THE_FIX, differential
from .deadline import Deadline, Phases
from .exhibits import exhibits_of
from .facts import detect, examine, facts_of, held_out_prompts
from .flips import HeldOut, _flippable, change_key, counterfactual
from .forecast import forecast_tested
from .horizon import SEEDS, compare, continue_step, samples_anew, take_trainers_optimizer
from .narrowed import a_cause_of_its_own, narrowing_tested
from .onsets import after_onsets, onsets_of
from .probe import PROBE_SEEDS, run_probe
from .report import Report, flip_measurable, rank
from .resampled import signal_tested


def diagnose(
    step: GRPOStep,
    flip: bool = True,
    held_out: int | None = None,
    horizon: int = 0,
    horizon_seeds: int = SEEDS,
    budget: float | None = None,
    progress: bool = False,
    probe: int | None = None,
    started: float | None = None,
) -> Report:
    """Every detector on the step, each present finding with a toggle flipped on it (`flip`), the differential,
    ranked. Where the task has held-out test prompts, each flip's one-step update is also scored on `held_out` of
    them (default: `HELD_OUT_PROMPTS`; 0: none) against the update as run. `horizon` K > 0: each cause's fix is
    followed for K steps on `horizon_seeds` seeds against the run continued alike (`horizon`), where the task's
    reward functions can score new completions (`fit` says what is cut first; a horizon past what the budget holds
    is refused, `horizon_bounds`). `budget` seconds (None: no bound) bound the whole diagnosis from `started`
    (time.perf_counter(); default now: a command passes its own start, so that loading counts): the step and its
    detectors always run, then the flips, the probe and the horizon take what is left, each cut before it would run
    past the end, and `Report.budget` says what was cut (`deadline`). `progress`: each phase and the time left, and
    the horizon's plan, on stderr. `probe` (None: not run): a probe reward the model can learn in place of the
    run's, one update through the run's pipeline and its path (`probe`), and where K > 0 its curve over K steps,
    before the horizon takes the rest."""
    problem = horizon_problem(horizon, horizon_seeds, budget) if horizon > 0 else None
    if problem:
        raise ValueError(problem)
    task = step.task
    try:
        deadline = Deadline(budget, time.perf_counter() if started is None else started)
        return _diagnose(step, flip, held_out, horizon, horizon_seeds, deadline, progress, probe)
    finally:
        step.task = task  # `examine` reads an infinite reward as None for the diagnosis alone


def _diagnose(step: GRPOStep, flip, held_out, horizon: int, horizon_seeds: int, deadline: Deadline, progress, probe):
    start = time.perf_counter()
    phases = Phases(deadline, progress)
    prompts = held_out_prompts(step, held_out) if flip else []
    with phases.timed(STEP_PHASE):
        facts, delta, after = examine(step, prompts)
    phases.say("the step run and examined")
    step.reward_tally = {}  # what the functions return on the completions scored from here on
    base = facts.run
    with phases.timed("the resampled tests"):
        findings = narrowing_tested(step, signal_tested(step, forecast_tested(step, detect(facts)), deadline.holds))
    phases.cut += [f"the resample of {f.id}" for f in findings if f.evidence.get("not_resampled")]
    chained: list[str] = []
    fixes: dict[str, dict] = {}
    if flip and delta is not None:
        findings, detected = _flipped(step, facts, findings, delta, HeldOut(prompts, after, eval_sampling_of(
            base.config), 0.0) if after else None, phases)  # fmt: skip
        fixes = {f.id: c for f in findings if (c := _fix_changes(step, f, base.config, facts.uses_vllm)) is not None}
        with phases.timed("causes told from symptoms"):
            findings, chained = differential(findings, fixes, _detect_under(step, base, detected, findings, phases))
    findings = after_onsets(
        findings,
        chained,
        onsets_of(
            list(facts.logged_history),
            base.config.max_grad_norm,
            {f.id: f.severity for f in findings},
            next((tuple(f.evidence.get("named") or ()) for f in findings if f.id == "constant_reward"), ()),
        ),
    )
    with phases.timed("the run's start"):
        findings = a_cause_of_its_own(collapse_at_start(step, base, before_the_jump(step, findings)))
    step.restore_policy()
    probed = _probed(step, base, probe, phases)
    findings, followed = _followed(step, base, findings, fixes, horizon, horizon_seeds, chained, phases)
    findings = none_later(findings, step.reward_tally, dict(zip(step.task.reward_names, step.task.weights)))
    if phases.cut:
        phases.say(f"cut for the budget: {', '.join(phases.cut)}")
    return Report(
        rank(findings, chained),
        base.config.settings(),
        time.perf_counter() - start,
        facts.uses_vllm,
        followed,
        exhibits=exhibits_of(facts),
        probe=probed,
        budget=phases.said(),
    )


STEP_PHASE = "the step and its detectors"


def one_step(base: StepRun, phases: Phases) -> float:
    """Seconds one step of the probe or the horizon costs: the step's own phases where it sampled here, else (a
    capture's completions are the trainer's) the step with its detectors, an upper bound."""
    sampled = base.timings.get("rollout")
    if sampled is not None and sampled.seconds > 0:
        return sum(t.seconds for t in base.timings.values())
    return phases.seconds[STEP_PHASE]


def _flipped(step: GRPOStep, facts, findings: list[Finding], delta, held_out: HeldOut | None, phases: Phases):
    """Each flippable finding with its toggle flipped on the step (`counterfactual`), its severity from the flip where
    that decides it, in the order found; a flip that would run past the budget is cut (the slowest flip so far, or
    the step itself before the first, is what one costs), its detector's severity kept. (findings, detected)."""
    base = facts.run
    flips = [i for i, f in enumerate(findings) if _flippable(f, base.config, facts.uses_vllm)]
    paired = held_out and dataclasses.replace(held_out, level=bonferroni_level(len(flips)))
    detected: dict[tuple, dict[str, Finding]] = {}
    findings, took = list(findings), []
    phases.say(f"flipping {len(flips)} findings")
    with phases.timed("the flips"):
        for i in flips:
            if not phases.deadline.holds(max(took, default=phases.seconds[STEP_PHASE])):
                phases.cut.append(f"the flip of {findings[i].id}")
                continue
            t0 = time.perf_counter()
            toggle = PITFALLS[findings[i].id].toggle
            effect = counterfactual(step, base, delta, *toggle, paired, detected, facts.step_kl)
            findings[i] = severity_from_flip(dataclasses.replace(findings[i], effect=effect), facts.uses_vllm)
            took.append(time.perf_counter() - t0)
    return findings, detected


def _probed(step: GRPOStep, base: StepRun, probe: int | None, phases: Phases) -> dict | None:
    """The probe where asked (None: not run; K > 0: with its curve over K steps), cut where not even one step of it
    (about what the step cost, an upper bound) fits in what is left; `run_probe` times one curve step and fits its
    seeds to the rest."""
    if probe is None:
        return None
    if not phases.deadline.holds(one_step(base, phases)):
        phases.cut.append("the probe")
        return {"carries": None, "why": "cut for the budget: not even one of its steps fit in what was left"}
    curve = f", then trained {probe} steps x {PROBE_SEEDS} seeds" if probe > 0 else ""
    phases.say(f"probe: a reward the model can learn in place of the run's, one update through its pipeline{curve}")
    with phases.timed("the probe"):
        return run_probe(step, base, probe, PROBE_SEEDS, phases.deadline.for_phase())


def _followed(step: GRPOStep, base: StepRun, findings, fixes: dict, horizon: int, seeds: int, chained, phases: Phases):
    """Each cause's fix followed `horizon` steps (`_follow`) within what is left, cut where not even its smallest plan
    (one timed step, then 2 arms x 2 seeds x 2 steps) fits; (findings, what was followed) or (findings, None)."""
    if horizon <= 0:
        return findings, None
    if not phases.deadline.holds((2 + 2 * 2 * 2) * one_step(base, phases)):
        phases.cut.append("the horizon")
        return findings, {"steps": 0, "why": "cut for the budget: not even its smallest plan fit in what was left"}
    phases.say(f"the horizon: each cause's fix followed {horizon} steps")
    with phases.timed("the horizon"):
        findings, followed = _follow(
            step, findings, fixes, horizon, seeds, phases.deadline.for_phase(), chained, phases.progress
        )
    phases.cut.extend(f"the horizon's arm for {cause}" for cause in followed.get("cut", {}).get("causes", ()))
    return findings, followed


def none_later(findings: list[Finding], tally: dict[str, list[int]], weights: dict[str, float]) -> list[Finding]:
    """bad_reward where a function weighted other than 0 returned None or NaN on NONE_WARNING of the completions
    scored after the step's own (flips, resamples, the horizon) and the step's own finding is not loud: TRL's sum
    skips them, so their rows lose that function's signal; never dropped silently."""
    later = {k: (none, n) for k, (none, n) in tally.items() if k in weights and weights[k] != 0 and n and none}
    loud = {k: v for k, v in later.items() if v[0] >= NONE_WARNING * v[1]}
    i = next((i for i, f in enumerate(findings) if f.id == "bad_reward"), None)
    if not loud or i is None or findings[i].severity in LOUD:
        return findings
    f = findings[i]
    said = ("None or NaN on the completions scored after this step's own (resampled, flipped, followed over steps): "
            + ", ".join(f"{k} {none}/{n}" for k, (none, n) in loud.items())
            + " (TRL's sum skips them: those rows lose the function's signal)")  # fmt: skip
    summary = said if f.severity == "absent" else f"{f.summary}; {said}"
    evidence = {**f.evidence, "none_later": {k: list(v) for k, v in later.items()}}
    return [
        *findings[:i],
        dataclasses.replace(f, severity="warning", summary=summary, evidence=evidence),
        *findings[i + 1 :],
    ]


# findings whose statistic says only that something differs; whether it matters is what flipping it does to the update
SEVERITY_FROM_FLIP = ("dropout", "grad_clipped")
# ...and, where the trainer sampled with its own model, a truncated sampler's: the mass it cut biases vLLM's
# importance ratio (TRL #6789), which such a run does not have; what is left is which completions the step can
# sample, which the flip (scoring over the sampler's support) does not measure: where the sampler can produce a tenth
# of the policy's completions or less (`signal_path.LOST`), the finding keeps its severity whatever the flip says
SEVERITY_FROM_FLIP_WITHOUT_VLLM = ("sampler_truncation",)


def severity_from_flip(f: Finding, uses_vllm: bool = False) -> Finding:
    """A loud finding of SEVERITY_FROM_FLIP whose flip leaves the update as it is (`flips.COSMETIC`: the update's
    cosine and grad_norm within 1%) is info: under the trainer's optimizer it changes nothing this step learns."""
    e, ids = f.effect, SEVERITY_FROM_FLIP + (() if uses_vllm else SEVERITY_FROM_FLIP_WITHOUT_VLLM)
    if f.id not in ids or f.severity not in LOUD or not e or "error" in e:
        return f
    if f.id in SEVERITY_FROM_FLIP_WITHOUT_VLLM and f.evidence.get("reach", 1.0) <= LOST:
        return f
    where = "on this step"
    if not flip_measurable(e):  # no gradient either way: what a fresh draw of its prompts with one shows
        e, where = e.get("resampled"), "on its prompts sampled anew"
        if e is None:
            return f
    if not e["cosmetic"]:
        return f
    said = (f"{f.summary}; flipped {where} it leaves the update as it is (cosine {e['update_cosine']:+.3f}, "
            f"norm {e['update_norm'][0]:.3g} -> {e['update_norm'][1]:.3g})")  # fmt: skip
    return dataclasses.replace(f, severity="info", summary=said)


def _follow(step: GRPOStep, findings: list[Finding], fixes: dict, steps: int, seeds: int, budget, chained, progress):
    """Each cause's fix followed for `steps` steps against the run (`horizon`), within `budget` seconds (None: no
    bound): one continuation step is timed first and the plan cut to fit, the most likely causes kept (`fit`); the
    findings with `learning` set, and what was done and cut (a fix the step cannot take over steps, a length past the
    model's positions, is listed in `not_followed` with why), or why nothing was (no reward functions for new
    completions, no fix to follow)."""
    if step.stored_rewards:
        why = "one-step effects only: the capture's stored rewards score its own completions, not new ones (--task)"
        return findings, {"steps": 0, "why": why}
    causes = [f for f in findings if f.id in fixes and not f.symptom_of]
    if not causes:
        return findings, {"steps": 0, "why": "no cause with a fix on this step to follow"}
    causes.sort(key=lambda f: (chained.index(f.id) if f.id in chained else len(chained), SEVERITIES.index(f.severity)))
    read_end = any(changes_sampling(fixes[f.id]) for f in causes)  # an arm that samples otherwise: `compare`
    t0 = time.perf_counter()
    timed = continue_step(step, {}, min(steps, 2), 0, read_end)
    per_step = (time.perf_counter() - t0) / min(steps, 2)
    plan = fit(budget, per_step, len(causes), steps, seeds)
    kept, seeds, steps = causes[: plan["causes"]], plan["seeds"], plan["steps"]
    runs = range(seeds)
    level = bonferroni_level(len(kept))
    total = (1 + len(kept)) * seeds
    if progress:
        print(plan_line(plan, len(causes)), file=sys.stderr)
    with tqdm(total=total, desc="horizon", unit="run", disable=not progress, file=sys.stderr) as bar:

        def arm(changes: dict):
            out = []
            for s in runs:
                out.append(timed if not changes and s == 0 and steps == len(timed.rewards) else
                           continue_step(step, changes, steps, s, read_end))  # fmt: skip
                bar.update(1)
            return out

        as_run = arm({})
        learned, unfollowed, late = {}, {}, []
        for f in kept:
            if budget is not None and time.perf_counter() - t0 > budget:  # the plan ran slower than timed (a loaded
                late.append(f.id)  # machine): no overrun, the cause cut as the plan's own cuts are
                continue
            try:
                learned[f.id] = {**compare(as_run, arm(fixes[f.id]), level), "changes": fixes[f.id]}
            except ValueError as e:  # a fix the step cannot take over steps (a length past the model's positions)
                unfollowed[f.id] = str(e)
    findings = [dataclasses.replace(f, learning=learned.get(f.id)) for f in findings]
    by_step = [sum(c.rewards[k] for c in as_run) / seeds for k in range(steps)]
    cut = {"causes": late + [f.id for f in causes[plan["causes"] :]], "late": late}  # late: planned, then cut when the
    cut |= {k: plan[k] for k in ("steps_asked", "seeds_asked")}  # machine ran slower than its timed step
    return findings, {
        "steps": steps,
        "seeds": seeds,
        "level": level,
        "as_run_rewards_by_step": by_step,
        "seconds_per_step": per_step,
        "estimate_seconds": plan["estimate"],
        "budget_seconds": budget,
        "cut": cut,
        "not_followed": unfollowed,
    }


def fit(budget: float | None, per_step: float, causes: int, steps: int, seeds: int) -> dict:
    """The horizon's plan within `budget` seconds at `per_step` seconds a continuation step: (1 + causes) arms x seeds
    x steps, cut where it does not fit: causes first (the least likely go; one is kept), then steps (to 2), then
    seeds (to 2). {"causes", "seeds", "steps", "estimate", "steps_asked", "seeds_asked"}."""

    def cost(n: int, s: int, k: int) -> float:
        return (1 + n) * s * k * per_step

    n, s, k = causes, seeds, steps
    if budget is not None:
        while cost(n, s, k) > budget and n > 1:
            n -= 1
        while cost(n, s, k) > budget and k > 2:
            k -= 1
        while cost(n, s, k) > budget and s > 2:
            s -= 1
    return {"causes": n, "seeds": s, "steps": k, "estimate": cost(n, s, k), "steps_asked": steps, "seeds_asked": seeds}


def plan_line(plan: dict, causes: int) -> str:
    """What the horizon will run and what it cut, before it starts."""
    said = (f"horizon: {1 + plan['causes']} arms x {plan['seeds']} seeds x {plan['steps']} steps, about "
            f"{plan['estimate']:.0f} s")  # fmt: skip
    cut = []
    if plan["causes"] < causes:
        cut.append(f"{causes - plan['causes']} of {causes} causes")
    if plan["steps"] < plan["steps_asked"]:
        cut.append(f"steps {plan['steps_asked']} -> {plan['steps']}")
    if plan["seeds"] < plan["seeds_asked"]:
        cut.append(f"seeds {plan['seeds_asked']} -> {plan['seeds']}")
    return said + (f" (to fit the budget: cut {', '.join(cut)})" if cut else "")


def _samples_anew(step: GRPOStep) -> bool:
    """Whether a fix may change how the step samples: the bundled step always; a capture where its reward functions
    are at hand (--task), by sampling anew from the captured weights (the trainer's completions stay as evidence)."""
    return step.capture is None or not step.stored_rewards


def _kept(changes: dict, step: GRPOStep, config) -> dict:
    """`changes` less what the config already holds, and less its rollout fields where the step cannot sample anew;
    a temperature only ever raised (a fix samples wider, never colder)."""
    kept = {}
    for field, value in changes.items():
        now = getattr(config, field)
        if now == value or (StepConfig.phase_of(field) == "rollout" and not _samples_anew(step)):
            continue
        if field == "temperature" and now >= value:
            continue
        kept[field] = value
    return kept


def _fix_changes(step: GRPOStep, f: Finding, config, vllm: bool) -> dict | None:
    """The config changes the differential fixes a loud finding with: its scaled field (`fix_scales`: a rollout
    field only where the step can sample anew), else its toggle and what the fix changes beside it (`fix_also`,
    rollout fields likewise), else `fix_also` alone (a fix that samples anew). None: no fix on this step (no switch,
    already set, vLLM's on a run without vLLM, a flip refused, one that takes the gradient away: it would clear
    findings by scoring nothing, or one not measurable: no gradient with it or without)."""
    p = PITFALLS[f.id]
    if f.severity not in LOUD:
        return None
    if p.fix_scales is not None:
        if _samples_anew(step) or StepConfig.phase_of(p.fix_scales[0]) != "rollout":
            return p.scaled(config)
    if p.toggle is None:
        return _kept(dict(p.fix_also), step, config) or None
    e = f.effect
    if not _flippable(f, config, vllm) or e is None or "error" in e or e["removes_gradient"] or not flip_measurable(e):
        return None
    return {p.toggle[0]: p.toggle[1], **_kept(dict(p.fix_also), step, config)}


def _revealed(fixed: Finding, as_found: Finding) -> Finding:
    """A finding loud with a sampling fix, quiet in the resample without it and on the trainer's step: the fix, not
    a draw, made it show (`chain.differential` names it behind the cause); else the trainer's finding."""
    if fixed.severity in LOUD and as_found.severity not in LOUD and fixed.id not in SIGNAL_OF_THE_FIX:
        return dataclasses.replace(fixed, evidence={**fixed.evidence, "revealed": True})
    return as_found


THE_TEXTS = ("identical_groups",)  # what was sampled: no change after sampling alters it (its severity, resampled)


def _detect_under(step: GRPOStep, base: StepRun, detected: dict, as_found: list[Finding], phases=None):
    """Every detector on the step with config changes applied (the same completions and weights), remembered in
    `detected` by `change_key`; None where the step refuses them. A change of how the step samples (a rollout
    field) is measured on a capture by sampling anew twice from the captured weights, with the change and without
    its rollout fields (the other fixes kept), at the same seed, each update the engine's stepping the trainer's
    optimizer (`take_trainers_optimizer`): a finding counts as cleared only where the resample without the change
    keeps it (else the trainer's finding is kept: a new draw alone quieted it). On the same completions, THE_TEXTS
    are the trainer's findings as found: their severity came from sampling anew, which the detector alone has not.
    `phases`: a fix whose step would run past the budget is not tested (None, as one the step refuses), said cut."""
    trainer = {f.id: f for f in as_found}

    def run_detectors(changes: dict, anew: bool) -> dict[str, Finding] | None:
        key = (*change_key(changes), ("sampled anew", True)) if anew else change_key(changes)  # flips store the latter
        if key not in detected and phases is not None and not phases.deadline.holds(phases.seconds[STEP_PHASE]):
            under = ", ".join(f"{k}={v}" for k, v in changes.items()) or "the run's own settings, sampled anew"
            said = f"the step under {under} (to tell causes from symptoms)"
            phases.cut += [said] if said not in phases.cut else []
            return None
        if key not in detected:
            cfg = base.config.replace(**changes)
            with step.trial():
                if anew:
                    take_trainers_optimizer(step, cfg)
                try:
                    run = step.run(cfg, until="update", base=StepRun(cfg) if anew else base, remember=False)
                except ValueError:  # a fix this step cannot take (a length past the model's positions)
                    detected[key] = None
                else:
                    detected[key] = {f.id: f for f in detect(facts_of(step, run))}
        return detected[key]

    def detect_under(changes: dict) -> dict[str, Finding] | None:
        if not samples_anew(step, changes):
            found = run_detectors(changes, False)  # the same completions: their texts are as the trainer's finding says
            return found and {**found, **{i: trainer[i] for i in THE_TEXTS if i in trainer and i in found}}
        kept = {k: v for k, v in changes.items() if StepConfig.phase_of(k) != "rollout"}  # earlier rounds' fixes
        fixed, again = run_detectors(changes, True), run_detectors(kept, True)
        if fixed is None or again is None:
            return None
        return {i: f if again[i].severity in LOUD else _revealed(f, trainer.get(i, f)) for i, f in fixed.items()}

    return detect_under
