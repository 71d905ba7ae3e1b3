"""pandas tables of a step: per sample, and variants of the config side by side on the same rollout."""

from __future__ import annotations

import re

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
