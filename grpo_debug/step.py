"""One GRPO step, phase by phase, with each phase's result kept.

`GRPOStep.run(cfg)` re-runs only the phases at and after the first one whose config fields changed,
on the same cached rollout; the policy is restored to its pre-update weights before any phase that
reads it is re-run.
"""

from __future__ import annotations

import copy
import resource
import time
from dataclasses import dataclass, field

import torch

from .advantages import Advantages, summarize_advantages
from .config import PHASES, StepConfig
from .evaluation import Evaluation, evaluate_pair
from .logprobs import TokenLogProbs, compute_logprobs, scoring_kwargs
from .loss import LossBreakdown, compute_loss, loss_kwargs
from .model import LoadedModel, load_model
from .rewards import Rewards, compute_rewards
from .rollout import Rollout, rollout
from .task import Task, load_task
from .update import StepResult, update


@dataclass
class PhaseTiming:
    seconds: float
    peak_rss_mb: float  # process peak resident memory after the phase (monotone; CPU)


@dataclass
class StepRun:
    config: StepConfig
    rollout: Rollout | None = None
    logprobs: TokenLogProbs | None = None
    rewards: Rewards | None = None
    advantages: Advantages | None = None
    loss: LossBreakdown | None = None
    update: StepResult | None = None
    evaluation: Evaluation | None = None
    timings: dict[str, PhaseTiming] = field(default_factory=dict)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class GRPOStep:
    def __init__(self, cfg: StepConfig | None = None, task: Task | None = None,
                 loaded: LoadedModel | None = None):
        self.cfg = cfg or StepConfig()
        self.loaded = loaded or load_model(self.cfg.model)
        self.initial_state = copy.deepcopy(self.loaded.policy.state_dict())
        self.task = task or load_task(self.cfg.task)
        self.result = StepRun(self.cfg)
        self._policy_dirty = False
        self._scored_rollout, self._scored_with = None, None  # what the cached log-probs were scored on
        self.last_rerun: list[str] = []

    @property
    def policy(self):
        return self.loaded.policy

    def restore_policy(self) -> None:
        if self._policy_dirty:
            self.policy.load_state_dict(self.initial_state)
            self._policy_dirty = False

    def run(self, cfg: StepConfig | None = None, until: str = "evaluation") -> StepRun:
        cfg = cfg or self.cfg
        if cfg.task != self.cfg.task:
            self.task = load_task(cfg.task)
        if cfg.model != self.cfg.model:
            self.__init__(cfg, self.task)
        stop = PHASES.index(until)
        changed = cfg.first_changed_phase(self.result.config)
        missing = next((p for p in PHASES[:stop + 1] if getattr(self.result, p) is None), None)
        due = [p for p in (changed, missing) if p is not None]
        start = min(due, key=PHASES.index) if due else None
        self.last_rerun = [] if start is None else list(PHASES[PHASES.index(start):stop + 1])
        self.cfg = cfg
        self.result.config = cfg
        for phase in self.last_rerun:
            t0 = time.perf_counter()
            setattr(self.result, phase, getattr(self, f"_{phase}")(cfg))
            self.result.timings[phase] = PhaseTiming(time.perf_counter() - t0, _peak_rss_mb())
        for phase in PHASES[stop + 1:]:
            setattr(self.result, phase, None)
        return self.result

    # ---- phases: each reads the config and the results of earlier phases only
    def _rollout(self, cfg: StepConfig) -> Rollout:
        self.restore_policy()
        return rollout(self.policy, self.loaded.tokenizer, cfg, prompts=self.task.prompts("train", cfg.num_prompts))

    def _logprobs(self, cfg: StepConfig) -> TokenLogProbs:
        self.restore_policy()
        previous, rollout = self.result.logprobs, self.result.rollout
        same_scoring = (previous is not None and self._scored_rollout is rollout
                        and self._scored_with == scoring_kwargs(cfg))  # e.g. only the mask changed
        result = compute_logprobs(self.policy, self.loaded.reference, rollout, cfg, reference_is_policy=True,
                                  scored=previous if same_scoring else None)
        self._scored_rollout, self._scored_with = rollout, scoring_kwargs(cfg)
        return result

    def _rewards(self, cfg: StepConfig) -> Rewards:
        r = self.result.rollout
        return compute_rewards(r.prompts, r.completions, r.num_generations, self.task)

    def _advantages(self, cfg: StepConfig) -> Advantages:
        return summarize_advantages(self.result.rewards.total, cfg.num_generations, cfg.scale_rewards, cfg.std_floor)

    def _loss(self, cfg: StepConfig) -> LossBreakdown:
        lp = self.result.logprobs
        return compute_loss(lp.policy, lp.policy, lp.reference, self.result.advantages.values, lp.mask,
                            **loss_kwargs(cfg))

    def _update(self, cfg: StepConfig) -> StepResult:
        self.restore_policy()
        self._policy_dirty = True
        return update(self.policy, self.result.rollout, self.result.logprobs, self.result.advantages.values, cfg)

    def _evaluation(self, cfg: StepConfig) -> Evaluation:
        return evaluate_pair(self.loaded.reference, self.policy, self.loaded.tokenizer, cfg, self.task)


def metrics(run: StepRun) -> dict[str, float]:
    """The step's numbers under TRL's metric names where TRL logs the same quantity."""
    out: dict[str, float] = {}
    r, lp, adv, loss, upd = run.rollout, run.logprobs, run.advantages, run.loss, run.update
    if r is not None:
        lengths = r.completion_lengths.float()
        out.update({"completions/mean_length": lengths.mean().item(), "completions/min_length": lengths.min().item(),
                    "completions/max_length": lengths.max().item(),
                    "completions/clipped_ratio": 1 - r.finished.float().mean().item(),
                    "identical_groups": float(len(r.identical_groups))})
    if lp is not None:
        out.update({"logps/max_sampler_gap": lp.max_sampler_gap, "logps/top_p_gap": lp.top_p_gap,
                    "logps/eos_kept": lp.eos_kept})
    if run.rewards is not None:
        for name, values in run.rewards.components.items():
            out[f"rewards/{name}/mean"] = torch.nanmean(values).item()
    if adv is not None:
        out.update({"reward": adv.reward, "reward_std": adv.reward_std,
                    "frac_reward_zero_std": adv.frac_reward_zero_std, "advantages/max_abs": adv.max_abs_advantage,
                    "advantages/phantom_groups": float(len(adv.phantom_groups))})
    if loss is not None:
        out.update({"loss": loss.loss.item(), "loss/policy": loss.policy_loss.item(), "loss/kl": loss.kl_loss.item(),
                    **loss.metrics})
    if upd is not None:
        out.update({"grad_norm": upd.grad_norm, "update_norm": upd.update_norm})
        if len(upd.per_sample_grad_norms):
            out["per_sample_grad_norm/max"] = upd.per_sample_grad_norms.max().item()
    if run.evaluation is not None:
        ev = run.evaluation
        out.update({"eval/reward_before": ev.before.reward, "eval/reward_after": ev.after.reward,
                    "eval/delta": ev.delta, "eval/delta_ci_low": ev.ci_low, "eval/delta_ci_high": ev.ci_high})
    for phase, timing in run.timings.items():
        out[f"time/{phase}_s"] = timing.seconds
    return out
