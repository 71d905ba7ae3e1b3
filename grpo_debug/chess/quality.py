"""Quality floors of a RookWorld model on the held-out split: `python -m grpo_debug.chess.quality`.

Samples `--samples` completions per prompt (temperature 0.7, top_p 0.95, seeded) for `--prompts`
P: prompts of `policy_eval` and as many A: prompts of `env_eval`, then reports:
  policy/parse_rate            P: completions whose M:, E:, B: sections parse
  policy/best_move_legal       B: moves legal in the position
  policy/best_move_top5        B: moves among Stockfish's top 5
  policy/groups_nonzero_std    prompts whose 8 rewards are not all equal (GRPO has a signal)
  env/next_fen_exact           A: next FENs naming the right position
  env/groups_nonzero_std, reward means and more.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from ..rollout import sample_completions
from .data import env_example, load_split, policy_example
from .engine import PositionAnalysis
from .format import EnvOutcome, parse_env_completion, parse_policy_completion, same_position
from .rewards import score_env, score_policy

FLOORS = {
    "policy/parse_rate": 0.95,
    "policy/best_move_legal": 0.30,
    "policy/best_move_top5": 0.05,
    "groups_nonzero_std": 0.80,
    "env/next_fen_exact": 0.20,
}


def _rate(flags: list[bool]) -> float:
    return sum(flags) / max(len(flags), 1)


def _nonzero_std(groups: list[list[float]]) -> list[bool]:
    return [statistics.pstdev(g) > 0 for g in groups]


def policy_metrics(records: list[dict], completions: list[list[str]]) -> dict[str, float]:
    parse, legal, top5, groups = [], [], [], []
    for record, samples in zip(records, completions):
        analysis = PositionAnalysis.from_json(record)
        rewards = []
        for text in samples:
            parsed = parse_policy_completion(text)
            parse.append(parsed.ok)
            legal.append(parsed.best in analysis.evals)  # the analysis lists every legal move, standard UCI
            top5.append(parsed.best in analysis.top5)
            rewards.append(score_policy(analysis, text).total)
        groups.append(rewards)
    return {
        "policy/parse_rate": _rate(parse),
        "policy/best_move_legal": _rate(legal),
        "policy/best_move_top5": _rate(top5),
        "policy/groups_nonzero_std": _rate(_nonzero_std(groups)),
        "policy/reward_mean": statistics.fmean(r for g in groups for r in g),
    }


def env_metrics(records: list[dict], completions: list[list[str]]) -> dict[str, float]:
    parse, exact, groups = [], [], []
    for record, samples in zip(records, completions):
        truth = EnvOutcome(record["next_fen"], record["reward"], record["terminated"], record["truncated"])
        rewards = []
        for text in samples:
            parsed = parse_env_completion(text)
            parse.append(parsed.ok)
            exact.append(same_position(parsed.next_fen, truth.next_fen))
            rewards.append(score_env(truth, text).total)
        groups.append(rewards)
    return {
        "env/parse_rate": _rate(parse),
        "env/next_fen_exact": _rate(exact),
        "env/groups_nonzero_std": _rate(_nonzero_std(groups)),
        "env/reward_mean": statistics.fmean(r for g in groups for r in g),
    }


def floor_metrics(
    model, tokenizer, num_prompts: int = 200, num_samples: int = 8, seed: int = 0, progress: bool = True
) -> dict[str, float]:
    start = time.time()
    policy_records = load_split("policy_eval")[:num_prompts]
    env_records = load_split("env_eval")[:num_prompts]
    policy_out = sample_completions(
        model,
        tokenizer,
        [policy_example(r)[0] for r in policy_records],
        num_samples,
        max_new_tokens=64,
        seed=seed,
        progress=progress,
    )
    env_out = sample_completions(
        model,
        tokenizer,
        [env_example(r)[0] for r in env_records],
        num_samples,
        max_new_tokens=120,
        seed=seed,
        progress=progress,
    )
    metrics = {**policy_metrics(policy_records, policy_out), **env_metrics(env_records, env_out)}
    metrics["groups_nonzero_std"] = (metrics["policy/groups_nonzero_std"] + metrics["env/groups_nonzero_std"]) / 2
    metrics = {k: round(v, 4) for k, v in metrics.items()}
    metrics["eval_seconds"] = round(time.time() - start, 1)
    return metrics


def main(argv: list[str] | None = None) -> None:
    from ..model import load_model

    parser = argparse.ArgumentParser(
        prog="python -m grpo_debug.chess.quality",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", default=None, help="folder or hub id (default: the bundled model)")
    parser.add_argument("--prompts", type=int, default=200)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
    metrics = floor_metrics(loaded.policy, loaded.tokenizer, args.prompts, args.samples, args.seed)
    metrics["floors_met"] = {k: metrics[k] >= v for k, v in FLOORS.items()}
    print(json.dumps(metrics, indent=2))


if __name__ == "__main__":
    from ..kernels import pin

    pin()  # before torch runs an op: the numbers this script writes are the same on every machine
    main()
