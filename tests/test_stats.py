"""The suite's intervals against their design: coverage by simulation with known effects, and the small rules."""

import json
import math

import numpy as np
import pytest
import torch
from scipy import stats as scipy_stats

from grpo_debug.stats import (
    bonferroni_level,
    crossed_bounds,
    crossed_interval,
    distinct_seeds,
    holm,
    log_ratio_interval,
    mean_squares,
    prompt_interval,
    seed_interval,
    sign_test,
    spearman,
    verdict,
)

REGIMES = {  # (seed, prompt, residual) standard deviations; the real experiments are residual-dominated
    "seed-dominated": (1.0, 0.3, 0.5),
    "prompt-dominated": (0.1, 1.0, 0.5),
    "balanced": (0.7, 0.7, 0.5),
    "residual-dominated": (0.033, 0.082, 0.225),  # the confirm run's components: 0.0011, 0.0067, 0.0505
}
LEVELS = (0.95, bonferroni_level(4), bonferroni_level(7))  # alone, and the families of 4 and 7 the verdicts use


@pytest.mark.parametrize("seeds", [3, 8, 12])
@pytest.mark.parametrize("regime", list(REGIMES))
def test_the_crossed_interval_covers_at_every_level_it_is_shown_at(seeds, regime):
    """Y[s, p] = mu + a_s + b_p + e_sp with 24 prompts crossed with the seeds, 1500 simulated experiments through
    the interval's own code: at 95%, 98.75% and 99.29% it holds mu at least as often as the level minus one
    point (Monte Carlo standard error about 0.26 points at 99%)."""
    sa, sb, se = REGIMES[regime]
    g = torch.Generator().manual_seed(seeds * 10 + len(regime))
    mu, runs = 0.3, 1500
    y = (
        mu
        + sa * torch.randn(runs, seeds, 1, generator=g, dtype=torch.float64)
        + sb * torch.randn(runs, 1, 24, generator=g, dtype=torch.float64)
        + se * torch.randn(runs, seeds, 24, generator=g, dtype=torch.float64)
    )
    low, high, _ = crossed_bounds(y, LEVELS)
    coverage = ((low <= mu) & (mu <= high)).mean(1)
    for level, covered in zip(LEVELS, coverage):
        assert covered >= level - 0.01, f"{seeds} seeds, {regime}: covers {covered:.4f} at a nominal {level:.4f}"
    one = crossed_interval(y[0], LEVELS[2])  # the vectorised bounds are the interval's
    assert (one.ci_low, one.ci_high) == (low[2, 0], high[2, 0])


def test_the_satterthwaite_interval_it_replaces_misses_too_often_at_corrected_levels():
    """Why Student's t with Satterthwaite's (capped) df went: with 3 seeds and balanced seed and prompt effects,
    at Bonferroni's 98.75% it missed mu more than 1.5 times as often as the level allows (the measurement
    behind the change), where the pivot misses less often than allowed."""
    g = torch.Generator().manual_seed(7)
    runs, level = 3000, bonferroni_level(4)
    y = 0.3 + 0.7 * torch.randn(runs, 3, 1, generator=g, dtype=torch.float64)
    y = y + 0.7 * torch.randn(runs, 1, 24, generator=g, dtype=torch.float64)
    y = y + 0.5 * torch.randn(runs, 3, 24, generator=g, dtype=torch.float64)
    grand, ms_seed, ms_prompt, _ = (x.numpy() for x in mean_squares(y))
    df = np.minimum(
        (ms_seed + ms_prompt) ** 2 / (ms_seed**2 / 2 + ms_prompt**2 / 23), 2 * (ms_seed + ms_prompt) / ms_seed
    )
    half = scipy_stats.t.ppf(0.5 + level / 2, df) * np.sqrt((ms_seed + ms_prompt) / 72)
    satterthwaite_misses = 1 - ((grand - half <= 0.3) & (0.3 <= grand + half)).mean()
    low, high, _ = crossed_bounds(y, (level,))
    pivot_misses = 1 - ((low[0] <= 0.3) & (0.3 <= high[0])).mean()
    assert satterthwaite_misses > 1.5 * (1 - level) > pivot_misses, (satterthwaite_misses, pivot_misses)


def test_the_nested_bootstrap_it_replaces_undercovers_with_three_seeds():
    """Why the percentile bootstrap over seeds then prompts within each seed went: seeds and prompts are crossed,
    and with 3 seeds and dominant seed effects it covered well below 95% (the measurement behind the change)."""
    g = torch.Generator().manual_seed(0)
    hits, runs = 0, 400
    for _ in range(runs):
        y = (
            0.3
            + torch.randn(3, 1, generator=g, dtype=torch.float64)
            + 0.3 * torch.randn(1, 24, generator=g, dtype=torch.float64)
        )
        seeds = torch.randint(0, 3, (500, 3), generator=g)
        prompts = torch.randint(0, 24, (500, 3, 24), generator=g)
        means = y[seeds.unsqueeze(-1), prompts].mean((1, 2))
        hits += torch.quantile(means, 0.025) <= 0.3 <= torch.quantile(means, 0.975)
    assert hits / runs < 0.85


def test_a_deterministic_arm_is_one_sample():
    row = torch.tensor([0.1, 0.4, 0.2, 0.9])
    table = row.repeat(3, 1)
    assert len(distinct_seeds(table)) == 1
    assert crossed_interval(table) == prompt_interval(row)
    assert crossed_interval(table).n_seeds == 1
    three = torch.stack([row, row + 0.1, row - 0.05])
    assert crossed_interval(three).n_seeds == 3


def test_seed_intervals_log_ratios_and_the_sign_test():
    one = seed_interval(torch.tensor([0.5]))
    assert one.ci_low is None and one.as_dict()["ci_low"] is None and json.loads(json.dumps(one.as_dict()))
    kl = log_ratio_interval(torch.tensor([1.36e6, 1.9e4, 2.6e4]), torch.tensor([0.07, 0.09, 0.10]))
    assert kl.ci_low > 0  # every seed far above: detectable on the log scale
    assert sign_test(torch.tensor([1.0, 2.0, 3.0])) == 0.25  # three seeds can never reach p < 0.05
    with pytest.raises(ValueError, match="positive"):
        log_ratio_interval(torch.tensor([0.0]), torch.tensor([1.0]))


def test_holm_adjusts_a_family():
    assert holm([0.01, 0.04, 0.03, None]) == [0.03, 0.06, 0.06, None]
    assert holm([0.5]) == [0.5]


def test_verdicts_follow_their_intervals():
    up = crossed_interval(torch.tensor([[1.0, 1.1, 0.9], [1.2, 1.0, 1.1], [0.9, 1.0, 1.05]]))
    assert verdict(up).startswith("held-out reward higher")
    assert "not detected" in verdict(up, adjusted_p=0.2)
    flat = crossed_interval(torch.tensor([[1.0, -1.0], [-1.0, 1.2]]))
    assert "not detected" in verdict(flat) and "width" in verdict(flat)


def test_spearman_is_scipys():
    assert math.isclose(spearman([1, 2, 3, 4], [1, 3, 2, 4]), 0.8)


def test_variance_components_and_power_recover_a_known_design():
    from grpo_debug.stats import crossed_power, variance_components

    g = torch.Generator().manual_seed(3)
    y = (
        0.5
        + 0.4 * torch.randn(40, 1, generator=g)
        + 0.3 * torch.randn(1, 60, generator=g)
        + 0.2 * torch.randn(40, 60, generator=g)
    )
    c = variance_components(y)
    assert abs(c["seed"] - 0.16) < 0.08 and abs(c["prompt"] - 0.09) < 0.05 and abs(c["residual"] - 0.04) < 0.005
    low = crossed_power(0.05, {"seed": 0.0, "prompt": 0.0, "residual": 0.05}, seeds=4, prompts=24, runs=300)
    high = crossed_power(0.05, {"seed": 0.0, "prompt": 0.0, "residual": 0.05}, seeds=16, prompts=24, runs=300)
    assert low < high and crossed_power(0.0, c, seeds=8, prompts=24, runs=300) < 0.1  # no effect: about 5%


def test_a_crossed_interval_needs_two_seeds_and_two_prompts():
    with pytest.raises(ValueError, match="at least 2 seeds and 2 prompts, got 1 and 24"):
        crossed_bounds(torch.zeros(5, 1, 24))
    with pytest.raises(ValueError, match="at least 2 seeds and 2 prompts, got 3 and 1"):
        crossed_bounds(torch.zeros(5, 3, 1))


def test_the_within_group_correlation_is_pearsons_on_centred_rows_and_its_p_value_is_calibrated():
    """r is numpy's Pearson r of the group-centred values; under no association (normal rewards, 4 groups of
    4, the doctor's smallest step) the one-sided p-value is below 0.05 in 5% of 4000 draws and below 0.01 in
    1% (binomial 99.9% bounds), so the length verdict's error rate is what LENGTH_ALPHA says."""
    from grpo_debug.stats import within_group_correlation

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, generator=g), torch.randn(16, generator=g)
    cx, cy = (v.view(4, 4) - v.view(4, 4).mean(1, keepdim=True) for v in (x, y))
    r, _ = within_group_correlation(x, y, 4)
    assert r == pytest.approx(float(np.corrcoef(cx.flatten(), cy.flatten())[0, 1]), abs=1e-6)
    assert within_group_correlation(x, torch.zeros(16), 4) == (0.0, 1.0), "no spread: no correlation"
    p = torch.tensor([within_group_correlation(*torch.randn(2, 16, generator=g), 4)[1] for _ in range(4000)])
    for level in (0.05, 0.01):
        low, high = scipy_stats.binom.ppf([0.0005, 0.9995], 4000, level) / 4000
        share = (p <= level).float().mean().item()
        assert low <= share <= high, f"p <= {level} in {share:.3%} of null draws, outside [{low:.3%}, {high:.3%}]"
