"""Time and peak memory per phase of one GRPO step:
`python benchmarks/step.py [--threads N] [--skip-124m | --only-124m | --only-num-iterations | --only-vs-trl]`.

Prints JSON: the bundled model at 8 prompts x 8 samples (mixed and policy-only prompts), the one-call
vs per-prompt-loop generation ratio, the readable paths alone (`fast=False`), the cost of
num_iterations = 2 against 1 (the update phase and the whole step; the two alternate, fresh steps each),
our step (fast, and readable: every fast path off) vs one TRL GRPOTrainer step on the same configuration,
and the 124M GPT-2 shape (random weights, RookWorld-LM-124M's architecture) at 4 x 4 with 80 new
tokens. Bundled numbers are medians of `--repeats` fresh steps after a warm-up one. Targets (issue 3): bundled 8x8 step <= 5 s; no slower than TRL; 124M shape <= 60 s.
`--quick`: every configuration at 2 x 2 with 8 new tokens, one repeat (run by `make test`; no number means anything).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time

import torch
from common import PeakRSS, add_repeats, gpt2_124m_shape, sizes_and_repeats

from grpo_debug.config import PHASES, StepConfig
from grpo_debug.model import load_model
from grpo_debug.step import GRPOStep, StepRun

STEP_PHASES = [p for p in PHASES if p != "evaluation"]


def profile_step(step: GRPOStep, cfg: StepConfig) -> dict:
    """Run each phase once, fresh, timing it and its peak extra memory."""
    out = {}
    fresh = StepRun(cfg)  # no cached phase: the first run starts from the rollout
    for phase in STEP_PHASES:
        with PeakRSS() as mem:
            t0 = time.perf_counter()
            step.run(cfg, until=phase, base=fresh)
            fresh = None
            seconds = time.perf_counter() - t0
        out[phase] = {"seconds": round(seconds, 3), "peak_extra_mb": round(mem.mb, 1)}
    out["total_seconds"] = round(sum(v["seconds"] for v in out.values()), 3)
    return out


def generation_ratio(step: GRPOStep, cfg: StepConfig) -> dict:
    timings = {}
    for mode in ("batched", "loop"):
        run = step.run(cfg.replace(generation=mode), until="rollout", base=StepRun(cfg), remember=False)
        timings[mode] = round(run.rollout.seconds, 3)
    return {**timings, "loop_over_batched": round(timings["loop"] / timings["batched"], 2)}


def trl_step_seconds(cfg: StepConfig) -> float:
    from grpo_debug.capture.trl_bridge import trl_trainer

    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(sys.stderr):  # TRL prints its logs
        trainer = trl_trainer(cfg, tmp)
        t0 = time.perf_counter()
        trainer.train()
        return round(time.perf_counter() - t0, 3)


def profile_repeated(step: GRPOStep, cfg: StepConfig, repeats: int) -> dict:
    """Per phase and in total, the median of `repeats` fresh steps (this machine's timings move by 10-20%
    from run to run), with every total listed."""
    runs = [profile_step(step, cfg) for _ in range(repeats)]
    out = {
        phase: {key: statistics.median(r[phase][key] for r in runs) for key in ("seconds", "peak_extra_mb")}
        for phase in STEP_PHASES
    }
    totals = [r["total_seconds"] for r in runs]
    return {**out, "total_seconds": statistics.median(totals), "totals": totals}


def num_iterations_cost(step: GRPOStep, cfg: StepConfig, repeats: int, mu: int = 2) -> dict:
    """The update phase and the whole step at num_iterations = 1 and `mu`: medians of `repeats` fresh steps
    each, the two alternating (so that a slow stretch of the machine hits both), and the ratios."""
    runs = {1: [], mu: []}
    for _ in range(repeats):
        for m in runs:
            runs[m].append(profile_step(step, cfg.replace(num_iterations=m)))
    out = {}
    for m, profiles in runs.items():
        out[f"num_iterations_{m}"] = {
            "update_seconds": statistics.median(p["update"]["seconds"] for p in profiles),
            "total_seconds": statistics.median(p["total_seconds"] for p in profiles),
            "updates": [p["update"]["seconds"] for p in profiles],
            "totals": [p["total_seconds"] for p in profiles],
        }
    one, more = out["num_iterations_1"], out[f"num_iterations_{mu}"]
    out["update_ratio"] = round(more["update_seconds"] / one["update_seconds"], 2)
    out["step_ratio"] = round(more["total_seconds"] / one["total_seconds"], 2)
    return out


def bundled_model(repeats: int, sizes: dict) -> dict:
    report = {}
    bundled = StepConfig(**sizes)
    step = GRPOStep(bundled)
    profile_step(step, bundled)  # warm-up: first-call overheads out of the numbers
    report["bundled_8x8_mixed"] = profile_repeated(step, bundled, repeats)
    report["bundled_8x8_mixed_readable"] = profile_repeated(
        step, bundled.replace(fast=False), repeats
    )  # fast paths off
    report["bundled_8x8_mixed_no_per_sample_norms"] = profile_repeated(
        step, bundled.replace(per_sample_grad_norms=False), repeats
    )
    policy_only = bundled.replace(task="policy", max_new_tokens=sizes.get("max_new_tokens", 48))
    report["bundled_8x8_policy"] = profile_repeated(GRPOStep(policy_only), policy_only, repeats)  # a step per task
    report["generation_one_call_vs_loop"] = generation_ratio(step, bundled)
    report["num_iterations_2_vs_1_8x8_mixed"] = num_iterations_cost(step, bundled, repeats)

    report["vs_trl_8x8_mixed"] = vs_trl(step, bundled, repeats)
    return report


def vs_trl(step: GRPOStep, bundled: StepConfig, repeats: int) -> dict:
    """Our step (fast paths on, and every one off: the readable functions alone) against one TRL GRPOTrainer
    step on the same configuration, like for like (TRL computes no per-sample gradient norms): `repeats`
    rounds, the three alternating so that a slow stretch of the machine hits each, medians and every time."""
    trl_cfg = bundled.replace(beta=0.04, kl_estimator="k3_corrected", loss_type="dapo", per_sample_grad_norms=False)
    times = {"ours": [], "readable": [], "trl": []}
    for _ in range(repeats):
        times["ours"].append(profile_step(step, trl_cfg)["total_seconds"])
        times["readable"].append(profile_step(step, trl_cfg.replace(fast=False))["total_seconds"])
        times["trl"].append(trl_step_seconds(trl_cfg))
    median = {k: statistics.median(v) for k, v in times.items()}
    return {
        **{f"{k}_seconds": m for k, m in median.items()},
        "ours_over_trl": round(median["ours"] / median["trl"], 2),
        "readable_over_trl": round(median["readable"] / median["trl"], 2),
        "times": times,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_repeats(parser, help="fresh steps per bundled configuration (median)")
    parser.add_argument("--skip-124m", action="store_true")
    parser.add_argument("--only-124m", action="store_true")
    parser.add_argument("--only-vs-trl", action="store_true", help="only our step (fast and readable) vs TRL's")
    parser.add_argument(
        "--only-num-iterations",
        action="store_true",
        help="only num_iterations = 2 against 1 on the bundled model, default config",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sizes, repeats = sizes_and_repeats(args)
    report = {"threads": args.threads, "torch": torch.__version__, "quick": args.quick}

    only = {"vs_trl_8x8_mixed": vs_trl} if args.only_vs_trl else {}
    if args.only_num_iterations:
        only["num_iterations_2_vs_1_8x8_mixed"] = num_iterations_cost
    if only:  # one measurement on the bundled default config alone
        bundled = StepConfig(**sizes)
        step = GRPOStep(bundled)
        profile_step(step, bundled)  # warm-up
        report.update({key: measure(step, bundled, repeats) for key, measure in only.items()})
        print(json.dumps(report, indent=1))
        return

    if not args.only_124m:
        report.update(bundled_model(repeats, sizes))

    if not args.skip_124m:
        shape_cfg = StepConfig(**{"num_prompts": 4, "num_generations": 4, "max_new_tokens": 80, **sizes})
        big = GRPOStep(shape_cfg, loaded=gpt2_124m_shape(load_model().tokenizer, quick=args.quick))
        report["gpt2_124m_shape_4x4_80_tokens"] = profile_step(big, shape_cfg)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
