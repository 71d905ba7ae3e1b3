"""Every pitfall the suite knows, declared once: what it is called, the `StepConfig` field that flips it on a
step (and the value that removes it), the value TRL 1.16 computes where TRL has no switch for it, the widget
panel that offers it, the fix a TRL user writes, where it comes from, and the notebook section that teaches it.

Read by: the `trl` preset (`presets.py`: TRL's values), the TRL bridge and capture reading (through that
preset: a field TRL cannot switch is TRL's value on a capture, and refused in a `GRPOConfig` otherwise), the
widgets (`ui/widgets.py`: each panel's toggles), the doctor (`doctor/`: one detector per entry, named by its id;
each toggle flipped on the user's step) and the README's table (`markdown_table`). Torch-free, like `choices`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pitfall:
    id: str
    title: str
    fix: str  # the GRPOConfig / model / reward change that removes it, in TRL's names
    origin: str  # where it comes from: a bug report, a TRL issue or PR, a paper
    teach: str  # notebook and section that show it
    toggle: tuple[str, object] | None = None  # (StepConfig field, the value that removes it)
    trl_value: object = None  # that field's value in what TRL 1.16 computes by default, where it is not the fix
    panel: str | None = None  # the widget panel that offers the toggle: "pitfalls" or "off_policy"
    fix_without_vllm: str | None = None  # the fix for a run that did not sample with vLLM, where `fix` is vLLM's
    fix_also: tuple[tuple[str, object], ...] = ()  # what `fix` also changes (rollout fields: a new rollout)
    fix_scales: tuple[str, float] | None = None  # (field, factor): the differential's fix multiplies this field

    def scaled(self, config) -> dict:
        """{field: its value in `config` times the factor} (`fix_scales`), in the field's own type."""
        field, factor = self.fix_scales
        value = getattr(config, field)
        return {field: type(value)(value * factor)}

    def fix_for(self, uses_vllm: bool) -> str:
        """The fix that applies to a run: vLLM's settings only where it sampled with vLLM."""
        return self.fix if uses_vllm or self.fix_without_vllm is None else self.fix_without_vllm


def _p(id, title, fix, origin, teach, toggle=None, trl_value=None, panel=None, **fixes) -> Pitfall:
    return Pitfall(id, title, fix, origin, teach, toggle, trl_value, panel, **fixes)


PITFALLS: dict[str, Pitfall] = {
    p.id: p
    for p in (
        _p(
            "zero_std_groups",
            "groups whose rewards are all equal get advantage 0: no gradient from them",
            "raise num_generations or temperature, make the reward graded, or filter such prompts",
            "'loss is 0.0000' reports (TRL issues #3452, #2703, #3857): the real cause was frac_reward_zero_std = 1",
            "04_advantages: Zero-std groups still shape the loss; 08_diagnostics",
            fix_scales=("num_generations", 2),  # sampled anew: do larger groups tell their completions apart?
        ),
        _p(
            "constant_reward",
            "a reward function is constant within every group: it adds nothing to any advantage",
            "fix or drop that reward function (or give it reward_weights 0 and say so)",
            "a reward function that always returns the same value (a format check every completion passes or fails)",
            "03_rewards",
        ),
        _p(
            "dominant_reward",
            "one reward function carries most of the advantages' within-group variance",
            "multi_objective_aggregation='normalize_then_sum' (each function normalised within its group before the "
            "sum), or rescale reward_weights, if the other functions were meant to count",
            "multi-reward runs where one graded term drowns binary ones",
            "03_rewards",
            ("multi_objective_aggregation", "normalize_then_sum"),
        ),
        _p(
            "length_reward",
            "the reward rises with completion length, beyond what chance gives at the step's size: longer is paid",
            "remove the length dependence, or cap it (a soft overlong penalty, DAPO)",
            "length hacking under GRPO (Dr. GRPO, DAPO's overlong reward shaping)",
            "03_rewards; 05_loss (loss types normalise by length differently)",
        ),
        _p(
            "bad_reward",
            "rewards that are None, NaN or infinite",
            "return a float for every completion; None only where the function does not apply",
            "TRL gives a completion whose every function returned None the reward NaN and warns on inf",
            "03b_stockfish: Malformed completions get documented scores, not exceptions",
        ),
        _p(
            "rewards_not_own",
            "the rewards are not the completions' own: recomputed, rescored or reordered, they change",
            "make each reward a function of its completion (and its dataset row) alone: no randomness, no state kept "
            "between calls, no dependence on a row's position in the batch; the functions given must be the run's",
            "a reward that reads the wrong row, keeps a counter or samples a judge at a temperature; a recomputation "
            "that is not the step the trainer took",
            "03_rewards",
        ),
        _p(
            "truncation",
            "completions stop at max_completion_length without an EOS",
            "raise max_completion_length, or mask_truncated_completions=True (DAPO's overlong filtering)",
            "DAPO; TRL's mask_truncated_completions",
            "01_rollout; 02_logprobs",
            ("mask_truncated_completions", True),
            fix_scales=("max_new_tokens", 4),  # a rollout field: where the step can sample anew
        ),
        _p(
            "eos_masked",
            "the EOS token is masked out of the loss (pad == eos and a mask built from token values)",
            "build the completion mask from lengths, keeping the first EOS (TRL does since PR #4970)",
            "the temperature-and-mask bug report's fix (it masks the EOS too); TRL PR #4970",
            "02_logprobs: The EOS when pad == eos",
            ("mask", "keep_first_eos"),
            panel="pitfalls",
        ),
        _p(
            "temperature",
            "sampled at temperature T, scored at T = 1",
            "divide the logits by the sampling temperature before log_softmax (TRL does since v0.16, PR #3029)",
            "the temperature-and-mask bug report; TRL issue #4159 (the IS ratio at 2.0 with temperature)",
            "02_logprobs",
            ("logprob_temperature", True),
            panel="pitfalls",
        ),
        _p(
            "dropout",
            "dropout is on in the policy's forward passes: two scorings of the same tokens differ",
            "disable_dropout=True in GRPOConfig (TRL 1.16's default is False)",
            "a public RookWorld debug log (policy -440 vs reference -45 nats); TRL issue #3234",
            "02_logprobs; 02b_trl_rows: Which rows TRL 1.16 gets wrong, and why",
            ("dropout", False),
            trl_value=True,  # disable_dropout=False
            panel="pitfalls",
            fix_also=(("sample_dropout", False),),  # disable_dropout also samples in eval mode
        ),
        _p(
            "position_ids",
            "absolute positions, left-padded prompts, no position_ids when scoring: rows scored at shifted positions",
            "train with grpo_debug.capture.trl_bridge.PositionIdsGRPOTrainer, a GRPOTrainer whose scoring forward "
            "passes position_ids = attention_mask.cumsum(-1) - 1",
            "TRL issue #6800 (GPT-2 without position_ids)",
            "02_logprobs; 02b_trl_rows: Which rows TRL 1.16 gets wrong, and why",
            ("position_ids", True),
            trl_value=False,  # TRL scores with input_ids and attention_mask only
            panel="pitfalls",
        ),
        _p(
            "sampler_truncation",
            "top_p / top_k / min_p sampling: the samples come from a truncated distribution the loss does not score",
            "score over the sampler's support (TRL PR #7269), or sample with top_p=1.0, top_k=0",
            "TRL issues #6789, #4772; PR #7269",
            "05c_mismatch: 2. Truncated sampling",
            ("logprob_support", "sampler_support"),
        ),
        _p(
            "identical_groups",
            "every completion of a group is the same text: truncated or cold sampling leaves nothing to rank",
            "sample with top_p=1.0, top_k=0 and temperature >= 1.0 (TRL's defaults), or raise num_generations",
            "a user's run with top_p 0.5: every group 8 identical completions, blamed on a correct reward",
            "01_rollout; 04_advantages: Zero-std groups still shape the loss",
            fix_also=(("top_p", 1.0), ("top_k", 0), ("min_p", None), ("temperature", 1.0)),  # sampled anew
        ),
        _p(
            "sampler_mismatch",
            "the sampler's log-probs drift from the trainer's (verl's rollout-correction health check)",
            "vllm_importance_sampling_correction=True, or sample at the trainer's precision",
            "verl docs/algo/rollout_corr.md; TRL issues #4772, #5231",
            "05c_mismatch: 1. The gap, as verl measures it; 4. Length times drift",
            ("vllm_importance_sampling_correction", True),
            panel="off_policy",
            fix_without_vllm="without vLLM the sampler is the trainer's own model: the gap is how the trainer "
            "scores (dropout on, positions, precision); fix the findings it is a symptom of",
        ),
        _p(
            "sequence_ratio_sum",
            "the sequence-level sampler ratio sums its tokens' log-ratios: it drifts from 1 with length, and the "
            "cap masks or clamps long completions whose tokens agree",
            "a mean over the sequence's tokens (TRL PR #5815); until then vllm_importance_sampling_mode='token_*'",
            "TRL issue #5814 (IS ratio mean 0.57 with sum, 0.99 with mean on one run); #4772's length x drift; "
            "GSPO's 1/|y|",
            "05c_mismatch: 6. The sequence ratio: a sum or a mean",
            ("vllm_importance_sampling_aggregation", "mean"),
            trl_value="sum",
            panel="off_policy",
        ),
        _p(
            "precision",
            "the sampler runs at another precision than the trainer",
            "sample and score at one precision, or correct with vllm_importance_sampling_correction=True",
            "TRL issues #5231, #6789; verl's rollout correction",
            "05c_mismatch: 3. The sampler and the trainer at different precisions",
            ("vllm_importance_sampling_correction", True),
            panel="off_policy",
            fix_without_vllm="sample and score at one precision (the model's dtype for both, or bf16=False)",
        ),
        _p(
            "kl_off",
            "beta = 0: no reference model, no KL term (the logged kl is 0)",
            "beta > 0 (e.g. 0.04) if the policy should stay near the reference",
            "TRL issue #4040; TRL's default beta=0.0 since 0.19",
            "05_loss: KL estimators",
        ),
        _p(
            "kl_estimator",
            "the KL estimator's value and gradient differ from the KL's",
            "use_bias_correction_kl=True (k3 times the ratio: the reverse-KL gradient)",
            "Tang & Munos 2025, 'On a few pitfalls in KL divergence gradient estimation for RL'",
            "05d_kl_estimators: The four estimators; 05d_kl_estimators: Per-token KL on real tokens",
            ("kl_estimator", "k3_corrected"),
            panel="pitfalls",
        ),
        _p(
            "clip_inactive",
            "the PPO clip never acts: the ratio is 1 on the step's first pass",
            "nothing to fix at num_iterations=1; clipping acts from the second pass or with a mismatched sampler",
            "'why is clip_ratio always 0?'",
            "05b_off_policy: The ratio, per pass",
        ),
        _p(
            "clip_saturated",
            "a large share of tokens is clipped: their gradient is cut",
            "lower learning_rate or num_iterations, or widen epsilon / epsilon_high",
            "PPO practice; DAPO's clip-higher",
            "05b_off_policy: The ratio, per pass",
        ),
        _p(
            "entropy_collapse",
            "the policy's token entropy is near 0: every sample of a group is (nearly) the same",
            "raise temperature, add an entropy bonus, or lower the learning rate",
            "entropy collapse in RL for LLMs (Cui et al. 2025)",
            "05b_off_policy: Entropy, and training on the high-entropy tokens only",
        ),
        _p(
            "advantage_scale",
            "tiny reward stds divided into the advantages blow noise up (phantom advantages)",
            "scale_rewards='batch' or 'none' (Dr. GRPO)",
            "TRL's std + 1e-4; Dr. GRPO",
            "04b_std_traps: Phantom advantages, on purpose",
            ("scale_rewards", "none"),
            panel="pitfalls",
        ),
        _p(
            "large_advantages",
            "advantages far above the unit scale group normalisation gives: rewards in their own units, undivided",
            "scale_rewards='group' or 'batch', or rescale the rewards (reward_weights) toward unit size",
            "scale_rewards='none' (Dr. GRPO) with rewards in the hundreds: the loss, its gradient and its clipping grow "
            "with them",
            "04_advantages",
            ("scale_rewards", "group"),
        ),
        _p(
            "update_size",
            "one update moves the policy far on its own completions (KL per token between before and after)",
            "lower learning_rate, or keep max_grad_norm on",
            "PPO/GRPO practice (a trust region per step); the tiers: data/calibration/update_size.json",
            "06_update",
            fix_scales=("learning_rate", 0.1),  # an update field: on the same completions, a capture's too
        ),
        _p(
            "grad_clipped",
            "grad_norm far above max_grad_norm: most of the gradient's length is clipped away every step",
            "find what makes the gradient large (the causes ranked above it: advantages, learning rate); a clip that "
            "always acts sets the step's size, not the loss",
            "TRL logs grad_norm before clipping; max_grad_norm=1.0 is its default",
            "06_update",
            ("max_grad_norm", 0.0),  # flipped: the update without the clip, under the trainer's optimizer
        ),
        _p(
            "kl_blowup",
            "the policy has moved far from its reference (KL per token), over the steps before this one",
            "lower learning_rate or raise beta, and resume from a checkpoint before the KL grew",
            "TRL logs kl every step; a run at learning_rate 0.1 went 0 -> 0.16 -> 1.36 nats in three steps",
            "05_loss: KL estimators",
        ),
        _p(
            "loss_normaliser",
            "dr_grpo divides by max_completion_length, far above the real lengths: every gradient is shrunk",
            "lower max_completion_length toward the real lengths, or loss_type='dapo'",
            "Dr. GRPO's constant normaliser; TRL's dr_grpo",
            "05b_off_policy: Micro-batches and their normalisers",
            ("loss_type", "dapo"),
            panel="pitfalls",
        ),
        _p(
            "signal_lost",
            "the learning signal is lost at one stage of the step (samples, rewards, advantages, tokens, loss, "
            "parameters, update), whatever the cause",
            "change the setting the finding traces at that stage (its `fix` says which)",
            "the doctor's signal path: a step that learns nothing for a cause no other entry names",
            "10_doctor",
        ),
    )
}


def markdown_table() -> str:
    """The catalogue as the README's table (`tests/test_doctor.py` checks the README holds it as written here)."""
    rows = [
        "| finding | what | flipped on your step by | fix (TRL's names) | from | learn |",
        "|---|---|---|---|---|---|",
    ]
    for p in PITFALLS.values():
        toggle = "" if p.toggle is None else f"`{p.toggle[0]}={p.toggle[1]}`"
        cells = [f"`{p.id}`", p.title, toggle, p.fix, p.origin, p.teach]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


def trl_values() -> dict[str, object]:
    """{StepConfig field: TRL 1.16's value} for every pitfall TRL has by default: the `trl` preset's pitfalls."""
    return {p.toggle[0]: p.trl_value for p in PITFALLS.values() if p.toggle and p.trl_value is not None}


def panel_fields(panel: str) -> list[str]:
    """The StepConfig fields whose pitfalls the widget `panel` offers, in catalogue order, each once."""
    return list(dict.fromkeys(p.toggle[0] for p in PITFALLS.values() if p.toggle and p.panel == panel))
