"""Take the same set-up to TRL: the RookWorld reward as a `reward_funcs` entry, a `GRPOConfig` from a
`StepConfig`, and the step's prompts as a dataset. This is how a run leaves one machine (TRL with
accelerate or DeepSpeed); the pitfalls TRL has already fixed cannot be switched on there.
"""

from __future__ import annotations

from .config import StepConfig
from .rewards import RewardScorer
from .rollout import step_prompts

# TRL always divides logits by the temperature, keeps the first EOS, passes no dropout-free choice
# but `disable_dropout`, and gathers correctly: these settings of ours have no TRL equivalent.
_TRL_FIXED = {"logprob_temperature": True, "mask": "trl", "gather": "correct", "generation": "batched"}
_TRL_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo")


def rookworld_reward(scorer: RewardScorer | None = None):
    """A TRL reward function: `f(prompts, completions, **kwargs) -> list[float]`, total reward per completion."""
    scorer = scorer or RewardScorer.bundled()

    def rookworld(prompts: list[str], completions: list[str], **kwargs) -> list[float]:
        return [scorer.score(p, c).total for p, c in zip(prompts, completions)]

    return rookworld


def prompt_dataset(cfg: StepConfig):
    from datasets import Dataset
    return Dataset.from_dict({"prompt": step_prompts(cfg.task, cfg.num_prompts)})


def grpo_config(cfg: StepConfig, output_dir: str, **overrides):
    """TRL `GRPOConfig` for one optimizer step on all B*G samples, matching `cfg`."""
    from trl import GRPOConfig
    unsupported = {k: getattr(cfg, k) for k, v in _TRL_FIXED.items() if getattr(cfg, k) != v}
    if cfg.loss_type not in _TRL_LOSSES:
        unsupported["loss_type"] = cfg.loss_type
    if cfg.kl_estimator not in ("k3", "k3_corrected"):
        unsupported["kl_estimator"] = cfg.kl_estimator
    if cfg.std_floor:
        unsupported["std_floor"] = cfg.std_floor
    if unsupported:
        raise ValueError(f"TRL has no switch for {unsupported}: these pitfalls exist only in grpo-debug")
    args = dict(
        output_dir=output_dir, use_cpu=True, bf16=cfg.dtype == "bfloat16", report_to="none", save_strategy="no",
        per_device_train_batch_size=cfg.num_prompts * cfg.num_generations, num_generations=cfg.num_generations,
        max_completion_length=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
        beta=cfg.beta, loss_type=cfg.loss_type, epsilon=cfg.epsilon_low, epsilon_high=cfg.epsilon_high,
        scale_rewards=cfg.scale_rewards, use_bias_correction_kl=cfg.kl_estimator == "k3_corrected",
        learning_rate=cfg.learning_rate, max_grad_norm=cfg.max_grad_norm, weight_decay=cfg.weight_decay,
        disable_dropout=not cfg.dropout, gradient_checkpointing=False, seed=cfg.seed, max_steps=1,
        logging_steps=1, dataloader_num_workers=0, lr_scheduler_type="constant", warmup_steps=0)
    args.update(overrides)
    return GRPOConfig(**args)


def trl_trainer(cfg: StepConfig, output_dir: str, scorer: RewardScorer | None = None, **overrides):
    """A ready `GRPOTrainer` on `cfg.model` with the RookWorld reward and the step's prompts."""
    from trl import GRPOTrainer

    from .model import load_model
    loaded = load_model(cfg.model)
    return GRPOTrainer(model=loaded.name, reward_funcs=[rookworld_reward(scorer)],
                       args=grpo_config(cfg, output_dir, **overrides), train_dataset=prompt_dataset(cfg),
                       processing_class=loaded.tokenizer)
