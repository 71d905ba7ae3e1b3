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
    assert health_line(got).endswith("healthy (verl's per-token thresholds)")


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
    from grpo_debug.show.metrics import metrics
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
    from grpo_debug.show.metrics import metrics
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


def test_each_sequence_ratio_is_the_product_of_its_token_ratios_against_its_length():
    """#4772's mechanism by hand: log prod rho = sum of the scored tokens' log-ratios, the same ratio the
    sequence_* correction modes weigh by before truncation, and the share outside the cap that
    mismatch_metrics reports; a steady drift d reaches the cap at length ln(cap) / d."""
    from grpo_debug.sampler import length_at_cap, outside_cap, sampler_importance_ratio, sequence_ratios

    got = sequence_ratios(SAMPLER + DELTA, SAMPLER, MASK)
    tokens = [0.2, -0.1, 0.4, -0.3, 0.05]
    assert got.lengths.tolist() == [3, 2]
    assert got.log_ratio.tolist() == pytest.approx([0.2 - 0.1 + 0.4, -0.3 + 0.05], abs=1e-6)
    mean = sum(tokens) / 5
    assert got.token_drift == pytest.approx(mean, abs=1e-6)
    assert got.token_spread == pytest.approx(math.sqrt(sum((x - mean) ** 2 for x in tokens) / 4), abs=1e-6)
    unclipped = sampler_importance_ratio(SAMPLER + DELTA, SAMPLER, MASK, "sequence_mask", None, None)
    assert torch.allclose(torch.exp(got.log_ratio), unclipped.squeeze(-1))
    assert outside_cap(got, clip_max=1.3).tolist() == [True, False]  # e^0.5 = 1.65 > 1.3 > e^-0.25
    assert outside_cap(got, clip_min=0.9, clip_max=None).tolist() == [False, True]
    share = mismatch_metrics(SAMPLER + DELTA, SAMPLER, MASK, clip_max=1.3)[
        "rollout_corr/sequence/fraction_outside_clip"
    ]
    assert share == pytest.approx(outside_cap(got, clip_max=1.3).float().mean().item())
    sampler = SAMPLER.clone()
    sampler[0, 1] = float("nan")  # a token the sampler could not score counts as ratio 1
    assert sequence_ratios(SAMPLER + DELTA, sampler, MASK).log_ratio[0].item() == pytest.approx(0.6)
    assert length_at_cap(0.012, 3.0) == pytest.approx(math.log(3) / 0.012)  # ~92 tokens: #4772's cap of 3
    assert length_at_cap(-0.012, 3.0) == math.inf and length_at_cap(0.0, 3.0) == math.inf


def test_the_float32_sampler_is_autocast_off_and_a_low_precision_one_is_on():
    """The default sampler runs exactly the plain float32 forward (today's numbers, bit for bit)."""
    from grpo_debug.config import StepConfig
    from grpo_debug.model import load_model
    from grpo_debug.rollout import at_precision

    assert StepConfig().sampler_dtype == "float32" and StepConfig.phase_of("sampler_dtype") == "rollout"
    policy = load_model().policy.eval()
    ids = torch.tensor([[5, 17, 42, 99]])
    with torch.no_grad():
        plain = policy(input_ids=ids).logits
        with at_precision("float32", "sampler"):
            assert not torch.is_autocast_enabled("cpu")
            assert torch.equal(policy(input_ids=ids).logits, plain)
        for dtype in ("bfloat16", "float16"):
            with at_precision(dtype, "sampler"):
                assert torch.is_autocast_enabled("cpu")
                assert not torch.equal(policy(input_ids=ids).logits.float(), plain)
    with pytest.raises(ValueError, match="sampler dtype must be one of"):
        at_precision("float64", "sampler")


def _sampled(fast: bool, dtype: str):
    from grpo_debug.config import StepConfig
    from grpo_debug.model import load_model
    from grpo_debug.rollout import rollout
    from grpo_debug.specs import sampling_of
    from grpo_debug.speed import kernels
    from grpo_debug.task import load_task

    policy, _, tokenizer = load_model()
    prompts = load_task("mixed").prompts("train", 3)
    cfg = StepConfig(num_generations=4, max_new_tokens=48, temperature=0.7, top_p=1.0, seed=0, sampler_dtype=dtype)
    return rollout(policy, tokenizer, prompts, sampling_of(cfg), kernels(fast).generate)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_low_precision_sampler_fast_and_readable_agree_to_its_rounding(dtype):
    """The fast generate under autocast: the same tokens as the readable one on most rows (a bf16 rounding
    can flip a draw near a boundary, and the row goes its own way from there), and the same sampler log-probs
    to the precision's rounding on every token both drew alike (bf16: 0.1, as the fast scoring's test)."""
    fast, plain = _sampled(True, dtype), _sampled(False, dtype)
    same_rows = (fast.completion_ids == plain.completion_ids).all(1)
    assert same_rows.float().mean() >= 0.75
    alike = (fast.completion_ids == plain.completion_ids).cumprod(1).bool()  # each row's common prefix
    assert ((fast.sampler_logps - plain.sampler_logps).abs() * alike).max() <= 0.1


def test_a_bfloat16_sampler_drifts_from_the_float32_trainer_and_a_float32_one_does_not():
    """The step's own metrics: the float32 sampler matches the trainer's float32 scoring to float rounding;
    the bfloat16 sampler's log-probs carry its rounding, a mismatch verl's metrics see."""
    from grpo_debug.config import StepConfig
    from grpo_debug.show.metrics import metrics
    from grpo_debug.step import GRPOStep

    cfg = StepConfig(num_prompts=2, num_generations=4, max_new_tokens=48)
    step = GRPOStep(cfg)
    same = metrics(step.run(cfg, until="logprobs"))
    assert cfg.replace(sampler_dtype="bfloat16").first_changed_phase(cfg) == "rollout"
    low = metrics(step.run(cfg.replace(sampler_dtype="bfloat16"), until="logprobs"))
    assert abs(same["rollout_corr/kl"]) < 1e-5 and same["rollout_corr/k3_kl"] < 1e-8
    assert low["rollout_corr/k3_kl"] > 100 * max(same["rollout_corr/k3_kl"], 1e-9)
    assert low["logps/max_sampler_gap"] > 1e-2 > same["logps/max_sampler_gap"]


def test_the_length_plot_marks_exactly_the_sequences_outside_the_cap():
    from grpo_debug.sampler import outside_cap, sequence_ratios
    from grpo_debug.ui.mismatch_plots import sequence_ratio_vs_length

    mask = (torch.arange(90) < torch.tensor([20, 40, 60, 80, 90]).unsqueeze(1)).float()
    panels = {"steady drift": sequence_ratios(torch.full((5, 90), 0.02), torch.zeros(5, 90), mask)}
    fig = sequence_ratio_vs_length(panels, clip_max=3.0, up_to=104)
    ax = fig.axes[0]
    inside, outside = (c.get_offsets() for c in ax.collections[:2])
    assert len(outside) == int(outside_cap(panels["steady drift"], None, 3.0).sum()) == 3  # e^1.2, e^1.6, e^1.8 > 3
    assert len(inside) == 2 and fig.legends and not ax.get_legend()  # the legend below the panels, off the data


def test_the_trl_bridge_refuses_a_sampler_precision_of_its_own():
    """TRL without vLLM samples with the trained model itself: a separate sampler precision is not a switch it has."""
    from grpo_debug.capture.trl_bridge import no_trl_switch
    from grpo_debug.config import StepConfig

    assert "sampler_dtype" not in no_trl_switch(StepConfig())
    assert no_trl_switch(StepConfig(sampler_dtype="bfloat16")) == {"sampler_dtype": "bfloat16"}
