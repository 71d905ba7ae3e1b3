"""The presets' field values (torch-free, like `choices`): `fixed` is every fix on (the StepConfig defaults);
`trl` is what TRL 1.16's GRPOTrainer computes with a default GRPOConfig (tested against its own code)."""

PRESETS: dict[str, dict[str, object]] = {
    "fixed": {},
    "trl": {
        "loss_type": "dapo",
        "beta": 0.0,
        "kl_estimator": "k3_corrected",
        "dropout": True,
        "position_ids": False,
        "dtype": "float32",
        "logprob_temperature": True,
        "mask": "keep_first_eos",
        "gather": "per_position",
        "scale_rewards": "group",
        "std_floor": 0.0,
        "epsilon_low": 0.2,
        "epsilon_high": 0.2,
        "mask_truncated_completions": False,
        "delta": None,
        "importance_sampling_level": "token",
        "top_entropy_quantile": 1.0,
        "off_policy_mask_threshold": None,
        "entropy_coef": 0.0,
        "sapo_temperature_pos": 1.0,
        "sapo_temperature_neg": 1.05,
        "vespo_k_pos": 2.0,
        "vespo_lambda_pos": 3.0,
        "vespo_k_neg": 3.0,
        "vespo_lambda_neg": 2.0,
        # TRL's default is True, but it acts only with use_vllm=True: a default trainer does not correct
        "vllm_importance_sampling_correction": False,
        "vllm_importance_sampling_mode": "sequence_mask",
        "vllm_importance_sampling_clip_min": None,
        "vllm_importance_sampling_clip_max": 3.0,
    },
}


# How a preset samples: set by `StepConfig.preset` only. `with_preset` and a preset's fields used as changes
# (`cfg.replace(**PRESETS[name])`) keep the rollout they are applied to.
PRESET_SAMPLING: dict[str, dict[str, object]] = {"trl": {"sample_dropout": True}}
