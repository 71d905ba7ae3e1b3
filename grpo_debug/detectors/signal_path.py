"""The learning signal's path through one GRPO step, measured stage by stage: what each stage lets through of what
came in, and what it lost to. Whatever broke a step, its signal is lost at one of these:

    samples      the completions the sampler drew: groups with two different texts, and the share of the policy's
                 completions the sampler can produce (top_p, top_k, min_p)
    rewards      groups whose weighted reward varies (only they give an advantage)
    advantages   rows of those groups with a non-zero advantage, and their scale
    tokens       completion tokens that carry the policy term's gradient (masks, top_entropy_quantile, the clip)
    loss         the policy term's gradient against the KL term's, d loss / d logp per token (lost where the KL term's
                 is the larger: the step mostly pulls back to the reference)
    parameters   trainable tensors the update moved
    update       the KL one update moved the policy by on its own completions, and what set its size

    stages = signal_path(facts)        # a Stage per stage, in the signal's order
    signal_lost(facts)                 # the first stage that loses nearly all of it: a Finding

A stage is measured on every step. Where a step loses nearly all its signal at one stage, that is a finding
whether or not a catalogued pitfall names it; where one does (a loud finding of the stage's own), `explained`
says which, and the catalogued finding leads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..logprobs import completion_mask
from ..sampler import sampler_reach
from ..show.loss_gradients import gradient_of_loss_wrt_logps
from .findings import LOUD, Finding, StepFacts, _finding

LOST = 0.1  # a stage that lets through a tenth of its signal or less has lost nearly all of it
KL_SWAMPS = 1.0  # the KL term's gradient larger than the policy term's: the step mostly pulls back to the reference
# a step that moves the policy by less than this (KL per token on its own completions) needs over 10,000 steps of its
# size, all pointing one way, to move as far as one step at the calibration's quiet rate (0.02 nats; KL grows as the
# square of the distance). On the bundled step (2026-11-28): learning_rate 1e-4 moves 0.024, TRL's default 1e-6
# 3.3e-6, 1e-8 8.3e-10, 1e-10 5.2e-11, where float32 rounds most of the update away; a LoRA run at TRL's default
# rate moves 7.5e-9 on its first steps (its B starts at 0): slow, not lost
MOVED_NOTHING = 1e-10
# ...and whose weights barely move: an update under this share of the trained weights' norm takes over 10,000 steps,
# all one way, to move them by 0.1% of it. Both must hold: a confident policy (its sampled tokens near probability
# 1) moves by a KL near 0 on its own completions however far its weights go, and a LoRA adapter whose B is still
# near 0 moves the policy at second order (corpus tuning runs: KL 1e-15 and 1e-11 at 6.8e-5 and 4.4e-4 of the
# norm; a rate of 1e-10 moves 1e-9 of it)
STILL = 1e-7
ZERO = 1e-12  # an advantage or a gradient below this is float rounding, not signal
FROZEN = 0.01  # a full model training under 1% of its weights: frozen, where no adapter is what trains

STAGES = ("samples", "rewards", "advantages", "tokens", "loss", "parameters", "update")
CATALOGUED = {  # each catalogued pitfall's stage: a loud one there explains what the stage lost
    "samples": ("identical_groups", "sampler_truncation", "temperature", "truncation"),
    "rewards": ("zero_std_groups", "constant_reward", "dominant_reward", "length_reward", "bad_reward",
                "rewards_not_own"),
    "advantages": ("advantage_scale", "large_advantages"),
    "tokens": ("eos_masked", "clip_saturated", "clip_inactive"),
    "loss": ("kl_off", "kl_estimator", "loss_normaliser", "sequence_ratio_sum", "precision", "dropout",
             "position_ids", "sampler_mismatch"),
    "parameters": (),
    "update": ("update_size", "grad_clipped", "kl_blowup", "entropy_collapse"),
}  # fmt: skip


@dataclass(frozen=True)
class Stage:
    name: str
    kept: float | None  # the share of what came in that this stage lets through; None: not measured on this step
    said: str  # what it measured, in one sentence
    lost_to: str = ""  # the setting that removed the rest, in TRL's names ("" where none did, or nothing was lost)
    fix: str = ""  # what to change, where the stage lost nearly all
    measured: dict = field(default_factory=dict)
    swamped: bool = False  # the stage's own signal outweighed by another (the loss: the KL term's gradient)

    @property
    def lost(self) -> bool:
        return self.swamped or (self.kept is not None and self.kept <= LOST)

    def as_dict(self) -> dict:
        return {"stage": self.name, "kept": self.kept, "lost": self.lost, "said": self.said, "lost_to": self.lost_to,
                "measured": self.measured}  # fmt: skip


def samples(f: StepFacts) -> Stage:
    """Groups with two different completions, and the share of the policy's completions the sampler can produce at
    all (`sampler_reach`: top_p, top_k and min_p cut mass at every token, and the cut multiplies along a completion);
    the stage keeps the smaller of the two."""
    r, cfg = f.run.rollout, f.run.config
    B = len(r.prompts)
    distinct = 1 - len(r.identical_groups) / B
    mass = reach = None
    if f.kept_mass is not None and bool(f.run.logprobs.mask.any()):
        m = f.run.logprobs.mask
        mass, reach = ((f.kept_mass * m).sum() / m.sum()).item(), sampler_reach(f.kept_mass, m)
    narrowed = [s for s in (f"top_p {cfg.top_p:g}" if cfg.top_p < 1 else "", f"top_k {cfg.top_k}" if cfg.top_k else "",
                            f"min_p {cfg.min_p:g}" if cfg.min_p else "", f"temperature {cfg.temperature:g}") if s]  # fmt: skip
    said = f"{B - len(r.identical_groups)}/{B} groups hold two different completions"
    if mass is not None:
        said += (f"; the sampler kept {mass:.0%} of the policy's probability mass per token and can produce "
                 f"{reach:.0%} of its completions ({', '.join(narrowed)})")  # fmt: skip
    kept = distinct if reach is None else min(distinct, reach)
    return Stage("samples", kept, said, ", ".join(narrowed) if kept <= LOST else "",
                 "sample wider (raise temperature, top_p, top_k; lower min_p) or raise num_generations",
                 dict(groups=B, identical_groups=len(r.identical_groups), kept_mass=mass, reach=reach))  # fmt: skip


def _unscored_groups(adv) -> set[int]:
    """The groups with fewer than two rewards scored (a None from every function on the others: NaN, which TRL's
    sums skip): their std is NaN, and no advantage comes of them."""
    return set(torch.isnan(adv.group_std.float()).nonzero().flatten().tolist())


def _flat_groups(adv) -> set[int]:
    """The groups whose weighted rewards do not vary: TRL's zero-std groups, those whose std is float rounding, and
    those with fewer than two rewards scored."""
    return set(adv.zero_std_groups) | set(adv.rounding_std_groups) | _unscored_groups(adv)


def rewards(f: StepFacts) -> Stage:
    per, adv = f.run.rewards.per_function, f.run.advantages
    B = len(adv.group_mean)
    flat = _flat_groups(adv)
    varied = 1 - len(flat) / B
    weights = dict(zip(per, f.reward_weights))
    silenced = [n for n, w in weights.items() if w == 0]
    lost_to = ""
    if varied <= LOST and silenced and len(silenced) == len(per):
        lost_to = f"reward_weights {list(weights.values())}"
    unscored = _unscored_groups(adv)
    if varied <= LOST and not lost_to and len(unscored) > len(flat) / 2:
        lost_to = "None rewards"
    said = f"{B - len(flat)}/{B} groups' weighted rewards vary"
    if silenced:
        said += f" ({', '.join(silenced)} weighted 0)"
    if unscored:
        said += f" ({len(unscored)} with fewer than two completions scored: None from every function)"
    fix = ("return a float for every completion: a row no function scores gets no advantage" if lost_to ==
           "None rewards" else "make the reward graded, or sample groups whose completions differ in what it pays for")  # fmt: skip
    return Stage("rewards", varied, said, lost_to, fix,
                 dict(groups=B, flat_groups=len(flat), weighted_zero=silenced, unscored=len(unscored)))  # fmt: skip


def advantages(f: StepFacts) -> Stage:
    adv, G = f.run.advantages, f.run.config.num_generations
    flat = _flat_groups(adv)
    rows = torch.tensor([i // G not in flat for i in range(len(adv.values))])
    A = adv.values.detach().float().cpu()
    if not bool(rows.any()):
        return Stage("advantages", None, "no group with varied rewards: no advantage to measure",
                     measured=dict(rows=0))  # fmt: skip
    nonzero = (A[rows].abs() > ZERO).float().mean().item()
    scale = A[rows].abs().mean().item()
    return Stage("advantages", nonzero, f"{nonzero:.0%} of the rows of varied groups have a non-zero advantage "
                 f"(mean |A| {scale:.3g}, scale_rewards {f.run.config.scale_rewards!r})", "",
                 "check the advantage computation: varied rewards gave zero advantages",
                 dict(rows=int(rows.sum()), nonzero=nonzero, mean_abs=scale))  # fmt: skip


def tokens(f: StepFacts) -> Stage:
    r, lp, loss, cfg = f.run.rollout, f.run.logprobs, f.run.loss, f.run.config
    generated = completion_mask(r, "keep_first_eos").to(lp.mask.device)
    total = generated.sum().item()
    trained = loss.trained.float() * (~loss.clipped).float()
    carry = trained.sum().item() / max(total, 1.0)
    truncated = (generated * (~r.finished).float().unsqueeze(1).to(generated.device)) if cfg.mask_truncated_completions \
        else torch.zeros_like(generated)  # fmt: skip
    removed = {
        "mask_truncated_completions=True": truncated.sum().item(),
        f"the loss mask (mask {cfg.mask!r})": ((generated - lp.mask).clamp(min=0) - truncated).clamp(min=0).sum().item(),
        _token_filter(cfg): (lp.mask - loss.trained.float()).clamp(min=0).sum().item(),
        f"the clip (epsilon_low {cfg.epsilon_low:g}, epsilon_high {cfg.epsilon_high:g})":
            (loss.trained.float() * loss.clipped.float()).sum().item(),
    }  # fmt: skip
    removed = {k: v / max(total, 1.0) for k, v in removed.items() if v > 0}
    top = max(removed, key=removed.get) if removed else ""
    said = f"{carry:.0%} of the {int(total)} completion tokens carry the policy term's gradient"
    if removed:
        said += "; removed by " + ", ".join(f"{k} {v:.0%}" for k, v in sorted(removed.items(), key=lambda kv: -kv[1]))
    return Stage("tokens", carry, said, top, f"loosen what removed them: {top}" if top else "",
                 dict(tokens=int(total), carrying=carry, removed=removed))  # fmt: skip


def _token_filter(cfg) -> str:
    said = [f"top_entropy_quantile {cfg.top_entropy_quantile:g}"] if cfg.top_entropy_quantile < 1 else []
    said += [f"off_policy_mask_threshold {cfg.off_policy_mask_threshold:g}"] if cfg.off_policy_mask_threshold else []
    return " and ".join(said) or "the token masks"


def loss(f: StepFacts) -> Stage:
    """d loss / d logp per token, the policy term's (beta 0) against the rest (the KL term's, and the entropy bonus
    where on): the signal the backward pass sends into the model, the model's Jacobian not applied."""
    run, cfg = f.run, f.run.config
    whole = gradient_of_loss_wrt_logps(run, cfg)
    policy = gradient_of_loss_wrt_logps(run, cfg.replace(beta=0.0, entropy_coef=0.0)) if cfg.beta or cfg.entropy_coef \
        else whole  # fmt: skip
    kl = whole - policy
    p, k = policy.norm().item(), kl.norm().item()
    cosine = (policy.flatten() @ whole.flatten()).item() / (p * whole.norm().item()) if p > ZERO and k > ZERO else None
    measured = dict(policy_gradient=p, kl_gradient=k, cosine_policy_total=cosine, beta=cfg.beta)
    if p <= ZERO:
        return Stage("loss", 0.0 if k > ZERO else None, "the policy term sends no gradient"
                     + (f"; the KL term's is {k:.3g} (beta {cfg.beta:g})" if k > ZERO else ""), measured=measured)  # fmt: skip
    ratio = k / p
    said = f"the policy term's gradient {p:.3g}, the KL term's {k:.3g} (beta {cfg.beta:g}: {ratio:.2g}x)"
    if cosine is not None:
        said += f", the whole's cosine with the policy term's {cosine:+.2f}"
    swamped = ratio > KL_SWAMPS  # the KL term's pull back to the reference outweighs what the rewards ask
    return Stage("loss", 1 / (1 + ratio) if swamped else 1.0, said, f"beta {cfg.beta:g}" if swamped else "",
                 "lower beta (the KL weight)", {**measured, "kl_over_policy": ratio}, swamped)  # fmt: skip


def parameters(f: StepFacts) -> Stage:
    """The trainable tensors the update moved; lost where a full model (no adapter) trains under `FROZEN` of its
    weights: a model frozen by mistake (an adapter trains a small share by design)."""
    p = f.parameters
    if not p:
        return Stage("parameters", None, "not measured on this step")
    trainable, total, moved, share = p["trainable_tensors"], p["tensors"], p["moved_tensors"], p["trainable_share"]
    said = f"{trainable}/{total} parameter tensors train ({share:.2%} of the weights)"
    if share < FROZEN and not p.get("adapter"):
        return Stage("parameters", share, said + ", no adapter among them: the rest frozen",
                     f"requires_grad=False on {1 - share:.2%} of the weights",
                     "train the parameters the run means to (requires_grad=True), or an adapter (peft_config)",
                     dict(p))  # fmt: skip
    if moved is None or f.run.update is None or f.run.update.grad_norm <= ZERO:
        return Stage("parameters", None, said + "; no update with a gradient to see which moved", measured=dict(p))
    said += f", {moved} of them moved"
    kept = moved / trainable if trainable else 0.0
    return Stage("parameters", kept, said, "requires_grad=False" if trainable == 0 else "",
                 "train the parameters the run means to (requires_grad)", dict(p))  # fmt: skip


def update(f: StepFacts) -> Stage:
    upd, cfg = f.run.update, f.run.config
    if upd is None or f.step_kl is None:
        return Stage("update", None, "no update measured on this step")
    rate = upd.learning_rates[0] if upd.learning_rates else cfg.learning_rate
    clip = cfg.max_grad_norm / upd.grad_norm if cfg.max_grad_norm and upd.grad_norm > cfg.max_grad_norm else 1.0
    relative = upd.update_norm / f.weight_norm if f.weight_norm else math.inf
    measured = dict(moved_kl=f.step_kl, learning_rate=rate, grad_norm=upd.grad_norm, clip_factor=clip,
                    update_norm=upd.update_norm, relative=relative)  # fmt: skip
    said = (f"one update moved the policy by KL {f.step_kl:.3g} nats per token on its own completions "
            f"(learning_rate {rate:g}, grad_norm {upd.grad_norm:.3g}"
            + (f", clipped x{clip:.2g}" if clip < 1 else "") + f"; {relative:.2g} of the weights' norm)")  # fmt: skip
    if upd.grad_norm <= ZERO:
        return Stage("update", None, said + ": no gradient to step with", measured=measured)
    nothing = f.step_kl < MOVED_NOTHING and relative < STILL
    scheduled = f" as scheduled from learning_rate {cfg.learning_rate:g}" if rate != cfg.learning_rate else ""
    lost_to = f"learning_rate {rate:g}{scheduled}" if nothing else ""
    return Stage("update", 0.0 if nothing else 1.0, said, lost_to, "raise learning_rate", measured)


def signal_path(f: StepFacts) -> tuple[Stage, ...]:
    return tuple(measure(f) for measure in (samples, rewards, advantages, tokens, loss, parameters, update))


def signal_lost(f: StepFacts) -> Finding:
    """The first stage of the signal's path that lets through a tenth of it or less (`LOST`): problem where it lets
    through none, else warning; absent where every stage lets most of it through."""
    stages = signal_path(f)
    path = [s.as_dict() for s in stages]
    lost = next((s for s in stages if s.lost), None)
    if lost is None:
        return _finding("signal_lost", "absent", "every stage lets the signal through: "
                        + "; ".join(f"{s.name} {s.kept:.0%}" for s in stages if s.kept is not None), path=path)  # fmt: skip
    severity = "problem" if lost.kept == 0 else "warning"
    traced = f": {lost.lost_to}" if lost.lost_to else ""
    return _finding("signal_lost", severity, f"the learning signal is lost at the {lost.name}{traced} ({lost.said})",
                    path=path, stage=lost.name, lost_to=lost.lost_to, fix=lost.fix)  # fmt: skip


def stage_of(f: Finding) -> str | None:
    """The stage of the signal's path a finding speaks of: `signal_lost`'s own, truncation's the tokens where TRL
    masks cut completions from the loss (else what was sampled), every other catalogued finding's by `CATALOGUED`;
    None for one of no stage."""
    if f.id == "signal_lost":
        return f.evidence.get("stage")
    if f.id == "truncation" and f.evidence.get("masked"):
        return "tokens"
    return next((stage for stage, ids in CATALOGUED.items() if f.id in ids), None)


def explained(findings: list[Finding]) -> list[Finding]:
    """`signal_lost` where a loud catalogued finding of its stage is there: info, naming it (the catalogued finding
    leads, with its own fix); the others as they are."""
    out = []
    for x in findings:
        stage = x.evidence.get("stage") if x.id == "signal_lost" else None
        by = [y.id for y in findings if y.id != x.id and y.severity in LOUD and stage and stage_of(y) == stage]
        if by and x.severity in LOUD:
            x = Finding(x.id, "info", f"{x.summary}; named by {', '.join(by)}", {**x.evidence, "explained_by": by})
        out.append(x)
    return out
