"""Influence cost: `python benchmarks/influence.py [--threads N]`, JSON on stdout.

For the bundled model at 8 prompts x 8 samples: a plain training step (forward, backward), the hook
method (per-sample gradients from one backward, then inner products with the validation gradient)
and the naive loop (one backward per sample). The 124M GPT-2 shape is not measured yet: its tied
embedding alone needs 64 x 50257 x 768 floats (10 GB) per materialised per-sample gradient.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from grpo_debug.config import StepConfig
from grpo_debug.influence import influence_scores, per_sample_train_gradients, validation_gradient, validation_set
from grpo_debug.step import GRPOStep
from grpo_debug.loss import loss_weights
from grpo_debug.rollout import row_chunks
from grpo_debug.update import chunk_loss


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, round(time.perf_counter() - t0, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = StepConfig(beta=0.0)
    step = GRPOStep(cfg)
    run = step.run(cfg, until="loss")
    model, r, lp, adv = step.policy, run.rollout, run.logprobs, run.advantages.values
    val = validation_set(step, "same_batch")

    weights = loss_weights(lp.mask, cfg.loss_type, cfg.max_new_tokens)

    def plain_step():  # what `update` does without hooks: backward 8 rows at a time
        model.zero_grad(set_to_none=True)
        for rows in row_chunks(r.num_samples):
            chunk_loss(model, r, lp, adv, cfg, rows, weights).backward()
        model.zero_grad(set_to_none=True)

    def hook_method():
        grads = per_sample_train_gradients(model, r, lp, adv, cfg)
        _, val_grad = validation_gradient(model, val, cfg, "seqloss-lastadv")
        return influence_scores(grads, val_grad)

    def naive_loop():  # one backward per sample
        _, val_grad = validation_gradient(model, val, cfg, "seqloss-lastadv")
        params = [p for p in model.parameters() if p.requires_grad]
        scores = []
        for i in range(r.num_samples):
            model.zero_grad(set_to_none=True)
            chunk_loss(model, r, lp, adv, cfg, [i], weights).backward()
            scores.append(sum((p.grad.double() * val_grad[p].double()).sum() for p in params).item())
        model.zero_grad(set_to_none=True)
        return torch.tensor(scores)

    _, plain = timed(plain_step)
    fast, hook = timed(hook_method)
    slow, naive = timed(naive_loop)
    print(json.dumps({"threads": args.threads, "samples": r.num_samples, "plain_step_seconds": plain,
                      "hook_method_seconds": hook, "naive_loop_seconds": naive,
                      "hook_over_plain": round(hook / plain, 2), "naive_over_hook": round(naive / hook, 2),
                      "max_rel_diff_hook_vs_naive": ((fast.double() - slow.double()).abs().max()
                                                     / slow.abs().max()).item()}, indent=1))


if __name__ == "__main__":
    main()
