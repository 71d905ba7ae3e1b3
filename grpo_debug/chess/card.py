"""Write the bundled model's card from measurements: `python -m grpo_debug.chess.card [--metrics floors.json]`.

Without `--metrics` it runs `python -m grpo_debug.chess.quality`'s measurement (200 + 200 held-out prompts,
8 samples each, seed 0) first. The card quotes the numbers as measured, the learning curve as logged.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import NamedTuple

import torch

from ..files import DATA_DIR, DEFAULT_MODEL_DIR
from ..model import load_model
from .quality import FLOORS, floor_metrics


def _curve_table(model_dir: Path) -> str:
    path = model_dir / "learning_curve.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    cols = [
        "step",
        "minutes",
        "val_loss_policy",
        "val_loss_env",
        "policy/parse_rate",
        "policy/best_move_legal",
        "policy/best_move_top5",
        "env/next_fen_exact",
        "groups_nonzero_std",
    ]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        lines.append("| " + " | ".join(str(row.get(c, "")) for c in cols) + " |")
    return "\n".join(lines)


def _runs(model_dir: Path) -> str:
    """The training runs as commands: each resumed run continues the saved state, so running them in
    order rebuilds the model."""
    path = model_dir / "training_runs.jsonl"
    runs = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return "\n".join(
        f"  {i + 1}. steps {r['from_step']} to {r['to_step']}: `python -m grpo_debug.chess.train_model --lr {r['lr']} "
        f"--min-lr {r['min_lr']} --warmup-steps {r['warmup_steps']} --max-steps {r['max_steps']} "
        f"--policy-fraction {r.get('policy_fraction', 0.5)} "
        f"--eval-every {r['eval_every']} --metrics-every {r['metrics_every']} --stop-step {r['to_step']} "
        f"--minutes 1000`"
        for i, r in enumerate(runs)
    )


class ModelFacts(NamedTuple):
    """What the card quotes about the model and its training, read from its folder."""

    train: dict  # the training config of train_state.pt
    step: int
    minutes: float
    arch: dict  # config.json
    n_params: int  # lm_head is tied to the token embedding: counted once
    size_mb: float
    manifest: dict  # the bundled data's manifest.json


def model_facts(model_dir: Path) -> ModelFacts:
    state = torch.load(model_dir / "train_state.pt", weights_only=True, map_location="cpu")
    return ModelFacts(
        train=state["config"],
        step=state["step"],
        minutes=state["trained_seconds"] / 60,
        arch=json.loads((model_dir / "config.json").read_text()),
        n_params=sum(v.numel() for k, v in state["model"].items() if k != "lm_head.weight"),
        size_mb=sum(p.stat().st_size for p in model_dir.iterdir() if p.name != "train_state.pt") / 2**20,
        manifest=json.loads((DATA_DIR / "manifest.json").read_text()),
    )


def _about(model_dir: Path) -> str:
    """The model, how it was trained (the runs as commands) and on what data."""
    m = model_facts(model_dir)
    cfg, config, manifest = m.train, m.arch, m.manifest
    return f"""# rookworld-tiny

A GPT-2 (`GPT2LMHeadModel`) trained from scratch on the bundled RookWorld-format data, so that
grpo-debug runs offline. It stands in for `jrahn/RookWorld-LM-124M`: same text formats (P: policy,
A: environment), same architecture family, same dropout (0.1), much smaller and much weaker.

- {m.n_params / 1e6:.2f}M parameters: {config["n_layer"]} layers, {config["n_embd"]} wide, {config["n_head"]} heads,
  {config["n_positions"]} positions; vocabulary {config["vocab_size"]} (BPE with one token per board square, see
  `grpo_debug/chess/tokenizer.py`); {m.size_mb:.1f} MB on disk (the resumable `train_state.pt` is not part of the model).
- Trained {m.step} steps of {cfg["batch_size"]} samples (each run's P: share is its `--policy-fraction`, the rest
  A:), AdamW lr {cfg["lr"]} cosine to {cfg["min_lr"]}, bfloat16 autocast on one CPU thread: {m.minutes:.0f} minutes
  of training. Loss on completion tokens and the EOS. The runs (a resumed run keeps the step, optimizer and
  data order, and follows the cosine of its own `--max-steps`, so it can raise the learning rate where it resumes):
{_runs(model_dir)}
- Why the mix changes: an environment model that predicts the next position right gives all 8 samples of an
  A: prompt the same answer, and such a group carries no GRPO signal. After run 2 (step 5345), next FEN exact was 66.3%
  but only 53.5% of A: groups (75.25% of all groups) had a reward std above 0. A run on P: alone lets the
  model forget part of the A: task (`val_loss_env` rises in the learning curve) while the policy keeps
  learning; the table below is measured after it.
- Data: `data/` ({manifest["counts"]["policy_train"]} P: positions, {manifest["counts"]["env_train"]} A: transitions;
  {manifest["stockfish"]}), see `data/README.md`.
- Reproduce: the runs above in order, from an empty folder (`--out`), with the tokenizer trained first by
  the same command (same seed, same data order; one thread)."""


def _floors_table(metrics: dict) -> str:
    return "\n".join(
        f"| `{k}` | {metrics[k]:.4f} | {v} | {'met' if metrics[k] >= v else 'NOT met'} |" for k, v in FLOORS.items()
    )


def _verdict(metrics: dict) -> str:
    """Whether every floor is met; if the groups with a reward std are too few, why."""
    missing = [k for k, v in FLOORS.items() if metrics[k] < v]
    if not missing:
        return "Every floor is met."
    verdict = f"**Not finished**: this checkpoint does not meet {', '.join(f'`{k}`' for k in missing)}."
    if "groups_nonzero_std" in missing:
        verdict += (
            f" Groups with a non-zero reward std: P: {metrics['policy/groups_nonzero_std']:.1%}, A: "
            f"{metrics['env/groups_nonzero_std']:.1%}. An environment model that predicts the next position "
            "right gives all 8 samples the same answer, so its A: group carries no GRPO signal; the A: share "
            "falls as `env/next_fen_exact` rises."
        )
    return verdict


def _quality(metrics: dict) -> str:
    """The held-out measurement against the floors, with every number of the run."""
    return f"""## Measured quality (held-out split)

`python -m grpo_debug.chess.quality --prompts 200 --samples 8 --seed 0`: 200 P: prompts of `policy_eval` and
200 A: prompts of `env_eval`, none seen in training, 8 samples each at temperature 0.7, top_p 0.95.

| metric | measured | floor (issue 2) | |
|---|---|---|---|
{_floors_table(metrics)}

All numbers of that run:

```json
{json.dumps(metrics, indent=1)}
```

{_verdict(metrics)}"""


def _learning_curve(model_dir: Path) -> str:
    return f"""## Learning curve

Validation loss per completion token on 200 + 200 held-out examples; the floor metrics every 1000 steps
on a quick subset (24 prompts x 4 samples per task, so noisier than the table above).

{_curve_table(model_dir)}"""


def render(metrics: dict, model_dir: Path = DEFAULT_MODEL_DIR) -> str:
    """The model card: what the model is, its measured quality, its learning curve."""
    return f"{_about(model_dir)}\n\n{_quality(metrics)}\n\n{_learning_curve(model_dir)}\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m grpo_debug.chess.card", description=__doc__)
    parser.add_argument("--metrics", type=Path, help="JSON printed by `python -m grpo_debug.chess.quality`")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.metrics:
        metrics = json.loads(args.metrics.read_text())
    else:
        loaded = load_model(DEFAULT_MODEL_DIR)
        metrics = floor_metrics(loaded.policy, loaded.tokenizer, 200, 8, 0)
    metrics.pop("floors_met", None)
    (DEFAULT_MODEL_DIR / "README.md").write_text(render(metrics))
    print((DEFAULT_MODEL_DIR / "README.md").read_text())


if __name__ == "__main__":
    from ..kernels import pin

    pin()  # before torch runs an op: the numbers this script writes are the same on every machine
    main()
