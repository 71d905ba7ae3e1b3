"""Influence cost: `python benchmarks/influence.py [--threads N] [--skip-124m]`, JSON on stdout.

On the same batch of 64 samples (8 prompts x 8), for the bundled model and the 124M GPT-2 shape
(random weights, 80 new tokens): a plain training step (forward + backward, 8 rows at a time), the
validation gradient (one summed vector), the hook method (one backward with layer hooks, then each
sample's factored gradient dotted with the validation gradient; no per-sample gradient is built)
and the naive loop (one backward per sample, its full gradient dotted with the validation gradient).
Targets (issue 5): hook method within 2x a plain step; at least 3x faster than the naive loop.
For the bundled model also the AdamW-aware score (tracin/optimizer.py), which builds every per-sample
gradient because AdamW's update map is not linear (skipped for the 124M shape: 64 x 124M floats).
`--quick`: 2 x 2 samples, 8 new tokens, a 1-layer stand-in for the 124M shape (run by `make test`).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from common import QUICK_SET, PeakRSS, add_quick, gpt2_124m_shape

from grpo_debug.config import StepConfig
from grpo_debug.loss import Batch, Normalisation, loss_weights
from grpo_debug.model import load_model
from grpo_debug.rollout import row_chunks
from grpo_debug.specs import loss_spec_of, scoring_of
from grpo_debug.step import GRPOStep, StepRun
from grpo_debug.tracin.influence import ValidationSet, batch_influence, validation_gradient, validation_set
from grpo_debug.tracin.specs import specs_of
from grpo_debug.update import scored_rows_loss


def measured(fn) -> tuple[object, dict]:
    with PeakRSS() as mem:
        t0 = time.perf_counter()
        out = fn()
        seconds = time.perf_counter() - t0
    return out, {"seconds": round(seconds, 3), "peak_extra_mb": round(mem.mb, 1)}


def influence_costs(model, run: StepRun, adam_aware: bool = False) -> dict:
    """The costs on `run` (a StepRun up to the loss) of `model`, the weights that produced it."""
    cfg, r, lp, adv = run.config, run.rollout, run.logprobs, run.advantages.values
    val = validation_set(run, "same_batch")
    synthetic = bool((adv == 0).all())  # a random-weight model's completions all score alike: no signal
    if synthetic:  # the cost does not depend on the values; give every sample a gradient to compare
        adv = torch.randn(r.num_samples, generator=torch.Generator().manual_seed(0))
        val = ValidationSet(r, lp, adv, run.rewards.total)
    batch, norm = Batch(r, lp, adv), Normalisation(loss_weights(lp.mask, cfg.loss_type, cfg.max_new_tokens))
    share = lambda rows: scored_rows_loss(model, batch, scoring_of(cfg), loss_spec_of(cfg), norm, rows)[0]
    params = [p for p in model.parameters() if p.requires_grad]

    def plain_step():  # what `update` does without hooks
        model.zero_grad(set_to_none=True)
        for rows in row_chunks(r.num_samples):
            share(rows).backward()
        model.zero_grad(set_to_none=True)

    def naive_loop():
        scores = []
        for i in range(r.num_samples):
            model.zero_grad(set_to_none=True)
            share([i]).backward()
            scores.append(sum((p.grad.double() * val_grad[p].double()).sum() for p in params).item())
        model.zero_grad(set_to_none=True)
        return torch.tensor(scores)

    _, plain = measured(plain_step)
    (_, val_grad), val_cost = measured(lambda: validation_gradient(model, val, specs_of(cfg), "seqloss-lastadv"))
    fast, hook = measured(lambda: batch_influence(model, r, lp, adv, specs_of(cfg), val_grad))
    slow, naive = measured(naive_loop)
    extra = {}
    if adam_aware:
        from grpo_debug.tracin.first_order import scores_for
        from grpo_debug.tracin.influence import per_sample_train_gradients

        _, extra["adam_aware_score"] = measured(
            lambda: scores_for(
                per_sample_train_gradients(model, r, lp, adv, specs_of(cfg)).gradients(),
                val_grad,
                specs_of(cfg),
                "adam",
            )
        )
        extra["adam_aware_over_hook"] = round(extra["adam_aware_score"]["seconds"] / hook["seconds"], 2)
    return {
        **extra,
        "samples": r.num_samples,
        "synthetic_advantages": synthetic,
        "tokens_per_sample": r.prompt_ids.shape[1] + r.completion_ids.shape[1],
        "plain_step": plain,
        "validation_gradient": val_cost,
        "hook_method": hook,
        "naive_loop": naive,
        "hook_over_plain": round(hook["seconds"] / plain["seconds"], 2),
        "hook_plus_validation_gradient_over_plain": round(
            (hook["seconds"] + val_cost["seconds"]) / plain["seconds"], 2
        ),
        "naive_over_hook": round(naive["seconds"] / hook["seconds"], 2),
        "max_rel_diff_hook_vs_naive": ((fast.double() - slow.double()).abs().max() / slow.abs().max()).item(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--skip-124m", action="store_true")
    add_quick(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = StepConfig(beta=0.0, **(QUICK_SET if args.quick else {}))
    bundled = GRPOStep(cfg)
    report = {
        "threads": args.threads,
        "quick": args.quick,
        "bundled_8x8_mixed": influence_costs(bundled.policy, bundled.run(cfg, until="loss"), adam_aware=True),
    }
    if not args.skip_124m:
        shape_cfg = cfg if args.quick else cfg.replace(max_new_tokens=80)
        big = GRPOStep(shape_cfg, loaded=gpt2_124m_shape(load_model().tokenizer, quick=args.quick))
        report["gpt2_124m_shape_8x8_80_tokens"] = influence_costs(big.policy, big.run(shape_cfg, until="loss"))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
