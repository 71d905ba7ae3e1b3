"""Every knob of one GRPO step, in one dataclass that checks itself; each field owned by the phase that reads it.

Two presets name the two steps the suite compares (`StepConfig.preset(name)`, `--preset name`; their values
and what they mean: `presets.py`); sampling, the optimiser and the precision stay the step's own in both. Where
each toggle comes from (the five bug reports) is in README.md, "Where each toggle comes from".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from . import choices
from .files import DEFAULT_MODEL
from .presets import PRESET_SAMPLING, PRESETS
from .task import REGISTERED_TASKS

PHASES = ("rollout", "logprobs", "rewards", "advantages", "loss", "update", "evaluation")

# Upper bounds: far above any one step a person debugs (a large real run: 1,024 x 16 samples, 32k-token
# completions), far below what exhausts a machine before a model even loads (num_generations=100000 asked
# for 133 GB). A bigger step is refused at once, naming the bound.
MAX_SAMPLES = 2**14  # B x G, and any one count of samples or micro-batches
MAX_TOKENS = 2**17  # completion tokens; top_k (vocabularies are ~50k-260k)
MAX_PROMPTS = 10**9  # a prompt index or count


def _in(
    phase: str,
    default,
    help: str,
    choices: Sequence[str] | None = None,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
):
    """A field of `phase`. `choices`: the allowed values (read at each check: the task names are those registered
    then); `low`/`high`: an allowed range (`low_open`: > low)."""
    return field(
        default=default,
        metadata={"phase": phase, "help": help, "choices": choices, "low": low, "high": high, "low_open": low_open},
    )


@dataclass(frozen=True)
class StepConfig:
    # --- rollout: B prompts x G samples
    model: str = _in("rollout", DEFAULT_MODEL, "bundled folder, any local folder, or a hub id")
    task: str = _in(
        "rollout",
        "mixed",
        "a registered task (`grpo_debug.task`): its prompt sets and reward functions; "
        "the bundled chess tasks: P: only, A: only, or alternating (the only one with left padding)",
        choices=REGISTERED_TASKS,
    )
    num_prompts: int = _in("rollout", 8, "B, prompts per step (B x G at most MAX_SAMPLES)", low=1, high=MAX_SAMPLES)
    num_generations: int = _in(
        "rollout", 8, "G, samples per prompt (a group needs at least 2)", low=2, high=MAX_SAMPLES
    )
    temperature: float = _in("rollout", 0.7, "sampling temperature", low=0, low_open=True)
    top_p: float = _in(
        "rollout",
        1.0,
        "nucleus sampling; < 1 makes the sampler's log-probs differ from any recomputation",
        low=0,
        high=1,
        low_open=True,
    )
    top_k: int = _in(
        "rollout", 0, "sample among the k likeliest tokens only (0: all, TRL's default)", low=0, high=MAX_TOKENS
    )
    min_p: float | None = _in(
        "rollout", None, "drop tokens below min_p x the top token's probability (none: off, TRL's)", low=0, high=1
    )
    max_new_tokens: int = _in(
        "rollout", 104, "completion budget: P: completions take ~30 tokens, A: ~90", low=1, high=MAX_TOKENS
    )
    seed: int = _in(
        "rollout", 0, "sampling seed (training adds the step to seed x 1000: kept far below 2**63)", low=0, high=2**40
    )
    prompt_offset: int = _in(
        "rollout",
        0,
        "the step's prompts are the task's prompts offset..offset+B-1 of the set (training step t: t x B)",
        low=0,
        high=MAX_PROMPTS,
    )
    generation: choices.Generation = _in(
        "rollout", "batched", "one generate call for B*G, or one call per prompt", choices=choices.GENERATIONS
    )
    sampler_dtype: choices.SamplerDtype = _in(
        "rollout",
        "float32",
        "generation precision (autocast), so the sampler's log-probs carry its rounding, as a bf16 vLLM's do; "
        "`dtype` stays the trainer's",
        choices=choices.SAMPLER_DTYPES,
    )
    fast: bool = _in(
        "rollout",
        True,
        "the fast paths (grpo_debug/fast/): the same numbers to float rounding; false runs the readable functions only",
    )
    sample_dropout: bool = _in(
        "rollout",
        False,
        "sample with the policy in train mode (dropout on), as TRL 1.16 "
        "generates when disable_dropout=False; the trl preset's, kept when a preset is "
        "switched on a cached rollout",
    )
    pad_with_eos: bool = _in(
        "rollout", True, "pad completions with EOS, as GPT-2 does (pad == eos); the bundled tokenizer has its own <pad>"
    )
    # --- log-probs of policy and reference
    logprob_temperature: bool = _in(
        "logprobs", True, "divide the logits by the sampling temperature before log_softmax, as the sampler did"
    )
    logprob_support: choices.Support = _in(
        "logprobs",
        "full_vocabulary",
        "score over the full vocabulary (TRL), or over the tokens the sampler's top_k/top_p/min_p kept, "
        "renormalised (TRL PR #7269): the ratio to the sampler then shows drift, not the truncation",
        choices=choices.SUPPORTS,
    )
    mask: choices.Mask = _in(
        "logprobs",
        "keep_first_eos",
        "completion tokens that count: up to and including the first "
        "EOS (from lengths); before the first EOS and no token equal to PAD (by value); every position",
        choices=choices.MASKS,
    )
    dropout: bool = _in("logprobs", False, "score the policy in train mode (dropout on); the reference stays in eval")
    position_ids: bool = _in("logprobs", True, "pass attention_mask.cumsum(-1) - 1 as position_ids when scoring")
    dtype: choices.Dtype = _in("logprobs", "float32", "scoring precision (bfloat16: autocast)", choices=choices.DTYPES)
    gather: choices.Gather = _in(
        "logprobs",
        "per_position",
        "which logits score token t: those of position t-1, or the first completion position's for every token",
        choices=choices.GATHERS,
    )
    mask_truncated_completions: bool = _in(
        "logprobs",
        False,
        "TRL's option: completions that never produced an EOS get no loss (DAPO's overlong filtering)",
    )
    # --- advantages
    scale_rewards: choices.ScaleRewards = _in(
        "advantages",
        "group",
        "TRL's scale_rewards: divide by the group's std, the batch's, or not at all",
        choices=choices.SCALE_REWARDS,
    )
    multi_objective_aggregation: choices.Aggregation = _in(
        "advantages",
        "sum_then_normalize",
        "TRL's multi_objective_aggregation: sum the reward functions, then normalise the sum (TRL's default); or "
        "normalise each function within its group, then sum (each function counts whatever its units)",
        choices=choices.AGGREGATIONS,
    )
    std_floor: float = _in("advantages", 0.0, "clamp the std from below before dividing (0: off, as TRL)", low=0)
    # --- loss
    loss_type: choices.LossType = _in(
        "loss", "grpo", "normalisation of the token losses, or sequence REINFORCE", choices=choices.LOSS_TYPES
    )
    beta: float = _in("loss", 0.04, "KL coefficient", low=0)
    kl_estimator: choices.KlEstimator = _in(
        "loss",
        "k3",
        "per-token KL estimate (k3_corrected: k3 times the ratio, TRL's use_bias_correction_kl)",
        choices=choices.KL_ESTIMATORS,
    )
    epsilon_low: float = _in("loss", 0.2, "PPO clip, lower (TRL's epsilon)", low=0, high=1)
    epsilon_high: float = _in(
        "loss", 0.2, "PPO clip, upper (cispo: the cap on the weight, TRL recommends 5.0)", low=0, high=1e6
    )
    delta: float | None = _in(
        "loss",
        None,
        "two-sided clipping (INTELLECT-2): cap the ratio at delta on every "
        "token, as TRL 1.16 clamps it before the min: it binds for negative advantages, and for "
        "positive ones too when delta < 1 + epsilon_high; none: off (TRL's default)",
        low=0,
        low_open=True,
    )
    importance_sampling_level: choices.ImportanceSamplingLevel = _in(
        "loss",
        "token",
        "the ratio per token, or one per sequence: exp of the mean log-ratio (GSPO)",
        choices=choices.IMPORTANCE_SAMPLING_LEVELS,
    )
    top_entropy_quantile: float = _in(
        "loss", 1.0, "train only on this top fraction of tokens by entropy (1: every token)", low=0, high=1
    )
    off_policy_mask_threshold: float | None = _in(
        "loss",
        None,
        "drop negative-advantage sequences whose mean log(sampler / policy) is above this (DeepSeek-V3.2); none: off",
        low=0,
    )
    entropy_coef: float = _in(
        "loss", 0.0, "entropy bonus: subtract coef x mean token entropy from the loss", low=-100, high=100
    )
    sapo_temperature_pos: float = _in(
        "loss", 1.0, "sapo's gate temperature for positive advantages", low=0, low_open=True
    )
    sapo_temperature_neg: float = _in(
        "loss", 1.05, "sapo's gate temperature for other advantages", low=0, low_open=True
    )
    vespo_k_pos: float = _in("loss", 2.0, "vespo's power k for A >= 0", low=0)
    vespo_lambda_pos: float = _in("loss", 3.0, "vespo's decay lambda for A >= 0", low=0)
    vespo_k_neg: float = _in("loss", 3.0, "vespo's power k for A < 0", low=0)
    vespo_lambda_neg: float = _in("loss", 2.0, "vespo's decay lambda for A < 0", low=0)
    vllm_importance_sampling_correction: bool = _in(
        "loss",
        False,
        "weight each token by pi_old / pi_sampler, the sampler's log-probs standing in for vLLM's "
        "(TRL: default true, acting only when use_vllm=True; off here, as in TRL without vLLM)",
    )
    vllm_importance_sampling_mode: choices.SamplerCorrectionMode = _in(
        "loss",
        "sequence_mask",
        "per token or per sequence; clamp the ratio (truncate) or zero it outside the bounds (mask)",
        choices=choices.SAMPLER_CORRECTION_MODES,
    )
    vllm_importance_sampling_aggregation: Literal["mean", "sum"] = _in(
        "loss",
        "mean",
        "sequence_* modes: a sequence's log-ratio is the mean of its tokens' (GSPO's 1/|y|, TRL issue #5814's fix) "
        "or their sum (TRL 1.16: the ratio's spread grows with length, and the cap masks long rows)",
        choices=("mean", "sum"),
    )
    vllm_importance_sampling_clip_min: float | None = _in(
        "loss", None, "lower bound of the sampler ratio (none: no bound)", low=0
    )
    vllm_importance_sampling_clip_max: float | None = _in(
        "loss", 3.0, "upper bound of the sampler ratio (none: no bound)", low=0
    )
    gradient_accumulation_steps: int = _in("loss", 1, "micro-batches per optimizer step", low=1, high=MAX_SAMPLES)
    steps_per_generation: int | None = _in(
        "loss",
        None,
        "micro-batches the B*G samples are split into (none: gradient_accumulation_steps, as TRL)",
        low=1,
        high=MAX_SAMPLES,
    )
    # --- update
    num_iterations: int = _in(
        "update", 1, "mu: optimizer passes over the same rollout, each re-scoring it", low=1, high=1000
    )
    learning_rate: float = _in(
        "update",
        1e-4,
        "AdamW learning rate (above 1 every AdamW step moves each weight by more than 1: refused)",
        low=0,
        high=1,
    )
    max_grad_norm: float = _in("update", 1.0, "clip the total gradient norm (0: off)", low=0)
    weight_decay: float = _in("update", 0.0, "AdamW weight decay", low=0)
    per_sample_grad_norms: bool = _in("update", True, "per-sample gradient norms from layer hooks")
    # --- evaluation before and after the update
    eval_prompts: int = _in("evaluation", 32, "held-out test prompts", low=1, high=MAX_PROMPTS)
    eval_samples: int = _in(
        "evaluation", 4, "samples per test prompt, same seeds before and after", low=1, high=MAX_SAMPLES
    )
    bootstrap: int = _in("evaluation", 1000, "bootstrap resamples for the confidence interval", low=1, high=10**6)

    def __post_init__(self):
        for f in dataclasses.fields(self):
            _check(f, getattr(self, f.name))
        _check_batch_layout(self)

    @property
    def micro_batches(self) -> int:
        """S: the B*G samples are split into this many micro-batches (TRL's steps_per_generation)."""
        return self.steps_per_generation or self.gradient_accumulation_steps

    def settings(self) -> dict:
        """Every field but `model` and `task`, which name a folder and a plug-in rather than a setting."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in ("model", "task")}

    def replace(self, **changes) -> StepConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def preset(cls, name: str, **overrides) -> StepConfig:
        """The preset's log-prob, advantage and loss fields (and the `trl` preset's sampling in train mode);
        every other field its default or `overrides`."""
        if name not in PRESETS:
            raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {name!r}")
        return cls(**{**PRESETS[name], **PRESET_SAMPLING.get(name, {}), **overrides})

    @staticmethod
    def preset_fields(name: str) -> dict[str, object]:
        """Every log-prob, advantage and loss field of a preset (the ones it changes and the defaults it keeps):
        a preset as a change to apply to any config, e.g. `cfg.replace(**StepConfig.preset_fields("trl"))`."""
        preset = StepConfig.preset(name)
        return {k: getattr(preset, k) for k in PRESET_FIELDS}

    def with_preset(self, name: str) -> StepConfig:
        """This config with a preset's fields; sampling, update and evaluation settings kept."""
        return StepConfig.preset(
            name, **{k: getattr(self, k) for k in self.__dataclass_fields__ if k not in PRESET_FIELDS}
        )

    def acts(self, name: str) -> bool:
        """Whether field `name` changes what this config computes: the sampler correction's settings act only
        with it on."""
        return self.vllm_importance_sampling_correction or not name.startswith("vllm_importance_sampling_")

    def preset_name(self) -> str | None:
        """The preset whose log-prob, advantage and loss fields this config has (those that act), or None."""
        return next((name for name in PRESETS if not self._differences(self.with_preset(name))), None)

    def pitfalls_on(self) -> dict[str, object]:
        """The log-prob, advantage and loss fields that act and differ from the `fixed` preset."""
        return self._differences(self.with_preset("fixed"))

    def _differences(self, other: StepConfig) -> dict[str, object]:
        return {
            k: getattr(self, k)
            for k in self.__dataclass_fields__
            if getattr(self, k) != getattr(other, k) and (k not in PRESET_FIELDS or self.acts(k) or other.acts(k))
        }

    @staticmethod
    def phase_of(name: str) -> str:
        return StepConfig.__dataclass_fields__[name].metadata["phase"]

    def first_changed_phase(self, other: StepConfig) -> str | None:
        """The earliest phase whose fields differ between the two configs (None: identical)."""
        changed = {
            self.phase_of(f.name) for f in dataclasses.fields(self) if getattr(self, f.name) != getattr(other, f.name)
        }
        return next((p for p in PHASES if p in changed), None)


BATCH_LAYOUT_FIELDS = ("gradient_accumulation_steps", "steps_per_generation")  # kept by presets, like B and G
PRESET_FIELDS = tuple(
    f.name
    for f in dataclasses.fields(StepConfig)
    if f.metadata["phase"] in ("logprobs", "advantages", "loss") and f.name not in BATCH_LAYOUT_FIELDS
)


def base_type(f: dataclasses.Field) -> tuple[str, bool]:
    """("int" | "float" | "str" | "bool", whether None is allowed) from the annotation; a choice (a `Literal`
    type of `choices`) is a str."""
    base = f.type.replace(" | None", "")
    return "str" if f.metadata["choices"] else base, f.type.endswith("| None")


def allowed_values(f: dataclasses.Field) -> str:
    m = f.metadata
    base, optional = base_type(f)
    if m["choices"]:
        return "one of " + ", ".join(m["choices"])
    if base == "bool":
        return "true or false"
    low = "" if m["low"] is None else f"{'>' if m['low_open'] else '>='} {m['low']:g}"
    high = "" if m["high"] is None else f"<= {m['high']:g}"
    kind = "an integer" if base == "int" else "a number" if base == "float" else "a non-empty string"
    return " ".join(filter(None, [kind, low, "and" if low and high else "", high, "or none" if optional else ""]))


FLOAT_LIMIT = 1e30  # every float setting: float32 overflows at 3.4e38 (std_floor=3.4e38 did, deep in the advantages)


def _check(f: dataclasses.Field, value) -> None:
    m, ok = f.metadata, True
    base, optional = base_type(f)
    if value is None and optional:
        return
    if base == "bool":
        ok = isinstance(value, bool)
    elif base == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif base == "float":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    elif base == "str":
        ok = isinstance(value, str) and value != ""
    if ok and m["choices"]:
        ok = value in m["choices"]
    if ok and m["low"] is not None:
        ok = value > m["low"] if m["low_open"] else value >= m["low"]
    if ok and m["high"] is not None:
        ok = value <= m["high"]
    if not ok:
        raise ValueError(f"StepConfig.{f.name} = {value!r} is not allowed: it must be {allowed_values(f)}")
    if base == "float" and abs(value) > FLOAT_LIMIT:
        raise ValueError(
            f"StepConfig.{f.name} = {value!r} is not allowed: the step computes in float32 (largest value "
            f"3.4e38), so a setting must be within +-{FLOAT_LIMIT:g}"
        )


def _check_batch_layout(cfg: StepConfig) -> None:
    """TRL's constraints between fields: the micro-batches split the B*G samples evenly, and each optimizer
    step takes whole micro-batches of this one generation."""
    N, S, GA = cfg.num_prompts * cfg.num_generations, cfg.micro_batches, cfg.gradient_accumulation_steps
    if N > MAX_SAMPLES:
        raise ValueError(
            f"num_prompts x num_generations = {cfg.num_prompts} x {cfg.num_generations} = {N} samples is not "
            f"allowed: at most {MAX_SAMPLES} in one step"
        )
    low, high = cfg.vllm_importance_sampling_clip_min, cfg.vllm_importance_sampling_clip_max
    if low is not None and high is not None and not low < high:
        raise ValueError(
            f"vllm_importance_sampling_clip_min = {low:g} is not allowed with clip_max = {high:g}: the bounds "
            "must satisfy min < max (else every sampler ratio is clipped or masked and the loss is 0)"
        )
    if N % S:
        name = "steps_per_generation" if cfg.steps_per_generation else "gradient_accumulation_steps"
        also = "" if cfg.steps_per_generation else " (steps_per_generation is none: it takes this value)"
        raise ValueError(
            f"StepConfig.{name} = {S} is not allowed{also}: it must divide the num_prompts x num_generations "
            f"= {N} samples"
        )
    if S % GA:
        raise ValueError(
            f"StepConfig.gradient_accumulation_steps = {GA} is not allowed: it must divide "
            f"steps_per_generation = {S} (an optimizer step cannot span two generations here)"
        )
    if (
        cfg.loss_type == "vespo"
        and cfg.vllm_importance_sampling_correction
        and cfg.vllm_importance_sampling_mode not in ("token_truncate", "token_mask")
    ):
        raise ValueError(
            f"StepConfig.vllm_importance_sampling_mode = {cfg.vllm_importance_sampling_mode!r} is not "
            "allowed with loss_type='vespo': it must be token_truncate or token_mask (as TRL requires)"
        )


def changes_sampling(changes) -> bool:
    """Whether config changes (field -> value) touch how the completions are sampled: a rollout field (a name that
    is no StepConfig field does not)."""
    fields = StepConfig.__dataclass_fields__
    return any(field in fields and StepConfig.phase_of(field) == "rollout" for field in changes)


def rollout_fields_refused(fields: list[str]) -> str:
    """Why a captured step refuses a change of how it sampled, in words, and what shows another value."""
    names = fields[0] if len(fields) == 1 else f"{', '.join(fields[:-1])} and {fields[-1]}"
    what = "is a rollout field" if len(fields) == 1 else "are rollout fields"
    return (
        f"{names} {what}: a capture's completions are the trainer's, kept as they were; to see another value, "
        "sample anew (python -m grpo_debug doctor CAPTURE --task FILE.py:NAME does, where it is a cause)"
    )
