"""pandas tables of a step: per sample, and variants of the config side by side on the same rollout."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd
import torch

from ..config import StepConfig
from ..runs.results import detected, per_seed
from ..show.metrics import metrics
from ..step import GRPOStep, StepRun

NARROW = ("group", "completion", "reward", "advantage", "loss_share", "grad_norm")  # what a panel discusses
BREAK = "\u200b"  # a zero-width space: a line may break there; plain text, so no HTML sanitizer removes it
BREAK_AFTER = re.compile(r"([/_+,|])(?=\S)")  # after these, inside names like rewards/best_move and FENs


def breakable(text: str) -> str:
    """`text` with a line-break opportunity after each / _ + , | that a character follows: a header like
    `rewards/best_move` or a FEN then wraps inside a narrow column instead of widening it."""
    return BREAK_AFTER.sub(r"\1" + BREAK, text)


class FittedTable(pd.DataFrame):
    """A DataFrame whose notebook display fits the column: its headers and text cells may wrap after / _ + , |
    (zero-width spaces in the displayed copy only; the data keep their names and values). Index labels stay
    whole: the row names read in one piece.
    Selecting columns or rows (`table[cols].head(16)`) keeps the display."""

    @property
    def _constructor(self):
        return FittedTable

    def _repr_html_(self) -> str | None:
        label = lambda v: breakable(v) if isinstance(v, str) else v
        shown = pd.DataFrame(self).rename(columns=label)
        for column in shown.columns:
            if not pd.api.types.is_numeric_dtype(shown[column]):  # text: object or pandas' str dtype
                shown[column] = shown[column].map(label)
        return shown._repr_html_()


def fit_column(table: pd.DataFrame) -> FittedTable:
    """Any table shown so that it wraps inside the notebook column (`FittedTable`)."""
    return FittedTable(table)


def per_sample(run: StepRun, wide: bool = False) -> pd.DataFrame:
    """One row per completion: its group, text, total reward, advantage and loss share (and gradient norm),
    which fit a notebook column; its display wraps long headers and text (`FittedTable`). `wide=True` adds the
    length, the reward components (`rewards/<name>`, TRL's prefix, so that no component can overwrite the
    total), the sequence log-prob, entropy and sampler gap."""
    r, lp = run.rollout, run.logprobs
    rows = {
        "group": [i // r.num_generations for i in range(r.num_samples)],
        "completion": [c if len(c) <= 60 else c[:57] + "..." for c in r.completions],
        "length": r.completion_lengths.tolist(),
    }
    if run.rewards is not None:
        rows["reward"] = run.rewards.total.tolist()
        rows.update({f"rewards/{name}": values.tolist() for name, values in run.rewards.components.items()})
    if run.advantages is not None:
        rows["advantage"] = run.advantages.values.tolist()
    if lp is not None:
        rows["seq_logp"] = (lp.policy * lp.mask).sum(1).tolist()
        rows["entropy"] = ((lp.entropies * lp.mask).sum(1) / lp.mask.sum(1).clamp(min=1)).tolist()
        rows["max_sampler_gap"] = lp.sampler_gap.max(1).values.tolist()
    if run.loss is not None:
        rows["loss_share"] = run.loss.per_sample_loss.tolist()
    if run.update is not None and len(run.update.per_sample_grad_norms):
        rows["grad_norm"] = run.update.per_sample_grad_norms.tolist()
    table = FittedTable(rows)
    return table if wide else table[[c for c in NARROW if c in table]]


def compare_variants(
    step: GRPOStep,
    variants: dict[str, dict],
    base: StepConfig | None = None,
    until: str = "loss",
    columns: list[str] | None = None,
) -> pd.DataFrame:
    """Each variant (a dict of StepConfig changes) run from the same base run (its cached rollout); one row
    per variant, its metric names wrapping in a notebook column (`FittedTable`). The step's current run stays
    the base run."""
    base_run = step.run(base or step.cfg, until=until)
    rows = {}
    for name, changes in variants.items():
        run = step.run(base_run.config.replace(**changes), until=until, base=base_run, remember=False)
        values = {k: v for k, v in metrics(run).items() if not k.startswith("time/")}
        rows[name] = {k: values.get(k, float("nan")) for k in columns} if columns else values
    return FittedTable(pd.DataFrame.from_dict(rows, orient="index"))


def marked_completions(
    run: StepRun, flags: torch.Tensor, tokenizer, samples: list[int], left: str = "«", right: str = "»"
) -> pd.DataFrame:
    """Each chosen completion's text with the flagged tokens ((N, C) bool, e.g. an iteration's `clipped`)
    between `left` and `right`, and its advantage and number of flagged tokens."""
    r = run.rollout
    rows = {}
    for i in samples:
        length = int(r.completion_lengths[i])
        pieces = [tokenizer.decode([t]) for t in r.completion_ids[i, :length].tolist()]
        text = "".join(f"{left}{p}{right}" if flags[i, k] else p for k, p in enumerate(pieces))
        rows[i] = {
            "advantage": run.advantages.values[i].item(),
            "flagged": int(flags[i, :length].sum()),
            "completion": text,
        }
    return pd.DataFrame.from_dict(rows, orient="index")


def trained_log(trainer, columns: list[str]) -> FittedTable:
    """`trainer.train()` without the log dictionaries transformers prints at every logging step (its
    PrinterCallback, or ProgressCallback's bar), and the few logged numbers `columns`, named as TRL names
    them, one row per step: the log a reader reads instead of the dictionaries."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for printer in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(printer)
    trainer.train()
    steps = [h for h in trainer.state.log_history if "loss" in h]  # not the run's closing summary (train_loss)
    return FittedTable(pd.DataFrame(steps).set_index("step")[list(columns)])


def reading(entry: dict, seeds: torch.Tensor | None) -> str:
    """A verdict in a few words: detected (and which way) where the corrected interval excludes 0, else not
    detected, saying so where every seed points the same way (the direction is then unanimous, its size not
    resolved at the family's level)."""
    if entry["ci_low"] is None:
        return "one sample: no interval"
    if detected(entry):
        return "detected: " + ("up" if entry["mean"] > 0 else "down")
    if seeds is not None and len(seeds) > 1 and ((seeds > 0).all() or (seeds < 0).all()):
        return f"not detected; all {len(seeds)} seeds {'up' if seeds[0] > 0 else 'down'}"
    return "not detected"


def verdict_table(results: dict, key: str) -> pd.DataFrame:
    """One family of a training comparison's summary (`key`: "change_from_start", "minus_fixed", "kl minus_fixed",
    ..., or "claims": the comparison's held-out claims, whatever arm each is against) as one row per arm or
    claim: the estimate, its interval at the family's corrected level, Holm's p, how many seeds point up, and
    the reading (`reading`)."""
    entries = [
        (arm, k, entry)
        for arm, row in results["summary"].items()
        for k, entry in row.items()
        if isinstance(entry, dict)
        and "family" in entry
        and (k == key if key != "claims" else k.startswith("minus_") and "claim" in entry)
    ]
    rows = {}
    for arm, key_of_arm, entry in entries:
        seeds = per_seed(results, arm, key_of_arm)
        if seeds is not None and entry["n_seeds"] < len(seeds):  # identical seeds: one sample, not several
            seeds = None
        interval = "-" if entry["ci_low"] is None else f"[{entry['ci_low']:+.4f}, {entry['ci_high']:+.4f}]"
        rows[arm if "claim" not in entry else f"{arm} - {entry['other']}"] = {
            "estimate": f"{entry['mean']:+.4f}",
            f"interval ({100 * entry['level']:.2f}%)": interval,
            "Holm p": "-" if entry["holm_p"] is None else f"{entry['holm_p']:.3g}",
            "seeds up": "-" if seeds is None else f"{int((seeds > 0).sum())} of {len(seeds)}",
            "reading": reading(entry, seeds),
        }
    if not rows:
        raise ValueError(f"no arm of this comparison has a {key!r} family of verdicts")
    first = entries[0][2]
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = f"{first['family']} (family of {first['family_size']})"
    return table


# The small tables of the student's path (notebooks 00, 01, 03, 08): each turns a step's numbers into what one cell
# shows, so that the cell keeps only the idea.

COMPONENT_MEANING = {  # the bundled chess task's reward components (grpo_debug/chess/rewards.py)
    "best_move": "P: the best move's rank among the legal moves",
    "candidates": "P: the 5 moves against Stockfish's top 5",
    "evals": "P: the 5 evaluations against Stockfish's",
    "format": "the completion parses",
    "fen": "A: the position after the move",
    "reward": "A: the completion's reward field (0.001 legal, -1 illegal)",
    "terminated": "A: the game-over flag",
    "truncated": "A: the illegal-move flag",
}


def component_means(means: dict[str, float], meaning: dict[str, str] = COMPONENT_MEANING) -> FittedTable:
    """One row per reward component: its mean (`means`, e.g. an `EvalSide`'s components) and what it scores
    (`meaning`; "-" for a component it does not describe, such as a captured run's own)."""
    return FittedTable({"mean": means, "what it scores": {name: meaning.get(name, "-") for name in means}})


def rollout_table(rollout, groups: int = 2, per_group: int = 4, width: int = 80) -> FittedTable:
    """The first `per_group` samples of each of the first `groups` groups of a `Rollout`: group, task (the prompt's
    first two characters), length, whether it ended with an EOS, and the completion cut to `width` characters.
    The row label is the sample's row in the batch (row i belongs to prompt i // G)."""
    G = rollout.num_generations
    rows = [i for i in range(min(groups, len(rollout.prompts)) * G) if i % G < per_group]
    return FittedTable(
        {
            "group": [i // G for i in rows],
            "task": [rollout.prompts[i // G][:2] for i in rows],
            "length": [int(rollout.completion_lengths[i]) for i in rows],
            "ended with EOS": [bool(rollout.finished[i]) for i in rows],
            "completion": [rollout.completions[i][:width] for i in rows],
        },
        index=rows,
    )


def components_by_group(table: pd.DataFrame, groups: int = 2, rows: int = 4) -> list[FittedTable]:
    """`per_sample(run, wide=True)` cut into one table per group (the first `groups`, `rows` samples each): the
    completion, its total reward and the components that score its task (a component that scores none of the
    group's samples, NaN throughout, is left out: a P: group has no `fen`)."""
    scores = ["completion", "reward", *[c for c in table.columns if c.startswith("rewards/")]]
    return [
        FittedTable(table[table["group"] == g][scores].head(rows).dropna(axis=1, how="all"))
        for g in sorted(set(table["group"]))[:groups]
    ]


def within_group_spread(
    components: dict[str, torch.Tensor], group_size: int, weights: dict[str, float] | None = None
) -> dict[str, float]:
    """Each component's spread within the groups, as a share of all the components' spread: its (N,) values minus
    their group's mean (groups of `group_size` consecutive rows), squared and summed, NaN (not scored) left out.
    `weights` ({component: w}, e.g. the reward formula's): the spread of w times the values (w^2 times theirs); a
    component without a weight, or of weight 0, left out (it enters no reward). None: unweighted, every component.
    Largest first; a component the same within every group has share 0."""
    spread = {}
    for name, values in components.items():
        weight = 1.0 if weights is None else weights.get(name, 0.0)
        if weight == 0:
            continue
        grouped = values.view(-1, group_size)  # weighted after the sum: a group's equal values stay exactly equal
        spread[name] = weight**2 * (grouped - grouped.nanmean(1, keepdim=True)).pow(2).nansum().item()
    total = sum(spread.values())
    return dict(sorted(((k, v / total if total else 0.0) for k, v in spread.items()), key=lambda kv: -kv[1]))


def scored_cases(score, cases: dict[str, str]) -> pd.DataFrame:
    """One row per named completion in `cases`: the components and the total of `score(completion)` (a function
    returning a `Score`, e.g. `lambda text: score_policy(analysis, text)`)."""
    scores = {name: score(text) for name, text in cases.items()}
    return pd.DataFrame({name: {**s.components, "total": s.total} for name, s in scores.items()}).T


@dataclass(frozen=True)
class GradientReach:
    """Where a token page's d loss / d logp lands: `tokens` kept tokens (mask 1) get a gradient that is not 0,
    of magnitude `smallest` to `largest`, of the `signal_tokens` kept tokens of the samples whose advantage is not
    0; the samples `none` (with their `advantages`) get none on any kept token. Printed, it is that sentence (the
    largest |advantage| of `none` for their advantages)."""

    tokens: int
    smallest: float
    largest: float
    signal_tokens: int
    none: list[int]
    advantages: list[float]

    def __str__(self) -> str:
        largest_a = max((abs(a) for a in self.advantages), default=0.0)
        return (
            f"{self.tokens} kept tokens get |d loss / d logp| from {self.smallest:.1e} to {self.largest:.1e} (samples "
            f"with A != 0 keep {self.signal_tokens}); samples with none: {self.none}, max |A| {largest_a:.1e}"
        )


def gradient_reach(samples) -> GradientReach:
    """Where the d loss / d logp of a token page's samples (`TokenPage.samples`) lands (`GradientReach`)."""
    kept = {s.index: [abs(g) for g, m in zip(s.values["gradient"], s.values["mask"]) if m] for s in samples}
    moved = [g for grads in kept.values() for g in grads if g > 0]
    none = [s for s in samples if not any(kept[s.index])]
    return GradientReach(
        len(moved),
        min(moved, default=0.0),
        max(moved, default=0.0),
        sum(len(kept[s.index]) for s in samples if s.advantage != 0),
        [s.index for s in none],
        [s.advantage for s in none],
    )
