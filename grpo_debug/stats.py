"""Every interval, test and multiplicity correction the suite reports, each with the design it assumes.

The training experiments' design: S seeds (the independent unit: each seed is its own training run) are each
evaluated on the same P test prompts with the same evaluation sampling seed, so seeds and prompts are CROSSED,
not nested: a table Y[s, p] = mu + a_s + b_p + e_sp, with a_s the seed's effect, b_p the prompt's (shared by
every seed) and e_sp the rest. The quantity of interest is mu, over new seeds and new prompts alike.

- `crossed_interval`: a two-way random-effects interval for mu. Var(mean) = s2_a / S + s2_b / P + s2_e / (S P)
  = (E[MS_seed] + E[MS_prompt] - E[MS_residual]) / (S P); each mean square is its expectation times an
  independent chi-square over its df, so replacing each expectation by MS * df / chi2_df (a draw) gives a
  *generalized pivotal quantity* for mu (Weerahandi 1993; Hannig's fiducial argument):
      R = mean - Z * sqrt(max(0, Rs + Rp - Re) / (S P)),   Rs = (S-1) MS_seed / U_(S-1), ...
  whose quantiles over `PIVOT_DRAWS` Monte Carlo draws (a fixed seed: the same table gives the same interval)
  are the interval, and whose tail share is the p-value. It carries the seed term's S - 1 df in full, where
  Student's t with Satterthwaite's df (the interval it replaced) covered 0.975 at a nominal 0.9875 and 0.982 at
  0.9929 with 3 seeds, and over-covered (0.993 at 95%) where the residual dominates, as in the real experiments.
  Coverage at the levels the verdicts use (95%, and Bonferroni's for families of 4 and 7), with 3, 8 and 12 seeds,
  in seed-, prompt-, residual-dominated and balanced designs, is checked by simulation in tests/test_stats.py
  (>= nominal minus 1 point in every cell). With 3 seeds it still over-covers where the prompts or the residual
  dominate: two df cannot tell a small seed variance from none.
- `seed_interval`: Student's t over per-seed values (a metric logged once per seed and step: KL, loss), seeds iid.
- `log_ratio_interval`: the same on log(mine / theirs) per seed, for positive heavy-tailed metrics (KL): a
  ratio of geometric means; `sign_test` beside it needs no distribution at all (with 3 seeds its smallest
  two-sided p is 0.25: it can never decide).
- `prompt_interval`: one model pair on P prompts (a deterministic arm): Student's t over prompts (the seed is
  fixed, so the interval speaks of these weights on new prompts). `prompt_bootstrap`: the same design, the
  percentile bootstrap over prompts that a single step's evaluation reports (notebooks 06, 07).
- `distinct_seeds`: an arm whose seeds gave byte-identical tables (a greedy arm ignores the seed) is one sample.
- `holm`: Holm's step-down adjustment of a family's p-values (family-wise error 5%); `bonferroni_level`: the
  confidence level each interval of a family of m is shown at (1 - 0.05 / m), so that no shown interval
  contradicts its verdict.
- `spearman`: scipy's rank correlation.
Every function returns plain floats; an undefined bound is None (strict JSON has no NaN).
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
from scipy import stats as scipy_stats

LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    mean: float
    ci_low: float | None
    ci_high: float | None
    df: float | None  # degrees of freedom of the t quantile (None: undefined, or not a t interval)
    p_value: float | None  # two-sided, for mean = 0
    n_seeds: int  # independent seeds behind it (1 for a deterministic arm)
    method: str
    level: float = LEVEL

    @property
    def half_width(self) -> float | None:
        return None if self.ci_low is None else (self.ci_high - self.ci_low) / 2

    def contains_zero(self) -> bool:
        return self.ci_low is None or self.ci_low <= 0 <= self.ci_high

    def as_dict(self) -> dict:
        return {k: _finite_or_none(v) for k, v in asdict(self).items()}


def _finite_or_none(value):
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _t(mean: float, se: float, df: float, n_seeds: int, method: str, level: float) -> Interval:
    if not (se > 0 and df > 0 and math.isfinite(se)):
        exact = se == 0 and df > 0
        return Interval(
            mean,
            mean if exact else None,
            mean if exact else None,
            df if df > 0 else None,
            (0.0 if mean != 0 else 1.0) if exact else None,
            n_seeds,
            method,
            level,
        )
    q = scipy_stats.t.ppf(0.5 + level / 2, df)
    p = 2 * scipy_stats.t.sf(abs(mean) / se, df)
    return Interval(mean, mean - q * se, mean + q * se, float(df), float(p), n_seeds, method, level)


def distinct_seeds(table: torch.Tensor) -> torch.Tensor:
    """The (S', ...) rows of a per-seed table with byte-identical repeats removed: a deterministic arm
    (greedy decoding ignores the seed) is one sample, however many seeds it ran."""
    kept: list[torch.Tensor] = []
    for row in table:
        if not any(torch.equal(row, k) for k in kept):
            kept.append(row)
    return torch.stack(kept)


PIVOT_DRAWS = 20_000  # Monte Carlo draws of the crossed interval's pivot (the bounds move ~1e-3 SE between seeds)


@functools.lru_cache(maxsize=32)
def _pivot_draws(seeds: int, prompts: int) -> tuple[np.ndarray, ...]:
    """(PIVOT_DRAWS,) standard normals and chi-squares on the seed, prompt and residual df, from a fixed seed."""
    rng = np.random.default_rng(20_261_126)
    return (
        rng.standard_normal(PIVOT_DRAWS),
        rng.chisquare(seeds - 1, PIVOT_DRAWS),
        rng.chisquare(prompts - 1, PIVOT_DRAWS),
        rng.chisquare((seeds - 1) * (prompts - 1), PIVOT_DRAWS),
    )


def mean_squares(tables: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(N, S, P) tables -> (N,) each: the grand mean and the seed, prompt and residual mean squares."""
    y = torch.as_tensor(tables, dtype=torch.float64)
    _, S, P = y.shape
    grand = y.mean((1, 2))
    seed_means, prompt_means = y.mean(2), y.mean(1)
    ms_seed = P * ((seed_means - grand[:, None]) ** 2).sum(1) / (S - 1)
    ms_prompt = S * ((prompt_means - grand[:, None]) ** 2).sum(1) / (P - 1)
    residual = y - seed_means[:, :, None] - prompt_means[:, None, :] + grand[:, None, None]
    ms_residual = (residual**2).sum((1, 2)) / ((S - 1) * (P - 1))
    return grand, ms_seed, ms_prompt, ms_residual


def crossed_bounds(
    tables: torch.Tensor, levels: tuple[float, ...] = (LEVEL,)
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(N, S, P) tables with S, P >= 2 -> (L, N) lower and upper bounds at each of the L `levels`, and (N,)
    two-sided p-values for mu = 0: the quantiles and tail shares of the generalized pivotal quantity (module
    docstring). Vectorised over tables (64 at a time: a (64, PIVOT_DRAWS) slab), so that a coverage simulation
    runs this very code."""
    _, S, P = tables.shape
    if S < 2 or P < 2:
        raise ValueError(f"a crossed interval needs at least 2 seeds and 2 prompts, got {S} and {P}")
    z, u_seed, u_prompt, u_residual = _pivot_draws(S, P)
    tails = [q for level in levels for q in (0.5 - level / 2, 0.5 + level / 2)]
    out = []
    for chunk in torch.as_tensor(tables, dtype=torch.float64).split(64):
        grand, ms_seed, ms_prompt, ms_residual = (x.numpy()[:, None] for x in mean_squares(chunk))
        variance = (S - 1) * ms_seed / u_seed + (P - 1) * ms_prompt / u_prompt
        variance -= (S - 1) * (P - 1) * ms_residual / u_residual
        pivot = grand - z * np.sqrt(np.maximum(variance, 0.0) / (S * P))
        bounds = np.quantile(pivot, tails, axis=1)
        below = (pivot <= 0).sum(1)
        p = np.minimum(1.0, (2 * np.minimum(below, PIVOT_DRAWS - below) + 1) / (PIVOT_DRAWS + 1))
        out.append((bounds[0::2], bounds[1::2], p))
    low, high, p = zip(*out)
    return np.concatenate(low, axis=1), np.concatenate(high, axis=1), np.concatenate(p)


def crossed_interval(table: torch.Tensor, level: float = LEVEL) -> Interval:
    """mu of a (seeds, prompts) table with crossed seeds and prompts (module docstring). Identical seeds are
    counted once; with one distinct seed it is `prompt_interval` of that row, with one prompt Student's t over
    the seeds (that prompt's mean)."""
    y = distinct_seeds(torch.as_tensor(table, dtype=torch.float64))
    S, P = y.shape
    if S == 1:
        return prompt_interval(y[0], level)
    if P == 1:
        return seed_interval(y[:, 0], level)
    low, high, p = crossed_bounds(y[None], (level,))
    low, high, p = float(low[0, 0]), float(high[0, 0]), float(p[0])
    method = f"crossed seeds x prompts, two-way random effects: generalized pivot ({PIVOT_DRAWS} draws)"
    return Interval(y.mean().item(), low, high, None, p, S, method, level)


def prompt_interval(values: torch.Tensor, level: float = LEVEL) -> Interval:
    """The mean of per-prompt values of one fixed model pair: Student's t over prompts."""
    x = torch.as_tensor(values, dtype=torch.float64).flatten()
    n = len(x)
    se = x.std().item() / math.sqrt(n) if n > 1 else float("nan")
    return _t(x.mean().item(), se, n - 1, 1, "one seed: Student's t over prompts", level)


def seed_interval(values: torch.Tensor, level: float = LEVEL) -> Interval:
    """The mean of one value per seed (iid seeds): Student's t over seeds; None bounds for one seed."""
    x = torch.as_tensor(values, dtype=torch.float64).flatten()
    n = len(x)
    se = x.std().item() / math.sqrt(n) if n > 1 else float("nan")
    return _t(x.mean().item(), se, n - 1, n, "Student's t over seeds", level)


def log_ratio_interval(mine: torch.Tensor, theirs: torch.Tensor, level: float = LEVEL) -> Interval:
    """For a positive, heavy-tailed per-seed metric (KL): Student's t over seeds of log(mine / theirs), paired
    by seed. exp(mean) is the ratio of geometric means."""
    mine, theirs = (torch.as_tensor(v, dtype=torch.float64).flatten() for v in (mine, theirs))
    if (mine <= 0).any() or (theirs <= 0).any():
        raise ValueError("log_ratio_interval needs positive values")
    out = seed_interval(torch.log(mine) - torch.log(theirs), level)
    return Interval(**{**asdict(out), "method": "Student's t over seeds of log(mine / theirs)"})


def sign_test(differences: torch.Tensor) -> float:
    """Two-sided sign test p-value of per-seed paired differences (zeros dropped)."""
    d = torch.as_tensor(differences, dtype=torch.float64).flatten()
    d = d[d != 0]
    if len(d) == 0:
        return 1.0
    return float(scipy_stats.binomtest(int((d > 0).sum()), len(d), 0.5).pvalue)


def holm(p_values: list[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (family-wise error control); None stays None and is not counted."""
    indexed = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    m, out, running = len(indexed), [None] * len(p_values), 0.0
    for rank, (p, i) in enumerate(indexed):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def bonferroni_level(family_size: int, level: float = LEVEL) -> float:
    """The confidence level at which each of a family's intervals is shown: 1 - (1 - level) / m."""
    return 1 - (1 - level) / max(family_size, 1)


def prompt_bootstrap(diffs: torch.Tensor, resamples: int, seed: int = 0) -> tuple[float, float]:
    """One step's evaluation (one model pair, one seed) on P prompts: the 95% percentile bootstrap of the mean
    paired difference over prompts, the unit that was sampled (notebooks 06 and 07)."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, len(diffs), (resamples, len(diffs)), generator=g)
    means = diffs[idx].mean(1)
    return torch.quantile(means, 0.025).item(), torch.quantile(means, 0.975).item()


def within_group_correlation(x: torch.Tensor, y: torch.Tensor, G: int) -> tuple[float, float]:
    """Pearson r of (N,) x and y within groups of G consecutive rows (each group's mean taken out of both: a
    prompt's difficulty is not a correlation; NaN counts as 0), and the one-sided p-value of r > 0 under no
    association: t = r sqrt(df / (1 - r^2)) on df = N - N/G - 1 (a partial correlation's degrees of freedom).
    r = 0 and p = 1 where either has no spread within its groups or df < 1."""
    x, y = (v.double().nan_to_num(0.0).view(-1, G) for v in (x, y))
    x, y = (v - v.mean(1, keepdim=True) for v in (x, y))
    denominator = (x.norm() * y.norm()).item()
    df = x.numel() - x.shape[0] - 1
    if denominator == 0 or df < 1:
        return 0.0, 1.0
    r = max(-1.0, min(1.0, (x * y).sum().item() / denominator))
    if abs(r) == 1.0:
        return r, 0.0 if r > 0 else 1.0
    return r, float(scipy_stats.t.sf(r * math.sqrt(df / (1 - r * r)), df))


def spearman(a, b) -> float:
    """Spearman's rank correlation (scipy; ties get average ranks)."""
    return float(
        scipy_stats.spearmanr(torch.as_tensor(a).flatten().numpy(), torch.as_tensor(b).flatten().numpy()).statistic
    )


def is_detected(ci_low: float | None, ci_high: float | None, adjusted_p: float | None = None) -> bool:
    """Whether a difference is detected: its interval excludes 0 and the family's adjusted p (when given) agrees."""
    return ci_low is not None and not ci_low <= 0 <= ci_high and (adjusted_p is None or adjusted_p < 1 - LEVEL)


def verdict(interval: Interval, what: str = "held-out reward", adjusted_p: float | None = None) -> str:
    """A difference in words from its interval: 'higher'/'lower' only where the interval excludes 0 (and the
    family's adjusted p agrees, when given), else 'not detected' with the interval's width."""
    if interval.ci_low is None:
        return f"{what}: {interval.mean:+.4f}, no interval (one sample)"
    numbers = f"{interval.mean:+.4f} [{interval.ci_low:+.4f}, {interval.ci_high:+.4f}]"
    if is_detected(interval.ci_low, interval.ci_high, adjusted_p):
        return f"{what} {'higher' if interval.mean > 0 else 'lower'}: {numbers}"
    return f"{what}: not detected, {numbers} (width {interval.ci_high - interval.ci_low:.3f})"


def variance_components(table: torch.Tensor) -> dict[str, float]:
    """Seed, prompt and residual variances of a (seeds, prompts) table, from the two-way ANOVA's mean squares
    (negative estimates set to 0: with 3 seeds a seed variance of 0 is often what this reads, not what is)."""
    grand, ms_seed, ms_prompt, ms_residual = (x.item() for x in mean_squares(torch.as_tensor(table)[None]))
    S, P = torch.as_tensor(table).shape
    return {
        "seed": max((ms_seed - ms_residual) / P, 0.0),
        "prompt": max((ms_prompt - ms_residual) / S, 0.0),
        "residual": ms_residual,
        "effect": grand,
    }


def crossed_power(
    effect: float,
    components: dict[str, float],
    seeds: int,
    prompts: int,
    runs: int = 1000,
    seed: int = 0,
    level: float = LEVEL,
) -> float:
    """The share of `runs` simulated experiments (the crossed model with these variance components and a true
    `effect`) whose `crossed_interval` excludes 0: the power of a planned run with `seeds` seeds."""
    g = torch.Generator().manual_seed(seed)
    y = (
        effect
        + math.sqrt(components["seed"]) * torch.randn(runs, seeds, 1, generator=g, dtype=torch.float64)
        + math.sqrt(components["prompt"]) * torch.randn(runs, 1, prompts, generator=g, dtype=torch.float64)
        + math.sqrt(components["residual"]) * torch.randn(runs, seeds, prompts, generator=g, dtype=torch.float64)
    )
    low, high, _ = crossed_bounds(y, (level,))
    return float(((low[0] > 0) | (high[0] < 0)).mean())


def wilson_bounds(mean: float, n: int, z: float) -> tuple[float, float]:
    """Wilson's score interval around `mean`, the mean of `n` values in [0, 1] (a share; a [0, 1] variable's variance
    is at most mean (1 - mean), so the bound a share has holds for it too), at `z` standard errors."""
    if n <= 0:
        return 0.0, 1.0
    centre = (mean + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(max(mean * (1 - mean), 0.0) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)
