"""Real TRL GRPOTrainer steps on the bundled model, on CPU, with the bridge's reward, config and trainer."""

import pytest
import torch
from trl import GRPOTrainer

from grpo_debug.advantages import summarize_advantages
from grpo_debug.capture.trl_bridge import PositionIdsGRPOTrainer, grpo_config, no_trl_switch, trl_trainer
from grpo_debug.chess.task import RookWorldReward, rookworld_task
from grpo_debug.config import StepConfig

SMALL = dict(num_prompts=2, num_generations=4, max_new_tokens=104)


def test_one_real_trl_step(tmp_path, scorer):
    cfg = StepConfig(**SMALL, beta=0.04)
    seen = []
    reward = RookWorldReward(scorer)

    def recording(prompts, completions, **kwargs):
        values = reward(prompts, completions)
        seen.append(torch.tensor(values))
        return values

    trainer = trl_trainer(cfg, str(tmp_path), rookworld_task(cfg.task, scorer))
    assert isinstance(trainer, PositionIdsGRPOTrainer)
    trainer.reward_funcs = [recording]
    trainer.reward_func_names = ["rookworld"]
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    logged = trainer.state.log_history[0]
    assert logged["grad_norm"] > 0 and abs(logged["loss"]) < 1e-4  # grpo at ratio 1: value ~0, gradient not 0
    assert logged["kl"] == 0.0  # dropout disabled: policy and reference score identically
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
    ours = summarize_advantages(seen[0], cfg.num_generations)
    assert logged["reward"] == pytest.approx(ours.reward, abs=1e-6)
    assert logged["reward_std"] == pytest.approx(ours.reward_std, abs=1e-6)
    assert logged["frac_reward_zero_std"] == pytest.approx(ours.frac_reward_zero_std)


def _sampler_and_recomputed(trainer_class, cfg, tmp_path, scorer):
    """Run one real step; return (sampler log-probs, TRL's recomputed log-probs, completion mask, prompt mask)."""
    from grpo_debug.capture.trl_bridge import prompt_dataset
    from grpo_debug.model import load_model

    loaded = load_model(cfg.model)
    record = {"logits": []}

    class Recording(trainer_class):
        def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *a, **kw):
            out = super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, *a, **kw)
            if "inputs" in record and "recomputed" not in record:  # the loss's own scoring pass
                record["recomputed"] = out[0].detach()
            return out

        def _compute_loss(self, model, inputs):
            record.setdefault("inputs", inputs)
            return super()._compute_loss(model, inputs)

    trainer = Recording(
        model=loaded.name,
        reward_funcs=[RookWorldReward(scorer)],
        train_dataset=prompt_dataset(cfg),
        args=grpo_config(cfg, str(tmp_path)),
        processing_class=loaded.tokenizer,
    )

    def keep_sampling_logits(module, args, kwargs, output):
        if record["generating"]:  # one forward per sampled token: its last position's logits
            record["logits"].append(output.logits[:, -1].detach().float())

    generate = trainer.model.generate

    def recording_generate(*args, **kwargs):
        record["generating"] = True
        try:
            record["sequences"] = generate(*args, **kwargs)
            return record["sequences"]
        finally:
            record["generating"] = False

    record["generating"] = False
    trainer.model.generate = recording_generate
    handle = trainer.model.register_forward_hook(keep_sampling_logits, with_kwargs=True)
    trainer.train()
    handle.remove()
    inputs = record["inputs"]
    prompt_ids, ids, cmask = inputs["prompt_ids"], inputs["completion_ids"], inputs["completion_mask"]
    logits = torch.stack(record["logits"], dim=1) / cfg.temperature  # (N, steps, V) in generation order
    generated = record["sequences"][:, -logits.shape[1] :]
    # TRL shuffles the generation batch before the loss: find each scored row's generation row
    order = [
        next(
            j
            for j in range(len(generated))
            if torch.equal(generated[j, : ids.shape[1]] * cmask[i], ids[i] * cmask[i])
            and torch.equal(record["sequences"][j, : prompt_ids.shape[1]], prompt_ids[i])
        )
        for i in range(len(ids))
    ]
    sampler = logits[order, : ids.shape[1]].log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    return sampler, record["recomputed"], cmask.bool(), inputs["prompt_mask"]


def test_bridge_trainer_scores_left_padded_gpt2_rows_as_they_were_sampled(tmp_path, scorer):
    cfg = StepConfig(**SMALL)  # the fixed preset: dropout off, position_ids on
    sampler, recomputed, mask, prompt_mask = _sampler_and_recomputed(PositionIdsGRPOTrainer, cfg, tmp_path, scorer)
    padded = (prompt_mask == 0).any(1)
    assert padded.any() and (~padded).any(), "the mixed prompts must put some rows behind left padding"
    gap = ((sampler - recomputed).abs() * mask).max(1).values
    print("bridge: max |sampler - recomputed| per row", [f"{g:.2e}" for g in gap.tolist()])
    assert gap.max() <= 1e-4


def test_trl_as_shipped_shifts_left_padded_rows(tmp_path, scorer):
    cfg = StepConfig(**SMALL, position_ids=False)
    sampler, recomputed, mask, prompt_mask = _sampler_and_recomputed(GRPOTrainer, cfg, tmp_path, scorer)
    padded = (prompt_mask == 0).any(1)
    gap = ((sampler - recomputed).abs() * mask).max(1).values
    print("TRL 1.16 GRPOTrainer: max |sampler - recomputed| per row (nats)", [f"{g:.2f}" for g in gap.tolist()])
    assert gap[padded].min() > 1.0, "left-padded rows scored at shifted positions"
    assert gap[~padded].max() <= 1e-4, "rows without padding are unaffected"


def test_pitfalls_trl_has_fixed_cannot_be_exported(tmp_path):
    with pytest.raises(ValueError, match="logprob_temperature"):
        grpo_config(StepConfig(logprob_temperature=False), str(tmp_path))
    with pytest.raises(ValueError, match="kl_estimator"):
        grpo_config(StepConfig(kl_estimator="k1"), str(tmp_path))
    assert no_trl_switch(StepConfig(mask="drop_eos_and_pad", gather="first_position")) == {
        "mask": "drop_eos_and_pad",
        "gather": "first_position",
    }
    assert no_trl_switch(StepConfig.preset("trl")) == {} and no_trl_switch(StepConfig()) == {}
    args = grpo_config(StepConfig(kl_estimator="k3_corrected", loss_type="dr_grpo"), str(tmp_path))
    assert args.use_bias_correction_kl and args.loss_type == "dr_grpo" and args.disable_dropout


def test_trl_preset_is_what_a_default_grpo_config_sets(tmp_path):
    defaults = GRPOConfig_defaults()
    trl = StepConfig.preset("trl")
    assert trl.loss_type == defaults.loss_type and trl.beta == defaults.beta
    assert (trl.kl_estimator == "k3_corrected") == defaults.use_bias_correction_kl
    assert trl.dropout == (not defaults.disable_dropout)
    assert defaults.bf16 and trl.dtype == "float32"  # TRL resolves bf16=None to True; the preset keeps float32
    assert trl.scale_rewards == defaults.scale_rewards and trl.epsilon_low == defaults.epsilon
    assert trl.epsilon_high == (defaults.epsilon_high or defaults.epsilon)
    from grpo_debug.capture.trl_bridge import SAME_NAME

    for name in SAME_NAME:
        if name not in ("loss_type", "beta", "scale_rewards", "epsilon_high"):
            assert getattr(trl, name) == getattr(defaults, name), name
    assert trl.gradient_accumulation_steps == defaults.gradient_accumulation_steps
    assert trl.micro_batches == defaults.steps_per_generation
    for name in ("mode", "clip_min", "clip_max"):
        key = f"vllm_importance_sampling_{name}"
        assert getattr(trl, key) == getattr(defaults, key), key
    # TRL's correction defaults to True but acts only with use_vllm=True; a default trainer does not correct
    assert defaults.vllm_importance_sampling_correction and not defaults.use_vllm
    assert not trl.vllm_importance_sampling_correction


def GRPOConfig_defaults():
    from trl import GRPOConfig

    return GRPOConfig(output_dir="unused", use_cpu=True)


def test_the_bridge_sets_no_deprecated_trl_or_transformers_field(tmp_path):
    """A deprecation warning from our code is a bug, wherever the library attributes it: transformers warns
    from its own __post_init__ when `gradient_checkpointing` is set, so pytest's module filter cannot see it."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = grpo_config(StepConfig(), str(tmp_path))
    deprecations = [str(w.message) for w in caught if issubclass(w.category, (DeprecationWarning, FutureWarning))]
    assert not deprecations, deprecations
    assert config.activation_checkpointing is False and config.gradient_checkpointing is False
