"""Every loss TRL 1.16 offers, off-policy: our `compute_loss` against TRL's real `_compute_loss`.

Identical tensors in, values and gradients (d loss / d per-token log-probs) out, within 1e-6: every
`loss_type`, token and sequence importance levels, mu = 1 (old log-probs None: ratio exactly 1) and
mu = 2 (old log-probs from before an update: ratio != 1, clipping active), gradient accumulation 1 and 4
(the generation batch split into micro-batches, each normalised as TRL normalises it), `delta`, the
off-policy mask, the top-entropy mask, the entropy bonus, and every sampler importance-sampling mode.
"""

import pytest
import torch
from trl_probes import LossProbe, trl_high_entropy_mask, trl_importance_sampling, trl_off_policy_mask

from grpo_debug.choices import SAMPLER_CORRECTION_MODES, TRL_LOSS_TYPES
from grpo_debug.loss import compute_loss, high_entropy_mask, off_policy_mask
from grpo_debug.sampler import sampler_importance_ratio, sampler_metrics

N, T = 16, 10


def generation_batch(seed: int = 0, off_policy: bool = True):
    """Per-token log-probs of a generation batch of N rows (right-padded), as after one update: old and
    current differ by ~0.4 nats, the sampler by ~0.2 more."""
    g = torch.Generator().manual_seed(seed)
    logps = -torch.rand(N, T, generator=g) * 3
    old = logps + 0.4 * torch.randn(N, T, generator=g) if off_policy else None
    sampler = (logps if old is None else old) + 0.2 * torch.randn(N, T, generator=g)
    ref = logps + 0.5 * torch.randn(N, T, generator=g)
    lengths = torch.randint(1, T + 1, (N,), generator=g)
    lengths[0] = T
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).float()
    advantages = torch.randn(N, generator=g)
    entropies = torch.rand(N, T, generator=g) * 2
    return dict(logps=logps, old=old, sampler=sampler, ref=ref, mask=mask, advantages=advantages, entropies=entropies)


def run_both(b, spec: dict, ga: int = 1, sampler_mode: str | None = None, beta: float = 0.0):
    """Sum over the GA micro-batches of each side's loss, its gradient, and each side's metrics per micro-batch."""
    ratio = None
    if sampler_mode is not None:
        old = b["logps"] if b["old"] is None else b["old"]
        ratio = sampler_importance_ratio(old, b["sampler"], b["mask"], sampler_mode, 0.5, 2.0)
    num_items = b["mask"].sum()
    ours_in = b["logps"].clone().requires_grad_(True)
    trl_in = b["logps"].clone().requires_grad_(True)
    ours_total, trl_total, metrics = 0.0, 0.0, []
    probe = LossProbe(
        loss_type=spec["loss_type"],
        beta=beta,
        epsilon=0.2,
        epsilon_high=spec.get("epsilon_high", 0.28),
        delta=spec.get("delta"),
        importance_sampling_level=spec.get("importance_sampling_level", "token"),
        max_completion_length=T + 2,
        grad_accum=ga,
        steps_per_generation=ga,
        top_entropy_quantile=spec.get("top_entropy_quantile", 1.0),
        off_policy_mask_threshold=spec.get("off_policy_mask_threshold"),
        entropy_coef=spec.get("entropy_coef", 0.0),
    )
    for rows in torch.arange(N).chunk(ga):
        take = lambda x, rows=rows: None if x is None else x[rows]
        sampler_logps = take(b["sampler"]) if ratio is not None else None
        ours = compute_loss(
            ours_in[rows],
            take(b["old"]),
            take(b["ref"]),
            b["advantages"][rows],
            b["mask"][rows],
            entropies=b["entropies"][rows],
            sampler_logps=sampler_logps,
            sampler_ratio=take(ratio),
            num_items_in_batch=num_items,
            beta=beta,
            kl_estimator="k3_corrected",
            epsilon_low=0.2,
            max_completion_length=T + 2,
            gradient_accumulation_steps=ga,
            steps_per_generation=ga,
            **{"epsilon_high": 0.28, **spec},
        )
        theirs, trl_metrics = probe.loss(
            trl_in[rows],
            b["advantages"][rows],
            b["mask"][rows],
            old_per_token_logps=take(b["old"]),
            ref_per_token_logps=take(b["ref"]),
            entropies=b["entropies"][rows],
            num_items_in_batch=num_items,
            sampling_per_token_logps=sampler_logps,
            importance_sampling_ratio=take(ratio),
        )
        ours_total, trl_total = ours_total + ours.loss, trl_total + theirs
        metrics.append((ours, trl_metrics))
    ours_total.backward()
    trl_total.backward()
    return ours_total, trl_total, ours_in.grad, trl_in.grad, metrics


def assert_same(result):
    ours, theirs, ours_grad, trl_grad, metrics = result
    assert abs(ours.item() - theirs.item()) <= 1e-6, (ours.item(), theirs.item())
    assert (ours_grad - trl_grad).abs().max().item() <= 1e-6
    for breakdown, trl_metrics in metrics:
        assert trl_metrics, "TRL logged nothing"
        for name, value in trl_metrics.items():
            if name == "policy_loss":
                continue  # TRL's policy term before the accumulation scaling: not a number we compute
            assert breakdown.metrics[name] == pytest.approx(value, abs=1e-6), name
        assert torch.allclose(breakdown.per_sample_loss.sum(), breakdown.loss, atol=1e-6)


def _level_ok(loss_type, level):
    return not (loss_type == "vespo" and level == "sequence")  # TRL refuses vespo at sequence level


@pytest.mark.parametrize("loss_type", TRL_LOSS_TYPES)
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("mu", [1, 2])
@pytest.mark.parametrize("ga", [1, 4])
def test_every_loss_type_level_mu_and_accumulation(loss_type, level, mu, ga):
    if not _level_ok(loss_type, level):
        pytest.skip("TRL refuses vespo with importance_sampling_level='sequence'")
    b = generation_batch(seed=ga * 10 + mu, off_policy=mu > 1)
    spec = {"loss_type": loss_type, "importance_sampling_level": level}
    if loss_type == "cispo":
        spec["epsilon_high"] = 5.0 if mu == 1 else 1.1  # TRL's recommended cap; a low one that bites
    result = run_both(b, spec, ga=ga, beta=0.04)
    assert_same(result)
    if mu > 1 and loss_type in ("grpo", "dapo"):
        assert sum(m[0].metrics["clip_ratio/region_mean"] for m in result[4]) > 0  # clipping really happened


@pytest.mark.parametrize("loss_type", TRL_LOSS_TYPES)
@pytest.mark.parametrize("mode", SAMPLER_CORRECTION_MODES)
@pytest.mark.parametrize("ga", [1, 4])
def test_sampler_importance_sampling_modes(loss_type, mode, ga):
    if loss_type == "vespo" and mode.startswith("sequence"):
        pytest.skip("TRL requires token_* modes with vespo")
    b = generation_batch(seed=3, off_policy=True)
    assert_same(run_both(b, {"loss_type": loss_type}, ga=ga, sampler_mode=mode))


@pytest.mark.parametrize(
    "option",
    [
        {"delta": 1.3},
        {"delta": 1.1},
        {"off_policy_mask_threshold": 0.05},
        {"top_entropy_quantile": 0.2},
        {"entropy_coef": 0.01},
        {"delta": 1.3, "top_entropy_quantile": 0.5, "entropy_coef": 0.01, "off_policy_mask_threshold": 0.05},
    ],
)
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "sapo", "luspo"])
@pytest.mark.parametrize("ga", [1, 4])
def test_options(option, loss_type, ga):
    b = generation_batch(seed=5, off_policy=True)
    assert_same(run_both(b, {"loss_type": loss_type, **option}, ga=ga, sampler_mode="token_truncate", beta=0.04))


def test_bnpo_and_dapo_differ_only_under_accumulation():
    """One micro-batch: the same number. Four: bnpo normalises each by its own tokens, dapo by the batch's."""
    b = generation_batch(seed=7, off_policy=False)
    one = {t: run_both(b, {"loss_type": t}, ga=1)[0].item() for t in ("bnpo", "dapo")}
    four = {t: run_both(b, {"loss_type": t}, ga=4)[0].item() for t in ("bnpo", "dapo")}
    assert one["bnpo"] == pytest.approx(one["dapo"], abs=1e-7)
    assert abs(four["bnpo"] - four["dapo"]) > 1e-3


@pytest.mark.parametrize("mode", SAMPLER_CORRECTION_MODES)
@pytest.mark.parametrize("clip", [(None, 3.0), (0.5, 2.0), (0.9, None)])
def test_sampler_ratio_and_metrics_match_trl(mode, clip):
    if mode.endswith("truncate") and clip == (None, None):
        pytest.skip()
    b = generation_batch(seed=11)
    ours = sampler_importance_ratio(b["old"], b["sampler"], b["mask"], mode, *clip)
    theirs, trl_metrics = trl_importance_sampling(b["old"], b["sampler"], b["mask"], mode, *clip)
    assert ours.shape == theirs.shape
    assert torch.allclose(ours, theirs, atol=1e-6, rtol=1e-6)
    mine = sampler_metrics(b["old"], b["sampler"], b["mask"], ours)
    for name, value in trl_metrics.items():
        assert mine[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name


@pytest.mark.parametrize("quantile", [0.0, 0.2, 0.5, 1.0])
def test_high_entropy_mask_matches_trl(quantile):
    b = generation_batch(seed=13)
    assert torch.equal(
        high_entropy_mask(b["entropies"], b["mask"], quantile),
        trl_high_entropy_mask(b["entropies"], b["mask"], quantile),
    )


@pytest.mark.parametrize("threshold", [0.0, 0.05, 0.5])
def test_off_policy_mask_matches_trl(threshold):
    b = generation_batch(seed=17)
    A = b["advantages"].unsqueeze(1)
    assert torch.equal(
        off_policy_mask(A, b["logps"], b["sampler"], b["mask"], threshold),
        trl_off_policy_mask(b["advantages"], b["logps"], b["sampler"], b["mask"], threshold),
    )


def test_delta_caps_positive_advantages_too_below_one_plus_epsilon_high():
    """TRL clamps the ratio at delta before the min, for every token: with delta = 1.1 < 1 + epsilon_high a
    positive-advantage token whose ratio is 1.15 weighs 1.1 (the help text of StepConfig.delta says so)."""
    from grpo_debug.loss import compute_loss

    logps, old = torch.log(torch.tensor([[1.15]])), torch.zeros(1, 1)
    out = compute_loss(logps, old, None, torch.tensor([1.0]), torch.ones(1, 1), delta=1.1, epsilon_high=0.2, beta=0.0)
    assert torch.allclose(out.per_token_loss, torch.tensor([[-1.1]]))
    free = compute_loss(logps, old, None, torch.tensor([1.0]), torch.ones(1, 1), epsilon_high=0.2, beta=0.0)
    assert torch.allclose(free.per_token_loss, torch.tensor([[-1.15]]))
