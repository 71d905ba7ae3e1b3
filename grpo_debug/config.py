"""Every knob of one GRPO step, in one dataclass, each field owned by the phase that reads it.

The defaults are the fixed, TRL-like pipeline; each pitfall from the seeds is one field away.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .paths import DEFAULT_MODEL

PHASES = ("rollout", "logprobs", "rewards", "advantages", "loss", "update", "evaluation")


def _in(phase: str, default, help: str):
    return field(default=default, metadata={"phase": phase, "help": help})


@dataclass(frozen=True)
class StepConfig:
    # --- rollout: B prompts x G samples
    model: str = _in("rollout", DEFAULT_MODEL, "bundled folder, any local folder, or a hub id")
    task: str = _in("rollout", "mixed", "prompts: 'policy' (P:), 'env' (A:) or 'mixed' (alternating; the only one with left padding)")
    num_prompts: int = _in("rollout", 8, "B")
    num_generations: int = _in("rollout", 8, "G, samples per prompt")
    temperature: float = _in("rollout", 0.7, "sampling temperature")
    top_p: float = _in("rollout", 1.0, "nucleus sampling; < 1 makes the sampler's log-probs differ from any recomputation")
    max_new_tokens: int = _in("rollout", 104, "completion budget: P: completions take ~30 tokens, A: ~90")
    seed: int = _in("rollout", 0, "sampling seed")
    generation: str = _in("rollout", "batched", "'batched': one generate call for B*G; 'loop': one call per prompt (seed 003)")
    pad_with_eos: bool = _in("rollout", True, "pad completions with EOS, as GPT-2 and RookWorld-LM-124M do (pad == eos)")
    # --- log-probs of policy and reference
    logprob_temperature: bool = _in("logprobs", True, "divide logits by the sampling temperature (seed 004 fix 1)")
    mask: str = _in("logprobs", "trl", "'trl': keep first EOS, mask after; 'seed004': drop EOS and PAD by value; 'none'")
    dropout: bool = _in("logprobs", False, "score with the model in train mode (dropout 0.1 on)")
    position_ids: bool = _in("logprobs", True, "pass attention_mask.cumsum(-1) - 1 for left-padded rows")
    dtype: str = _in("logprobs", "float32", "'float32' or 'bfloat16' (autocast) for scoring")
    gather: str = _in("logprobs", "correct", "'correct' or 'seed003' (gathers every token from the first position)")
    # --- advantages
    scale_rewards: str = _in("advantages", "group", "TRL's scale_rewards: 'group', 'batch' or 'none'")
    std_floor: float = _in("advantages", 0.0, "clamp the std from below before dividing (0: off, as TRL)")
    # --- loss
    loss_type: str = _in("loss", "grpo", "grpo, bnpo, dr_grpo, dapo, reinforce_sum, reinforce_mean")
    beta: float = _in("loss", 0.04, "KL coefficient")
    kl_estimator: str = _in("loss", "k3", "k1, k2, k3 or k3_corrected (TRL's use_bias_correction_kl)")
    epsilon_low: float = _in("loss", 0.2, "PPO clip, lower")
    epsilon_high: float = _in("loss", 0.2, "PPO clip, upper")
    # --- update
    learning_rate: float = _in("update", 1e-4, "AdamW learning rate")
    max_grad_norm: float = _in("update", 1.0, "clip the total gradient norm (0: off)")
    weight_decay: float = _in("update", 0.0, "AdamW weight decay")
    per_sample_grad_norms: bool = _in("update", True, "per-sample gradient norms from layer hooks (~40% of a backward)")
    # --- evaluation before and after the update
    eval_prompts: int = _in("evaluation", 32, "held-out prompts")
    eval_samples: int = _in("evaluation", 4, "samples per held-out prompt, same seeds before and after")
    bootstrap: int = _in("evaluation", 1000, "bootstrap resamples for the confidence interval")

    def replace(self, **changes) -> "StepConfig":
        return dataclasses.replace(self, **changes)

    @staticmethod
    def phase_of(name: str) -> str:
        return StepConfig.__dataclass_fields__[name].metadata["phase"]

    def first_changed_phase(self, other: "StepConfig") -> str | None:
        """The earliest phase whose fields differ between the two configs (None: identical)."""
        changed = {self.phase_of(f.name) for f in dataclasses.fields(self)
                   if getattr(self, f.name) != getattr(other, f.name)}
        return next((p for p in PHASES if p in changed), None)


def parse_overrides(pairs: list[str]) -> dict:
    """`key=value` strings into typed StepConfig fields."""
    fields = StepConfig.__dataclass_fields__
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in fields:
            raise ValueError(f"expected key=value with key one of {sorted(fields)}, got {pair!r}")
        kind = type(fields[key].default)
        out[key] = value.lower() in ("1", "true", "yes", "on") if kind is bool else kind(value)
    return out
