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

# TracIn's choices (the train command's arms check them before torch loads)
ValLoss = Literal["seqloss-lastadv", "seqloss-reward"]
ValSource = Literal["same_batch", "random", "topk"]
Selection = Literal["all", "influence>0", "influence<0", "top_half", "bottom_half", "random_half"]
VAL_LOSSES = get_args(ValLoss)
VAL_SOURCES = get_args(ValSource)
SELECTIONS = get_args(Selection)

EVAL_SETS = ("test", "validation")  # the prompts a training run evaluates on: a result, or choosing a setting
