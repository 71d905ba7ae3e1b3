"""What `python -m grpo_debug step` prints (`report`) and writes with --json (`step_json`)."""

from __future__ import annotations

import dataclasses

from ..advantages import PHANTOM_STD
from ..sampler import health_line
from .metrics import metrics


def _line(name: str, value, note: str = "") -> str:
    text = f"{value:.6g}" if isinstance(value, float) else str(value)
    return f"  {name:<48} {text:>14}  {note}"


def report(run) -> str:
    """Every phase of `run` in a few lines each, TRL's metric names first."""
    cfg, m = run.config, metrics(run)
    off = [f"{k}={v}" for k, v in cfg.pitfalls_on().items()]
    out = [
        f"GRPO step on {cfg.model}",
        f"  preset: {cfg.preset_name() or 'custom'}",
        f"  differs from the fixed preset: {', '.join(off) or 'nothing (every fix on)'}",
        "",
    ]
    out += _rollout_and_logprobs(run, m) + _rewards_advantages_loss(run)
    out += _update(run) if run.update is not None else []
    out += _evaluation(run.evaluation) if run.evaluation is not None else []
    out += ["", "time per phase (s): " + ", ".join(f"{k} {v.seconds:.2f}" for k, v in run.timings.items())]
    return "\n".join(out)


def _rollout_and_logprobs(run, m: dict) -> list[str]:
    cfg, r, lp = run.config, run.rollout, run.logprobs
    return [
        "1. rollout",
        _line("samples", r.num_samples, f"{len(r.prompts)} prompts x {r.num_generations}"),
        _line("completions/mean_length", m["completions/mean_length"]),
        _line("completions/clipped_ratio", m["completions/clipped_ratio"], "no EOS within max_new_tokens"),
        _line("identical groups", len(r.identical_groups), "all G completions the same text"),
        _line("seconds", r.seconds, cfg.generation),
        "2. log-probs",
        _line(
            "logps/max_sampler_gap",
            lp.max_sampler_gap,
            "max |sampler - recomputed| over the scoring's support, nats; ~1e-5 with every fix on",
        ),
        _line("top_p renormalisation gap", lp.top_p_gap, "0 when top_p = 1"),
        _line("EOS inside the mask", lp.eos_kept, "1: the model is taught to stop"),
        _line("scored tokens", int(lp.mask.sum().item()), f"mask={cfg.mask}"),
        _line("rollout_corr/kl", m["rollout_corr/kl"], "E[log pi_sampler - log pi_trainer] (verl's names)"),
        _line("rollout_corr/chi2_token", m["rollout_corr/chi2_token"], "E[rho^2] - 1, rho = pi_trainer / pi_sampler"),
        _line(
            "rollout_corr/rollout_is_mean", m["rollout_corr/rollout_is_mean"], "mean rho per token, before truncation"
        ),
        _line("rollout_corr/rollout_is_eff_sample_size", m["rollout_corr/rollout_is_eff_sample_size"], "in (0, 1]"),
        _line(
            "rollout_corr/sequence/rollout_is_eff_sample_size",
            m["rollout_corr/sequence/rollout_is_eff_sample_size"],
            "the same, of the sequence weights",
        ),
        "  " + health_line(m),
    ]


def _rewards_advantages_loss(run) -> list[str]:
    cfg, adv, loss = run.config, run.advantages, run.loss
    out = ["3. rewards"] + [_line(f"rewards/{k}/mean", v.nanmean().item()) for k, v in run.rewards.components.items()]
    out += [
        "4. advantages",
        _line("reward", adv.reward),
        _line("reward_std", adv.reward_std),
        _line("frac_reward_zero_std", adv.frac_reward_zero_std, "groups with no signal"),
        _line("phantom groups", len(adv.phantom_groups), f"divided by 0 < std < {PHANTOM_STD}: noise amplified"),
        _line("max |advantage|", adv.max_abs_advantage, f"scale_rewards={cfg.scale_rewards}"),
        "5. loss",
        _line("loss", loss.loss.item(), f"{cfg.loss_type}; its value says little: judge the step by grad_norm"),
        _line("policy term", loss.policy_loss.item()),
        _line("beta * KL term", loss.kl_loss.item()),
        _line("kl", loss.metrics["kl"], f"{cfg.kl_estimator}, 0 at step 0 unless scoring differs"),
        _line("entropy", loss.metrics["entropy"], "mean over scored tokens, nats"),
    ]
    return out + [
        _line(k, v) for k, v in loss.metrics.items() if k.startswith(("clip_ratio", "sampling/", "cispo", "vespo"))
    ]


def _update(run) -> list[str]:
    cfg, upd = run.config, run.update
    return [
        "6. update",
        _line(
            "optimizer steps",
            upd.optimizer_steps,
            f"num_iterations={cfg.num_iterations} x steps_per_generation={cfg.micro_batches} "
            f"/ gradient_accumulation_steps={cfg.gradient_accumulation_steps}",
        ),
        _line("grad_norm", upd.grad_norm, "before clipping; non-zero even when loss ~ 0"),
        _line("clipped", upd.clipped, f"max_grad_norm={cfg.max_grad_norm}"),
        _line("update norm", upd.update_norm, f"AdamW lr={cfg.learning_rate}"),
        *[
            _line(f"pass {i}: {k}", it.metrics[k], "0 on-policy" if i == 1 else "")
            for i, it in enumerate(upd.iterations, start=1)
            for k in ("clip_ratio/region_mean", "kl")
            if k in it.metrics and len(upd.iterations) > 1
        ],
        _line(
            "max per-sample grad norm",
            upd.per_sample_grad_norms.max().item() if len(upd.per_sample_grad_norms) else float("nan"),
            "from layer hooks, one backward" if cfg.fast else "one backward per sample",
        ),
    ]


def _evaluation(ev) -> list[str]:
    return [
        "7. evaluation (held-out test prompts, paired seeds)",
        _line("reward before", ev.before.reward),
        _line("reward after", ev.after.reward),
        _line("delta", ev.delta, f"95% CI [{ev.ci_low:.4f}, {ev.ci_high:.4f}]"),
    ]


def step_json(run) -> dict:
    return {
        "config": dataclasses.asdict(run.config),
        "metrics": metrics(run),
        "completions": run.rollout.completions,
        "prompts": run.rollout.prompts,
        "rewards": run.rewards.total.tolist(),
        "advantages": run.advantages.values.tolist(),
        "reward_components": {k: v.tolist() for k, v in run.rewards.components.items()},
        "per_sample_loss": run.loss.per_sample_loss.tolist(),
        "per_sample_grad_norms": run.update.per_sample_grad_norms.tolist() if run.update else None,
    }
