"""Is it the reward or the pipeline? The run's own model and config trained a few steps on a probe reward the model
can surely learn, as RL practitioners check a learner on a probe environment before they blame the task.

    result = run_probe(step, run, steps=8, seeds=6)   # run: the step as run (a capture: the trainer's)

The probe pays each completion the share of its tokens that are one of a few `tokens`. They are chosen on the step's
own completions: the policy's most likely tokens, as many as bring the sampler's mass on them (its temperature,
top_k, top_p, min_p; averaged over every completion position, teacher-forced) nearest half, within 20-80%. A reward
on a choice the policy makes half the time, at every position, gives nearly every group reward variance and asks the
smallest change the policy can make, at every token the step trains.

What the probe moved is read without sampling noise: the policy's mass on the probe's tokens over the step's own
completions (every position, teacher-forced, dropout off), after each of K steps sampled anew from the moved policy
with the run's config and optimizer (a capture's: the trainer's AdamW at the captured step's rates, its second
moments kept, its first moments cleared: the user's reward's momentum would carry the first steps where it pointed),
each seed its own continuation.
Whether it carries is read from the direction of the move, not its size (a small rate moves the policy a little, in
the right direction): the cosine between the K steps' move of the trained weights and the gradient of the probe's
mass at the start, one value per seed, Student's t over seeds; above 0, the pipeline "carries" the signal. Else it
is "slow" where, at its pace, the policy would take more than LONG_RUN steps to move by MEANINGFUL nats per token
(KL on the same completions, k3: a rate too small for the weights, frozen weights, a schedule still warming up), and
"turned away" where it moves, not toward the probe (masks that leave few tokens a gradient, a KL weight that pulls
the policy back, a clip), whatever the user's reward does. The rise of the mass is reported beside it. Nothing of the step changes (`GRPOStep.trial`).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from ..rollout import row_chunks
from ..scoring import _tempered, completion_logits, per_token_logps
from ..specs import scoring_of
from ..stats import seed_interval
from ..step import GRPOStep, StepRun
from ..task import Task
from .facts import k3_per_token
from .horizon import _seed, take_trainers_optimizer

PROBE_STEPS = 8  # steps the probe is trained for (`doctor --probe K`)
PROBE_SEEDS = 6  # continuations, the seed the unit
MASS_BAND = (0.2, 0.8)  # the probe's tokens hold this share of the sampler's mass
LONG_RUN = 10_000  # steps: a pipeline that would take longer to move the policy by MEANINGFUL is too slow to learn
MEANINGFUL = 0.01  # nats per token of KL(start || now): a policy that has learned something


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


def mass_gradient(policy, rollout, scoring, tokens: list[int]) -> torch.Tensor:
    """(P,) float64: d(the sampler's mean mass on `tokens` over the rollout's completions) / d(each trained
    parameter), flattened in `named_parameters` order: the direction that raises the probe's mass fastest."""
    params = [p for p in policy.parameters() if p.requires_grad]
    where = _positions(rollout)
    total = [torch.zeros_like(p, dtype=torch.float64) for p in params]
    for rows in row_chunks(rollout.num_samples):
        probs = torch.softmax(_tempered(completion_logits(policy, rollout.rows(rows), scoring), scoring), -1)
        mass = (probs[..., tokens].sum(-1).double() * where[rows].to(probs.device)).sum() / max(where.sum().item(), 1.0)
        for t, g in zip(total, torch.autograd.grad(mass, params, allow_unused=True)):
            if g is not None:
                t += g.double()
    return torch.cat([t.flatten() for t in total])


def trained_vector(policy) -> torch.Tensor:
    return torch.cat([p.detach().double().flatten() for p in policy.parameters() if p.requires_grad])


def probe_of(step: GRPOStep, run: StepRun) -> TokenProbe | None:
    """The probe for the step's run `run` (see the module), or None where no set of the policy's most likely tokens
    holds 20-80% of its mass (one token holds more than 80%)."""
    step.restore_policy()
    masses, order = sampler_masses(step.policy, run.rollout, as_sampled(run.config)).sort(descending=True)
    low, high = MASS_BAND
    cumulative = masses.cumsum(0)[: int((masses.cumsum(0) < high).sum()) + 1]
    k = int((cumulative - 0.5).abs().argmin()) + 1  # nearest half: the most groups vary
    if not low <= cumulative[k - 1] <= high:
        return None
    tokens = tuple(order[:k].tolist())
    return TokenProbe(tokens, tuple(step.loaded.tokenizer.decode([t]) for t in tokens), float(cumulative[k - 1]))


def continue_on_probe(
    step: GRPOStep, run: StepRun, probe: TokenProbe, steps: int, seed: int, toward: torch.Tensor
) -> dict:
    """`run`'s config trained `steps` steps on the probe alone from the step's start, each step sampled anew from
    the policy the last one left; {"mass": (K+1,) the probe's mass on `run`'s completions before and after each
    step, "kl": (K+1,) KL(start || now) per token on them (k3), "reward": (K,) each batch's mean probe reward,
    "cosine": between the K steps' move of the trained weights and `toward` (`mass_gradient`), NaN where they did not
    move}. The step, its task and the caller's RNG are left as they were."""
    rollout, cfg = run.rollout, run.config
    scoring, task, where = as_sampled(cfg), step.task, _positions(run.rollout)
    start = per_token_logps(step.policy, rollout, scoring)
    masses, kl, rewards = [probe.start_mass], [0.0], []
    before = trained_vector(step.policy)
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
            moved = trained_vector(step.policy) - before
            norms = moved.norm() * toward.norm()
            cosine = float(moved @ toward / norms) if norms > 0 else float("nan")
        finally:
            step.task = task
    return {"seed": seed, "mass": masses, "kl": kl, "reward": rewards, "cosine": cosine}


def run_probe(
    step: GRPOStep, run: StepRun, steps: int = PROBE_STEPS, seeds: int = PROBE_SEEDS, budget: float | None = None
) -> dict:
    """The probe chosen on `run` (the step as run) trained on `seeds` continuations of `steps` steps, and what it
    says: `carries` True where the probe's mass rose (an interval over seeds above 0), False where it did not, None
    where no probe could be chosen or run (`why`). `budget` seconds (None: no bound): the first seed is timed, then
    the seeds cut to what fits (two at least: the seed is the unit; `seeds_asked`)."""
    probe = probe_of(step, run)
    if probe is None:
        return {"carries": None, "why": f"no probe: one token holds more than {MASS_BAND[1]:.0%} of the sampler's mass"}
    t0 = time.perf_counter()
    step.restore_policy()
    toward = mass_gradient(step.policy, run.rollout, as_sampled(run.config), list(probe.tokens))
    try:
        curves = [continue_on_probe(step, run, probe, steps, 0, toward)]
    except ValueError as e:  # the run's config cannot sample anew here (a length past the model's positions)
        return {"carries": None, "why": f"no probe: {e}"}
    per_seed = time.perf_counter() - t0
    kept = seeds if budget is None else max(2, min(seeds, int(budget // max(per_seed, 1e-9))))
    curves += [continue_on_probe(step, run, probe, steps, s, toward) for s in range(1, kept)]
    rise = seed_interval(torch.tensor([c["mass"][-1] - c["mass"][0] for c in curves]))
    cosines = torch.tensor([c["cosine"] for c in curves]).nan_to_num(0.0)
    toward_probe = seed_interval(cosines)
    moved = sum(c["kl"][-1] for c in curves) / len(curves)
    slow = moved < slow_below(steps)
    carries = bool(not slow and toward_probe.ci_low is not None and toward_probe.ci_low > 0)
    verdict = "carries" if carries else ("slow" if slow else "turned away")
    return {
        "carries": carries,
        "verdict": verdict,
        "tokens": list(probe.tokens),
        "words": list(probe.words),
        "start_mass": probe.start_mass,
        "steps": steps,
        "seeds": [c["seed"] for c in curves],
        "mass_by_step": [sum(c["mass"][k] for c in curves) / len(curves) for k in range(steps + 1)],
        "mass_by_seed": [c["mass"] for c in curves],
        "kl_by_seed": [c["kl"] for c in curves],
        "reward_by_seed": [c["reward"] for c in curves],
        "rise": rise.as_dict(),
        "cosine_by_seed": [c["cosine"] for c in curves],
        "toward_probe": toward_probe.as_dict(),
        "kl_moved": moved,
        "slow_below": slow_below(steps),
        "seeds_asked": seeds,
        "seconds": time.perf_counter() - t0,
        "said": said_of(verdict, probe, rise, toward_probe, moved, steps),
    }


def slow_below(steps: int) -> float:
    """The KL per token K steps must move the policy by for it to move by MEANINGFUL within LONG_RUN steps, at the
    same pace (a move that keeps its direction grows linearly in the weights: KL as the square of the steps)."""
    return MEANINGFUL * (steps / LONG_RUN) ** 2


def said_of(verdict: str, probe: TokenProbe, rise, toward, moved: float, steps: int) -> str:
    words = ", ".join(repr(w) for w in probe.words)
    what = (f"a probe reward paying for the share of {words} tokens (the policy's mass {probe.start_mass:.2f}), "
            f"trained {steps} steps with the run's own config: the weights moved toward the probe at cosine "
            f"{toward.mean:+.3f} [{toward.ci_low:+.3f}, {toward.ci_high:+.3f}], its mass {rise.mean:+.2g}, the policy "
            f"by KL {moved:.2g} per token")  # fmt: skip
    if verdict == "carries":
        return f"{what}: the pipeline carries a reward the model can learn; a signal lost here is lost at the reward"
    if verdict == "slow":
        return (
            f"{what}: at this pace the policy moves by {MEANINGFUL} nats per token in more than {LONG_RUN:,} "
            "steps: the pipeline moves it too little to learn even a reward it can learn (the rate, frozen "
            "weights, the schedule), whatever the reward"
        )
    return (
        f"{what}: the weights do not move toward the probe: the pipeline turns the signal away (masks, the KL "
        "weight, the clip), whatever the reward"
    )
