"""The positive control of `data/experiments/control_plan.json`: does the fixed configuration learn?

Stage 1 chooses the learning rate on validation prompts (`chosen_rate`: the highest mean validation reward after
K steps, a tie to the smaller rate); stage 2 runs the fixed configuration, TRL as shipped and two pitfalls at
that rate on new seeds, read as the comparison `control` (`positive_control`)."""

from __future__ import annotations

import json
from pathlib import Path

from ..stats import is_detected
from .comparisons import open_comparison
from .results import base_config, merge_results, summarize

SELECTION_FILES = ("control_lr_a.json", "control_lr_b.json")


def rates(folder: str | Path) -> dict[float, float]:
    """{learning rate: mean validation reward after K steps} of stage 1's arms, smallest rate first."""
    folder = Path(folder)
    parts = [json.loads((folder / f).read_text()) for f in SELECTION_FILES]
    if any(p.get("eval_set") != "validation" for p in parts):
        raise ValueError(f"{SELECTION_FILES}: a learning rate is chosen on validation prompts, not test prompts")
    merged = parts[0]
    for part in parts[1:]:
        merged = merge_results(merged, part)
    summary = summarize(merged["records"], list(merged["arms"]), merged["seeds"], merged["steps"])
    out = {
        float(merged["arms"][arm]["changes"]["learning_rate"]): row["reward_final"]["mean"]
        for arm, row in summary.items()
    }
    return dict(sorted(out.items()))


def chosen_rate(folder: str | Path) -> str:
    """The plan's rule: the rate with the highest mean validation reward (a tie to the smaller), as text."""
    table = rates(folder)
    best = max(table.values())
    return repr(next(lr for lr, reward in table.items() if reward == best))


def positive_control(folder: str | Path) -> dict:
    """Stage 2 as one comparison (`open_comparison(folder, "control")`) with the rate it ran at."""
    return open_comparison(folder, "control")


def headline(control: dict) -> str:
    """The positive control's verdict in one sentence, as README and notebook 06b print it."""
    change = control["summary"]["fixed"]["change_from_start"]
    lr = base_config(control).learning_rate
    detected = is_detected(change["ci_low"], change["ci_high"], change["holm_p"])
    return (
        f"after {control['steps']} steps at learning rate {lr:g} on {control['seeds']} new seeds x "
        f"{control['eval_prompts']} test prompts, the fixed configuration's held-out reward changed from its start "
        f"by {change['mean']:+.4f} [{change['ci_low']:+.4f}, {change['ci_high']:+.4f}] "
        f"({100 * change['level']:.2f}%, family of {change['family_size']}): "
        + ("detected" if detected else "not detected")
    )
