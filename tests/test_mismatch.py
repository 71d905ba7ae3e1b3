"""verl's sampler-vs-trainer diagnostics (`sampler.mismatch_metrics`), each against its formula computed by
hand on small tensors, and the health line against verl's thresholds."""

import math

import pytest
import torch

from grpo_debug.sampler import HEALTH, health_line, mismatch_metrics

MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
SAMPLER = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-0.3, -1.2, 0.0, 0.0]])
DELTA = torch.tensor([[0.2, -0.1, 0.4, 9.0], [-0.3, 0.05, 7.0, 7.0]])  # trainer - sampler; 9 and 7 are padding


def by_hand():
    """Every metric from Python lists of the scored tokens only."""
    rows = [[(SAMPLER[i, t].item(), DELTA[i, t].item()) for t in range(4) if MASK[i, t]] for i in range(2)]
    tokens = [d for row in rows for _, d in row]
    mean = lambda xs: sum(xs) / len(xs)
    trainer_mean = [mean([s + d for s, d in row]) for row in rows]
    sampler_mean = [mean([s for s, _ in row]) for row in rows]
    diff = [s - t for s, t in zip(sampler_mean, trainer_mean)]
    w = [math.exp(d) for d in tokens]
    clamped = [min(max(x, 0.5), 2.0) for x in w]
    normalised = [c / mean(clamped) for c in clamped]
    seq = [math.exp(sum(d for _, d in row)) for row in rows]
    return {
        "kl": mean([-d for d in tokens]),
        "k3_kl": mean([math.exp(d) - d - 1 for d in tokens]),
        "training_ppl": mean([math.exp(-m) for m in trainer_mean]),
        "rollout_ppl": mean([math.exp(-m) for m in sampler_mean]),
        "log_ppl_diff": mean(diff),
        "log_ppl_abs_diff": mean([abs(x) for x in diff]),
        "log_ppl_diff_max": max(diff),
        "ppl_ratio": mean([math.exp(x) for x in diff]),
        "chi2_token": mean([x * x for x in w]) - 1,
        "chi2_seq": mean([x * x for x in seq]) - 1,
        "rollout_is_mean": mean(w),
        "rollout_is_max": max(w),
        "rollout_is_min": min(w),
        "rollout_is_std": math.sqrt(mean([c * c for c in clamped]) - mean(clamped) ** 2),
        "rollout_is_eff_sample_size": 1 / mean([x * x for x in normalised]),
        "rollout_is_ratio_fraction_high": mean([float(x > 2) for x in w]),
        "sequence/rollout_is_mean": mean(seq),
        "token/fraction_outside_clip": mean([float(x > 3) for x in w]),
        "sequence/fraction_outside_clip": mean([float(x > 3) for x in seq]),
    }


def test_each_metric_is_its_formula_on_the_scored_tokens_only():
    got = mismatch_metrics(SAMPLER + DELTA, SAMPLER, MASK)
    for name, want in by_hand().items():
        assert got[f"rollout_corr/{name}"] == pytest.approx(want, rel=1e-5, abs=1e-6), name


def test_identical_log_probs_are_perfectly_on_policy_and_healthy():
    got = mismatch_metrics(SAMPLER, SAMPLER, MASK)
    for name in ("kl", "k3_kl", "chi2_token", "chi2_seq", "log_ppl_diff", "rollout_is_std"):
        assert got[f"rollout_corr/{name}"] == pytest.approx(0.0, abs=1e-6), name
    assert got["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx(1.0)
    assert got["rollout_corr/rollout_is_mean"] == pytest.approx(1.0)
    assert health_line(got).endswith("healthy (verl's thresholds)")


@pytest.mark.parametrize("name", list(HEALTH))
def test_each_threshold_of_verl_raises_its_warning(name):
    healthy = mismatch_metrics(SAMPLER, SAMPLER, MASK)
    bad = {
        "rollout_corr/rollout_is_mean": 2.5,
        "rollout_corr/rollout_is_eff_sample_size": 0.2,
        "rollout_corr/rollout_is_std": 1.5,
        "rollout_corr/kl": -0.2,
        "rollout_corr/chi2_token": 1.5,
    }[name]
    line = health_line({**healthy, name: bad})
    assert "WARNING" in line and name.split("/")[-1] in line and line.count("(") == 1


def test_a_sampler_that_cannot_score_a_token_counts_it_as_ratio_one():
    sampler = SAMPLER.clone()
    sampler[0, 1] = float("nan")
    got = mismatch_metrics(SAMPLER + DELTA, sampler, MASK)
    assert all(math.isfinite(v) for v in got.values())


def test_a_step_reports_the_top_p_bias_as_a_ratio_below_one_and_none_without_top_p():
    """The sampler renormalises over the top-p nucleus, the trainer scores the full vocabulary: each sampled
    token's rho = pi_trainer / pi_sampler is the nucleus's kept mass (<= 1). With top_p = 1 they agree."""
    from grpo_debug.config import StepConfig
    from grpo_debug.metrics import metrics
    from grpo_debug.step import GRPOStep

    cfg = StepConfig(num_prompts=2, num_generations=4, top_p=1.0)
    step = GRPOStep(cfg)
    full = metrics(step.run(cfg, until="logprobs"))
    nucleus = metrics(step.run(cfg.replace(top_p=0.8), until="logprobs"))
    assert abs(full["rollout_corr/kl"]) < 1e-4 and full["rollout_corr/rollout_is_eff_sample_size"] > 0.999
    assert nucleus["rollout_corr/rollout_is_max"] <= 1 + 1e-4 and nucleus["rollout_corr/rollout_is_mean"] < 0.99
    assert nucleus["rollout_corr/kl"] > 0  # the sampler is more confident than the trainer


@pytest.mark.parametrize("truncation", [{"top_p": 0.8}, {"top_k": 20}, {"min_p": 0.1}], ids=str)
def test_the_truncation_bias_is_the_kept_mass_and_renormalising_over_the_support_removes_it(truncation):
    """TRL PR #7269's measurement on the bundled model: scored over the full vocabulary, the mean per-token
    ratio is the mean kept mass (closed form); renormalised over the sampler's support, it is 1."""
    from grpo_debug.config import StepConfig
    from grpo_debug.metrics import metrics
    from grpo_debug.step import GRPOStep

    cfg = StepConfig(num_prompts=2, num_generations=4, **truncation)
    step = GRPOStep(cfg)
    full = metrics(step.run(cfg, until="logprobs"))
    renormalised = metrics(step.run(cfg.replace(logprob_support="sampler_support"), until="logprobs"))
    assert full["rollout_corr/rollout_is_mean"] == pytest.approx(full["logps/kept_mass_mean"], rel=0.01)
    assert renormalised["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, rel=0.01)
    assert abs(renormalised["rollout_corr/kl"]) <= abs(full["rollout_corr/kl"])
    if "top_p" in truncation:
        assert full["logps/kept_mass_mean"] < 0.99  # a real bias to remove
