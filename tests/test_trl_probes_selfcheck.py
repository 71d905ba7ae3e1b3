"""Self-checks of the TRL probes in trl_probes.py: each one runs and has the properties TRL's code gives it."""

import math

import pytest
import torch
from trl_probes import LossProbe, trl_high_entropy_mask, trl_importance_sampling, trl_off_policy_mask

B, T = 5, 7
LENGTHS = [7, 3, 1, 5, 7]
TOKEN_MODES = ["token_truncate", "token_mask"]
SEQ_MODES = ["sequence_truncate", "sequence_mask"]
LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]


def right_padded_mask(lengths=LENGTHS, width=T):
    m = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        m[i, :n] = 1
    return m


def logps(seed, spread=0.6):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) * 2 - 0.1
    sampling = old + torch.randn(B, T, generator=g) * spread
    return old, sampling


def test_token_truncate_is_clamped_exp_on_masked_tokens_and_one_on_padding():
    old, sampling = logps(0)
    sampling[0, 0] = old[0, 0] - 2.0  # exp(2) > 3: the clip bites
    m = right_padded_mask()
    sampling_garbage = sampling.masked_fill(m == 0, 123.0)  # beyond each row's length: never read
    ratio, metrics = trl_importance_sampling(old, sampling_garbage, m, "token_truncate")
    assert ratio.shape == (B, T)
    expected = torch.clamp(torch.exp(old - sampling), max=3.0)
    b = m.bool()
    torch.testing.assert_close(ratio[b], expected[b])
    assert (ratio[~b] == 1.0).all()
    assert (ratio <= 3.0).all() and ratio[0, 0] == 3.0
    # metrics: over the masked tokens only
    delta = (old - sampling).abs()[b]
    assert metrics["sampling/sampling_logp_difference/mean"] == pytest.approx(delta.mean().item(), rel=1e-5)
    assert metrics["sampling/sampling_logp_difference/max"] == pytest.approx(delta.max().item(), rel=1e-5)
    assert metrics["sampling/importance_sampling_ratio/min"] == pytest.approx(expected[b].min().item(), rel=1e-5)
    assert metrics["sampling/importance_sampling_ratio/mean"] == pytest.approx(expected[b].mean().item(), rel=1e-5)
    assert metrics["sampling/importance_sampling_ratio/max"] == pytest.approx(3.0)


def test_token_mask_zeroes_exactly_the_out_of_bounds_tokens():
    old, sampling = logps(1)
    m = right_padded_mask()
    lo, hi = 0.7, 1.6
    ratio, metrics = trl_importance_sampling(old, sampling, m, "token_mask", clip_min=lo, clip_max=hi)
    raw = torch.exp((old - sampling) * m)  # padding: exp(0) = 1, inside the bounds
    out = (raw < lo) | (raw > hi)
    assert out.any() and (~out & m.bool()).any()
    assert (ratio[out] == 0).all()
    torch.testing.assert_close(ratio[~out], raw[~out])
    assert metrics["sampling/importance_sampling_ratio/min"] == 0.0


@pytest.mark.parametrize("mode", SEQ_MODES)
def test_sequence_modes_are_one_ratio_per_row(mode):
    old, sampling = logps(2, spread=0.3)
    m = right_padded_mask()
    lo, hi = 0.5, 2.0
    ratio, metrics = trl_importance_sampling(old, sampling, m, mode, clip_min=lo, clip_max=hi)
    assert ratio.shape == (B, 1)
    raw = torch.exp(((old - sampling) * m).sum(-1, keepdim=True))
    out = (raw < lo) | (raw > hi)
    assert out.any() and (~out).any()
    if mode == "sequence_truncate":
        torch.testing.assert_close(ratio, raw.clamp(lo, hi))
    else:
        assert (ratio[out] == 0).all()
        torch.testing.assert_close(ratio[~out], raw[~out])
    assert metrics["sampling/importance_sampling_ratio/mean"] == pytest.approx(ratio.mean().item(), rel=1e-5)


@pytest.mark.parametrize("mask_kind", ["hole", "all_short", "empty_row"])
def test_masks_not_built_from_lengths_go_through_tool_mask(mask_kind):
    old, sampling = logps(3)
    m = right_padded_mask()
    if mask_kind == "hole":
        m[0, 2] = 0
    elif mask_kind == "all_short":
        m = right_padded_mask([min(n, T - 2) for n in LENGTHS])
    else:
        m[1] = 0
    ratio, _ = trl_importance_sampling(old, sampling, m, "token_truncate")
    b = m.bool()
    torch.testing.assert_close(ratio[b], torch.exp(old - sampling).clamp(max=3.0)[b])
    assert (ratio[~b] == 1.0).all()
    seq, _ = trl_importance_sampling(old, sampling, m, "sequence_truncate", clip_max=1e9)
    torch.testing.assert_close(seq, torch.exp(((old - sampling) * m).sum(-1, keepdim=True)))


def test_nan_sampling_logp_gives_ratio_one_and_finite_metrics():
    old, sampling = logps(4)
    m = right_padded_mask()
    sampling[0, 1] = float("nan")
    ratio, metrics = trl_importance_sampling(old, sampling, m, "token_truncate")
    assert ratio[0, 1] == 1.0 and torch.isfinite(ratio).all()
    assert all(math.isfinite(v) for v in metrics.values())


def test_high_entropy_mask_keeps_top_quantile_of_masked_tokens_only():
    g = torch.Generator().manual_seed(5)
    ent = torch.rand(B, T, generator=g) * 3
    m = right_padded_mask()
    ent_padded_high = ent.masked_fill(m == 0, 100.0)  # padding must never be picked, however high
    sel = trl_high_entropy_mask(ent_padded_high, m, 0.2)
    assert sel.dtype == torch.bool and sel.shape == (B, T)
    assert not (sel & ~m.bool()).any()
    thr = torch.quantile(ent[m.bool()], 0.8)
    assert torch.equal(sel, (ent >= thr) & m.bool())
    assert trl_high_entropy_mask(ent, m, 1.0).sum() == m.sum()  # quantile 0: every masked token


def test_off_policy_mask_drops_only_negative_advantage_high_kl_rows():
    old, sampling = logps(6, spread=0.0)
    m = right_padded_mask()
    per_token = sampling.clone()
    per_token[[1, 2]] -= 1.0  # rows 1, 2: sampling - per_token = +1 on every token (high KL)
    adv = torch.tensor([-1.0, -1.0, 1.0, -1.0, 0.0])
    keep = trl_off_policy_mask(adv, per_token, sampling, m, threshold=0.5)
    assert keep.shape == (B, 1)
    assert keep.squeeze(1).tolist() == [1.0, 0.0, 1.0, 1.0, 1.0]
    assert torch.equal(keep, trl_off_policy_mask(adv[:, None], per_token, sampling, m, threshold=0.5))


def _loss_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    m = right_padded_mask()
    old = -torch.rand(B, T, generator=g) * 2 - 0.1
    per_token = (old + torch.randn(B, T, generator=g) * 0.1).requires_grad_(True)
    sampling = old + torch.randn(B, T, generator=g) * 0.3
    adv = torch.tensor([1.0, -0.5, 0.7, -1.2, 0.3])
    ent = torch.rand(B, T, generator=g)
    return m, old, per_token, sampling, adv, ent


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("mode", TOKEN_MODES + SEQ_MODES)
def test_loss_probe_with_importance_sampling_ratio_and_accumulation(loss_type, mode):
    if loss_type == "vespo" and mode in SEQ_MODES:
        pytest.skip("GRPOTrainer refuses vespo with sequence-level vLLM IS")
    m, old, per_token, sampling, adv, ent = _loss_inputs(7)
    ratio, _ = trl_importance_sampling(old, sampling, m, mode, clip_min=0.5)
    level = "sequence" if loss_type == "luspo" else "token"
    probe = LossProbe(
        loss_type=loss_type,
        grad_accum=4,
        steps_per_generation=4,
        max_completion_length=T,
        epsilon_high=0.28,
        importance_sampling_level=level,
    )
    loss, metrics = probe.loss(
        per_token,
        adv,
        m,
        old_per_token_logps=old,
        entropies=ent,
        sampling_per_token_logps=sampling,
        importance_sampling_ratio=ratio,
    )
    assert probe.use_vllm and probe.vllm_importance_sampling_correction
    assert torch.isfinite(loss)
    (grad,) = torch.autograd.grad(loss, per_token)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0
    assert (grad[m == 0] == 0).all()
    assert "entropy" in metrics


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo"])
def test_loss_probe_multiplies_per_token_loss_by_the_ratio(loss_type):
    m, old, per_token, sampling, adv, ent = _loss_inputs(8)
    probe = LossProbe(loss_type=loss_type, grad_accum=4, steps_per_generation=4, max_completion_length=T)
    plain, _ = probe.loss(per_token, adv, m, old_per_token_logps=old)
    assert not probe.use_vllm
    doubled, _ = probe.loss(
        per_token, adv, m, old_per_token_logps=old, importance_sampling_ratio=torch.full((B, T), 2.0)
    )
    torch.testing.assert_close(doubled, 2 * plain)
    again, _ = probe.loss(per_token, adv, m, old_per_token_logps=old)  # turned back off
    assert not probe.use_vllm
    torch.testing.assert_close(again, plain)


def test_vespo_reads_the_ratio():
    m, old, per_token, sampling, adv, ent = _loss_inputs(9)
    probe = LossProbe(loss_type="vespo", max_completion_length=T)
    plain, _ = probe.loss(per_token, adv, m, old_per_token_logps=old)
    ratio, _ = trl_importance_sampling(old, sampling, m, "token_truncate")
    with_is, _ = probe.loss(per_token, adv, m, old_per_token_logps=old, importance_sampling_ratio=ratio)
    assert torch.isfinite(with_is) and not torch.isclose(plain, with_is)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_loss_probe_every_option_at_once(loss_type, level):
    """delta, off-policy mask (reading sampling_per_token_logps), top-entropy quantile, entropy bonus
    (reads accelerator.sync_gradients), beta with the bias-corrected KL, eval mode."""
    m, old, per_token, sampling, adv, ent = _loss_inputs(10)
    ratio, _ = trl_importance_sampling(old, sampling, m, "token_mask", clip_min=0.5)
    for training in (True, False):
        probe = LossProbe(
            loss_type=loss_type,
            beta=0.04,
            delta=1.5,
            importance_sampling_level=level,
            grad_accum=4,
            steps_per_generation=4,
            max_completion_length=T,
            training=training,
            top_entropy_quantile=0.5,
            off_policy_mask_threshold=0.05,
            entropy_coef=0.01,
        )
        loss, metrics = probe.loss(
            per_token,
            adv,
            m,
            old_per_token_logps=old,
            ref_per_token_logps=old - 0.1,
            entropies=ent,
            sampling_per_token_logps=sampling,
            importance_sampling_ratio=ratio,
        )
        assert torch.isfinite(loss)
        (grad,) = torch.autograd.grad(loss, per_token)
        assert torch.isfinite(grad).all() and grad.abs().sum() > 0
        assert "kl" in metrics and "policy_loss" in metrics
        assert ("entropy_coef" in metrics) == training
