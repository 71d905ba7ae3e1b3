"""The detectors of the log-probs: what scoring does to the sampled tokens (one pure function per pitfall)."""

from __future__ import annotations

from ..sampler import HEALTH, outside_clip, sampler_importance_ratio, sampler_reach
from .findings import Finding, StepFacts, _finding, _masked_mean

# ---- log-probs


def eos_masked(f: StepFacts) -> Finding:
    lp, r = f.run.logprobs, f.run.rollout
    finished = int(r.finished.sum())
    if finished == 0:
        return _finding("eos_masked", "absent", "no completion produced an EOS", eos_kept=lp.eos_kept)
    if lp.eos_kept >= 1.0:
        return _finding("eos_masked", "absent", "every finished completion's EOS is in the loss", eos_kept=1.0)
    return _finding(
        "eos_masked", "problem",
        f"{1 - lp.eos_kept:.0%} of the {finished} finished completions have their EOS masked out of the loss: the "
        "model is never taught to stop", eos_kept=lp.eos_kept,
    )  # fmt: skip


def temperature(f: StepFacts) -> Finding:
    cfg = f.run.config
    evidence = dict(sampling_temperature=cfg.temperature, scoring_divides=cfg.logprob_temperature)
    if cfg.logprob_temperature or cfg.temperature == 1.0:
        return _finding("temperature", "absent", "scored at the sampling temperature", **evidence)
    return _finding(
        "temperature", "problem",
        f"sampled at T = {cfg.temperature:g}, scored at T = 1: every log-prob, ratio and KL is of another policy",
        **evidence,
    )  # fmt: skip


def dropout(f: StepFacts) -> Finding:
    cfg = f.run.config
    evidence = dict(sources=list(f.dropout_sources), scored_in_train_mode=cfg.dropout, max_logp_gap=f.dropout_gap)
    if not f.dropout_sources:
        return _finding("dropout", "absent", "the model has no dropout", **evidence)
    if not cfg.dropout:
        return _finding("dropout", "absent", f"dropout off while scoring ({', '.join(f.dropout_sources)})",
                        **evidence)  # fmt: skip
    return _finding(
        "dropout", "warning",
        f"dropout on while scoring ({', '.join(f.dropout_sources)}): two scorings of the same tokens differ by "
        f"up to {f.dropout_gap:.3g} nats", **evidence,
    )  # fmt: skip


def position_ids(f: StepFacts) -> Finding:
    cfg = f.run.config
    evidence = dict(absolute_positions=f.absolute_positions, left_padded=f.left_padded, passed=cfg.position_ids)
    if not f.absolute_positions:
        return _finding("position_ids", "absent", "the model's positions are relative (rotary or none)", **evidence)
    if not f.left_padded:
        return _finding("position_ids", "absent", "no prompt is left-padded", **evidence)
    if cfg.position_ids:
        return _finding("position_ids", "absent", "position_ids passed while scoring", **evidence)
    rows = int((f.run.rollout.prompt_mask[:, 0] == 0).sum())
    return _finding(
        "position_ids", "problem",
        f"absolute positions and no position_ids: {rows} left-padded rows were scored at positions shifted from "
        "those they were sampled at", left_padded_rows=rows, **evidence,
    )  # fmt: skip


KEPT_MASS_WARNING = 0.95  # mean mass kept below this: the sampler's and the loss's policies differ by > 5%


def sampler_truncation(f: StepFacts) -> Finding:
    cfg, mask = f.run.config, f.run.logprobs.mask
    evidence = dict(top_p=cfg.top_p, top_k=cfg.top_k, min_p=cfg.min_p, support=cfg.logprob_support)
    if f.kept_mass is None:
        return _finding("sampler_truncation", "absent", "sampled from the full distribution", **evidence)
    mean = _masked_mean(f.kept_mass, mask)
    below = _masked_mean((f.kept_mass < 0.5).float(), mask)
    reach = sampler_reach(f.kept_mass, mask)
    evidence.update(kept_mass_mean=mean, tokens_below_half=below, reach=reach)
    if cfg.logprob_support == "sampler_support":
        return _finding("sampler_truncation", "absent", "scored over the sampler's support", **evidence)
    severity = "warning" if mean < KEPT_MASS_WARNING else "info"
    return _finding(
        "sampler_truncation", severity,
        f"top_p={cfg.top_p:g}, top_k={cfg.top_k}: the sampler kept {mean:.1%} of the mass on average "
        f"({below:.0%} of tokens below half) and can produce {reach:.0%} of the policy's completions; the loss "
        "scores the full distribution"
        + ("" if f.uses_vllm else " (the trainer sampled itself: no vLLM importance ratio carries the cut mass)"),
        **evidence,
    )  # fmt: skip


def sampler_mismatch(f: StepFacts) -> Finding:
    m = f.sampler_metrics
    if m is None:
        return _finding("sampler_mismatch", "absent", "the trainer sampled with its own model: no sampler log-probs")
    bad = {k.split("/")[-1]: m[k] for k, (_, off) in HEALTH.items() if k in m and off(m[k])}
    evidence = {k.split("/", 1)[-1]: v for k, v in m.items() if k in HEALTH or "sequence/fraction" in k}
    if not bad:
        return _finding("sampler_mismatch", "absent", "verl's health check passes (token level)", **evidence)
    return _finding(
        "sampler_mismatch", "warning",
        "sampler vs trainer outside verl's ranges: " + ", ".join(f"{k} {v:.3g}" for k, v in bad.items()), **evidence,
    )  # fmt: skip


SEQUENCE_RATIO_MOVE = 0.05  # a twentieth of the update's weight, or of its sequences, moved by the sum alone


def sequence_ratio_sum(f: StepFacts) -> Finding:
    """TRL 1.16's sequence ratio exp(sum of log-ratios) against exp(mean), on this step's own tokens: what the
    sum alone masks or clamps, and how far it moves the weight the correction puts on the update."""
    cfg, lp, sampler = f.run.config, f.run.logprobs, f.run.rollout.sampler_logps
    mode, low, high = (cfg.vllm_importance_sampling_mode, cfg.vllm_importance_sampling_clip_min,
                       cfg.vllm_importance_sampling_clip_max)  # fmt: skip
    evidence = dict(mode=mode, aggregation=cfg.vllm_importance_sampling_aggregation)
    if not cfg.vllm_importance_sampling_correction or not mode.startswith("sequence") or sampler is None:
        return _finding("sequence_ratio_sum", "absent", "no sequence-level sampler correction", **evidence)
    if cfg.vllm_importance_sampling_aggregation == "mean":
        return _finding("sequence_ratio_sum", "absent", "the sequence ratio is the mean of its tokens'", **evidence)
    raw = {a: sampler_importance_ratio(lp.policy, sampler, lp.mask, mode, None, None, a) for a in ("sum", "mean")}
    used = {a: sampler_importance_ratio(lp.policy, sampler, lp.mask, mode, low, high, a) for a in ("sum", "mean")}
    cut = {a: outside_clip(raw[a], low, high).float().mean().item() for a in raw}
    weight = {a: used[a].mean().item() for a in used}
    evidence.update(cut_share_sum=cut["sum"], cut_share_mean=cut["mean"], weight_sum=weight["sum"],
                    weight_mean=weight["mean"], mean_length=lp.mask.sum(1).float().mean().item())  # fmt: skip
    moved = max(cut["sum"] - cut["mean"], abs(weight["sum"] - weight["mean"]))
    return _finding(
        "sequence_ratio_sum", "warning" if moved >= SEQUENCE_RATIO_MOVE else "info",
        f"{mode} on summed log-ratios: {cut['sum']:.0%} of sequences outside the bounds (the mean: {cut['mean']:.0%}), "
        f"mean weight {weight['sum']:.3f} (the mean: {weight['mean']:.3f})", **evidence,
    )  # fmt: skip


PRECISION_DRIFT = 1e-3  # |mean log(pi_trainer / pi_sampler)| per token that a float32 pair never reaches


def precision(f: StepFacts) -> Finding:
    cfg = f.run.config
    evidence = dict(sampler_dtype=cfg.sampler_dtype, trainer_dtype=cfg.dtype)
    m = f.sampler_metrics
    if m is None or cfg.sampler_dtype == cfg.dtype:
        return _finding("precision", "absent", f"sampler and trainer at one precision ({cfg.dtype})", **evidence)
    drift, gap = abs(m["rollout_corr/log_ppl_diff"]), f.run.logprobs.max_sampler_gap
    evidence.update(log_ppl_abs_diff=m["rollout_corr/log_ppl_abs_diff"], max_sampler_gap=gap)
    severity = "warning" if m["rollout_corr/log_ppl_abs_diff"] > PRECISION_DRIFT or gap > 0.1 else "info"
    return _finding(
        "precision", severity,
        f"sampler in {cfg.sampler_dtype}, trainer in {cfg.dtype}: |log-ppl difference| "
        f"{m['rollout_corr/log_ppl_abs_diff']:.2g} per sequence, max token gap {gap:.3g} nats (drift {drift:.2g})",
        **evidence,
    )  # fmt: skip
