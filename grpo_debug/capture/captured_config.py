"""The `StepConfig` a capture implies: the `trl` preset with the capture's own `GRPOConfig` settings, None values
resolved as the trainer resolved them (`config_from_capture`)."""

from __future__ import annotations

import json
from pathlib import Path

from ..choices import SAME_NAME as TRL_SAME_NAME
from ..config import StepConfig
from ..task import register_task, task_names
from .captured import Capture, CaptureError
from .captured_task import task_name

# GRPOConfig fields read back under the same StepConfig name: the bridge's own list, plus sampling,
# batch layout and optimiser fields it sets explicitly
SAME_NAME = TRL_SAME_NAME + (
    "steps_per_generation",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "num_generations",
    "learning_rate",
    "max_grad_norm",
    "weight_decay",
    "seed",
)


def resolved_grpo_config(capture: Capture) -> dict:
    """The GRPOConfig as the trainer ran it: None values resolved as TRL resolves them at run time
    (epsilon_high -> epsilon, steps_per_generation -> gradient_accumulation_steps), or read from the values
    the trainer itself recorded (`resolved`, format 2)."""
    g = dict(capture.meta["grpo_config"])
    resolved = capture.meta.get("resolved") or {}
    if g.get("epsilon_high") is None:
        g["epsilon_high"] = resolved.get("epsilon_high", g["epsilon"])
    if g.get("steps_per_generation") is None:
        g["steps_per_generation"] = resolved.get("steps_per_generation", g.get("gradient_accumulation_steps", 1))
    if g.get("bf16") is None:
        g["bf16"] = resolved.get("mixed_precision") == "bf16" if resolved else not g.get("fp16", False)
    return g


def config_from_capture(capture: Capture, **changes) -> StepConfig:
    """The `trl` preset with the capture's GRPOConfig: sampling, loss, batch layout and optimiser settings,
    dropout (`disable_dropout`), precision (`bf16`), the KL estimator (`use_bias_correction_kl`), and
    position_ids where the trainer passed them (`PositionIdsGRPOTrainer`). `changes` apply after."""
    g, meta = resolved_grpo_config(capture), capture.meta
    if task_name(capture) not in task_names():  # a StepConfig.task choice from here on; `open_capture` fills it

        def not_opened():
            raise RuntimeError(f"{task_name(capture)}: open the capture (open_capture) for its task")

        register_task(task_name(capture), not_opened)
    fields = {k: g[k] for k in SAME_NAME if k in g and g[k] is not None}
    dropout = not g["disable_dropout"]
    fields.update(
        model=str(capture.path.resolve() / capture.meta["policy"]["folder"]),
        task=task_name(capture),
        num_prompts=capture.num_samples // g["num_generations"],
        max_new_tokens=g["max_completion_length"],
        epsilon_low=g["epsilon"],
        kl_estimator="k3_corrected" if g.get("use_bias_correction_kl") else "k3",
        dropout=dropout,
        sample_dropout=dropout,
        position_ids=meta["position_ids"],
        dtype="bfloat16" if g.get("bf16") else "float32",
        vllm_importance_sampling_correction=bool(g.get("use_vllm") and g.get("vllm_importance_sampling_correction")),
        per_sample_grad_norms=False,
        fast=_model_type(capture) == "gpt2" and not dropout,
    )
    try:
        captured = StepConfig.preset("trl", **fields)
    except ValueError as e:
        raise CaptureError(f"{capture.path / 'capture.json'}: its GRPOConfig has no StepConfig here: {e}") from None
    try:
        return captured.replace(**changes)
    except (ValueError, TypeError) as e:  # the caller's change, not the capture, is at fault
        raise ValueError(f"your change to the captured step ({', '.join(map(str, changes))}): {e}") from None


def _model_type(capture: Capture) -> str:
    policy = capture.meta["policy"]
    folder = Path(policy["base"]["folder"]) if policy.get("adapter") else capture.path / policy["folder"]
    return json.loads((folder / "config.json").read_text()).get("model_type", "")
