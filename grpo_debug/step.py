"""One GRPO step, phase by phase: `GRPOStep.run(cfg)` returns a new frozen `StepRun` on every call.

Only the phases at and after the first one whose config fields changed are re-run; the results of the
phases before it are shared with the previous run, not copied. The same step without the cache, top to
bottom, is `reference_step.grpo_step` (tested equal); `specs` turns the config into the phases' arguments.
"""

from __future__ import annotations

import contextlib
import dataclasses
import resource
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from .advantages import Advantages, advantages_of
from .config import PHASES, StepConfig, rollout_fields_refused
from .evaluation import Evaluation, eval_prompts, evaluate_pair
from .logprobs import TokenLogProbs, compute_logprobs
from .loss import LossBreakdown, batch_loss, batch_of
from .model import LoadedModel, load_model, mixed_halves_problem, pick_device, pick_dtype
from .rewards import Rewards, StoredReward, compute_rewards
from .rollout import Rollout, check_positions, rollout
from .scoring import Scoring
from .specs import eval_sampling_of, loss_spec_of, optimization_of, sampler_correction_of, sampling_of, scoring_of
from .speed import kernels, sampling_kernels
from .task import Task, load_task
from .update import StepResult, new_optimizer, update


@dataclass(frozen=True)
class PhaseTiming:
    seconds: float
    peak_rss_mb: float  # process peak resident memory after the phase (monotone; CPU)


@dataclass(frozen=True)
class StepRun:
    config: StepConfig
    rollout: Rollout | None = None
    logprobs: TokenLogProbs | None = None
    rewards: Rewards | None = None
    advantages: Advantages | None = None
    loss: LossBreakdown | None = None
    update: StepResult | None = None
    evaluation: Evaluation | None = None
    timings: dict[str, PhaseTiming] = field(default_factory=dict)  # every phase result's own timing
    rerun: tuple[str, ...] = ()  # the phases this run computed; the others are the previous run's
    prompt_set: str = "train"  # the task's prompt set the rollout sampled


def _scoring_key(scoring: Scoring) -> Scoring:
    """What the scored numbers depend on: every scoring field but the mask, except whether it scores PAD."""
    return dataclasses.replace(scoring, mask="all_positions" if scoring.score_after_eos else "keep_first_eos")


def trained_state(model) -> dict[str, torch.Tensor]:
    """A copy of what an update can change: each trained parameter by its `named_parameters` name (a LoRA policy:
    its adapter alone; the frozen base and the buffers are never copied)."""
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def put_trained(model, state: Mapping[str, torch.Tensor]) -> None:
    """The trained parameters set to `state` (`trained_state`), in place."""
    parameters = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in state.items():
            parameters[name].copy_(value)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


VALIDATION_SEED_OFFSET = 1  # a validation run samples with seed + 1


class GRPOStep:
    """A model, its frozen reference, a task (prompts and reward functions), and the last `StepRun`."""

    def __init__(
        self,
        cfg: StepConfig | None = None,
        task: Task | None = None,
        loaded: LoadedModel | None = None,
        *,
        capture: object | None = None,
        rollout: Rollout | None = None,
        at_reference: bool = True,
        update_phase=None,
        start: Mapping[str, torch.Tensor] | None = None,
        device: str | None = None,
        weights_dtype: str | None = None,
    ):
        """`capture` (a `capture.captured.Capture`) and its `rollout`: a step opened from a TRL run
        (`grpo_debug.capture.open_capture`). `at_reference`: the
        policy's starting weights are the reference's (False once trained). `update_phase(step, run)`: the
        update phase as the run that was captured took it (`capture.replay.captured_update`: the trainer's
        micro-batches and optimizer), or None where it cannot be, for the engine's own. `start`: the trained
        parameters' starting values where they are kept outside memory (`capture.saved_weights`); None: copied.
        `device` ("cpu", "cuda"; None: where the model is, the CPU when loaded here) and `weights_dtype`
        ("bfloat16"...; None: as loaded): the models are moved there once, and every tensor of the step follows them."""
        self.cfg = cfg or StepConfig()
        where = pick_device(device) if device else (loaded.policy.device if loaded else "cpu")
        problem = mixed_halves_problem(where, weights_dtype, self.cfg)
        if problem:  # before the model loads
            raise ValueError(problem)
        self.task = task or load_task(self.cfg.task)
        self.reward_tally: dict[str, list[int]] = {}  # function -> [None or NaN rewards, completions scored]
        self.loaded = loaded or load_model(self.cfg.model)
        if device is not None or weights_dtype is not None:
            self.loaded.to(pick_device(device) if device else self.loaded.policy.device, pick_dtype(weights_dtype))
        self.initial_state = trained_state(self.loaded.policy) if start is None else start
        timings = {"rollout": PhaseTiming(0.0, 0.0)} if rollout is not None else {}
        self.result = StepRun(self.cfg, rollout=rollout, timings=timings)
        self._policy_dirty = False
        self.at_reference = at_reference
        self.optimizer: torch.optim.Optimizer | None = None  # training: the AdamW carried from step to step
        self._last_optimizer: torch.optim.Optimizer | None = None
        self.capture = capture
        self.update_phase = update_phase

    @property
    def stored_rewards(self) -> bool:
        """A capture opened without your task: rewards exist for its completions only."""
        return self.capture is not None and all(isinstance(f, StoredReward) for f in self.task.reward_funcs)

    @property
    def policy(self):
        return self.loaded.policy

    @property
    def last_rerun(self) -> list[str]:
        return list(self.result.rerun)

    def restore_policy(self) -> None:
        if self._policy_dirty:
            put_trained(self.policy, self.initial_state)
            self._policy_dirty = False

    @property
    def updated(self) -> bool:
        """The policy holds other weights than the step's start (an update ran; `restore_policy` brings them back)."""
        return self._policy_dirty

    def policy_moved(self) -> None:
        """The policy's weights were changed outside the update phase: `restore_policy` brings back the start."""
        self._policy_dirty = True

    @contextlib.contextmanager
    def trial(self):
        """Steps taken inside (`advance` included) are undone on leaving: the start weights, the optimizer, the
        last run and its config come back (the doctor continues a step with and without a fix, `doctor.horizon`)."""
        saved = (self.initial_state, self.at_reference, self.optimizer, self._last_optimizer, self.result, self.cfg)
        try:
            yield self
        finally:
            self.initial_state, self.at_reference, self.optimizer, self._last_optimizer, self.result, self.cfg = saved
            self._policy_dirty = True
            self.restore_policy()

    def carry_optimizer(self, optimizer: torch.optim.Optimizer | None) -> None:
        """The optimizer an update phase of its own stepped (a capture's: the trainer's): `advance` carries it on."""
        self._last_optimizer = optimizer

    def advance(self) -> None:
        """Training: the weights the last run's update left become the next step's start (the reference
        stays the initial model), and the AdamW that took the step carries on, as TRL's optimizer does
        from one generation batch to the next. Every cached phase result is dropped."""
        self.optimizer = self._last_optimizer or self.optimizer
        self.start_from_current_weights()

    def start_from_current_weights(self, optimizer_state: dict | None = None) -> None:
        """The policy's weights as they are now become the step's start (a resumed training run loads
        them from a checkpoint first), with an AdamW restored from `optimizer_state` where given."""
        self.initial_state = trained_state(self.policy)
        self._policy_dirty = False
        self.at_reference = False
        if optimizer_state is not None:
            self.optimizer = new_optimizer(self.policy, optimization_of(self.cfg))
            self.optimizer.load_state_dict(optimizer_state)
        self.result = StepRun(self.cfg)

    def _captured_rollout_kept(self, cfg: StepConfig, before: StepConfig) -> str | None:
        """A captured step's rollout is the trainer's: a change of `fast` or `generation` (how we would sample)
        keeps it and re-runs from the log-probs; any other rollout field is refused."""
        how = ("fast", "generation")
        fields = [
            f.name
            for f in dataclasses.fields(StepConfig)
            if StepConfig.phase_of(f.name) == "rollout"
            and f.name not in how
            and getattr(cfg, f.name) != getattr(before, f.name)
        ]
        if fields:
            raise ValueError(rollout_fields_refused(fields))
        if cfg.fast != before.fast:  # `fast` also picks the scoring path
            return "logprobs"
        return cfg.replace(generation=before.generation).first_changed_phase(before)

    def update_rows(self, keep: torch.Tensor) -> StepRun:
        """The last run with its update taken on the kept samples only (TracIn-selected GRPO): their loss
        normalised over themselves, as the seeds' trainers did."""
        run = self.result
        done = {
            "rollout": run.rollout.rows(keep),
            "logprobs": run.logprobs.rows(keep),
            "advantages": dataclasses.replace(run.advantages, values=run.advantages.values[keep]),
        }
        t0 = time.perf_counter()
        result = self._update(run.config, done, run, run.prompt_set)
        timings = {**run.timings, "update": PhaseTiming(time.perf_counter() - t0, _peak_rss_mb())}
        self.result = dataclasses.replace(run, update=result, timings=timings, rerun=("update",))
        return self.result

    def validation_run(self, size: int, cfg: StepConfig | None = None) -> StepRun:
        """`size` fresh samples from the current weights (size / G prompts of the 'validation' set, G each,
        sampled with seed + 1: other draws than the step's), run rollout..advantages aside: the step's last
        run is left as it was. TracIn's random and top-k validation sets are cut from it (`validation_pool`)."""
        cfg = cfg or self.cfg
        if size % cfg.num_generations:
            raise ValueError(f"a validation run of {size} samples is not a multiple of G={cfg.num_generations}")
        pool = cfg.replace(seed=cfg.seed + VALIDATION_SEED_OFFSET, num_prompts=size // cfg.num_generations)
        return self.run(pool, until="advantages", base=StepRun(pool), prompt_set="validation", remember=False)

    def run(
        self,
        cfg: StepConfig | None = None,
        until: str = "evaluation",
        base: StepRun | None = None,
        prompt_set: str = "train",
        remember: bool = True,
    ) -> StepRun:
        """A new StepRun of `cfg` up to phase `until`, re-using `base`'s (default: the last run's) results of
        the phases before the first one `cfg` changes. `prompt_set`: the task's prompts to sample (the
        validation pool of TracIn is the same phases on "validation"); `remember=False` leaves `result`
        (the run later calls start from) as it was."""
        cfg = cfg or self.cfg
        if cfg.model != self.cfg.model or cfg.task != self.cfg.task:
            raise ValueError(
                f"a GRPOStep keeps its model and task ({self.cfg.model!r}, {self.cfg.task!r}): open a new "
                f"GRPOStep for model {cfg.model!r}, task {cfg.task!r}"
            )
        base = base or self.result
        stop = PHASES.index(until)
        changed = "rollout" if prompt_set != base.prompt_set else cfg.first_changed_phase(base.config)
        if changed == "rollout" and self.capture is not None and prompt_set == "train":
            changed = self._captured_rollout_kept(cfg, base.config)
        missing = next((p for p in PHASES[: stop + 1] if getattr(base, p) is None), None)
        due = [p for p in (changed, missing) if p is not None]
        start = PHASES.index(min(due, key=PHASES.index)) if due else stop + 1
        done = {p: getattr(base, p) for p in PHASES[:start]}
        timings = {p: t for p, t in base.timings.items() if p in done}
        for phase in PHASES[start : stop + 1]:
            t0 = time.perf_counter()
            done[phase] = PHASE_FUNCTIONS[phase](self, cfg, done, base, prompt_set)
            timings[phase] = PhaseTiming(time.perf_counter() - t0, _peak_rss_mb())
        run = StepRun(
            cfg,
            **{p: done.get(p) for p in PHASES[: stop + 1]},
            timings=timings,
            rerun=tuple(PHASES[start : stop + 1]),
            prompt_set=prompt_set,
        )
        if remember:
            self.cfg, self.result = cfg, run
        return run

    # ---- the phases: each reads the config and the results of earlier phases (`done`) only; `base` is the run
    # the new one starts from (the log-probs reuse its scoring when only the mask changed)

    def _rollout(self, cfg: StepConfig, done: dict, base: StepRun, prompt_set: str) -> Rollout:
        self.restore_policy()
        offset = cfg.prompt_offset if prompt_set == "train" else 0
        prompts = self.task.prompts(prompt_set, offset + cfg.num_prompts)[offset:]
        check_positions(self.policy, self.loaded.tokenizer, prompts, cfg.max_new_tokens)
        generate = sampling_kernels(cfg.fast, cfg.sample_dropout).generate
        return rollout(self.policy, self.loaded.tokenizer, prompts, sampling_of(cfg), generate)

    def _logprobs(self, cfg: StepConfig, done: dict, base: StepRun, prompt_set: str) -> TokenLogProbs:
        self.restore_policy()
        scoring = scoring_of(cfg)
        same_scoring = (
            base.logprobs is not None
            and base.rollout is done["rollout"]
            and base.config.fast == cfg.fast
            and _scoring_key(scoring_of(base.config)) == _scoring_key(scoring)
        )  # e.g. only the mask changed
        return compute_logprobs(
            self.policy,
            self.loaded.reference,
            done["rollout"],
            scoring,
            reference_is_policy=self.at_reference,
            scored=base.logprobs if same_scoring else None,
            score=kernels(cfg.fast).score,
        )

    def _rewards(self, cfg: StepConfig, done: dict, base: StepRun, prompt_set: str) -> Rewards:
        r = done["rollout"]
        ids = [row[:n].tolist() for row, n in zip(r.completion_ids, r.completion_lengths.tolist())]
        rewards = compute_rewards(r.prompts, r.completions, r.num_generations, self.task, ids)
        for name, values in rewards.per_function.items():  # every scoring, sampled anew or not (`reward_tally`)
            tally = self.reward_tally.setdefault(name, [0, 0])
            tally[0], tally[1] = tally[0] + int(values.isnan().sum()), tally[1] + len(values)
        return rewards.to(r.completion_ids.device)  # scored from text; the step's tensors live with the policy

    def _advantages(self, cfg: StepConfig, done: dict, base: StepRun, prompt_set: str) -> Advantages:
        return advantages_of(cfg, done["rewards"], self.task.weights)

    def _loss(self, cfg: StepConfig, done: dict, base: StepRun, prompt_set: str) -> LossBreakdown:
        r, advantages = done["rollout"], done["advantages"].values
        return batch_loss(loss_spec_of(cfg), sampler_correction_of(cfg), done["logprobs"], advantages, r.sampler_logps)

    def _update(self, cfg: StepConfig, done: dict, base: StepRun, prompt_set: str) -> StepResult:
        """The update from the step's initial weights with a fresh AdamW, or in training (after `advance`) with
        the AdamW carried from the previous steps; a capture's (`update_phase`): the trainer's step, replayed."""
        self.restore_policy()
        self._policy_dirty = True
        lp, r = done["logprobs"], done["rollout"]
        if self.update_phase is not None and self.optimizer is None:
            phases = StepRun(cfg, rollout=done["rollout"], logprobs=done["logprobs"], advantages=done["advantages"])
            captured = self.update_phase(self, phases)
            if captured is not None:
                return captured
        self._last_optimizer = self.optimizer or new_optimizer(self.policy, optimization_of(cfg))
        advantages, loss, correction = done["advantages"].values, loss_spec_of(cfg), sampler_correction_of(cfg)
        return update(
            self.policy,
            batch_of(r, lp, advantages, loss, correction, cfg.num_iterations),
            scoring_of(cfg),
            loss,
            optimization_of(cfg),
            optimizer=self._last_optimizer,
            start=self.initial_state.values(),  # the weights it starts from, read as needed: no second copy
            num_iterations=cfg.num_iterations,
            per_sample_grad_norms=cfg.per_sample_grad_norms,
            score=kernels(cfg.fast).score if cfg.per_sample_grad_norms else kernels(cfg.fast).score_update,
            norms=kernels(cfg.fast).norms,
        )

    def _evaluation(self, cfg: StepConfig, done: dict, base: StepRun, prompt_set: str) -> Evaluation:
        prompts = eval_prompts(self.task, cfg.eval_prompts)
        return evaluate_pair(
            self.loaded.reference,
            self.policy,
            self.loaded.tokenizer,
            prompts,
            eval_sampling_of(cfg),
            self.task,
            cfg.bootstrap,
            kernels(cfg.fast).generate,
        )


PHASE_FUNCTIONS = {
    "rollout": GRPOStep._rollout,
    "logprobs": GRPOStep._logprobs,
    "rewards": GRPOStep._rewards,
    "advantages": GRPOStep._advantages,
    "loss": GRPOStep._loss,
    "update": GRPOStep._update,
    "evaluation": GRPOStep._evaluation,
}
