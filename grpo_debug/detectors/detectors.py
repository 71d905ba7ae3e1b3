"""One pure function per pitfall: `StepFacts` (a step run up to its update, and what was measured beside it)
in, a `Finding` out. Severity: `problem` (the step cannot learn what it should), `warning` (it learns
something else, or much less), `info` (worth knowing, by design), `absent`. Every threshold is a constant
here, with where it comes from.
"""

from __future__ import annotations

import math

import torch

from ..advantages import TRL_EPS, groups_without_signal
from ..pitfalls import PITFALLS
from ..show.diagnostics import ON_POLICY, first_pass_ratio_gap
from ..stats import holm, within_group_correlation
from . import logprob_detectors
from .findings import Finding, StepFacts, _finding, _groups, _masked_mean
from .signal_path import signal_lost  # noqa: F401 (found by `_detector`, as the catalogue names it)

# ---- rewards and advantages

NO_SIGNAL_WARNING = 0.5  # half the groups or more without a gradient: the step learns from a few prompts


def zero_std_groups(f: StepFacts) -> Finding:
    adv, mask, upd = f.run.advantages, f.run.logprobs.mask, f.run.update
    G = f.run.config.num_generations
    zero = groups_without_signal(adv).to(mask.device)
    token_share = _masked_mean(zero.repeat_interleave(G).float().unsqueeze(1).expand_as(mask), mask)
    share = zero.float().mean().item()
    evidence = dict(
        frac_reward_zero_std=adv.frac_reward_zero_std,
        groups=sorted(int(g) for g in zero.nonzero().flatten()),
        of_groups=len(zero),
        groups_without_signal=share,
        tokens_without_signal=token_share,
        grad_norm=upd.grad_norm,
    )
    if share == 1.0:
        return _finding(
            "zero_std_groups", "problem",
            f"every group's rewards are equal: every advantage is 0 and the loss's 0.0000 is real "
            f"({_gradient_left(upd.grad_norm, f.run.config.beta)})", **evidence,
        )  # fmt: skip
    if share == 0:
        return _finding("zero_std_groups", "absent", "every group has varied rewards", **evidence)
    severity = "warning" if share >= NO_SIGNAL_WARNING else "info"
    return _finding(
        "zero_std_groups", severity,
        f"{share:.0%} of groups ({token_share:.0%} of tokens) have equal rewards and no gradient; "
        f"the rest give grad_norm {upd.grad_norm:.3g}: a loss near 0 is cosmetic", **evidence,
    )  # fmt: skip


def _gradient_left(grad_norm: float, beta: float) -> str:
    if beta > 0:
        return f"grad_norm {grad_norm:.3g} from the KL term alone"
    return f"grad_norm {grad_norm:.3g}: beta = 0, so nothing is left to learn from"


def _constant_within_groups(values: torch.Tensor, G: int) -> bool:
    """Every group's values equal, up to float32's rounding of the group mean (a sum's last bit is no signal)."""
    scale = 1.0 + values.nan_to_num(0.0).abs().max().item()
    return _within_group(values, G).abs().max().item() <= 1e-6 * scale


def _within_group(values: torch.Tensor, G: int) -> torch.Tensor:
    """(N,) each value minus its group's mean (NaN, a function that does not apply, counts as 0)."""
    v = _groups(values.nan_to_num(0.0), G)
    return (v - v.mean(1, keepdim=True)).flatten()


def constant_reward(f: StepFacts) -> Finding:
    """A function that adds nothing to any advantage. Where the functions are at hand, it is called on other
    completions of each prompt (`probes`): one that ignores the completion is named; one that is constant only because
    every group's completions are identical is not (the sampler made the groups so: `identical_groups`)."""
    per, G, r = f.run.rewards.per_function, f.run.config.num_generations, f.run.rollout
    varied_groups = [g for g in range(len(r.prompts)) if g not in set(r.identical_groups)]
    constant = [name for name, v in per.items() if _constant_within_groups(v, G)]
    unscored = [name for name in constant if bool(((~_groups(per[name].isnan(), G)).sum(1) < 2).all())]
    evidence = dict(constant_functions=constant, functions=list(per), groups_with_varied_completions=len(varied_groups),
                    unscored_within_groups=unscored)  # fmt: skip
    weights = dict(zip(per, f.reward_weights))
    silenced = [name for name in per if weights.get(name) == 0]  # TRL multiplies by the weight: 0 adds nothing
    if silenced:
        evidence.update(reward_weights=weights, weighted_zero=silenced)
    weighted = (f"; {', '.join(silenced)} {'is' if len(silenced) == 1 else 'are'} weighted 0 "
                f"(reward_weights {list(weights.values())}): nothing {'it scores' if len(silenced) == 1 else 'they score'} "
                "reaches an advantage") if silenced else ""  # fmt: skip
    probes = f.reward_probes or {}
    ignoring = [n for n in constant if n in probes and probes[n].ignores_completion]
    if probes:
        evidence["probed"] = {n: p.as_dict() for n, p in probes.items()}
    if not constant and silenced:
        carried = len(silenced) < len(per)
        return _finding("constant_reward", "info" if carried else "problem",
                        f"every reward function varies within some group{weighted}"
                        + (" (a weight of 0 logs a function without training on it)" if carried else
                           ": no reward function reaches the advantages"), named=[], **evidence)  # fmt: skip
    if not constant:
        return _finding("constant_reward", "absent", "every reward function varies within some group", **evidence)
    reads = [n for n in constant if n in probes and probes[n].varies_across_completions]
    if probes and reads and len(reads) == len(constant):
        return _finding("constant_reward", "absent" if not varied_groups else "info",
                        f"{', '.join(constant)} gave one value within every group, yet another value when called on "
                        "other or changed completions of the same prompts: it reads the completion, and every "
                        "completion here earns the same from it", **evidence)  # fmt: skip
    if not probes and not varied_groups:
        return _finding("constant_reward", "info",
                        f"{', '.join(constant)} gave one value within every group, but every group's completions are "
                        "identical: no function could vary (pass --task to call it on other completions)",
                        **evidence)  # fmt: skip
    named = ignoring or [n for n in constant if n not in reads]
    said = ("gave the same value for every completion of each prompt, its own, another prompt's and changed ones"
            if ignoring else "is constant within every group")  # fmt: skip
    nothing = [n for n in per if n in named or n in silenced]
    severity = "problem" if len(nothing) == len(per) else "warning"
    return _finding(
        "constant_reward", severity,
        f"{', '.join(named)} {said}{weighted}: {len(nothing)} of {len(per)} reward functions add nothing to any "
        "advantage", named=named, **evidence,
    )  # fmt: skip


DOMINANT_SHARE = 0.9
ERASED_SHARE = 0.01  # a function with under 1% of the variance it shares: its signal is lost in the sum


def _normalised_within_group(values: torch.Tensor, G: int) -> torch.Tensor:
    """(N,) `_within_group` divided by its group's std (+ TRL's 1e-4): what normalize_then_sum adds up."""
    centred = _groups(_within_group(values, G), G)
    return (centred / (centred.std(1, keepdim=True) + TRL_EPS)).flatten()


def dominant_reward(f: StepFacts) -> Finding:
    """Each function's share of the advantages' within-group variance: cov(part_k, total) / var(total), where
    part_k is w_k r_k centred in its group (sum_then_normalize), or also divided by its group's std
    (normalize_then_sum: each function counts alike whatever its units)."""
    per, cfg = f.run.rewards.per_function, f.run.config
    G = cfg.num_generations
    centre = _normalised_within_group if cfg.multi_objective_aggregation == "normalize_then_sum" else _within_group
    parts = {name: w * centre(v, G) for (name, v), w in zip(per.items(), f.reward_weights)}
    total = sum(parts.values())
    variance = (total * total).sum().item()
    if len(parts) < 2 or variance == 0:
        return _finding("dominant_reward", "absent", "one reward function, or no variance to share")
    shares = {name: (p * total).sum().item() / variance for name, p in parts.items()}
    top = max(shares, key=shares.get)
    evidence = dict(variance_shares=shares, reward_weights=dict(zip(per, f.reward_weights)))
    varied = [n for n in parts if not _constant_within_groups(per[n], G)]  # a constant one is constant_reward's
    erased = [n for n in varied if n != top and abs(shares[n]) < ERASED_SHARE]
    paid = [n for n in erased if f.reward_probes and n in f.reward_probes and f.reward_probes[n].paid_for_length]
    if erased and shares[top] >= DOMINANT_SHARE and paid == erased:
        return _finding("dominant_reward", "info",
                        f"{top} ({shares[top]:.0%}) erases {', '.join(erased)}, which pays for length (length_reward): "
                        "normalising it in would pay for length more", erased=erased, **evidence)  # fmt: skip
    if erased and shares[top] >= DOMINANT_SHARE:
        return _finding(
            "dominant_reward", "warning",
            f"{', '.join(erased)} {'varies' if len(erased) == 1 else 'vary'} within groups but "
            f"{'carries' if len(erased) == 1 else 'carry'} under {ERASED_SHARE:.0%} of the advantages' variance "
            f"({', '.join(f'{n} {shares[n]:.2%}' for n in erased)}): {top} ({shares[top]:.0%}) erases "
            f"{'it' if len(erased) == 1 else 'them'}{_weighted(f.reward_weights)}", erased=erased, **evidence,
        )  # fmt: skip
    if shares[top] < DOMINANT_SHARE:
        return _finding("dominant_reward", "absent", f"largest share of the advantage variance {shares[top]:.0%}",
                        **evidence)  # fmt: skip
    return _finding(
        "dominant_reward", "info",
        f"{top} carries {shares[top]:.0%} of the advantages' within-group variance (a covariance share: above "
        "100% when the other functions pull against it)", **evidence,
    )  # fmt: skip


def _weighted(weights: tuple[float, ...]) -> str:
    """The weights a finding about the weighted sum was measured under, where they are not TRL's default (all 1)."""
    return "" if all(w == 1 for w in weights) else f" (under reward_weights {list(weights)})"


LENGTH_CORRELATION = 0.7  # within-group Pearson r between a reward and the completion length
# ... and the family-wise error of one step's length verdicts (Holm over its reward functions): a sample's r
# reaches 0.7 by chance more often the fewer completions it has (a 16-completion step has 11 df), and a
# recorder judges every step of a run
LENGTH_ALPHA = 0.01


def paid_for_length(tests: dict[str, tuple[float, float]]) -> str | None:
    """The reward function that pays for length, if one does: its within-group r with the completion length
    reaches LENGTH_CORRELATION and its one-sided p-value, Holm-adjusted over `tests` ({name: (r, p)}, the
    step's reward functions), is at most LENGTH_ALPHA; the largest r among them. None: no function does."""
    adjusted = dict(zip(tests, holm([p for _, p in tests.values()])))
    paid = [k for k, (r, _) in tests.items() if r >= LENGTH_CORRELATION and adjusted[k] <= LENGTH_ALPHA]
    return max(paid, key=lambda k: tests[k][0]) if paid else None


def length_reward(f: StepFacts) -> Finding:
    """A reward that pays for length. Decided by intervention where the functions are at hand (`probes`: each
    completion scored again with whitespace appended and with its last word repeated, its content kept): a function
    that rises is paid for length; one that only correlates with length (right answers that happen to be longer)
    is not. Without the functions, the within-group correlation is reported as info: it cannot tell the two apart."""
    r, per, G = f.run.rollout, f.run.rewards.per_function, f.run.config.num_generations
    lengths = r.completion_lengths.float()
    probes = f.reward_probes
    tests = {name: within_group_correlation(v, lengths, G) for name, v in {**per, "total": f.run.rewards.total}.items()}
    correlations = {name: t[0] for name, t in tests.items()}
    evidence = dict(within_group_correlation=correlations, one_sided_p={k: t[1] for k, t in tests.items()})
    weights = dict(zip(per, f.reward_weights))
    if probes:
        evidence["probed"] = {n: p.as_dict() for n, p in probes.items()}
        paid = [n for n, p in probes.items() if p.paid_for_length]
        silenced = [n for n in paid if weights.get(n) == 0]  # TRL multiplies by the weight: 0 pays nothing
        paid = [n for n in paid if n not in silenced]
        if silenced and not paid:
            return _finding("length_reward", "info",
                            f"{', '.join(silenced)} pays for length, but is weighted 0 (reward_weights "
                            f"{list(weights.values())}): what it pays reaches no advantage", paid=[],
                            weighted_zero=silenced, **evidence)  # fmt: skip
        if paid:
            p = probes[paid[0]]
            how = max((p.rise_padded, "whitespace appended", p.raised_padded),
                      (p.rise_repeated, "its last word repeated", p.raised_repeated))  # fmt: skip
            return _finding(
                "length_reward", "warning",
                f"{', '.join(paid)} pays for length: with {how[1]} (content kept), the reward rose by {how[0]:+.3g} "
                f"on average, on {how[2]:.0%} of completions (its within-group spread {p.spread:.3g}): longer is paid",
                paid=paid, **evidence,
            )  # fmt: skip
    if _within_group(lengths, G).abs().max().item() == 0:
        return _finding("length_reward", "absent", "every completion of a group has the same length", **evidence)
    name = paid_for_length({k: tests[k] for k in per})
    if probes:
        top = max(per, key=lambda k: correlations[k])
        if correlations[top] >= LENGTH_CORRELATION:
            return _finding("length_reward", "info",
                            f"{top} rises with completion length (within-group r = {correlations[top]:+.2f}), but not "
                            "when only the length changes (whitespace appended, the last word repeated): it pays for "
                            "something that comes with length", **evidence)  # fmt: skip
    elif name is not None:
        return _finding(
            "length_reward", "info",
            f"{name} rises with completion length (within-group r = {correlations[name]:+.2f}, Holm-adjusted "
            f"p <= {LENGTH_ALPHA}); a correlation cannot tell length from what comes with it: pass --task to call "
            "the function on the same completions made longer",
            **evidence,
        )  # fmt: skip
    if min(correlations[k] for k in per) <= -LENGTH_CORRELATION:
        low = min(per, key=lambda k: correlations[k])
        return _finding("length_reward", "info", f"{low} falls with length (r = {correlations[low]:+.2f}): a "
                        "length penalty, if meant", **evidence)  # fmt: skip
    return _finding("length_reward", "absent", f"largest |r| with length {max(map(abs, correlations.values())):.2f}",
                    **evidence)  # fmt: skip


NONE_WARNING = 0.25  # a function that does not apply to a quarter of the completions: their signal from it is gone
UNSCORABLE_PROBLEM = 1.0  # no completion scored by any function: every advantage is 0


def bad_reward(f: StepFacts) -> Finding:
    rewards, n = f.run.rewards, len(f.run.rewards.total)
    none = {
        name: int(v.isnan().sum()) - len(rewards.infinite.get(name, ())) for name, v in rewards.per_function.items()
    }
    unscorable = int(rewards.total.isnan().sum())
    evidence = dict(none_rewards=none, infinite_rewards={k: len(v) for k, v in rewards.infinite.items()},
                    unscorable=unscorable, completions=n)  # fmt: skip
    said = []
    if rewards.infinite:
        said.append("infinite rewards (read as None here; TRL 1.16 zeroes such a group's advantages, or sets them "
                     "to -3.4e38 under scale_rewards='none'): "
                     + ", ".join(f"{k} {len(v)}/{n} (first at sample {v[0]})" for k, v in rewards.infinite.items()))  # fmt: skip
    if any(none.values()):
        said.append("None rewards (skipped in the sum, as TRL does): "
                    + ", ".join(f"{k} {c}/{n}" for k, c in none.items() if c))  # fmt: skip
    if unscorable:
        said.append(f"{unscorable}/{n} completions no function scored (reward NaN and advantage 0, as in TRL 1.16)")
    weights = dict(zip(rewards.per_function, f.reward_weights))
    silenced = [k for k, c in none.items() if c and weights.get(k) == 0]  # its None, like its number, weighs 0
    if silenced:
        evidence["weighted_zero"] = silenced
        said.append(f"({', '.join(silenced)} weighted 0: {'its' if len(silenced) == 1 else 'their'} None rewards "
                    "change no advantage)")  # fmt: skip
    probes = {k: p for k, p in (f.reward_probes or {}).items() if weights.get(k) != 0}
    by_form = {k: probes[k].none_moved for k, c in none.items() if c and k in probes and probes[k].none_moved > 0}
    latent = {k: probes[k].none_moved for k, c in none.items()
              if not c and k in probes and probes[k].none_moved >= NONE_WARNING}  # fmt: skip
    evidence["none_moved_by_whitespace"] = by_form | latent
    if by_form:
        said.append("a None that comes and goes with whitespace appended, content kept: "
                    + ", ".join(f"{k} on {share:.0%} of completions" for k, share in by_form.items())
                    + " (it reads the text's form, not its answer)")  # fmt: skip
    if latent:
        said.append("no None on this step, but whitespace appended, content kept, turns "
                    + ", ".join(f"{k} None on {share:.0%} of completions" for k, share in latent.items())
                    + " (it reads the text's form: a completion that differs only so loses its signal)")  # fmt: skip
    if not said:
        return _finding("bad_reward", "absent", "every reward is a finite number", **evidence)
    if rewards.infinite or unscorable >= UNSCORABLE_PROBLEM * n:
        severity = "problem"
    elif by_form or latent or max((c for k, c in none.items() if k not in silenced), default=0) >= NONE_WARNING * n:
        severity = "warning"
    else:
        severity = "info"
    return _finding("bad_reward", severity, "; ".join(said), **evidence)


NOT_OWN_PROBLEM = 0.5  # half the rows or more scored otherwise: the advantages are mostly the reward's noise


def rewards_not_own(f: StepFacts) -> Finding:
    """Rewards that are not the completions' own: recomputed on the very completions the trainer scored, they differ
    from what it logged (the rows named); or scored again, or in reverse order, the same completions get other
    scores (`probes`). Either way the advantages are not what the completions earned."""
    per, n = f.run.rewards.per_function, len(f.run.rewards.total)
    probes = f.reward_probes or {}
    drift = {
        name: _differing_rows(per[name], logged) for name, logged in (f.logged_rewards or {}).items() if name in per
    }
    drift = {name: rows for name, rows in drift.items() if rows}
    again = {k: p.rescored_moved for k, p in probes.items() if p.rescored_moved > 0}
    order = {k: p.reordered_moved for k, p in probes.items() if p.reordered_moved > 0}
    evidence = dict(differs_from_logged={k: rows[:16] for k, rows in drift.items()},
                    rows_differing={k: len(rows) for k, rows in drift.items()}, compared=f.logged_rewards is not None,
                    rescored_moved=again, reordered_moved=order)  # fmt: skip
    said = []
    if drift:
        said.append("recomputed on the completions the trainer scored, " + ", ".join(
            f"{k} differs from the trainer's logged rewards on {len(rows)}/{n} rows (first: row {rows[0]}, "
            f"{_value(per[k][rows[0]].item())} here, {_value(f.logged_rewards[k][rows[0]])} logged)"
            for k, rows in drift.items()))  # fmt: skip
    if again:
        said.append("scored again, " + ", ".join(f"{k} changed {v:.0%} of its scores" for k, v in again.items()))
    if order:
        said.append(
            "scored in reverse order, " + ", ".join(f"{k} changed {v:.0%} of its scores" for k, v in order.items())
        )
    if not said:
        how = "equal the trainer's logged ones and " if f.logged_rewards is not None else ""
        checked = "; scored again and in reverse order they do not move" if probes else ""
        if not how and not checked:
            return _finding("rewards_not_own", "absent", "not checked: the reward functions are not at hand (--task)",
                            **evidence)  # fmt: skip
        return _finding("rewards_not_own", "absent", f"the recomputed rewards {how}are the completions' own{checked}"
                        if how else f"the rewards are the completions' own{checked}", **evidence)  # fmt: skip
    share = max([len(r) / n for r in drift.values()] + list(again.values()) + list(order.values()))
    severity = "problem" if share >= NOT_OWN_PROBLEM else "warning"
    return _finding("rewards_not_own", severity, "the rewards are not the completions' own: " + "; ".join(said),
                    **evidence)  # fmt: skip


def _differing_rows(ours: torch.Tensor, logged: tuple) -> list[int]:
    """The rows where a recomputed reward differs from the logged one beyond float32's rounding (None is NaN)."""
    theirs = torch.tensor([math.nan if v is None else float(v) for v in logged], dtype=torch.float64)
    mine = ours.detach().double().cpu()
    if len(theirs) != len(mine):
        return list(range(len(mine)))
    scale = 1.0 + torch.cat([mine, theirs]).nan_to_num(0.0, posinf=0.0, neginf=0.0).abs().max().item()
    differs = ((mine - theirs).abs() > 1e-6 * scale) & ~(mine.isnan() & theirs.isnan())
    differs |= mine.isnan() != theirs.isnan()
    return differs.nonzero().flatten().tolist()


def _value(v) -> str:
    return "None" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4g}"


TRUNCATED_WARNING = 0.25  # a quarter of the completions cut: their rewards judge unfinished text
TRUNCATED_PROBLEM = 1.0  # every completion cut: nothing finished to learn from


def truncation(f: StepFacts) -> Finding:
    r, cfg = f.run.rollout, f.run.config
    cut = (~r.finished).float().mean().item()
    evidence = dict(
        truncated_share=cut,
        max_completion_length=cfg.max_new_tokens,
        mean_length=r.completion_lengths.float().mean().item(),
        masked=cfg.mask_truncated_completions,
    )
    if cut == 0:
        return _finding("truncation", "absent", "every completion ended with an EOS", **evidence)
    masked = " (masked from the loss: mask_truncated_completions)" if cfg.mask_truncated_completions else ""
    if cut >= TRUNCATED_PROBLEM:
        return _finding(
            "truncation", "problem",
            f"every completion hit max_completion_length={cfg.max_new_tokens} without an EOS{masked}: raise it "
            "(masking them would leave nothing to learn from)", **evidence,
        )  # fmt: skip
    severity = "warning" if cut >= TRUNCATED_WARNING else "info"
    return _finding(
        "truncation", severity,
        f"{cut:.0%} of completions hit max_completion_length={cfg.max_new_tokens} without an EOS{masked}",
        **evidence,
    )  # fmt: skip


IDENTICAL_WARNING = 0.5  # half the groups without two different completions: most prompts teach nothing
COLD = 0.5  # a sampling temperature at or below this narrows the distribution by itself (TRL's default is 1.0)


def _narrowed(cfg) -> list[str]:
    """The sampling settings that narrow the distribution TRL samples from (its defaults narrow nothing)."""
    said = [f"top_p {cfg.top_p:g}"] if cfg.top_p < 1 else []
    said += [f"top_k {cfg.top_k}"] if cfg.top_k else []
    said += [f"min_p {cfg.min_p:g}"] if cfg.min_p else []
    return said + ([f"temperature {cfg.temperature:g}"] if cfg.temperature <= COLD else [])


def identical_groups(f: StepFacts) -> Finding:
    """Groups whose G completions are one text: no reward function can tell them apart, so their advantages are 0
    whatever the rewards. Loud only where the sampling settings narrow the distribution (a fix to resample with);
    at TRL's sampling defaults identical completions are a model that is sure of its answer."""
    r, cfg = f.run.rollout, f.run.config
    share = len(r.identical_groups) / max(len(r.prompts), 1)
    narrowed = _narrowed(cfg)
    evidence = dict(identical_groups=list(r.identical_groups), share=share, narrowed_by=narrowed)
    if share == 0:
        return _finding("identical_groups", "absent", "every group holds two different completions or more", **evidence)
    said = f"{len(r.identical_groups)} of {len(r.prompts)} groups: all {cfg.num_generations} completions identical"
    if not narrowed:
        return _finding("identical_groups", "info", f"{said}, sampled at temperature {cfg.temperature:g} with nothing "
                        "cut: the model is that sure of them", **evidence)  # fmt: skip
    severity = "problem" if share == 1 else "warning" if share >= IDENTICAL_WARNING else "info"
    return _finding("identical_groups", severity, f"{said}, sampled with {', '.join(narrowed)}: their advantages are 0 "
                    "whatever the reward functions pay", **evidence)  # fmt: skip


# ---- loss


def kl_off(f: StepFacts) -> Finding:
    beta = f.run.config.beta
    if beta > 0:
        return _finding("kl_off", "absent", f"beta = {beta:g}", beta=beta)
    return _finding("kl_off", "info", "beta = 0: no reference model and no KL term; the logged kl is 0", beta=beta)


KL_GRADIENT_ERROR = 0.25  # |E[grad k] - grad KL| / |grad KL| (or the value's relative error) above this: off


def kl_estimator(f: StepFacts) -> Finding:
    cfg, measured = f.run.config, f.kl_against_exact
    if cfg.beta == 0 or measured is None:
        return _finding("kl_estimator", "absent", "no KL term (beta = 0)", estimator=cfg.kl_estimator)
    evidence = dict(estimator=cfg.kl_estimator, beta=cfg.beta, **measured)
    numbers = (
        f"exact KL {measured['exact_kl']:.3g}, {cfg.kl_estimator} on the sampled tokens "
        f"{measured['estimate_on_sampled_tokens']:.3g}"
    )
    cosine, error = measured["grad_cosine"], measured["grad_rel_error"]
    if math.isnan(error):
        return _finding(
            "kl_estimator", "info" if cfg.kl_estimator != "k1" else "warning",
            f"{numbers}: the policy is the reference on this step, so every estimator's gradient is 0 here; "
            f"{_KL_WHY.get(cfg.kl_estimator, cfg.kl_estimator)} once it moves",
            **evidence,
        )  # fmt: skip
    numbers += f"; its expected gradient is {error:.0%} off the exact KL's (cosine {cosine:.3f})"
    if error <= KL_GRADIENT_ERROR:
        exact, expected = measured["exact_kl"], measured["expected_estimate"]
        if abs(expected - exact) > KL_GRADIENT_ERROR * exact:
            return _finding(
                "kl_estimator", "info",
                f"{numbers}: it pulls toward the reference as KL does, but its value (expected {expected:.3g}) "
                "is not the KL: the logged kl is not the divergence",
                **evidence,
            )  # fmt: skip
        return _finding("kl_estimator", "absent", f"{numbers}: it pulls toward the reference as KL does", **evidence)
    return _finding("kl_estimator", "warning", f"{numbers}: {_KL_WHY.get(cfg.kl_estimator, '')}", **evidence)


_KL_WHY = {
    "k1": "k1's gradient is 0 in expectation: the KL term does not pull toward the reference",
    "k2": "k2's value is not the KL (its expected gradient is the reverse KL's)",
    "k3": "k3's gradient without the ratio is the gradient of KL(ref || pi), not KL(pi || ref) (Tang & Munos 2025)",
    "k3_corrected": "k3 times the ratio: the reverse KL's gradient",
}


CLIP_SATURATED = 0.2  # a fifth of the tokens with a cut gradient


def clip_inactive(f: StepFacts) -> Finding:
    region = f.run.update.iterations[0].metrics.get("clip_ratio/region_mean", 0.0)
    on_policy = first_pass_ratio_gap(f.run) < ON_POLICY
    if f.run.config.num_iterations == 1 and on_policy:
        return _finding(
            "clip_inactive", "info",
            "num_iterations = 1: the old log-probs are this pass's own, so the ratio is 1 and every clip_ratio is 0 "
            "by design",
            clip_ratio_region_mean=region,
        )  # fmt: skip
    return _finding("clip_inactive", "absent", f"clip_ratio/region_mean {region:.3g}", clip_ratio_region_mean=region)


def clip_saturated(f: StepFacts) -> Finding:
    upd = f.run.update
    regions = [it.metrics.get("clip_ratio/region_mean", 0.0) for it in upd.iterations]
    worst = max(regions, default=0.0)
    evidence = dict(clip_ratio_region_mean_per_pass=regions)
    if worst < CLIP_SATURATED:
        return _finding("clip_saturated", "absent", f"at most {worst:.1%} of tokens clipped in a pass", **evidence)
    return _finding("clip_saturated", "warning", f"{worst:.0%} of tokens clipped in a pass: their gradient is cut",
                    **evidence)  # fmt: skip


ENTROPY_COLLAPSE = 0.05  # nats per token


def entropy_before(history: tuple[dict, ...] | list[dict]) -> tuple[int, float] | None:
    """(step, entropy) at the first step TRL logged an entropy: the policy before the run's updates (TRL's
    entropy is the scoring pass's, before its step's optimizer step); None where nothing was logged."""
    return next(((int(h["step"]), float(h["entropy"])) for h in history if "entropy" in h), None)


def entropy_collapse(f: StepFacts) -> Finding:
    """A collapse is a fall during the run: an entropy below ENTROPY_COLLAPSE that was as low at the run's first
    logged step is the model's own sureness (or the sampler's temperature: TRL scores at it), no update made it."""
    lp = f.run.logprobs
    mean = _masked_mean(lp.entropies, lp.mask)
    identical = len(f.run.rollout.identical_groups)
    first = entropy_before(f.logged_history)
    evidence = dict(entropy=mean, identical_groups=identical, entropy_at_first_logged_step=first)
    if mean >= ENTROPY_COLLAPSE:
        return _finding("entropy_collapse", "absent", f"mean token entropy {mean:.3g} nats", **evidence)
    said = f"mean token entropy {mean:.3g} nats; {identical} groups sampled one completion G times"
    if first is not None and first[1] < ENTROPY_COLLAPSE:
        return _finding(
            "entropy_collapse", "info",
            f"{said}; it was {first[1]:.3g} at step {first[0]}, the run's first logged step "
            f"({'before any update' if first[0] <= 1 else 'no fall logged since'}): the model's own sureness at the "
            f"run's temperature, not a collapse its updates made",
            **evidence,
        )  # fmt: skip
    dated = (
        "; TRL logged no entropy to date it" if first is None else f"; it fell from {first[1]:.3g} at step {first[0]}"
    )
    return _finding("entropy_collapse", "warning", said + dated, **evidence)


PHANTOM_RELATIVE = 0.01  # a group std below 1% of the batch's reward std, scaled up to unit size
FULL_SIZE = 0.5  # ...where its largest |A| reaches half a unit (a std far below TRL's 1e-4 eps is divided by the eps)


def _varying_within(per_function: dict[str, torch.Tensor], G: int, groups: list[int]) -> list[str]:
    """The reward functions whose values differ within any of `groups`: where those groups' slivers come from."""
    if not groups:
        return []
    rows = torch.tensor(groups)
    return [n for n, v in per_function.items() if not _constant_within_groups(_groups(v, G)[rows].flatten(), G)]


def advantage_scale(f: StepFacts) -> Finding:
    """Phantom advantages: a group whose rewards differ by a sliver of the batch's spread, divided by its own
    std, gets advantages as large as a group whose rewards really differ."""
    adv, cfg = f.run.advantages, f.run.config
    batch_std = f.run.rewards.total.std().item() if len(f.run.rewards.total) > 1 else 0.0
    blown = adv.values.view(-1, cfg.num_generations).abs().amax(1) >= FULL_SIZE  # TRL's eps keeps a rounding's small
    phantom = [g for g in adv.phantom_groups if blown[g]]
    tiny = [g for g in phantom if adv.group_std[g].item() < PHANTOM_RELATIVE * batch_std]
    evidence = dict(scale_rewards=cfg.scale_rewards, phantom_groups=len(phantom), tiny_std_groups=len(tiny),
                    batch_reward_std=batch_std, max_abs_advantage=adv.max_abs_advantage,
                    sliver_functions=_varying_within(f.run.rewards.per_function, cfg.num_generations, tiny))  # fmt: skip
    if cfg.scale_rewards == "none" or not phantom:
        return _finding("advantage_scale", "absent", f"max |A| {adv.max_abs_advantage:.3g}", **evidence)
    n = len(tiny) or len(phantom)
    groups = f"{n} group{'s' if n != 1 else ''}"
    if tiny:
        return _finding(
            "advantage_scale", "warning",
            f"{groups} whose reward std is below {PHANTOM_RELATIVE:.0%} of the batch's ({batch_std:.3g}) divided into "
            f"their advantages (max |A| {adv.max_abs_advantage:.3g}): slivers blown up to full-size advantages",
            **evidence,
        )  # fmt: skip
    return _finding("advantage_scale", "info", f"{groups} with a reward std below 0.05 scaled to unit advantages",
                    **evidence)  # fmt: skip


# max |A| that a group normalised by its own std can reach is (G - 1) / sqrt(G) (2.5 at G = 8): these are far past it
LARGE_ADVANTAGE_WARNING = 10.0  # the policy term outweighs a unit-scale one tenfold (and beta's KL term with it)
LARGE_ADVANTAGE_PROBLEM = 100.0  # a hundredfold: the rewards' units, not their ranking, set the step


def advantage_severity(max_abs_advantage: float) -> str:
    """large_advantages' level for the largest |advantage|: problem, warning, or absent."""
    if max_abs_advantage >= LARGE_ADVANTAGE_PROBLEM:
        return "problem"
    return "warning" if max_abs_advantage >= LARGE_ADVANTAGE_WARNING else "absent"


def large_advantages(f: StepFacts) -> Finding:
    adv, cfg = f.run.advantages, f.run.config
    G = cfg.num_generations
    bound = (G - 1) / math.sqrt(G)
    evidence = dict(max_abs_advantage=adv.max_abs_advantage, group_normalised_bound=bound,
                    scale_rewards=cfg.scale_rewards, beta=cfg.beta)  # fmt: skip
    said = f"max |A| {adv.max_abs_advantage:.3g} (a group normalised by its std reaches at most {bound:.2g} at G={G})"
    severity = advantage_severity(adv.max_abs_advantage)
    if severity == "problem":
        return _finding("large_advantages", "problem", f"{said}: past {LARGE_ADVANTAGE_PROBLEM:g}, the rewards' "
                        f"units set the step (scale_rewards={cfg.scale_rewards!r})", **evidence)  # fmt: skip
    if severity == "warning":
        return _finding("large_advantages", "warning", f"{said}: past {LARGE_ADVANTAGE_WARNING:g}, the policy term "
                        "outweighs a unit-scale one (and beta's KL term) tenfold", **evidence)  # fmt: skip
    return _finding("large_advantages", "absent", said, **evidence)


CLIPPED_INFO = 2.0  # grad_norm / max_grad_norm: half the gradient's length cut
CLIPPED_WARNING = 10.0  # nine tenths cut: the clip, not the loss, sets how far the step goes


def grad_clipped(f: StepFacts) -> Finding:
    """How much of the gradient's length max_grad_norm cuts (TRL's grad_norm is the norm before clipping). Info at
    most: the clip protects the run, and under AdamW (TRL's optimizer, and this engine's) a clip that scales every
    step's gradient alike is divided out of the update; what makes the gradient large is the cause. One step's flip
    (max_grad_norm=0) cannot measure it on a captured step whose optimizer state was built from clipped gradients."""
    upd, cfg = f.run.update, f.run.config
    evidence = dict(grad_norm=upd.grad_norm, max_grad_norm=cfg.max_grad_norm)
    if not cfg.max_grad_norm or upd.grad_norm is None or not math.isfinite(upd.grad_norm):
        return _finding("grad_clipped", "absent", f"max_grad_norm {cfg.max_grad_norm:g}: no clipping", **evidence)
    ratio = upd.grad_norm / cfg.max_grad_norm
    evidence["ratio"] = ratio
    cut = max(0.0, 1 - cfg.max_grad_norm / upd.grad_norm) if upd.grad_norm > 0 else 0.0
    said = f"grad_norm {upd.grad_norm:.3g} against max_grad_norm {cfg.max_grad_norm:g}: {cut:.0%} of its length cut"
    if ratio >= CLIPPED_WARNING:  # info: AdamW divides a clip that scales every step alike out of its update
        return _finding("grad_clipped", "info", f"{said}; under AdamW a clip that cuts every step alike is divided "
                        "out of the update: it matters where the gradient's norm jumps from step to step",
                        **evidence)  # fmt: skip
    if ratio >= CLIPPED_INFO:
        return _finding("grad_clipped", "info", said, **evidence)
    return _finding("grad_clipped", "absent", said, **evidence)


UPDATE_WARNING = 0.01  # ||delta theta|| / ||theta||: the recorder's signal (it has no second scoring), and the
# doctor's where the update's KL was not measured or stays low (corpus tuning runs: clean ones move 3e-6 to 9e-4 of
# the norm a step, learning rates of 0.01-0.03 move 8-17%, one at KL 0.0066 on its own confident completions)
# KL(pi_before || pi_after) per token that one update makes on its own completions (`moved_kl`). Measured in
# data/calibration/update_size.json (`python -m grpo_debug.doctor.calibration`): one step of the bundled task at
# learning rates 1e-5 to 1e-1, 3 seeds. At 1e-4 (KL about 0.02) the held-out reward does not move; at 1e-3
# (0.35 to 0.43) it falls a little; from 3e-3 (1.3 and up) every seed lost 0.4 or more of it.
MOVED_KL_WARNING = 0.1  # nats per token: five times the quiet rate's, below where the reward began to fall
MOVED_KL_PROBLEM = 1.0  # nats per token: every calibration step past it lost the held-out reward


def update_size(f: StepFacts) -> Finding:
    upd, cfg = f.run.update, f.run.config
    rate = upd.learning_rates[0] if upd.learning_rates else cfg.learning_rate  # as applied (a capture: scheduled)
    relative = upd.update_norm / f.weight_norm if f.weight_norm else math.inf
    evidence = dict(update_norm=upd.update_norm, weight_norm=f.weight_norm, relative=relative,
                    learning_rate=rate, grad_norm=upd.grad_norm, moved_kl=f.step_kl)  # fmt: skip
    moved = f"{relative:.2%} of the weights' norm, learning_rate {rate:g}"
    if f.step_kl is None:
        if relative > UPDATE_WARNING:
            return _finding("update_size", "warning", f"the step moves the weights by {moved}", **evidence)
        return _finding("update_size", "absent", f"the step moves the weights by {relative:.2g} of their norm",
                        **evidence)  # fmt: skip
    said = f"one update moved the policy by KL {f.step_kl:.3g} nats per token on its own completions ({moved})"
    if f.step_kl >= MOVED_KL_PROBLEM:
        return _finding("update_size", "problem", f"{said}: past {MOVED_KL_PROBLEM:g}, one step cost the held-out "
                        "reward on every seed of the calibration", **evidence)  # fmt: skip
    if f.step_kl >= MOVED_KL_WARNING:
        return _finding("update_size", "warning", f"{said}: past {MOVED_KL_WARNING:g}, the held-out reward began "
                        "to fall in the calibration", **evidence)  # fmt: skip
    if relative > UPDATE_WARNING:  # a confident policy's own completions hide a move this size (p near 1: KL near 0)
        return _finding("update_size", "warning", f"{said}: the weights moved by over {UPDATE_WARNING:.0%} of their "
                        f"norm in one update: {1 / relative:.0f} steps of this size move them by their own norm",
                        **evidence)  # fmt: skip
    return _finding("update_size", "absent", said, **evidence)


KL_BLOWUP_WARNING = MOVED_KL_WARNING  # the same distance, however many steps it took
KL_BLOWUP_PROBLEM = MOVED_KL_PROBLEM


KL_NOISE = 1e-3  # nats per token: a logged kl below this is the estimator's noise, not a level to grow from
KL_GROWTH_WARNING = 2.0  # the logged kl doubling (or more) per step...
KL_GROWTH_STEPS = 8  # ...and past KL_BLOWUP_PROBLEM within this many steps at that rate (the doctor's horizon)


def kl_growth(history: tuple[tuple[int, float], ...]) -> float | None:
    """The logged kl's growth per step over its last two values above KL_NOISE: (kl_b / kl_a) ** (1 / (b - a));
    None with fewer than two."""
    points = [(s, kl) for s, kl in history if kl > KL_NOISE]
    if len(points) < 2 or points[-1][0] <= points[-2][0]:
        return None
    (a, kl_a), (b, kl_b) = points[-2:]
    return (kl_b / kl_a) ** (1 / (b - a))


def kl_blowup(f: StepFacts) -> Finding:
    """How far the policy is from its reference at the step's start: the exact KL(pi || ref) per token over the
    vocabulary where measured (beta > 0), else the kl TRL logged at the captured step (k3 on the sampled tokens);
    and how fast TRL's logged kl grew over the steps before (a capture's `logged_kl`)."""
    cfg, exact = f.run.config, f.kl_against_exact
    kl, source = (exact["exact_kl"], "exact KL(pi || ref)") if exact else (f.logged_kl, "TRL's logged kl")
    growth = kl_growth(f.kl_history)
    evidence = dict(kl=kl, source=source, beta=cfg.beta, logged_kl=f.logged_kl, growth_per_step=growth,
                    logged_history=[list(h) for h in f.kl_history[-8:]])  # fmt: skip
    if kl is None or not math.isfinite(kl):
        return _finding("kl_blowup", "absent", "no reference (beta = 0): the KL to it is not measured", **evidence)
    said = f"{source} {kl:.3g} nats per token at the step's start"
    if not exact and cfg.dropout and f.dropout_sources:
        said += " (with dropout on in the trainer's forwards, its k3 holds dropout's noise too)"
    if growth is not None and growth > 1:
        said += f", the logged kl growing x{growth:.2g} per step"
    if kl >= KL_BLOWUP_PROBLEM:
        return _finding("kl_blowup", "problem", f"{said}: the steps before this one moved the policy past "
                        f"{KL_BLOWUP_PROBLEM:g} nat, where one step cost the held-out reward in the calibration",
                        **evidence)  # fmt: skip
    if kl >= KL_BLOWUP_WARNING:
        return _finding("kl_blowup", "warning", f"{said}: past {KL_BLOWUP_WARNING:g}", **evidence)
    if growth is not None and growth >= KL_GROWTH_WARNING and kl > KL_NOISE:
        steps = math.log(KL_BLOWUP_PROBLEM / kl) / math.log(growth)
        evidence["steps_to_problem"] = steps
        if steps <= KL_GROWTH_STEPS:
            return _finding("kl_blowup", "warning", f"{said}: at that rate past {KL_BLOWUP_PROBLEM:g} nat in about "
                            f"{math.ceil(steps)} steps", **evidence)  # fmt: skip
    return _finding("kl_blowup", "absent", said, **evidence)


NORMALISER_RATIO = 4.0  # max_completion_length over the mean scored length


def loss_normaliser(f: StepFacts) -> Finding:
    cfg, lp = f.run.config, f.run.logprobs
    mean_length = lp.mask.sum(1).float().mean().item()
    evidence = dict(loss_type=cfg.loss_type, max_completion_length=cfg.max_new_tokens, mean_scored_length=mean_length)
    if cfg.loss_type != "dr_grpo" or cfg.max_new_tokens <= NORMALISER_RATIO * mean_length:
        return _finding("loss_normaliser", "absent", f"loss_type {cfg.loss_type}", **evidence)
    return _finding(
        "loss_normaliser", "warning",
        f"dr_grpo divides by max_completion_length={cfg.max_new_tokens}, {cfg.max_new_tokens / mean_length:.1f}x "
        f"the mean scored length {mean_length:.1f}: the loss's gradient is shrunk by as much, though Adam divides a "
        f"constant scale out of its step (the flip's update norm says how far the update itself moves)", **evidence,
    )  # fmt: skip


def _detector(pitfall_id: str):
    """The detector of a catalogue entry: the function of the same name here or in `logprob_detectors`."""
    found = globals().get(pitfall_id) or getattr(logprob_detectors, pitfall_id, None)
    if not callable(found):
        raise ImportError(f"pitfall {pitfall_id!r} (pitfalls.py) has no detector function of that name")
    return found


DETECTORS = tuple(_detector(id) for id in PITFALLS)  # in catalogue order
