"""One real TRL GRPOTrainer step on the bundled model, on CPU, with the bridge's reward and config."""

import pytest
import torch

from grpo_debug.advantages import summarize_advantages
from grpo_debug.config import StepConfig
from grpo_debug.trl_bridge import grpo_config, rookworld_reward, trl_trainer


def test_one_real_trl_step(tmp_path, scorer):
    cfg = StepConfig(num_prompts=2, num_generations=4, max_new_tokens=104, beta=0.04)
    seen = []
    reward = rookworld_reward(scorer)

    def recording(prompts, completions, **kwargs):
        values = reward(prompts, completions)
        seen.append(torch.tensor(values))
        return values

    trainer = trl_trainer(cfg, str(tmp_path), scorer)
    trainer.reward_funcs = [recording]
    trainer.reward_func_names = ["rookworld"]
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    logged = trainer.state.log_history[0]
    assert logged["grad_norm"] > 0 and abs(logged["loss"]) < 1e-4  # ratio 1 at step 0, gradient not 0
    assert logged["kl"] == 0.0  # dropout disabled: policy and reference score identically
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
    ours = summarize_advantages(seen[0], cfg.num_generations)
    assert logged["reward"] == pytest.approx(ours.reward, abs=1e-6)
    assert logged["reward_std"] == pytest.approx(ours.reward_std, abs=1e-6)
    assert logged["frac_reward_zero_std"] == pytest.approx(ours.frac_reward_zero_std)


def test_pitfalls_trl_has_fixed_cannot_be_exported(tmp_path):
    with pytest.raises(ValueError, match="logprob_temperature"):
        grpo_config(StepConfig(logprob_temperature=False), str(tmp_path))
    with pytest.raises(ValueError, match="kl_estimator"):
        grpo_config(StepConfig(kl_estimator="k1"), str(tmp_path))
    args = grpo_config(StepConfig(kl_estimator="k3_corrected", loss_type="dr_grpo"), str(tmp_path))
    assert args.use_bias_correction_kl and args.loss_type == "dr_grpo" and args.disable_dropout
