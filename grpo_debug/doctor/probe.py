"""Is it the reward or the pipeline? A probe reward the model can surely learn put in place of the run's, as RL
practitioners check a learner on a probe environment before they blame the task.

    result = run_probe(step, run)            # run: the step as run (a capture: the trainer's)
    result = run_probe(step, run, steps=8)   # and the probe trained 8 steps from the step, 6 seeds: its curve

The probe pays each completion the share of its tokens that are one of a few `tokens`. They are chosen on the step's
own completions: the policy's most likely tokens, as many as bring the sampler's mass on them (its temperature,
top_k, top_p, min_p; averaged over every completion position, teacher-forced) within 20-80%, the count that gives
the most of the step's groups reward variance, then the nearest half. A reward on a choice the policy makes about half
the time, at every position, asks the smallest change the policy can make, at every token the step trains.

The verdict is an intervention on the reward alone: the step's own completions scored by the probe instead of the
run's functions, then the run's own pipeline (its advantages, masks, loss, trainable weights and optimizer: on a
capture the trainer's step, replayed) takes one update from them, and the stages of the signal's path that follow
the rewards (`detectors.signal_path`: advantages, tokens, loss, parameters, update) are measured on it, with the
thresholds the step's own path is read with. Where one loses nearly all of the probe's signal, the pipeline loses
it ("lost", at that stage, the setting traced), whatever the reward; where each lets it through, the pipeline
carries a signal the model can learn, and a signal lost on the run's own step is lost at the reward ("carries").
A probe whose own rewards do not vary gives no verdict. Nothing of the step changes (`GRPOStep.trial`).

With `steps` K > 0 the probe is also trained K steps from the step on `seeds` continuations (each step sampled anew
from the moved policy, the run's config and optimizer: a capture's trainer AdamW at its rates, its second moments
kept, its first moments cleared so that the user's reward's momentum does not carry the first steps): the curve of
the policy's mass on the probe's tokens over the step's own completions, with the rise's interval over seeds. At
the rates runs use (1e-6 to 1e-4) a few steps move that mass by 1e-4 or less: the curve shows what the probe moved,
the verdict comes from the one update's path.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..detectors import signal_path
from ..detectors.findings import StepFacts
from ..rollout import row_chunks
from ..scoring import _tempered, completion_logits, per_token_logps
from ..specs import scoring_of
from ..stats import seed_interval
from ..step import GRPOStep, StepRun
from ..task import Task
from .facts import k3_per_token, moved_kl, parameters_moved, weight_norm_of
from .horizon import _seed, take_trainers_optimizer

PROBE_SEEDS = 6  # continuations of the curve, the seed the unit
MASS_BAND = (0.2, 0.8)  # the probe's tokens hold this share of the sampler's mass


@dataclass(frozen=True)
class TokenProbe:
    """A reward: the share of a completion's tokens (up to its EOS) that are one of `tokens` (0 for an empty one).
    Reads the completions' token ids (`takes_completion_ids`), as TRL passes them."""

    tokens: tuple[int, ...]
    words: tuple[str, ...]  # the tokens decoded, for the report
    start_mass: float  # the sampler's mass on `tokens` over the step's completions before any probe step
    __name__ = "probe"
    takes_completion_ids = True

    def __call__(self, prompts, completions, completion_ids, **kwargs) -> list[float]:
        kept = set(self.tokens)
        return [sum(t in kept for t in ids) / len(ids) if ids else 0.0 for ids in completion_ids]


def as_sampled(cfg):
    """The scoring that reads the sampler's own distribution: the run's temperature and truncation, no dropout."""
    scoring = scoring_of(cfg).without_dropout()
    return dataclasses.replace(scoring, temperature=cfg.temperature, support="sampler_support")


def _positions(rollout) -> torch.Tensor:
    """(N, C) 1 on each completion position up to and including its EOS."""
    columns = torch.arange(rollout.completion_ids.shape[1], device=rollout.completion_ids.device)
    return (columns[None] < rollout.completion_lengths[:, None]).double()


def sampler_masses(policy, rollout, scoring, tokens: list[int] | None = None) -> torch.Tensor:
    """The sampler's distribution over the rollout's completions, teacher-forced, dropout off, averaged over every
    completion position up to its EOS: (V,) the mean next-token distribution where `tokens` is None, else (1,) the
    mean mass on `tokens`. In chunks of rows, so that (rows, C, V) stays small."""
    where, total = _positions(rollout), None
    for rows in row_chunks(rollout.num_samples):
        with torch.no_grad():
            probs = torch.softmax(
                _tempered(completion_logits(policy, rollout.rows(rows), scoring), scoring), -1
            ).double()
        if tokens is not None:
            probs = probs[..., tokens].sum(-1, keepdim=True)
        part = (probs * where[rows].to(probs.device)[..., None]).sum((0, 1))
        total = part if total is None else total + part
    return total / max(where.sum().item(), 1.0)


def varied_groups(rollout, tokens: list[int]) -> int:
    """How many of the rollout's groups the probe paying for `tokens` gives reward variance (its share of those tokens
    up to each completion's EOS differs within the group)."""
    where = _positions(rollout)
    kept = torch.isin(rollout.completion_ids, torch.tensor(tokens, device=rollout.completion_ids.device))
    share = (kept.double().cpu() * where.cpu()).sum(1) / where.sum(1).clamp(min=1).cpu()
    groups = share.view(-1, rollout.num_generations)
    return int((groups.amax(1) > groups.amin(1)).sum())


def probe_of(step: GRPOStep, run: StepRun) -> TokenProbe | None:
    """The probe for the step's run `run` (see the module): among the sets of the policy's most likely tokens holding
    20-80% of its mass, the one that gives the most of the step's own groups reward variance (two completions of a
    group that differ may hold the same share of one set and not of another), then the nearest half; where none
    gives any group variance, the one token of the completions that gives the most groups variance, then the most
    likely (a rarer choice, but a signal the pipeline's stages can be measured on; also where one token holds more
    than 80% of the mass). None only for completions without a token."""
    step.restore_policy()
    masses, order = sampler_masses(step.policy, run.rollout, as_sampled(run.config)).sort(descending=True)
    low, high = MASS_BAND
    cumulative = masses.cumsum(0)[: int((masses.cumsum(0) < high).sum()) + 1]
    rank = {t: i for i, t in enumerate(order.tolist())}
    mass_of = lambda tokens: float(sum(masses[rank[t]] for t in tokens))  # noqa: E731
    candidates = [order[:k].tolist() for k in range(1, len(cumulative) + 1) if low <= cumulative[k - 1] <= high]
    varied = {tuple(s): varied_groups(run.rollout, s) for s in candidates}
    best = max(candidates, key=lambda s: (varied[tuple(s)], -abs(mass_of(s) - 0.5)), default=None)
    if best is None or varied[tuple(best)] == 0:
        present = [[t] for t in run.rollout.completion_ids.unique().tolist() if t in rank]
        best = max(present, key=lambda s: (varied_groups(run.rollout, s), -rank[s[0]]), default=best)
    if best is None:
        return None
    tokens = tuple(best)
    return TokenProbe(tokens, tuple(step.loaded.tokenizer.decode([t]) for t in tokens), mass_of(tokens))


def probe_path(step: GRPOStep, run: StepRun, probe: TokenProbe) -> tuple[signal_path.Stage, ...]:
    """The step's own completions scored by `probe` alone, one update of them through the run's pipeline (the run's
    config; a capture's trainer step, replayed), and the stages of the signal's path measured on it from the rewards
    on (`signal_path.signal_path`; the samples are the step's own). The step is left as it was."""
    task = step.task
    with step.trial():
        step.task = Task("probe", task.prompts, (probe,), held_out=task.held_out)
        try:
            scored = StepRun(run.config, rollout=run.rollout, logprobs=run.logprobs, prompt_set=run.prompt_set)
            probed = step.run(run.config, until="update", base=scored)
            moved = parameters_moved(step, probed)  # before `moved_kl` puts the step's start back
            facts = StepFacts(run=probed, reward_weights=(1.0,), absolute_positions=False, left_padded=False,
                              dropout_sources=(), dropout_gap=None, sampler_metrics=None, kept_mass=None,
                              kl_against_exact=None, weight_norm=weight_norm_of(step),
                              step_kl=moved_kl(step, probed), parameters=moved)  # fmt: skip
        finally:
            step.task = task
    return signal_path.signal_path(facts)[1:]


def read_path(probe: TokenProbe, stages: Sequence[signal_path.Stage]) -> dict:
    """The verdict of the probe's one update (see the module) from its stages, the rewards' first: lost at the first
    stage after the rewards that loses nearly all of the probe's signal; carries where none does; None where the
    probe's own rewards do not vary."""
    own, pipeline = stages[0], stages[1:]
    lost = next((s for s in pipeline if s.lost), None)
    words = ", ".join(repr(w) for w in probe.words)
    what = (f"a probe reward paying for the share of {words} tokens (the policy's mass {probe.start_mass:.2f}) in "
            f"place of the run's, on the step's own completions ({own.said}), one update through the run's own "
            "pipeline")  # fmt: skip
    if own.lost:
        verdict, said = None, f"{what}: too few of its groups vary to carry a signal; no verdict"
    elif lost is not None:
        traced = f": {lost.lost_to}" if lost.lost_to else ""
        verdict = "lost"
        said = (f"{what}: lost at the {lost.name}{traced} ({lost.said}): the pipeline loses a signal the model can "
                "learn, whatever the reward")  # fmt: skip
    else:
        short = [f"{s.name} {s.kept:.0%}" for s in pipeline if s.kept is not None and s.kept < 0.995]
        kept = "; ".join(short) if short else "each 100%"
        verdict = "carries"
        said = (f"{what}: every stage after the rewards lets it through ({kept}; {pipeline[-1].said}): a signal "
                "lost on the run's own step is lost at the reward")  # fmt: skip
    return {"carries": None if verdict is None else verdict == "carries", "verdict": verdict,
            "stage": lost.name if verdict == "lost" else None, "lost_to": lost.lost_to if verdict == "lost" else "",
            "tokens": list(probe.tokens), "words": list(probe.words), "start_mass": probe.start_mass,
            "path": [s.as_dict() for s in stages], "said": said}  # fmt: skip


def continue_on_probe(step: GRPOStep, run: StepRun, probe: TokenProbe, steps: int, seed: int) -> dict:
    """The run's config trained `steps` steps on the probe alone from the step's start, each step sampled anew from
    the policy the last one left; {"mass": (K+1,) the probe's mass on `run`'s completions before and after each
    step, "kl": (K+1,) KL(start || now) per token on them (k3), "reward": (K,) each batch's mean probe reward}. The
    step, its task and the caller's RNG are left as they were."""
    rollout, cfg = run.rollout, run.config
    scoring, task, where = as_sampled(run.config), step.task, _positions(run.rollout)
    start = per_token_logps(step.policy, rollout, scoring)
    masses, kl, rewards = [probe.start_mass], [0.0], []
    device = next(step.policy.parameters()).device
    with step.trial(), torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        step.task = Task("probe", task.prompts, (probe,), held_out=task.held_out)
        try:
            if step.capture is not None:
                take_trainers_optimizer(step, cfg)
                for state in step.optimizer.state.values():  # its rates and second moments kept (each weight's
                    if "exp_avg" in state:  # scale); the first moments, which would carry the probe's first steps
                        state["exp_avg"].zero_()  # where the user's gradient pointed, cleared
            for k in range(steps):
                at = cfg.replace(seed=_seed(seed, k))
                torch.manual_seed(at.seed)
                done = step.run(at, until="update", base=StepRun(at))
                rewards.append(done.rewards.total.nan_to_num(0.0).mean().item())
                step.advance()
                masses.append(float(sampler_masses(step.policy, rollout, scoring, list(probe.tokens))))
                with torch.no_grad():
                    kl.append(k3_per_token(per_token_logps(step.policy, rollout, scoring) - start, where))
        finally:
            step.task = task
    return {"seed": seed, "mass": masses, "kl": kl, "reward": rewards}


def run_probe(
    step: GRPOStep, run: StepRun, steps: int = 0, seeds: int = PROBE_SEEDS, budget: float | None = None
) -> dict:
    """The probe chosen on `run` (the step as run), its one update's path and verdict (`read_path`), and where
    `steps` > 0 its curve over `seeds` continuations of `steps` steps (`read_curve`) within `budget` seconds (None:
    no bound): one probe step is timed, then the seeds cut to what fits, the curve left out where two do not (the
    seed is the unit; `seeds_asked`). `carries` True, False or None (no probe, or no verdict: `why`)."""
    t0 = time.perf_counter()
    probe = probe_of(step, run)
    if probe is None:
        return {"carries": None, "why": "no probe: the completions hold no token"}
    result = read_path(probe, probe_path(step, run, probe))
    if steps <= 0:
        return {**result, "seconds": time.perf_counter() - t0}
    try:  # one probe step timed, on a seed the plan does not use: the plan's unit
        timed = time.perf_counter()
        continue_on_probe(step, run, probe, 1, seeds)
        per_seed = (time.perf_counter() - timed) * steps
    except ValueError as e:  # the run's config cannot sample anew here (a length past the model's positions)
        return {**result, "curve": f"no curve: {e}", "seconds": time.perf_counter() - t0}
    left = None if budget is None else budget - (time.perf_counter() - t0)
    if left is not None and left < 2 * per_seed:
        curve = f"cut for the budget: 2 seeds of {steps} steps need about {2 * per_seed:.0f} s, {max(left, 0):.0f} s were left"
        return {**result, "curve": curve, "seconds": time.perf_counter() - t0}
    kept = seeds if left is None else min(seeds, int(left // per_seed))
    curves = [continue_on_probe(step, run, probe, steps, s) for s in range(kept)]
    return {**result, **read_curve(curves, steps), "seeds_asked": seeds, "seconds": time.perf_counter() - t0}


def read_curve(curves: list[dict], steps: int) -> dict:
    """The continuations' curves (`continue_on_probe`) and the rise of the probe's mass, its interval over seeds."""
    rise = seed_interval(torch.tensor([c["mass"][-1] - c["mass"][0] for c in curves]))
    return {
        "steps": steps,
        "seeds": [c["seed"] for c in curves],
        "mass_by_step": [sum(c["mass"][k] for c in curves) / len(curves) for k in range(steps + 1)],
        "mass_by_seed": [c["mass"] for c in curves],
        "kl_by_seed": [c["kl"] for c in curves],
        "reward_by_seed": [c["reward"] for c in curves],
        "rise": rise.as_dict(),
        "kl_moved": sum(c["kl"][-1] for c in curves) / len(curves),
    }
