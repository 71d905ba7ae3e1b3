"""The presets' field values (torch-free, like `choices`), tested against TRL's own code:
  fixed  every fix on: sampler and recomputed log-probs agree, EOS kept, dropout off, position_ids
         passed (the defaults of `StepConfig()`).
  trl    what TRL 1.16's `GRPOTrainer` computes with a default `GRPOConfig` on a GPT-2 model:
         loss_type="dapo", beta=0.0, use_bias_correction_kl=True (k3 times the ratio),
         disable_dropout=False (dropout on in the policy's forward passes), and completions scored with
         input_ids and attention_mask only (no position_ids: left-padded rows of an absolute-position
         model are scored at shifted positions). `StepConfig.preset("trl")` also samples with dropout on
         (`sample_dropout`), as TRL generates in train mode; `with_preset` keeps a cached rollout's mode.
Sampling (temperature, top_p, B, G, max tokens) and the optimiser settings stay the step's own in both.
Precision is the step's own too: TRL resolves `bf16=None` to True (bfloat16 autocast), which adds ~0.1 nats
of rounding per token on the bundled model and makes numbers depend on batch shapes; `dtype="bfloat16"`
adds it to either preset.
"""

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
        "logprob_support": "full_vocabulary",
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
