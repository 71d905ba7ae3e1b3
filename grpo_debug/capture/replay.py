"""Whether we reproduce a captured TRL step: `reproduction(run, capture, model, step)` replays the captured
optimizer step as TRL took it (`trl_step`: its micro-batches, its pass, its dropout masks) and compares every
number with the step's own metrics from the trainer. Open a capture with `open_capture`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from ..kernels import kernels_in_use
from ..model import absolute_positions, has_dropout
from ..show.metrics import metrics
from ..specs import loss_spec_of, optimization_of, scoring_of
from ..update import Iteration, StepResult, new_optimizer
from . import optimizer_state
from .captured import Capture, CaptureError
from .captured_config import config_from_capture
from .lora import is_adapter_model
from .optimizer_schema import state_note
from .trl_step import RankSchedule, checkpointing_of, trl_step

COMPARED = (
    "loss",
    "grad_norm",
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "kl",
    "entropy",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "clip_ratio/low_min",
    "clip_ratio/high_max",
    "cispo_clip_ratio",
    "vespo/phi_seq_mean",
)  # TRL's names


# |ours - trainer's| <= relative x |trainer's| + absolute, by where the replay runs and its weights' dtype. The CPU in
# float32 reruns the trainer's own kernels (a capture from the CPU: its digits); GPU kernels are not bit-reproducible
# across batch shapes and machines; weights cast to 16 bits round every product (measured on the bundled capture,
# bfloat16 weights on the CPU: loss 1.2%, kl 1.1%, grad_norm 0.14% off).
TOLERANCES = {"float32": {"cpu": (1e-5, 1e-7), "cuda": (1e-3, 1e-6)}, "16-bit": (5e-2, 1e-4)}


def tolerance(device_type: str, dtype: torch.dtype) -> tuple[float, float]:
    """(relative, absolute): how close a replay on `device_type` with weights in `dtype` comes to the trainer."""
    if dtype in (torch.float16, torch.bfloat16):
        return TOLERANCES["16-bit"]
    return TOLERANCES["float32"].get(device_type, TOLERANCES["float32"]["cuda"])


def within(ours: float, trainers: float, relative: float, absolute: float) -> bool:
    return abs(ours - trainers) <= relative * abs(trainers) + absolute


def replay_trl_step(step, run, optimizer=None):
    """The captured optimizer step, replayed as TRL took it (`trl_step.trl_step`) under the step's config:
    its micro-batches and pass, pi_old and the reference's log-probs from generation time (recomputed when a
    scoring toggle changed them and the step is its generation's first), the trainer's dropout masks.
    `optimizer`: then steps once (the weights are left moved: `step.restore_policy()` brings them back)."""

    capture, cfg, b = step.capture, run.config, step.capture.batch
    step.restore_policy()  # the weights before the step, whatever the engine's update phase did to them
    schedule = capture.schedule
    as_captured = scoring_of(cfg) == scoring_of(config_from_capture(capture))
    first_of_generation = schedule["generation_first_step"] == capture.meta["step"]
    old = b.get("old_per_token_logps")
    if old is not None and not as_captured and first_of_generation:
        old = run.logprobs.policy
    ref = b.get("ref_per_token_logps") if as_captured else run.logprobs.reference
    scoring = scoring_of(cfg)
    fused = scoring.temperature == cfg.temperature and scoring.gather == "per_position"
    if fused:
        add_trl_head(step.policy, cfg.temperature, bool(capture.meta["grpo_config"].get("cast_lm_head_to_fp32")))
    return trl_step(
        step.policy,
        run.rollout,
        run.logprobs.mask,
        run.advantages.values,
        scoring_of(cfg),
        loss_spec_of(cfg),
        rank_schedules(capture),
        old_logps=None if old is None else old.float(),
        ref_logps=None if ref is None else ref.float(),
        max_grad_norm=cfg.max_grad_norm,
        fused=fused,
        optimizer=optimizer,
        checkpointing=checkpointing_of(capture.meta["grpo_config"]),  # the trainer's memory, the same numbers
    )


@dataclass(frozen=True)
class TrainerUpdate:
    """The captured optimizer step taken with the trainer's optimizer: what the weights did."""

    delta: dict[str, torch.Tensor]  # each trained parameter's change, by name
    optimizer: str  # what stepped: the trainer's optimizer as captured, or why a fresh AdamW did (`FRESH`)
    exact: bool  # the trainer's optimizer, rebuilt from the capture
    learning_rate: tuple[float, ...]  # each group's rate as it stepped
    grad_norm: float  # before clipping

    @property
    def norm(self) -> float:
        return math.sqrt(sum(float((d.double() ** 2).sum()) for d in self.delta.values()))


def starting_optimizer(capture: Capture, model, cfg, as_captured) -> tuple[torch.optim.Optimizer, str, bool]:
    """The optimizer an update on this capture steps with, what it is in words, and whether it is the trainer's:
    the trainer's as captured (`optimizer_state`), each group's scheduled rate scaled by cfg.learning_rate / the
    GRPOConfig's (the same rate when unchanged), the decaying groups at cfg.weight_decay; else, where the capture
    holds none or one this replay cannot rebuild, a fresh AdamW at cfg's rate, said so."""
    entry = capture.meta.get("optimizer")
    problem = optimizer_state.rebuild_problem(entry)
    if problem is not None:
        return new_optimizer(model, optimization_of(cfg)), f"{problem}: {optimizer_state.FRESH}", False
    scale = cfg.learning_rate / as_captured.learning_rate if as_captured.learning_rate else 1.0
    tensors = capture.optimizer_tensors
    note = state_note(entry, tensors, capture.meta["step"])  # before the optimizer owns and steps them
    try:
        optimizer = optimizer_state.trainer_optimizer(
            model, entry, tensors, lr=[lr * scale for lr in entry["learning_rate"]]
        )
    except ValueError as e:  # a state the weights' headers could not check: a shape the model disagrees with
        raise CaptureError(f"{capture.optimizer_file}: {e}") from None
    if cfg.weight_decay != as_captured.weight_decay:
        for group in optimizer.param_groups:
            if group["weight_decay"]:
                group["weight_decay"] = cfg.weight_decay
    rates = ", ".join(f"{g['lr']:.6g}" for g in optimizer.param_groups)
    what = (
        f"the trainer's {entry['class']} as captured: its state before step {capture.meta['step']}, "
        f"{len(entry['groups'])} parameter group(s), learning rate {rates}"
        + (" as scheduled for the step" if scale == 1.0 else f" (the scheduled rate x {scale:.6g})")
        + (f"; {note}" if note else "")
    )
    return optimizer, what, True


def captured_update(step, run) -> StepResult | None:
    """The update phase on a capture: the captured optimizer step replayed as the trainer took it
    (`replay_trl_step`: its micro-batches, pass and dropout masks), clipped as it clipped, and stepped once by
    `starting_optimizer` under the run's config; the tokens it did not train on hold 0 in the pass's record.
    None where it is not the trainer's step (the engine's update phase runs instead, from a fresh AdamW, and
    `reproduction` says so): no schedule recorded; another batch size; per-sample gradient norms asked for, which
    only the engine's `update` takes; a batch layout (num_iterations, steps_per_generation,
    gradient_accumulation_steps) other than the captured one, or a captured one whose generation batch feeds
    several optimizer steps (the engine then takes every one of them from step k's weights, as its passes show;
    `trainer_update` and `landing` take the captured step alone)."""
    capture, cfg = step.capture, run.config
    captured = config_from_capture(capture)
    layout = ("num_iterations", "steps_per_generation", "gradient_accumulation_steps")
    if (
        capture.schedule is None
        or cfg.per_sample_grad_norms
        or cfg.num_prompts * cfg.num_generations != capture.num_samples
        or any(getattr(cfg, k) != getattr(captured, k) for k in layout)
        or cfg.num_iterations * cfg.steps_per_generation != cfg.gradient_accumulation_steps
    ):
        return None
    start = time.perf_counter()
    step.restore_policy()
    step.carry_optimizer(None)  # the last update's optimizer let go before this one is read: one state at a time
    optimizer, what, _ = starting_optimizer(capture, step.policy, cfg, captured)
    params = [p for p in step.policy.parameters() if p.requires_grad]
    before = step.initial_state.values()  # restored: the weights now, kept by the step (no second copy)
    replay = replay_trl_step(step, run, optimizer)
    step.policy_moved()
    step.carry_optimizer(optimizer)  # training on from here (`advance`) steps the trainer's optimizer
    tokens = replay.tokens
    pass_record = Iteration(
        logps=replay.logps,
        entropies=tokens["entropies"],
        ratio=tokens["ratio"],
        importance_weight=tokens["importance_weight"],
        clipped=tokens["clipped"],
        trained=tokens["trained"],
        per_token_loss=tokens["per_token_loss"],
        losses=(replay.loss,),
        grad_norms=(replay.grad_norm,),
        metrics=replay.metrics,
    )
    max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf")
    return StepResult(
        loss=replay.loss,
        grad_norm=replay.grad_norm,
        clipped=replay.grad_norm > max_norm,
        per_sample_grad_norms=torch.tensor([]),
        update_norm=torch.sqrt(sum(((p.detach() - b) ** 2).sum() for p, b in zip(params, before))).item(),
        seconds=time.perf_counter() - start,
        iterations=(pass_record,),
        optimizer_steps=1,
        learning_rates=tuple(float(g["lr"]) for g in optimizer.param_groups),
        optimizer=what,
    )


def trainer_update(step, run) -> TrainerUpdate:
    """The captured step replayed as the trainer took it (`replay_trl_step`), then stepped by the trainer's
    optimizer rebuilt from the capture (its moments, groups and scheduled rate; `optimizer_state`), or, where the
    capture holds none or one this replay cannot rebuild, by a fresh AdamW at the config's rate, said so. The
    policy is left at the weights after the step (`step.restore_policy()` brings back those before)."""
    capture = step.capture
    step.restore_policy()
    optimizer, what, exact = starting_optimizer(capture, step.policy, run.config, config_from_capture(capture))
    trained = {n: p for n, p in step.policy.named_parameters() if p.requires_grad}
    before = step.initial_state  # restored: the weights now, kept by the step (no second copy)
    replay = replay_trl_step(step, run, optimizer)
    step.policy_moved()
    return TrainerUpdate(
        delta={n: p.detach() - before[n] for n, p in trained.items()},
        optimizer=what,
        exact=exact,
        learning_rate=tuple(g["lr"] for g in optimizer.param_groups),
        grad_norm=replay.grad_norm,
    )


def rank_schedules(capture: Capture) -> list[RankSchedule]:
    """The captured step's micro-batches process by process (`trl_step.RankSchedule`): one process's from
    `schedule.micro_batches` and `rng_states` (M, S); several processes' from `schedule.ranks` and
    `rng_states` (P, M, S), each at its own widths. The capture was checked when read (`checking`)."""
    schedule, states = capture.schedule, capture.batch.get("rng_states")
    if "ranks" not in schedule:
        micro = tuple(tuple(mb["rows"]) for mb in schedule["micro_batches"])
        return [RankSchedule(micro, None if states is None else tuple(states))]
    return [
        RankSchedule(
            tuple(tuple(mb["rows"]) for mb in rank["micro_batches"]),
            None if states is None else tuple(states[r]),
            rank["prompt_width"],
            rank["completion_width"],
        )
        for r, rank in enumerate(schedule["ranks"])
    ]


def add_trl_head(model, temperature: float, cast_lm_head_to_fp32: bool) -> None:
    """TRL's fused LM head on `model` (once): `model(..., fused_lm_head=True)` then scores as the trainer did;
    every other call is the model's own forward."""
    from trl.trainer.utils import add_fused_lm_head

    if is_adapter_model(model):  # a LoRA policy: TRL patches the base model, called through the adapter
        model = model.get_base_model()
    if getattr(model, "_trl_fused_head", None) != (temperature, cast_lm_head_to_fp32):
        if getattr(model, "_trl_fused_head", None) is not None:
            del model.forward  # back to the class's forward before patching again
        add_fused_lm_head(
            model, temperature=temperature, cast_lm_head_to_fp32=cast_lm_head_to_fp32, outputs=("log_probs", "entropy")
        )
        model._trl_fused_head = (temperature, cast_lm_head_to_fp32)


def pitfalls(capture: Capture, model) -> dict[str, str]:
    """What the captured run did that the suite calls a pitfall, whether or not it explains a difference."""
    left_padded = bool((capture.batch["prompt_mask"][:, 0] == 0).any())
    out = {}
    if absolute_positions(model) and not capture.meta["position_ids"] and left_padded:
        out["positions"] = (
            "absolute positions scored without position_ids: left-padded rows were scored at "
            "positions shifted from those they were sampled at"
        )
    if has_dropout(model) and not capture.meta["grpo_config"]["disable_dropout"]:
        out["dropout"] = "dropout was on in the trainer's forward passes (disable_dropout=False)"
    return out


def causes(capture: Capture, model, replayed_dropout: bool) -> dict[str, str]:
    """Each cause of a difference between the replay and the trainer this module can detect: 'present: ...'
    or 'absent: ...'."""
    g, b = capture.meta["grpo_config"], capture.batch
    out = {}
    dropout_on = has_dropout(model) and not g["disable_dropout"]
    if not dropout_on:
        out["dropout"] = "absent: dropout off" + ("" if has_dropout(model) else " (the model has none)")
    elif replayed_dropout:
        out["dropout"] = "absent: the trainer's dropout masks are replayed from its captured random states"
    else:
        out["dropout"] = (
            "present: dropout was on and its masks are not replayed (a capture without random states: "
            "written before format 2, or by processes that recorded different numbers of forwards); loss, kl "
            "and grad_norm differ by dropout noise"
        )
    if "sampling_per_token_logps" in b:
        mask = b["completion_mask"].bool()
        gap = (b["sampling_per_token_logps"] - b["trainer_per_token_logps"]).abs()[mask].nan_to_num(0).max().item()
        out["sampler_gap"] = f"present: max |sampler - trainer| log-prob {gap:.3g}"
    else:
        out["sampler_gap"] = "absent: the trainer generated with its own model (no sampler log-probs)"
    if capture.schedule is None:
        out["micro_batches"] = (
            "present: no schedule recorded (a capture written before format 2, or a multi-process capture "
            "written before each process's schedule was recorded): the whole batch is replayed as one "
            "micro-batch"
        )
    return out


def reproduction(run, capture: Capture, model, step=None) -> dict:
    """{"logged": the trainer's numbers for the step ("logged_source" says whether the trainer's own per-step
    metrics or what TRL logged), "replayed": ours, "difference": ours - the trainer's,
    "where": the device and weights' dtype it ran on, the tolerance stated for
    them (`tolerance`) and the metrics outside it, "logps": our per-token log-probs against the trainer's, "rewards": per reward function, the largest
    |ours - captured|, "ranks": each process's loss, the trainer's and ours (None: one process, or not
    replayed), "pitfalls": `pitfalls`, "causes": `causes`, "kernels": `kernels_against`,
    "optimizer": what the update phase steps with}. With `step` (the GRPOStep) and a captured
    schedule, the optimizer step is replayed micro-batch by micro-batch, process by process
    (`replay_trl_step`); without, from the whole batch as one (`metrics.metrics`)."""

    trainer_logps = capture.batch["trainer_per_token_logps"].float()
    ours = metrics(run)
    replayed_dropout, ranks = False, None
    if (
        step is not None
        and capture.schedule is not None
        and run.config.num_prompts * run.config.num_generations == capture.num_samples
    ):
        replay = replay_trl_step(step, run)
        ours = {**ours, **replay.metrics, "loss": replay.loss, "grad_norm": replay.grad_norm}
        ranks = rank_losses(capture.schedule, replay.rank_losses)
        policy_logps = replay.logps
        replayed_dropout = "rng_states" in capture.batch and run.config.dropout
    else:
        policy_logps = run.logprobs.policy
    logged = capture.step_metrics
    keys = [k for k in COMPARED if logged.get(k) is not None and k in ours]
    parameter = next(model.parameters())
    relative, absolute = tolerance(parameter.device.type, parameter.dtype)
    mask = capture.batch["completion_mask"].bool() & trainer_logps.isfinite() & policy_logps.isfinite()
    gap = (policy_logps - trainer_logps).abs()[mask]
    return {
        "step": capture.meta["step"],
        "config": run.config.settings(),
        "logged": {k: logged[k] for k in keys},
        "logged_source": capture.step_metrics_source,
        "replayed": {k: ours[k] for k in keys},
        "difference": {k: ours[k] - logged[k] for k in keys},
        "where": {
            "device": str(parameter.device),
            "dtype": str(parameter.dtype).removeprefix("torch."),
            "tolerance": {"relative": relative, "absolute": absolute},
            "outside": [k for k in keys if not within(ours[k], logged[k], relative, absolute)],
        },
        "logps": {
            "max_abs_difference": gap.max().item() if len(gap) else None,
            "mean_abs_difference": gap.mean().item() if len(gap) else None,
            "rows_compared": int(mask.any(1).sum()),
        },
        "rewards": reward_drift(run.rewards, capture),
        "ranks": ranks,
        "pitfalls": pitfalls(capture, model),
        "causes": causes(capture, model, replayed_dropout),
        "kernels": kernels_against(capture),
        "optimizer": optimizer_of_update(run),
    }


def optimizer_of_update(run) -> str:
    """Which optimizer the update phase stepped with on this capture, in words: the captured step's own words
    (`captured_update`: the trainer's optimizer, or why a fresh AdamW), or the engine's passes."""
    if run.update is None:
        return "no update was run"
    if run.update.optimizer == StepResult.optimizer:  # the engine's own update phase
        return (
            "a fresh AdamW, the engine's own passes over the generation batch: its layout is not one optimizer "
            "step as captured (trainer_update and landing replay the captured step with the trainer's optimizer)"
        )
    return run.update.optimizer


def kernels_against(capture: Capture) -> dict:
    """The CPU kernels the run used (capture.json's `kernels`) against this process's: {"captured", "here",
    "same", "note"}; a capture written before they were recorded has captured None and says so."""
    captured, here = capture.meta.get("kernels"), kernels_in_use()
    if captured is None:
        return {"captured": None, "here": here, "same": None, "note": "the capture did not record its kernels"}
    same = captured == here
    note = (
        "the replay runs the kernels the run did"
        if same
        else "the replay runs other CPU kernels than the run did: numbers may differ at float-rounding level"
    )
    return {"captured": captured, "here": here, "same": same, "note": note}


def rank_losses(schedule: dict, replayed: tuple[float, ...]) -> list[dict[str, float]] | None:
    """Each process's loss (its micro-batches' sum): [{"logged": the trainer's, "replayed": ours}], in process
    order; None for a one-process capture."""
    if "ranks" not in schedule:
        return None
    return [{"logged": sum(rank["losses"]), "replayed": ours} for rank, ours in zip(schedule["ranks"], replayed)]


def reward_drift(rewards, capture: Capture) -> dict[str, float]:
    """Per reward function, the largest |recomputed - captured| reward over the captured completions (a
    function's None against None is 0, None against a number is inf)."""
    out = {}
    for name, values in capture.meta["rewards"].items():
        ours = rewards.per_function[name]
        stored = torch.tensor([math.nan if v is None else v for v in values], dtype=torch.float32, device=ours.device)
        gap = (ours - stored).abs().nan_to_num(math.inf)
        out[name] = torch.where(ours.isnan() & stored.isnan(), 0.0, gap).max().item()
    return out
