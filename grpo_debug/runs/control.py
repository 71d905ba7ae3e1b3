"""The positive control of `data/experiments/control_plan.json`: does the fixed configuration learn?

Stage 1 chooses the learning rate on validation prompts (`chosen_rate`: the highest mean validation reward after
K steps, a tie to the smaller rate); stage 2 runs the fixed configuration, TRL as shipped and two pitfalls at
that rate on new seeds, read as the comparison `control` (`positive_control`)."""

from __future__ import annotations

from pathlib import Path

from .comparisons import open_comparison
from .results import base_config, detected


def rates(folder: str | Path) -> dict[float, float]:
    """{learning rate: mean validation reward after K steps} of stage 1's arms (the comparison `control_lr`),
    smallest rate first."""
    stage_1 = open_comparison(folder, "control_lr")
    if stage_1.get("eval_set") != "validation":  # merge_results checked that its files agree
        raise ValueError(f"{stage_1['files']}: a learning rate is chosen on validation prompts, not test prompts")
    out = {
        float(stage_1["arms"][arm]["changes"]["learning_rate"]): row["reward_final"]["mean"]
        for arm, row in stage_1["summary"].items()
    }
    return dict(sorted(out.items()))


def chosen_rate(folder: str | Path) -> str:
    """The plan's rule: the rate with the highest mean validation reward (a tie to the smaller), as text."""
    table = rates(folder)
    best = max(table.values())
    return repr(next(lr for lr, reward in table.items() if reward == best))


def positive_control(folder: str | Path) -> dict:
    """Stage 2 as one comparison (`open_comparison(folder, "control")`); its base config holds the rate."""
    return open_comparison(folder, "control")


def headline(control: dict) -> str:
    """The positive control's verdict in one sentence, as README and notebook 06b print it."""
    change = control["summary"]["fixed"]["change_from_start"]
    lr = base_config(control).learning_rate
    return (
        f"after {control['steps']} steps at learning rate {lr:g} on {control['seeds']} new seeds x "
        f"{control['eval_prompts']} test prompts, the fixed configuration's held-out reward changed from its start "
        f"by {change['mean']:+.4f} [{change['ci_low']:+.4f}, {change['ci_high']:+.4f}] "
        f"({100 * change['level']:.2f}%, family of {change['family_size']}): "
        + ("detected" if detected(change) else "not detected")
    )
