"""Take the same set-up to TRL: a `GRPOConfig` from a `StepConfig`, the task's reward functions and weights as
`reward_funcs` and `reward_weights` (they are TRL reward functions already), the task's train prompts as a
dataset, and a `GRPOTrainer` that scores absolute-position models right.

TRL 1.16 scores completions with `input_ids` and `attention_mask` only (`_get_per_token_logps_and_entropies`).
A model with absolute position embeddings (GPT-2, RookWorld-LM-124M) then places a left-padded row at
positions 0..L-1, while `generate()` sampled it at positions counted from the attention mask: every
recomputed log-prob of that row is off, by several nats on most of its tokens on the bundled model (notebook 02
prints the gap row by row). Rotary models
(Llama, Qwen) see only relative positions and are unaffected. `PositionIdsGRPOTrainer` is a drop-in
`GRPOTrainer` whose scoring passes get `position_ids = attention_mask.cumsum(-1) - 1`, as generation has.
"""

from __future__ import annotations

import dataclasses

import torch
from trl import GRPOConfig, GRPOTrainer

from ..choices import SAME_NAME
from ..config import PRESET_FIELDS, StepConfig
from ..loss import TRL_LOSS_TYPES
from ..model import load_model
from ..scoring import positions_from_mask
from ..task import Task, load_task

TRL_KL_ESTIMATORS = ("k3", "k3_corrected")
# StepConfig fields that TRL has a switch for (translated in `grpo_config`); the rest of the preset fields
# are fixed in TRL, to the `trl` preset's value, and `position_ids` is this module's trainer class. The
# sampler correction acts in TRL only with vLLM, which this bridge does not run.
TRL_SWITCHES = SAME_NAME + ("dropout", "dtype", "kl_estimator", "epsilon_low", "position_ids")


def no_trl_switch(cfg: StepConfig) -> dict[str, object]:
    """The settings of `cfg` that TRL cannot express: pitfalls that exist only in grpo-debug (a setting that
    does not act in `cfg` is not one)."""
    trl = StepConfig.preset("trl")
    out = {
        k: getattr(cfg, k)
        for k in PRESET_FIELDS
        if k not in TRL_SWITCHES and cfg.acts(k) and getattr(cfg, k) != getattr(trl, k)
    }
    if cfg.loss_type not in TRL_LOSS_TYPES:
        out["loss_type"] = cfg.loss_type
    if cfg.kl_estimator not in TRL_KL_ESTIMATORS:
        out["kl_estimator"] = cfg.kl_estimator
    if cfg.generation != "batched":
        out["generation"] = cfg.generation
    if cfg.sample_dropout != cfg.dropout:  # TRL's one switch, disable_dropout, sets both
        out["sample_dropout"] = cfg.sample_dropout
    if cfg.sampler_dtype != "float32":  # a sampler precision of its own is vLLM's, which this bridge does not run
        out["sampler_dtype"] = cfg.sampler_dtype
    return out


def prompt_dataset(cfg: StepConfig, task: Task | None = None):
    """The step's prompts (the task's train prompts prompt_offset..prompt_offset+B-1) as TRL's `train_dataset`."""
    from datasets import Dataset

    task = task or load_task(cfg.task)
    offset = cfg.prompt_offset
    return Dataset.from_dict({"prompt": task.prompts("train", offset + cfg.num_prompts)[offset:]})


# transformers 5.24 renamed gradient_checkpointing (a FutureWarning when set) to activation_checkpointing
CHECKPOINTING = next(
    n
    for n in ("activation_checkpointing", "gradient_checkpointing")
    if n in {f.name for f in dataclasses.fields(GRPOConfig)}
)


def grpo_config(cfg: StepConfig, output_dir: str, **overrides) -> GRPOConfig:
    """TRL `GRPOConfig` for one optimizer step on all B*G samples, matching `cfg`."""
    unsupported = no_trl_switch(cfg)
    if unsupported:
        raise ValueError(f"TRL has no switch for {unsupported}: these pitfalls exist only in grpo-debug")
    args = dict(
        output_dir=output_dir,
        use_cpu=True,
        bf16=cfg.dtype == "bfloat16",
        report_to="none",
        save_strategy="no",
        per_device_train_batch_size=cfg.num_prompts * cfg.num_generations // cfg.micro_batches,
        steps_per_generation=cfg.micro_batches,
        num_generations=cfg.num_generations,
        max_completion_length=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=cfg.top_k,
        min_p=cfg.min_p,
        **{k: getattr(cfg, k) for k in SAME_NAME},
        epsilon=cfg.epsilon_low,
        use_bias_correction_kl=cfg.kl_estimator == "k3_corrected",
        learning_rate=cfg.learning_rate,
        max_grad_norm=cfg.max_grad_norm,
        weight_decay=cfg.weight_decay,
        disable_dropout=not cfg.dropout,
        **{CHECKPOINTING: False},
        seed=cfg.seed,
        max_steps=cfg.num_iterations * cfg.micro_batches // cfg.gradient_accumulation_steps,
        logging_steps=1,
        dataloader_num_workers=0,
        lr_scheduler_type="constant",
        warmup_steps=0,
    )
    args.update(overrides)
    return GRPOConfig(**args)


def _positions_from_mask(module, args, kwargs):
    """Forward pre-hook: a pass with an attention mask, no position_ids and no cache (TRL's scoring) gets
    the positions generation used."""
    mask = kwargs.get("attention_mask")
    cached = kwargs.get("cache") is not None or kwargs.get("past_key_values") is not None  # 5.24 renamed the latter
    if mask is not None and kwargs.get("position_ids") is None and not cached:
        kwargs["position_ids"] = positions_from_mask(mask)
    return args, kwargs


def pass_position_ids(model: torch.nn.Module):
    """Make every scoring forward of `model` pass position_ids from its attention mask; returns the hook handle."""
    return model.register_forward_pre_hook(_positions_from_mask, with_kwargs=True)


class PositionIdsGRPOTrainer(GRPOTrainer):
    """`GRPOTrainer` whose policy and reference score completions at the positions they were sampled at."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        pass_position_ids(self.model)
        if self.ref_model is not None:
            pass_position_ids(self.ref_model)


def trl_trainer(cfg: StepConfig, output_dir: str, task: Task | None = None, **overrides) -> GRPOTrainer:
    """A ready trainer on `cfg.model` with the task's reward functions and weights (default: the task `cfg.task`)
    and the step's prompts: `PositionIdsGRPOTrainer` when `cfg.position_ids` (the `fixed` preset), TRL's own
    `GRPOTrainer` when not (the `trl` preset)."""

    loaded = load_model(cfg.model)
    task = task or load_task(cfg.task)
    trainer_class = PositionIdsGRPOTrainer if cfg.position_ids else GRPOTrainer
    weights = {} if task.reward_weights is None else {"reward_weights": list(task.reward_weights)}
    return trainer_class(
        model=loaded.name,
        reward_funcs=list(task.reward_funcs),
        args=grpo_config(cfg, output_dir, **{**weights, **overrides}),
        train_dataset=prompt_dataset(cfg, task),
        processing_class=loaded.tokenizer,
    )
