"""What a capture reads off a running TRL `GRPOTrainer` (`capture.CaptureCallback`): the trainer itself,
each process's rows gathered, the values it resolved from its config; and the README written beside a
capture."""

from __future__ import annotations

import inspect
import math
from pathlib import Path

import torch

FORMAT = 4  # capture.json's "format": 2 adds the schedule, the random states, step_metrics and resolved; 3 checksums.json;  # 4 the optimizer's state (`optimizer`, optimizer.safetensors)
TENSORS = (
    "prompt_ids",
    "prompt_mask",
    "completion_ids",
    "completion_mask",
    "advantages",
    "old_per_token_logps",
    "ref_per_token_logps",
    "sampling_per_token_logps",
    "importance_sampling_ratio",
)
# plus `trainer_per_token_logps` (N, C): the policy's log-probs of each row as the trainer's loss of step k took
# them, put back in generation order; NaN for a row step k did not train on. And `rng_states` (M, S) uint8: the
# CPU random state at the start of each of step k's M training forwards; (P, M, S) in a run of P processes,
# process by process (capture.json's `schedule.ranks` then holds each process's micro-batches).


def find_trainer(cls=None):
    """The nearest caller frame's `self` that is a GRPOTrainer (the trainer whose `train()` runs), or None."""
    from trl import GRPOTrainer

    cls = cls or GRPOTrainer
    frame = inspect.currentframe()
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, cls):
            return candidate
        frame = frame.f_back
    return None


def policy_model(trainer):
    """The policy the trainer trains, unwrapped from its accelerator's wrappers (DDP, compile)."""
    return trainer.accelerator.unwrap_model(trainer.model)


def layout(trainer) -> tuple[int, int, int]:
    """steps_per_generation, num_iterations and gradient_accumulation_steps as the trainer runs them."""
    return trainer.args.steps_per_generation, trainer.num_iterations, trainer.current_gradient_accumulation_steps


def gathered(trainer, tensor: torch.Tensor, pad_first: bool = False, pad_index: float = 0) -> torch.Tensor:
    """Every process's rows of a per-process tensor, in process order, on the CPU. Along dim 1 each is padded
    to the longest: on the left (`pad_first`) for left-padded prompts, on the right for completions."""
    acc = trainer.accelerator
    if acc.num_processes > 1:
        if tensor.dim() > 1:
            tensor = acc.pad_across_processes(tensor, dim=1, pad_index=pad_index, pad_first=pad_first)
        tensor = acc.gather(tensor)
    return tensor.detach().cpu()


def gathered_batch_tensor(trainer, name: str, tensor: torch.Tensor) -> torch.Tensor:
    pad = trainer.processing_class.pad_token_id if name.endswith("_ids") else 0
    return gathered(trainer, tensor, pad_first=name.startswith("prompt"), pad_index=pad or 0)


def jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return repr(value)


LOGGED_KL_STEPS = 50  # the most recent logged kl values a capture keeps


def logged_kl(log_history: list[dict]) -> list[list[float]]:
    """[[step, kl], ...] of TRL's training logs up to now (the last LOGGED_KL_STEPS with a finite kl): how the KL
    to the reference grew before the captured step (`kl_blowup`)."""
    kept = [
        [h["step"], float(h["kl"])]
        for h in log_history
        if "loss" in h and isinstance(h.get("kl"), (int, float)) and math.isfinite(h["kl"])
    ]
    return kept[-LOGGED_KL_STEPS:]


# TRL 1.16's logged names that tell how a run went, step by step: the KL to the reference, the completions' length and
# the share cut at max_completion_length, the reward and its spread, the gradient's norm, the policy's entropy
HISTORY_KEYS = (
    "kl",
    "completions/mean_length",
    "completions/clipped_ratio",
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "grad_norm",
    "entropy",
    "learning_rate",
)


def is_history_key(name: str) -> bool:
    """One of HISTORY_KEYS, or a reward function's spread (`rewards/<name>/std`): when each function went flat."""
    return name in HISTORY_KEYS or (name.startswith("rewards/") and name.endswith("/std"))


def logged_history(log_history: list[dict]) -> list[dict]:
    """[{"step": k, name: value, ...}] of TRL's training logs up to now (the last LOGGED_KL_STEPS), each with the
    finite numbers of HISTORY_KEYS and each reward function's std it logged: the order in which things went wrong
    before the captured step."""
    kept = []
    for h in log_history:
        if "loss" not in h or not isinstance(h.get("step"), int):
            continue
        values = {k: float(v) for k, v in h.items() if is_history_key(k) and _finite_number(v)}
        kept.append({"step": h["step"], **values})
    return kept[-LOGGED_KL_STEPS:]


def _finite_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def resolved_settings(trainer) -> dict:
    """The values the trainer resolved from its GRPOConfig at run time (the saved config keeps None for some)."""
    args = trainer.args
    return {
        "epsilon_low": trainer.epsilon_low,
        "epsilon_high": trainer.epsilon_high,
        "steps_per_generation": args.steps_per_generation,
        "num_iterations": trainer.num_iterations,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "beta": trainer.beta,
        "loss_type": trainer.loss_type,
        "temperature": trainer.temperature,
        "top_p": getattr(trainer, "top_p", args.top_p),
        "top_k": getattr(trainer, "top_k", args.top_k),
        "min_p": getattr(trainer, "min_p", args.min_p),
        "mixed_precision": str(trainer.accelerator.mixed_precision),
        "disable_dropout": args.disable_dropout,
        "processes": trainer.accelerator.num_processes,
    }


README = """# A captured GRPO step

Optimizer step {step} of a TRL {trl_version} `{trainer_class}` run, captured by
`grpo_debug.capture.CaptureCallback` on {when}.

- `capture.json`: the `GRPOConfig` (`grpo_config`) and what the trainer resolved from it (`resolved`), the
  prompts and completions, each reward function's rewards and weight, the advantages, step {step}'s own
  metrics (`step_metrics`), what TRL logged at this step if it logged (`logged`: an average over its
  logging window), the micro-batches of this step (`schedule`) and where the weights are (`policy`).
- `batch.pt`: the tensors of the generation batch, in generation order (groups of {num_generations}
  consecutive rows): {tensors}.
- `policy/`: {policy_note} The reference model: {reference}.
- The optimizer: {optimizer_note}

Open it, from any directory:

    python -m grpo_debug replay {path} --json out.json
    python -m grpo_debug replay {path} --set position_ids=true --json out.json

or, in Python and in every notebook, `open_capture("{path}", task=your_reward_funcs)`.
"""


def resolved_name(name: str | None) -> str | None:
    """A local folder as an absolute path (a capture opens from any directory); a hub id as it is."""
    if name and Path(name).exists():
        return str(Path(name).resolve())
    return name
