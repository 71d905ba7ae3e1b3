"""Is it the reward or the pipeline? The run's own model and config trained a few steps on a probe reward the model
can surely learn, as RL practitioners check a learner on a probe environment before they blame the task.

    result = run_probe(step, run, steps=4, seeds=3)   # run: the step as run (a capture: the trainer's)

The probe pays 1 for a completion whose token at `position` is one of `tokens`, 0 otherwise. It is chosen on the
step's own completions: the first completion position where the policy, sampling as the run samples (its
temperature, top_k, top_p, min_p), puts 20% to 80% of its mass, summed over the completions' prefixes, on a few
tokens. Rewarding a choice the policy already makes half the time gives every group reward variance and asks the
smallest change the policy can make.

What the probe moved is read without sampling noise: the policy's mass on the probe's tokens at that position, on
the step's own completions' prefixes (teacher-forced, dropout off), after each of K steps sampled anew from the
moved policy with the run's config and optimizer (a capture's: the trainer's AdamW at the captured step's rates,
its moments cleared: the user's reward's momentum would carry the first steps where it pointed), each seed its own
continuation. The rise is mass after K steps minus mass before, one value per seed, Student's t over seeds. A
pipeline that carries the signal raises it (the interval above 0). One that does not either moves the policy too
little to learn anything in K steps (under MOVED of total variation at the probe's position: a rate too small for
the weights, frozen weights, a schedule still warming up) or moves it elsewhere (masks that leave the probe's token
no gradient, a KL weight that pulls the policy back, a clip), whatever the user's reward does. Nothing of the step changes (`GRPOStep.trial`).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from ..scoring import _tempered, completion_logits
from ..specs import scoring_of
from ..stats import seed_interval
from ..step import GRPOStep, StepRun
from ..task import Task
from .horizon import _seed, take_trainers_optimizer

PROBE_STEPS = 4  # steps the probe is trained for (`doctor --probe K`)
PROBE_SEEDS = 3  # continuations, the seed the unit
MASS_BAND = (0.2, 0.8)  # the probe's tokens hold this share of the sampler's mass at its position
POSITIONS = 16  # completion positions searched for one
MOVED = 0.01  # total variation at the probe's position under which K steps moved the policy too little to learn


@dataclass(frozen=True)
class TokenProbe:
    """A reward of 1 where a completion's token at `position` is one of `tokens`, else 0 (0 too for a completion
    shorter than position + 1). Reads the completions' token ids (`takes_completion_ids`), as TRL passes them."""

    position: int
    tokens: tuple[int, ...]
    words: tuple[str, ...]  # the tokens decoded, for the report
    start_mass: float  # the sampler's mass on `tokens` at `position` before any probe step
    __name__ = "probe"
    takes_completion_ids = True

    def __call__(self, prompts, completions, completion_ids, **kwargs) -> list[float]:
        kept = set(self.tokens)
        return [float(len(ids) > self.position and ids[self.position] in kept) for ids in completion_ids]


def position_probs(policy, rollout, scoring, position: int) -> torch.Tensor:
    """(R, V) float64: the sampler's next-token distribution at completion `position` for each of the R completions
    of the rollout that reach it, teacher-forced on their own prefixes, dropout off."""
    reach = rollout.completion_lengths > position
    head = dataclasses.replace(rollout, completion_ids=rollout.completion_ids[:, : position + 1])
    with torch.no_grad():
        logits = completion_logits(policy, head, scoring)[:, position]  # (N, V)
        return torch.softmax(_tempered(logits, scoring), dim=-1)[reach.to(logits.device)].double()


def as_sampled(cfg) -> object:
    """The scoring that reads the sampler's own distribution: the run's temperature and truncation, no dropout."""
    scoring = scoring_of(cfg).without_dropout()
    return dataclasses.replace(scoring, temperature=cfg.temperature, support="sampler_support")


def probe_of(step: GRPOStep, run: StepRun) -> TokenProbe | None:
    """The probe for the step's run `run` (see the module), or None where the policy is near-deterministic (one
    token holds more than 80% of the mass) at each of its first POSITIONS completion positions."""
    rollout, scoring = run.rollout, as_sampled(run.config)
    step.restore_policy()
    low, high = MASS_BAND
    for position in range(min(POSITIONS, rollout.completion_ids.shape[1])):
        probs = position_probs(step.policy, rollout, scoring, position)
        if not len(probs):
            break
        masses, order = probs.mean(0).sort(descending=True)
        if masses[0] > high:
            continue
        cumulative = masses.cumsum(0)
        k = int((cumulative < low).sum()) + 1  # the fewest top tokens holding >= 20% (each < 20%: under 40%)
        tokens = tuple(order[:k].tolist())
        words = tuple(step.loaded.tokenizer.decode([t]) for t in tokens)
        return TokenProbe(position, tokens, words, float(cumulative[k - 1]))
    return None


def continue_on_probe(step: GRPOStep, run: StepRun, probe: TokenProbe, steps: int, seed: int) -> dict:
    """`run`'s config trained `steps` steps on the probe alone from the step's start, each step sampled anew from
    the policy the last one left; {"mass": (K+1,) the probe's mass on `run`'s completions before and after each
    step, "reward": (K,) each batch's mean probe reward}. The step, its task and the caller's RNG are left as they
    were."""
    rollout, cfg = run.rollout, run.config
    scoring, task = as_sampled(cfg), step.task
    start = position_probs(step.policy, rollout, scoring, probe.position)
    masses, moved, rewards = [probe.start_mass], [0.0], []
    device = next(step.policy.parameters()).device
    with step.trial(), torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        step.task = Task("probe", task.prompts, (probe,), held_out=task.held_out)
        try:
            if step.capture is not None:
                take_trainers_optimizer(step, cfg)
                step.optimizer.state.clear()  # its groups and rates kept; moments the user's reward left would
                # steer the probe's first steps where the user's gradient pointed
            for k in range(steps):
                at = cfg.replace(seed=_seed(seed, k))
                torch.manual_seed(at.seed)
                run = step.run(at, until="update", base=StepRun(at))
                rewards.append(run.rewards.total.nan_to_num(0.0).mean().item())
                step.advance()
                now = position_probs(step.policy, rollout, scoring, probe.position)
                masses.append(float(now[:, list(probe.tokens)].sum(-1).mean()))
                moved.append(float(0.5 * (now - start).abs().sum(-1).mean()))
        finally:
            step.task = task
    return {"seed": seed, "mass": masses, "moved": moved, "reward": rewards}


def run_probe(
    step: GRPOStep, run: StepRun, steps: int = PROBE_STEPS, seeds: int = PROBE_SEEDS, budget: float | None = None
) -> dict:
    """The probe chosen on `run` (the step as run) trained on `seeds` continuations of `steps` steps, and what it
    says: `carries` True where the probe's mass rose by at least RISE with an interval over seeds above 0, False
    where it did not, None where no probe could be chosen or run (`why`). `budget` seconds (None: no bound): the
    first seed is timed, then the seeds cut to what fits (two at least: the seed is the unit; `seeds_asked`)."""
    probe = probe_of(step, run)
    if probe is None:
        why = (f"no probe: one token holds more than {MASS_BAND[1]:.0%} of the sampler's mass at each of the first "
               f"{POSITIONS} completion positions")  # fmt: skip
        return {"carries": None, "why": why}
    t0 = time.perf_counter()
    try:
        curves = [continue_on_probe(step, run, probe, steps, 0)]
    except ValueError as e:  # the run's config cannot sample anew here (a length past the model's positions)
        return {"carries": None, "why": f"no probe: {e}"}
    per_seed = time.perf_counter() - t0
    kept = seeds if budget is None else max(2, min(seeds, int(budget // max(per_seed, 1e-9))))
    curves += [continue_on_probe(step, run, probe, steps, s) for s in range(1, kept)]
    rise = seed_interval(torch.tensor([c["mass"][-1] - c["mass"][0] for c in curves]))
    moved = sum(c["moved"][-1] for c in curves) / len(curves)
    carries = bool(rise.ci_low is not None and rise.ci_low > 0)
    return {
        "carries": carries,
        "position": probe.position,
        "tokens": list(probe.tokens),
        "words": list(probe.words),
        "start_mass": probe.start_mass,
        "steps": steps,
        "seeds": [c["seed"] for c in curves],
        "mass_by_step": [sum(c["mass"][k] for c in curves) / len(curves) for k in range(steps + 1)],
        "mass_by_seed": [c["mass"] for c in curves],
        "moved_by_seed": [c["moved"] for c in curves],
        "reward_by_seed": [c["reward"] for c in curves],
        "rise": rise.as_dict(),
        "moved": moved,
        "least_moved": MOVED,
        "seeds_asked": seeds,
        "seconds": time.perf_counter() - t0,
        "said": said_of(carries, probe, rise, moved, steps),
    }


def said_of(carries: bool, probe: TokenProbe, rise, moved: float, steps: int) -> str:
    words = ", ".join(repr(w) for w in probe.words)
    what = (f"a probe reward paying for {words} at completion position {probe.position} (the policy's mass "
            f"{probe.start_mass:.2f}), trained {steps} steps with the run's own config: its mass {rise.mean:+.4f} "
            f"[{rise.ci_low:+.4f}, {rise.ci_high:+.4f}], the distribution there moved by {moved:.4f}")  # fmt: skip
    if carries:
        return f"{what}: the pipeline carries a reward the model can learn; a signal lost here is lost at the reward"
    if moved < MOVED:
        return (f"{what} (under {MOVED}): the pipeline moves the policy too little to learn even this reward in "
                f"{steps} steps (the rate, frozen weights, the schedule), whatever the reward")
    return (f"{what}, not toward the probe: the pipeline turns the signal away (masks, the KL weight, the clip), "
            "whatever the reward")
