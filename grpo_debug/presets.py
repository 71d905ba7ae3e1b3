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

from .pitfalls import trl_values

# Each preset's log-prob, advantage and loss fields that differ from StepConfig(): TRL's defaults that are
# settings here, and the pitfalls TRL has by default (their values declared in `pitfalls.py`). Every other
# such field is TRL's default already (tests/test_trl_bridge.py checks each against GRPOConfig());
# vllm_importance_sampling_correction defaults to True in TRL but acts only with use_vllm=True: a default
# trainer does not correct.
PRESETS: dict[str, dict[str, object]] = {
    "fixed": {},
    "trl": {
        "loss_type": "dapo",
        "beta": 0.0,
        "kl_estimator": "k3_corrected",  # use_bias_correction_kl=True
        **trl_values(),  # dropout on (disable_dropout=False), no position_ids, ...
    },
}


# How a preset samples: set by `StepConfig.preset` only. `with_preset` and a preset's fields used as changes
# (`cfg.replace(**StepConfig.preset_fields(name))`) keep the rollout they are applied to.
PRESET_SAMPLING: dict[str, dict[str, object]] = {"trl": {"sample_dropout": True}}
