"""What a fix does to learning: the step continued for a few steps with and without the fix, from the same seeds.

    baseline = continuations(step, {}, steps=8, seeds=(0, 1, 2))
    fixed = continuations(step, {"dropout": False}, steps=8, seeds=(0, 1, 2))
    effect = compare(baseline, fixed)

A continuation takes the step itself (on a capture: the trainer's batch and optimizer), then samples steps 2..K
anew from the task's train prompts (a capture's: its own prompts), each from the weights and the optimizer the
last one left (a capture's: the trainer's AdamW carried on at the captured step's rate); seed s draws the same
prompts' samples in both arms. Per continuation: each step's mean batch reward, its update norm, and the KL the
K steps made, KL(start || end) per token on the step's own completions (k3, dropout off). The effect is the fixed
arm's mean batch reward over steps 2..K (those sampled from the moved policy) minus the run's, one difference per
seed, with Student's t over the seeds: the seed is the unit. Nothing of the step changes (`GRPOStep.trial`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..config import StepConfig, changes_sampling
from ..scoring import per_token_logps
from ..specs import scoring_of
from ..stats import seed_interval, verdict
from ..step import GRPOStep, StepRun, put_trained
from .facts import k3_per_token

HORIZON = 8  # steps a fix is followed for (`doctor --horizon K`)
SEEDS = 3  # continuations per arm (`doctor --horizon-seeds N`)


@dataclass(frozen=True)
class Continuation:
    seed: int
    rewards: tuple[float, ...]  # (K,) each step's mean batch reward
    update_norms: tuple[float, ...]  # (K,) ||theta_after - theta_before|| of each step
    kl_to_start: float  # KL(start || end) per token on the step's own completions
    kl_by_step: tuple[float, ...] = ()  # (K,) KL(start || after step k) per token, the same completions
    end_reward: float | None = None  # the policy left after K steps, sampled as the run samples, at its own seed
    sampled_as_run: bool = True  # the arm samples as the run does (False: its changes touch sampling)

    @property
    def learning(self) -> float:
        """The mean batch reward of steps 2..K: what the moved policy earned, sampled as this arm samples."""
        later = self.rewards[1:] or self.rewards
        return sum(later) / len(later)


def samples_anew(step: GRPOStep, changes: dict) -> bool:
    """Whether `changes` on this step need new completions: a rollout field changed on a capture (whose completions
    are the trainer's)."""
    return step.capture is not None and changes_sampling(changes)


def take_trainers_optimizer(step: GRPOStep, cfg: StepConfig) -> None:
    """Inside `step.trial()`: the next update of new completions on a capture is the engine's, stepping the trainer's
    optimizer as captured (the replay of the trainer's update takes its own micro-batches, not new ones)."""
    from ..capture.captured_config import config_from_capture
    from ..capture.replay import starting_optimizer

    step.optimizer = starting_optimizer(step.capture, step.policy, cfg, config_from_capture(step.capture))[0]


def continue_step(step: GRPOStep, changes: dict, steps: int, seed: int, end_reward: bool = True) -> Continuation:
    """The step with `changes` (a change of how it samples: its first step sampled anew too), then steps - 1 more
    sampled at seeds derived from `seed`; the step is left as it was. `end_reward`: also sample one batch from the
    policy left, as the run samples (what `compare` reads where an arm samples otherwise; one rollout more)."""
    start_state = step.initial_state
    cfg = step.cfg.replace(**changes)
    anew = samples_anew(step, changes)
    rewards, norms, moved = [], [], []
    # the caller's RNG kept; each step's rollout seeds itself (its config's seed), and the engine's update seeds its
    # dropout masks at update.DROPOUT_SEED every step: the seed changes the samples, not the masks
    device = next(step.policy.parameters()).device
    with step.trial(), torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        torch.manual_seed(_seed(seed, 0))  # the update taken anew (a cached one is not on the weights)
        if anew:
            take_trainers_optimizer(step, cfg)
        kept = StepRun(cfg) if anew else dataclasses.replace(step.result, update=None, evaluation=None)
        first = step.run(cfg, until="update", base=kept)
        for k in range(steps):
            if k:
                torch.manual_seed(_seed(seed, k))
            run = (
                first
                if k == 0
                else step.run(cfg.replace(seed=_seed(seed, k)), until="update", base=_fresh(cfg, seed, k))
            )
            rewards.append(run.rewards.total.nan_to_num(0.0).mean().item())
            norms.append(run.update.update_norm)
            moved.append(_scored(step, first))
            step.advance()
        end = _reward_as_run_samples(step, _seed(seed, steps)) if end_reward else None
        kl = _kl_to_start(step, first, start_state, moved)
    return Continuation(seed, tuple(rewards), tuple(norms), kl[-1], tuple(kl), end, not changes_sampling(changes))


def _seed(seed: int, k: int) -> int:
    return 1_000_003 * (seed + 1) + k  # steps of one continuation, and continuations, never share a seed


def _fresh(cfg, seed: int, k: int):
    return StepRun(cfg.replace(seed=_seed(seed, k)))  # nothing cached: the step samples anew


def _reward_as_run_samples(step: GRPOStep, seed: int) -> float:
    """The mean reward of one batch sampled from the policy as it is now with the run's own sampling settings (the
    step's config, no arm's changes) at `seed`: a fix that samples otherwise (a temperature, a top_p) changes every
    batch reward it earns by how it samples, so what it taught is read where both arms sample alike."""
    torch.manual_seed(seed)
    cfg = step.cfg.replace(seed=seed)
    run = step.run(cfg, until="rewards", base=StepRun(cfg), remember=False)
    return run.rewards.total.nan_to_num(0.0).mean().item()


def _scored(step: GRPOStep, first) -> torch.Tensor:
    """The first step's completions scored by the policy as it is now (dropout off: no random state is drawn)."""
    with torch.no_grad():
        return per_token_logps(step.policy, first.rollout, scoring_of(first.config).without_dropout())


def _kl_to_start(step: GRPOStep, first, start_state: dict, moved: list[torch.Tensor]) -> list[float]:
    """KL(start || after step k) per token for each step k, k3 on the first step's completions (`moved`: their
    log-probs after each step), dropout off; the policy is left at the start (the trial brings back what it should
    hold)."""
    put_trained(step.policy, start_state)
    start = _scored(step, first)
    return [k3_per_token(now - start, first.logprobs.mask) for now in moved]


def continuations(step: GRPOStep, changes: dict, steps: int = HORIZON, seeds=range(SEEDS)) -> list[Continuation]:
    return [continue_step(step, changes, steps, s) for s in seeds]


def compare(as_run: list[Continuation], fixed: list[Continuation], level: float = 0.95) -> dict:
    """The fixed arm against the run, paired by seed: the difference in what the moved policy earned, its interval
    over seeds at `level` (the family's), and both arms' KL to the start and mean update norm. What the policy
    earned: the mean batch reward of steps 2..K where both arms sample alike; where the fix changes how it samples,
    the reward of the policy each arm left after K steps, sampled as the run samples (each arm's own batches differ
    by the sampling itself: a colder temperature earns more from the same weights)."""
    assert [c.seed for c in as_run] == [c.seed for c in fixed], "the arms are paired by seed"
    alike = all(c.sampled_as_run for c in (*as_run, *fixed))
    assert alike or all(c.end_reward is not None for c in (*as_run, *fixed)), (
        "an arm samples otherwise, so both are read on the policy each left: continue them with end_reward=True"
    )

    def earned(c: Continuation) -> float:
        return c.learning if alike else c.end_reward

    differences = torch.tensor([earned(f) - earned(r) for r, f in zip(as_run, fixed)])
    interval = seed_interval(differences, level)
    measured = "batch reward of steps 2..K" if alike else "reward after the K steps (sampled as the run samples)"

    def mean(values) -> float:
        values = list(values)
        return sum(values) / len(values)

    return {
        "steps": len(as_run[0].rewards),
        "seeds": [c.seed for c in as_run],
        "measured": measured,
        "reward_as_run": [earned(c) for c in as_run],
        "reward_fixed": [earned(c) for c in fixed],
        "difference": interval.as_dict(),
        "verdict": verdict(interval, f"{measured} with the fix"),
        "kl_to_start": [mean(c.kl_to_start for c in as_run), mean(c.kl_to_start for c in fixed)],
        "update_norm": [
            mean(n for c in as_run for n in c.update_norms),
            mean(n for c in fixed for n in c.update_norms),
        ],
        "rewards_by_step": {
            "as_run": [mean(c.rewards[k] for c in as_run) for k in range(len(as_run[0].rewards))],
            "fixed": [mean(c.rewards[k] for c in fixed) for k in range(len(fixed[0].rewards))],
        },
        "rewards_by_seed": {"as_run": [list(c.rewards) for c in as_run], "fixed": [list(c.rewards) for c in fixed]},
        "kl_by_seed": {"as_run": [list(c.kl_by_step) for c in as_run], "fixed": [list(c.kl_by_step) for c in fixed]},
    }
