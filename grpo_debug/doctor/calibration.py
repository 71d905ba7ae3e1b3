"""Where `update_size`'s and `kl_blowup`'s tiers come from: one step of the bundled task, from the same start, at
learning rates from 1e-5 to 1e-1, on several seeds. Each step's `moved_kl` (KL(pi_before || pi_after) per token on
its own completions) is paired with what the step did to the held-out reward (the same prompts and sampling
seeds before and after).

    python -m grpo_debug.doctor.calibration --json data/calibration/update_size.json [--seeds 3] [--quick]

The JSON holds the command, the date, the commit, every record and, per learning rate, the seeds' KLs and reward
changes; `detectors.MOVED_KL_WARNING` and `MOVED_KL_PROBLEM` cite it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

LEARNING_RATES = (1e-5, 1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)


def measure(seeds: int, quick: bool) -> list[dict]:
    from ..config import StepConfig
    from ..specs import eval_sampling_of
    from ..step import GRPOStep
    from .facts import held_out_prompts, held_out_side, moved_kl, update_vector

    shape = dict(num_prompts=2, num_generations=4, max_new_tokens=16) if quick else {}
    step = GRPOStep(StepConfig(**shape))
    prompts = held_out_prompts(step, 4 if quick else 16)
    weight_norm = sum(v.float().square().sum() for v in step.initial_state.values()).sqrt().item()
    records = []
    for seed in range(seeds):
        cfg = step.cfg.replace(seed=seed)
        start = held_out_side(step, eval_sampling_of(cfg), prompts)
        for lr in LEARNING_RATES[::3] if quick else LEARNING_RATES:
            run = step.run(cfg.replace(learning_rate=lr), until="update")
            relative = update_vector(step).norm().item() / weight_norm
            after = held_out_side(step, eval_sampling_of(cfg), prompts)
            kl = moved_kl(step, run)
            records.append(
                dict(
                    seed=seed,
                    learning_rate=lr,
                    moved_kl=kl,
                    relative_update=relative,
                    reward_before=start.reward,
                    reward_after=after.reward,
                    reward_change=after.reward - start.reward,
                )  # fmt: skip
            )
            print(json.dumps(records[-1]), file=sys.stderr, flush=True)
    return records


def by_rate(records: list[dict]) -> list[dict]:
    rates = sorted({r["learning_rate"] for r in records})
    return [
        {
            "learning_rate": lr,
            "moved_kl": [r["moved_kl"] for r in records if r["learning_rate"] == lr],
            "reward_change": [r["reward_change"] for r in records if r["learning_rate"] == lr],
            "relative_update": [r["relative_update"] for r in records if r["learning_rate"] == lr],
        }
        for lr in rates
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a 2 x 4 step, 3 learning rates: checks it runs")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error(f"--seeds {args.seeds}: at least 1")
    records = measure(args.seeds, args.quick)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {
        "command": " ".join(["python -m grpo_debug.doctor.calibration", *(argv or sys.argv[1:])]),
        "date": datetime.date.today().isoformat(),
        "commit": commit or None,
        "question": "what one step's moved_kl does to the held-out reward (update_size and kl_blowup tiers)",
        "records": records,
        "by_learning_rate": by_rate(records),
    }
    args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
