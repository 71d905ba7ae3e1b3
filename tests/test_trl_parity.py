"""Our advantages and losses against TRL 1.16's own code paths, on identical tensors."""

import pytest
import torch
from trl_probes import AdvProbe, LossProbe

from grpo_debug.advantages import advantages_of, compute_advantages, summarize_advantages
from grpo_debug.config import StepConfig
from grpo_debug.loss import compute_loss


def _batch(seed=0, N=8, T=12, off_policy=True):
    g = torch.Generator().manual_seed(seed)
    logps = -torch.rand(N, T, generator=g) * 3
    old = logps + 0.3 * torch.randn(N, T, generator=g) if off_policy else None
    ref = logps + 0.5 * torch.randn(N, T, generator=g)
    lengths = torch.randint(1, T + 1, (N,), generator=g)
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).float()
    advantages = torch.randn(N, generator=g)
    return logps, old, ref, advantages, mask


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("kl_estimator", ["k3", "k3_corrected"])
@pytest.mark.parametrize("off_policy", [True, False])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_loss_and_gradient_match_trl(loss_type, kl_estimator, off_policy, beta):
    logps, old, ref, advantages, mask = _batch(off_policy=off_policy)
    ours_in = logps.clone().requires_grad_(True)
    ours = compute_loss(
        ours_in,
        old,
        ref,
        advantages,
        mask,
        loss_type=loss_type,
        beta=beta,
        kl_estimator=kl_estimator,
        epsilon_low=0.2,
        epsilon_high=0.28,
        max_completion_length=16,
    )
    ours.loss.backward()
    trl_in = logps.clone().requires_grad_(True)
    probe = LossProbe(
        loss_type=loss_type,
        beta=beta,
        epsilon=0.2,
        epsilon_high=0.28,
        max_completion_length=16,
        use_bias_correction_kl=kl_estimator == "k3_corrected",
    )
    trl_loss, trl_metrics = probe.loss(
        trl_in, advantages, mask, old_per_token_logps=old, ref_per_token_logps=ref if beta else None
    )
    trl_loss.backward()
    assert abs(ours.loss.item() - trl_loss.item()) <= 1e-6
    assert torch.allclose(ours_in.grad, trl_in.grad, atol=1e-6, rtol=0)
    for name, value in trl_metrics.items():
        if name != "entropy":
            assert ours.metrics[name] == pytest.approx(value, abs=1e-6), name
    assert torch.allclose(ours.per_sample_loss.sum(), ours.loss)
    assert torch.allclose(ours.policy_loss + ours.kl_loss, ours.loss, atol=1e-6)


REWARDS = [
    torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.2, 0.9, -0.3, 0.4]),
    torch.randn(64, generator=torch.Generator().manual_seed(1)),
    torch.tensor([0.3, 0.3, 0.3001, 0.3, 1.0, -1.0, 1.0, -1.0]),
]


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
@pytest.mark.parametrize("case", range(len(REWARDS)))
def test_advantages_and_metrics_match_trl(scale_rewards, case):
    rewards, G = REWARDS[case], 4
    trl_adv, trl_metrics = AdvProbe(rewards, G, scale_rewards=scale_rewards).advantages()
    ours = compute_advantages(rewards, G, scale_rewards)
    assert torch.allclose(ours, trl_adv, atol=1e-6, rtol=0)
    summary = summarize_advantages(rewards, G, scale_rewards)
    for name in ["reward", "reward_std", "frac_reward_zero_std"]:
        assert summary.__getattribute__(name) == pytest.approx(trl_metrics[name], abs=1e-6), name


def test_nan_rewards_follow_trl():
    rewards = torch.tensor([1.0, float("nan"), 0.0, 1.0, 0.2, 0.4, 0.6, 0.8])
    trl_adv, _ = AdvProbe(rewards, 4).advantages()
    assert torch.allclose(compute_advantages(rewards, 4), trl_adv, atol=1e-6)
    assert compute_advantages(rewards, 4)[1] == 0.0


NAN = float("nan")
PER_FUNCTION = [  # (N, F) per-function rewards, NaN where a function returned None
    torch.tensor(
        [[1.0, 900.0], [0.0, 1000.0], [1.0, 1100.0], [0.0, 950.0], [0.5, 3.0], [0.5, 4.0], [0.2, 4.0], [0.9, 3.0]]
    ),  # fmt: skip
    torch.tensor([[1.0, NAN], [NAN, NAN], [0.0, 2.0], [1.0, 2.0], [0.2, 0.0], [0.4, NAN], [0.6, 1.0], [0.8, 1.0]]),
    torch.randn(16, 3, generator=torch.Generator().manual_seed(2)),
]


@pytest.mark.parametrize("case", range(len(PER_FUNCTION)))
@pytest.mark.parametrize("weights", [None, [1.0, 0.25, 2.0]])
def test_normalize_then_sum_and_unscorable_rows_match_trl(case, weights):
    """TRL's multi_objective_aggregation="normalize_then_sum", and a completion every function returned None for
    (its reward NaN, out of its group's baseline, advantage 0) under both aggregations, on TRL's own code."""
    from grpo_debug.advantages import normalize_then_sum
    from grpo_debug.config import StepConfig
    from grpo_debug.rewards import Rewards

    per_function, G = PER_FUNCTION[case], 4
    w = torch.ones(per_function.shape[1]) if weights is None else torch.tensor(weights[: per_function.shape[1]])
    total = (per_function * w).nansum(1)
    total[per_function.isnan().all(1)] = NAN  # what compute_rewards hands the advantages
    rewards = Rewards(total, {}, [], 0.0, {f"f{k}": per_function[:, k] for k in range(per_function.shape[1])})
    for aggregation in ("sum_then_normalize", "normalize_then_sum"):
        trl_adv, trl_metrics = AdvProbe(
            per_function, G, reward_weights=w.tolist(), multi_objective_aggregation=aggregation
        ).advantages()
        cfg = StepConfig(num_generations=G, multi_objective_aggregation=aggregation)
        ours = advantages_of(cfg, rewards, tuple(w.tolist()))
        assert torch.allclose(ours.values, trl_adv, atol=1e-5, rtol=1e-5), f"{aggregation}: advantages differ"
        for name in ["reward", "reward_std", "frac_reward_zero_std"]:
            assert getattr(ours, name) == pytest.approx(trl_metrics[name], abs=1e-5), f"{aggregation}: {name}"
    if per_function.isnan().all(1).any():
        assert (normalize_then_sum(per_function, w, G)[per_function.isnan().all(1)] == 0).all()


def test_std_floor_tames_phantom_advantages():
    rewards = torch.tensor([0.3, 0.3, 0.3001, 0.3, 1.0, -1.0, 1.0, -1.0])
    summary = summarize_advantages(rewards, 4)
    # a reward difference of 1e-4 (noise) gets an advantage of the same order as a real win/loss split
    assert summary.phantom_groups == [0] and summary.values[2] > 0.4 and summary.values[4] > 0.8
    floored = compute_advantages(rewards, 4, std_floor=0.1)
    assert floored[:4].abs().max() < 0.01
    assert torch.allclose(floored[4:], compute_advantages(rewards, 4)[4:])


def test_zero_std_groups_have_no_signal():
    rewards = torch.tensor([0.5] * 4 + [0.0, 1.0, 0.0, 1.0])
    summary = summarize_advantages(rewards, 4)
    assert summary.zero_std_groups == [0] and summary.frac_reward_zero_std == 0.5
    assert torch.equal(summary.values[:4], torch.zeros(4))


@pytest.fixture(scope="module")
def trl_step():
    from grpo_debug.step import GRPOStep

    cfg = StepConfig.preset("trl", num_prompts=2, num_generations=4)
    step = GRPOStep(cfg)
    step.run(cfg, until="logprobs")
    return step


def test_trl_preset_logps_are_trl_own_scoring(trl_step):
    """The step's log-probs under the trl preset (dropout aside: see the next test) against TRL 1.16's real
    `_get_per_token_logps_and_entropies`, on the step's cached rollout."""
    from trl_probes import trl_per_token_logps

    cfg = trl_step.cfg.replace(dropout=False)
    run = trl_step.run(cfg, until="logprobs")
    r, ours = run.rollout, run.logprobs
    trl_logps, _ = trl_per_token_logps(
        trl_step.policy,
        r.prompt_ids,
        r.prompt_mask,
        r.completion_ids,
        ours.mask,
        cfg.temperature,
        batch_size=cfg.num_generations,
    )
    mask = ours.mask.bool()
    assert ((ours.policy - trl_logps).abs() * mask).max() <= 1e-5
    padded = (r.prompt_mask == 0).any(1)
    gap = ((r.sampler_logps_temperature_only - trl_logps).abs() * mask).max(1).values
    assert gap[padded].min() > 1.0 and ours.max_sampler_gap > 1.0  # TRL's own scoring shifts the padded rows


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_trl_preset_dropout_is_trl_train_mode_forward(trl_step, dtype):
    """Dropout on (and bf16 autocast, TRL's resolved default): the same computation as TRL's train-mode
    forward, with the same seed and the same batch shape (dropout masks and bf16 rounding depend on both)."""
    from trl_probes import trl_per_token_logps

    from grpo_debug.logprobs import completion_mask
    from grpo_debug.scoring import Scoring, per_token_logps

    cfg, r = trl_step.cfg, trl_step.result.rollout
    mask = completion_mask(r, cfg.mask)
    trl_logps, _ = trl_per_token_logps(
        trl_step.policy,
        r.prompt_ids,
        r.prompt_mask,
        r.completion_ids,
        mask,
        cfg.temperature,
        bf16=dtype == "bfloat16",
        train=True,
        seed=7,
    )
    torch.manual_seed(7)
    with torch.no_grad():
        ours = per_token_logps(
            trl_step.policy, r, Scoring(temperature=cfg.temperature, position_ids=False, dropout=True, dtype=dtype)
        )
    assert ((ours - trl_logps).abs() * mask).max() <= 1e-5


def test_phantom_groups_only_where_a_tiny_std_divides():
    rewards = torch.tensor([0.3, 0.3, 0.3001, 0.3, 1.0, -1.0, 1.0, -1.0])
    assert summarize_advantages(rewards, 4, "group").phantom_groups == [0]
    assert summarize_advantages(rewards, 4, "none").phantom_groups == []  # nothing is divided
    assert summarize_advantages(rewards, 4, "batch").phantom_groups == []  # the batch std is large
    assert summarize_advantages(rewards, 4, "group", std_floor=0.1).phantom_groups == []


def test_identical_rewards_whose_std_rounds_above_zero_are_named_and_trl_divides_by_them():
    # eight float32 copies of 0.7314049: their mean rounds, the std is 6.4e-8 > isclose's atol 1e-8; 0.5 is exact
    rewards = torch.tensor([0.7314049005508423] * 8 + [0.5] * 8)
    trl_adv, trl_metrics = AdvProbe(rewards, 8).advantages()
    summary = summarize_advantages(rewards, 8)
    assert summary.frac_reward_zero_std == trl_metrics["frac_reward_zero_std"] == 0.5  # TRL counts one group as varied
    assert summary.zero_std_groups == [1] and summary.rounding_std_groups == [0]
    assert torch.allclose(summary.values, trl_adv, atol=1e-6, rtol=0) and trl_adv[:8].abs().max() > 1e-4
    varied = summarize_advantages(torch.tensor([0.3, 0.3, 0.3001, 0.3, 1.0, -1.0, 1.0, -1.0]), 4)
    assert varied.rounding_std_groups == []  # a real (tiny) difference is a phantom group, not rounding


def test_batch_scaling_reports_no_zero_std_while_a_group_has_zero_advantage():
    rewards = torch.tensor([0.5] * 4 + [0.0, 1.0, 0.0, 1.0])
    summary = summarize_advantages(rewards, 4, "batch")
    trl_adv, trl_metrics = AdvProbe(rewards, 4, scale_rewards="batch").advantages()
    assert summary.frac_reward_zero_std == trl_metrics["frac_reward_zero_std"] == 0.0  # TRL's definition
    assert summary.zero_std_groups == [0] and torch.equal(trl_adv[:4], torch.zeros(4))  # yet no signal
