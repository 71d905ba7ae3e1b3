"""The allowed values of StepConfig's choice fields, in a leaf module that imports neither torch nor
transformers: the config (and so the command line) checks a value before they are imported. Each choice is a
`Literal` type (the config's annotation, what an editor and a type checker read) and the tuple of its values
(what the config checks and the widgets offer)."""

from typing import Literal, get_args

Mask = Literal["keep_first_eos", "drop_eos_and_pad", "all_positions"]
Gather = Literal["per_position", "first_position"]
TrlLossType = Literal["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]
LossType = Literal[TrlLossType, "reinforce_sum", "reinforce_mean"]
KlEstimator = Literal["k1", "k2", "k3", "k3_corrected"]
ImportanceSamplingLevel = Literal["token", "sequence"]
SamplerCorrectionMode = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
Generation = Literal["batched", "loop"]
Dtype = Literal["float32", "bfloat16"]
SamplerDtype = Literal["float32", "bfloat16", "float16"]
ScaleRewards = Literal["group", "batch", "none"]
Aggregation = Literal["sum_then_normalize", "normalize_then_sum"]
Support = Literal["full_vocabulary", "sampler_support"]

MASKS = get_args(Mask)
GATHERS = get_args(Gather)
TRL_LOSS_TYPES = get_args(TrlLossType)
LOSS_TYPES = get_args(LossType)
CLIPPED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")  # the PPO objective, with TRL's clip_ratio/*
KL_ESTIMATORS = get_args(KlEstimator)
IMPORTANCE_SAMPLING_LEVELS = get_args(ImportanceSamplingLevel)
SAMPLER_CORRECTION_MODES = get_args(SamplerCorrectionMode)
GENERATIONS = get_args(Generation)
DTYPES = get_args(Dtype)
SAMPLER_DTYPES = get_args(SamplerDtype)
SCALE_REWARDS = get_args(ScaleRewards)
AGGREGATIONS = get_args(Aggregation)
SUPPORTS = get_args(Support)
ARM_NAMES = (
    "fixed",
    "trl",
    "no_temperature",
    "eos_dropped",
    "dropout",
    "no_position_ids",
    "k1",
    "reinforce",
    "tracin",
    "tracin_same_batch",
    "tracin_flipped",
    "tracin_top16",
    "tracin_random128",
    "dapo",
    "identical_groups",
)
# StepConfig fields that are GRPOConfig fields of the same name (the TRL bridge writes them, a capture reads
# them back)
SAME_NAME = (
    "beta",
    "loss_type",
    "epsilon_high",
    "scale_rewards",
    "multi_objective_aggregation",
    "delta",
    "importance_sampling_level",
    "top_entropy_quantile",
    "off_policy_mask_threshold",
    "entropy_coef",
    "sapo_temperature_pos",
    "sapo_temperature_neg",
    "vespo_k_pos",
    "vespo_lambda_pos",
    "vespo_k_neg",
    "vespo_lambda_neg",
    "mask_truncated_completions",
    "num_iterations",
    "gradient_accumulation_steps",
)

# StepConfig fields that are GRPOConfig fields of the same name beside SAME_NAME: how it samples, its batch layout,
# its optimiser (the TRL bridge writes them too) and vLLM's sampler correction
SAME_NAME_TOO = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "num_generations",
    "steps_per_generation",
    "learning_rate",
    "max_grad_norm",
    "weight_decay",
    "seed",
    "vllm_importance_sampling_correction",
    "vllm_importance_sampling_mode",
)
# StepConfig fields that GRPOConfig spells otherwise, as the TRL bridge's `grpo_config` writes them: field ->
# (GRPOConfig field, its value there for the StepConfig value; None: GRPOConfig has no such setting)
RENAMED = {
    "max_new_tokens": ("max_completion_length", lambda v: v),
    "epsilon_low": ("epsilon", lambda v: v),
    "dropout": ("disable_dropout", lambda v: not v),
    "sample_dropout": ("disable_dropout", lambda v: not v),  # TRL's one switch sets both
    "kl_estimator": ("use_bias_correction_kl", {"k3": False, "k3_corrected": True}.get),
    "dtype": ("bf16", {"float32": False, "bfloat16": True}.get),
}


def grpo_config_changes(changes: dict) -> dict | None:
    """StepConfig `changes` as GRPOConfig settings ({"max_new_tokens": 64} -> {"max_completion_length": 64}); None
    where one has no GRPOConfig setting (position_ids is a trainer class, the scoring switches are TRL's own code, a
    KL estimator other than k3's two) or two disagree on one (dropout on, sample_dropout off)."""
    out: dict = {}
    for field, value in changes.items():
        if field in SAME_NAME or field in SAME_NAME_TOO:
            name, said = field, value
        elif field in RENAMED:
            name, said = RENAMED[field][0], RENAMED[field][1](value)
            if said is None:
                return None
        else:
            return None
        if out.get(name, said) != said:
            return None
        out[name] = said
    return out


# TracIn's choices (the train command's arms check them before torch loads)
ValLoss = Literal["seqloss-lastadv", "seqloss-reward"]
ValSource = Literal["same_batch", "random", "topk"]
Selection = Literal["all", "influence>0", "influence<0", "top_half", "bottom_half", "random_half"]
VAL_LOSSES = get_args(ValLoss)
VAL_SOURCES = get_args(ValSource)
SELECTIONS = get_args(Selection)

EVAL_SETS = ("test", "validation")  # the prompts a training run evaluates on: a result, or choosing a setting
