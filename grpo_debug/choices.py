"""The allowed values of StepConfig's choice fields, in a leaf module that imports nothing: the config (and so
the command line) checks a value before torch or transformers is imported."""

MASKS = ("keep_first_eos", "drop_eos_and_pad", "all_positions")
GATHERS = ("per_position", "first_position")
TRL_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
LOSS_TYPES = TRL_LOSS_TYPES + ("reinforce_sum", "reinforce_mean")
CLIPPED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")  # the PPO objective, with TRL's clip_ratio/*
KL_ESTIMATORS = ("k1", "k2", "k3", "k3_corrected")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
SAMPLER_CORRECTION_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
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
