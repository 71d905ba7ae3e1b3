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
The pipeline is blamed on a measurement, never for want of one. "slow": it moves the policy too little to learn
anything; at its pace the policy would take more than LONG_RUN steps to move by MEANINGFUL nats per token (KL on the
same completions, k3: a rate too small for the weights, frozen weights, a schedule still warming up). "turned away":
its K steps' move of the trained weights points away from the gradient of the probe's mass (the cosine's interval
over seeds below 0), or, by intervention, it keeps less than half of what the same seeds make with the pipeline
opened (`opened`: the KL term off, no truncation mask, every token trained, no off-policy mask; nothing else
changed): the interval over seeds of progress - progress_opened / 2 below 0, progress being the move's length along
that gradient (masks that leave few tokens a gradient, a KL weight that pulls the policy back). Else it "carries" the
signal: it moves the policy at a pace that learns, toward the probe or not measurably away, and opening its settings
(where any differ) does not show it losing half; a signal lost is then lost at the reward. The intervals are in the
result. Nothing of the step changes (`GRPOStep.trial`).
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
KEPT = 0.5  # the share of the opened pipeline's progress the run's pipeline must keep to carry the signal
OPENED = dict(beta=0.0, mask_truncated_completions=False, top_entropy_quantile=1.0, off_policy_mask_threshold=None)


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


def opened(cfg):
    """The pipeline's settings that can keep the signal from the weights, opened (`OPENED`), and the list of those
    that changed, as "name value -> opened value" (empty: nothing to open). The clip is left as it is: at the first
    pass over a batch every ratio is 1 and no clip binds."""
    changed = [f"{k} {getattr(cfg, k)} -> {v}" for k, v in OPENED.items() if getattr(cfg, k) != v]
    return cfg.replace(**OPENED), changed


def continue_on_probe(
    step: GRPOStep, run: StepRun, probe: TokenProbe, steps: int, seed: int, toward: torch.Tensor, cfg=None
) -> dict:
    """`cfg` (None: `run`'s config) trained `steps` steps on the probe alone from the step's start, each step sampled anew from
    the policy the last one left; {"mass": (K+1,) the probe's mass on `run`'s completions before and after each
    step, "kl": (K+1,) KL(start || now) per token on them (k3), "reward": (K,) each batch's mean probe reward,
    "cosine": between the K steps' move of the trained weights and `toward` (`mass_gradient`), NaN where they did not
    move}. The step, its task and the caller's RNG are left as they were."""
    rollout, cfg = run.rollout, cfg or run.config
    scoring, task, where = as_sampled(run.config), step.task, _positions(run.rollout)
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
            progress = float(moved @ toward / toward.norm()) if toward.norm() > 0 else 0.0
        finally:
            step.task = task
    return {"seed": seed, "mass": masses, "kl": kl, "reward": rewards, "cosine": cosine, "progress": progress}


def run_probe(
    step: GRPOStep, run: StepRun, steps: int = PROBE_STEPS, seeds: int = PROBE_SEEDS, budget: float | None = None
) -> dict:
    """The probe chosen on `run` (the step as run) trained on `seeds` continuations of `steps` steps with the run's
    pipeline, and with it opened on the same seeds (where there is something to open), and what it says (see the
    module): `verdict` carries, slow or turned away; `carries` True, False (slow, turned away) or None (no probe:
    `why`). `budget` seconds (None: no bound): one probe step is timed, then the seeds cut to what fits, the probe
    cut where two do not (the seed is the unit; `seeds_asked`)."""
    t0 = time.perf_counter()
    probe = probe_of(step, run)
    if probe is None:
        return {"carries": None, "why": f"no probe: one token holds more than {MASS_BAND[1]:.0%} of the sampler's mass"}
    step.restore_policy()
    toward = mass_gradient(step.policy, run.rollout, as_sampled(run.config), list(probe.tokens))
    wide, changed = opened(run.config)
    arms = 2 if changed else 1

    def one_seed(s: int) -> tuple[dict, dict | None]:
        mine = continue_on_probe(step, run, probe, steps, s, toward)
        return mine, (continue_on_probe(step, run, probe, steps, s, toward, wide) if changed else None)

    try:  # one probe step timed, on a seed the plan does not use: the plan's unit
        timed = time.perf_counter()
        continue_on_probe(step, run, probe, 1, seeds, toward)
        per_seed = (time.perf_counter() - timed) * steps * arms
    except ValueError as e:  # the run's config cannot sample anew here (a length past the model's positions)
        return {"carries": None, "why": f"no probe: {e}"}
    left = None if budget is None else budget - (time.perf_counter() - t0)
    if left is not None and left < 2 * per_seed:
        return {"carries": None, "why": f"cut for the budget: 2 seeds of {steps} steps x {arms} arms "
                                        f"need about {2 * per_seed:.0f} s, {max(left, 0):.0f} s were left"}  # fmt: skip
    kept = seeds if left is None else min(seeds, int(left // per_seed))
    pairs = [one_seed(s) for s in range(kept)]
    return {**read_probe(probe, pairs, steps, changed), "seeds_asked": seeds, "seconds": time.perf_counter() - t0}


def read_probe(probe: TokenProbe, pairs: list[tuple[dict, dict | None]], steps: int, changed: list[str]) -> dict:
    """What the continuations say (`run_probe`): per seed (the run's pipeline, the same opened or None), the
    intervals over seeds, the verdict and its sentence, the curves."""
    curves = [mine for mine, _ in pairs]
    rises = torch.tensor([c["mass"][-1] - c["mass"][0] for c in curves])
    rise = seed_interval(rises)
    toward_probe = seed_interval(torch.tensor([c["cosine"] for c in curves]).nan_to_num(0.0))
    moved = sum(c["kl"][-1] for c in curves) / len(curves)
    kept_share = None
    if changed:
        progress = torch.tensor([c["progress"] for c in curves])
        opened_progress = torch.tensor([o["progress"] for _, o in pairs])
        opened_rises = torch.tensor([o["mass"][-1] - o["mass"][0] for _, o in pairs])
        kept_share = {"progress": seed_interval(progress).as_dict(),
                      "progress_opened": seed_interval(opened_progress).as_dict(),
                      "rise_opened": seed_interval(opened_rises).as_dict(),
                      "margin": seed_interval(progress - KEPT * opened_progress).as_dict()}  # fmt: skip
    verdict = verdict_of(moved < slow_below(steps), toward_probe, kept_share)
    mean_curve = lambda runs: [sum(c["mass"][k] for c in runs) / len(runs) for k in range(steps + 1)]  # noqa: E731
    return {
        "carries": verdict == "carries",
        "verdict": verdict,
        "tokens": list(probe.tokens),
        "words": list(probe.words),
        "start_mass": probe.start_mass,
        "steps": steps,
        "seeds": [c["seed"] for c in curves],
        "mass_by_step": mean_curve(curves),
        "mass_by_seed": [c["mass"] for c in curves],
        "kl_by_seed": [c["kl"] for c in curves],
        "reward_by_seed": [c["reward"] for c in curves],
        "rise": rise.as_dict(),
        "cosine_by_seed": [c["cosine"] for c in curves],
        "toward_probe": toward_probe.as_dict(),
        "kl_moved": moved,
        "slow_below": slow_below(steps),
        "opened": changed,
        "mass_by_step_opened": mean_curve([o for _, o in pairs]) if changed else None,
        "kept": kept_share,
        "said": said_of(verdict, probe, rise, toward_probe, moved, steps, changed, kept_share),
    }


def verdict_of(slow: bool, toward, kept: dict | None) -> str:
    """The pipeline is blamed on a measurement, never for want of one: slow (it moves the policy too little); turned
    away (its move points away from the probe: the cosine's interval below 0; or, opened on the same seeds, it keeps
    less than KEPT of the opened pipeline's progress: the margin's interval below 0); else it carries the signal."""
    if slow:
        return "slow"
    away = toward.ci_high is not None and toward.ci_high < 0
    lost = kept is not None and kept["margin"]["ci_high"] is not None and kept["margin"]["ci_high"] < 0
    return "turned away" if away or lost else "carries"


def slow_below(steps: int) -> float:
    """The KL per token K steps must move the policy by for it to move by MEANINGFUL within LONG_RUN steps, at the
    same pace (a move that keeps its direction grows linearly in the weights: KL as the square of the steps)."""
    return MEANINGFUL * (steps / LONG_RUN) ** 2


def said_of(verdict: str, probe: TokenProbe, rise, toward, moved: float, steps: int, changed, kept) -> str:
    words = ", ".join(repr(w) for w in probe.words)
    what = (f"a probe reward paying for the share of {words} tokens (the policy's mass {probe.start_mass:.2f}), "
            f"trained {steps} steps with the run's own config: the weights moved toward the probe at cosine "
            f"{toward.mean:+.3f} [{toward.ci_low:+.3f}, {toward.ci_high:+.3f}], its mass {rise.mean:+.2g}, the policy "
            f"by KL {moved:.2g} per token")  # fmt: skip
    if changed:
        share = kept["progress"]["mean"] / kept["progress_opened"]["mean"] if kept["progress_opened"]["mean"] else None
        what += (f"; opened ({', '.join(changed)}) on the same seeds its mass {kept['rise_opened']['mean']:+.2g}, the "
                 "run's pipeline making " + ("an undefined share" if share is None else f"{share:.0%}")
                 + " of the opened one's progress toward it")  # fmt: skip
    if verdict == "carries":
        return (f"{what}: no measurement shows the pipeline losing the signal (it moves the policy at a pace that learns,"
                " not away from a reward the model can learn); a signal lost here is lost at the reward")  # fmt: skip
    if verdict == "slow":
        return (
            f"{what}: at this pace the policy moves by {MEANINGFUL} nats per token in more than {LONG_RUN:,} "
            "steps: the pipeline moves it too little to learn even a reward it can learn (the rate, frozen "
            "weights, the schedule), whatever the reward"
        )
    if verdict == "turned away":
        return (
            f"{what}: the pipeline turns the signal away"
            + (f", keeping less than {KEPT:.0%} of what it learns opened" if changed else "")
            + " (masks, the KL weight), whatever the reward"
        )
    raise ValueError(f"no probe verdict {verdict!r}")
