"""Whether a narrowed sampler costs the run its signal. Groups of one text (`identical_groups`) in one draw of a few
prompts say little: at temperature 0.2, two of five groups may be one text by chance or by the setting. The fix is
measured instead: the step's prompts are sampled anew from its weights, with the user's reward functions, at the
run's settings and at TRL's sampling defaults (top_p 1, top_k 0, no min_p, temperature 1), the same seeds for both:

    recovered = share of groups without signal as run - share with the sampling fixed

a warning where the fix gives RECOVERED_WARNING of the groups a gradient or more, or where the run meets groups of
one text in half its groups or more (the detector's level, on the run's share); a problem where nearly every group
is one text; else info, with what the fix gave.

    findings = narrowing_tested(step, findings)

Only where the settings narrow the distribution (`detectors._narrowed`) and new completions can be scored.

Groups of one text have equal rewards by construction, and the sampling fix may bring zero_std_groups under its
level; yet where two draws of a sure model agree for the group's size as much as for the sampler, the other fix,
num_generations doubled (sampled anew by `resampled`), gives more groups a gradient than the sampling fix:

    findings = a_cause_of_its_own(findings)    # after the chain and time have linked symptoms to causes
"""

from __future__ import annotations

import dataclasses

import torch

from ..advantages import groups_without_signal, summarize_advantages
from ..config import StepConfig
from ..detectors.detectors import IDENTICAL_WARNING, _narrowed
from ..detectors.findings import LOUD, Finding
from ..pitfalls import PITFALLS
from ..step import GRPOStep, StepRun
from .resampled import NO_SIGNAL_PROBLEM, RECOVERED_WARNING, draws_for, recovered, sampled_anew

TRL_SAMPLING = dict(top_p=1.0, top_k=0, min_p=None)  # GRPOConfig's defaults, with temperature 1 or above


def sampled_shares(step: GRPOStep, cfg: StepConfig, draws: int) -> dict:
    """The step's prompts sampled `draws` times under `cfg` (`resampled.sampled_anew`): the shares of groups of one
    text and of groups without signal, {"identical", "without_signal", "groups"}. The caller's random state and the
    step are left as they were."""
    G = cfg.num_generations

    def read(run: StepRun) -> tuple[int, torch.Tensor]:
        without = groups_without_signal(summarize_advantages(run.rewards.total.float().cpu(), G))
        return len(run.rollout.identical_groups), without

    drawn = sampled_anew(step, cfg, draws, read)
    w = torch.cat([without for _, without in drawn]).float()
    return {"identical": sum(n for n, _ in drawn) / len(w), "without_signal": w.mean().item(), "groups": len(w)}


def severity_of(as_run: dict, fixed: dict) -> tuple[str, str]:
    """(severity, what the two samplings say) from `sampled_shares` as the run samples and with the fix."""
    recovered = as_run["without_signal"] - fixed["without_signal"]
    said = (f"; resampled {as_run['groups']} groups: {as_run['identical']:.0%} one text and "
            f"{as_run['without_signal']:.0%} without signal as the run samples, {fixed['without_signal']:.0%} "
            f"without signal at TRL's sampling defaults: the fix gives {recovered:.0%} of the groups a gradient")  # fmt: skip
    if as_run["identical"] >= NO_SIGNAL_PROBLEM:
        return "problem", said
    if recovered >= RECOVERED_WARNING or as_run["identical"] >= IDENTICAL_WARNING:
        return "warning", said
    return "info", said


def finishing(cfg: StepConfig, findings: list[Finding]) -> dict:
    """The config change that lets completions finish where truncation is loud (its fix, `PITFALLS`' fix_scales),
    else {}: rewards of cut completions are equal whatever the sampler does, so a sampling fix is measured with
    that fix in both arms (stranger tuning seed 542: every completion cut at 6 tokens, temperature 0.24)."""
    if not any(f.id == "truncation" and f.severity in LOUD for f in findings):
        return {}
    return PITFALLS["truncation"].scaled(cfg)


def narrowing_tested(step: GRPOStep, findings: list[Finding]) -> list[Finding]:
    """identical_groups, where present under narrowed sampling and new completions can be scored, with its severity
    from the two samplings (`severity_of`)."""
    cfg = step.cfg
    out = []
    for f in findings:
        if f.id != "identical_groups" or f.severity == "absent" or not _narrowed(cfg) or step.stored_rewards:
            out.append(f)
            continue
        draws, finished = draws_for(cfg.num_prompts, cfg.num_generations), finishing(cfg, findings)
        as_run = sampled_shares(step, cfg.replace(**finished), draws)
        fixed = sampled_shares(step, cfg.replace(**TRL_SAMPLING, temperature=max(cfg.temperature, 1.0), **finished),
                               draws)  # fmt: skip
        severity, said = severity_of(as_run, fixed)
        if finished:
            said += f" (both sampled with {', '.join(f'{k}={v}' for k, v in finished.items())}: truncation's fix)"
        evidence = {**f.evidence, "resampled": {"as_run": as_run, "fixed": fixed, "finished": finished}}
        out.append(dataclasses.replace(f, severity=severity, summary=f.summary + said, evidence=evidence))
    return out


def a_cause_of_its_own(findings: list[Finding]) -> list[Finding]:
    """zero_std_groups linked to identical_groups as its symptom is a cause again where its own fix (2G, sampled
    anew) gives RECOVERED_WARNING of the groups a gradient and more than the sampling fix gives (held-out-3 seed
    359: G = 2 under top_p 0.91, 2G gives 29%, top_p 1 gives 16%): the groups are alike for their size too."""
    by_id = {f.id: f for f in findings}
    zero, same = by_id.get("zero_std_groups"), by_id.get("identical_groups")
    if not (zero and same) or zero.symptom_of != ("identical_groups",):
        return findings
    own, theirs = recovered(zero), recovered(same)
    if own is None or theirs is None or own < RECOVERED_WARNING or own <= theirs:
        return findings
    said = (f"; its own fix, num_generations doubled, gives {own:.0%} of the groups a gradient, more than "
            f"identical_groups' sampling fix ({theirs:.0%}): a cause of its own")  # fmt: skip
    out = []
    for f in findings:
        if f.id == zero.id:
            f = dataclasses.replace(f, symptom_of=(), summary=f.summary + said)
        elif f.id == same.id:
            f = dataclasses.replace(f, clears=tuple(c for c in f.clears if c != zero.id))
        out.append(f)
    return out
