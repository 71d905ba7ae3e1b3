"""ipywidgets controls bound to StepConfig fields. The callbacks are plain functions (unit-tested):
a change builds a new config, re-runs only the phases after the one the field belongs to, on the
cached rollout, and redraws."""

from __future__ import annotations

import time
from dataclasses import dataclass

import ipywidgets as W
import matplotlib.pyplot as plt
from IPython.display import display

from . import plots
from .loss import KL_ESTIMATORS, LOSS_TYPES
from .step import GRPOStep, StepRun
from .tables import per_sample

CHOICES = {
    "mask": ["trl", "seed004", "none"],
    "dtype": ["float32", "bfloat16"],
    "gather": ["correct", "seed003"],
    "kl_estimator": list(KL_ESTIMATORS),
    "loss_type": list(LOSS_TYPES),
    "scale_rewards": ["group", "batch", "none"],
}
SLIDERS = {"beta": (0.0, 0.5, 0.01), "std_floor": (0.0, 0.5, 0.01)}
TOGGLES = ["logprob_temperature", "dropout", "position_ids"]
DEFAULT_FIELDS = TOGGLES + ["mask", "dtype", "gather", "scale_rewards", "std_floor", "loss_type", "kl_estimator", "beta"]


@dataclass
class ChangeResult:
    run: StepRun
    rerun: list[str]
    seconds: float


def apply_change(step: GRPOStep, field: str, value, until: str = "loss") -> ChangeResult:
    """Set one StepConfig field and re-run what it touches."""
    start = time.perf_counter()
    run = step.run(step.cfg.replace(**{field: value}), until=until)
    return ChangeResult(run, list(step.last_rerun), time.perf_counter() - start)


def make_control(field: str, value) -> W.Widget:
    if field in CHOICES:
        return W.Dropdown(options=CHOICES[field], value=value, description=field)
    if field in SLIDERS:
        lo, hi, step = SLIDERS[field]
        return W.FloatSlider(value=value, min=lo, max=hi, step=step, description=field, continuous_update=False)
    if isinstance(value, bool):
        return W.Checkbox(value=value, description=field)
    raise ValueError(f"no widget for StepConfig field {field!r}")


def summary(run: StepRun) -> dict[str, float]:
    lp, adv, loss = run.logprobs, run.advantages, run.loss
    return {"max |sampler - recomputed|": lp.max_sampler_gap, "EOS inside mask": lp.eos_kept,
            "reward": adv.reward, "frac_reward_zero_std": adv.frac_reward_zero_std,
            "max |advantage|": adv.max_abs_advantage, "loss": loss.loss.item(), "kl": loss.metrics["kl"]}


class StepPanel:
    """Every toggle in one panel; results redrawn below it after each change."""

    def __init__(self, step: GRPOStep, fields: list[str] = DEFAULT_FIELDS, until: str = "loss"):
        self.step, self.until = step, until
        step.run(step.cfg, until=until)
        self.controls = {f: make_control(f, getattr(step.cfg, f)) for f in fields}
        self.status = W.HTML()
        self.out = W.Output()
        for field, control in self.controls.items():
            control.observe(lambda change, field=field: self.on_change(field, change["new"]), names="value")
        self.redraw(ChangeResult(step.result, [], 0.0))

    def on_change(self, field: str, value) -> ChangeResult:
        result = apply_change(self.step, field, value, self.until)
        self.redraw(result)
        return result

    def redraw(self, result: ChangeResult) -> None:
        run = result.run
        self.status.value = (f"re-ran <b>{', '.join(result.rerun) or 'nothing'}</b> in {result.seconds:.2f} s; "
                             + ", ".join(f"{k} = {v:.4g}" for k, v in summary(run).items()))
        self.out.clear_output(wait=True)
        with self.out:
            figures = [plots.logprob_gap_heatmap(run.logprobs),
                       plots.advantages_bars(run.advantages, run.rollout.num_generations),
                       plots.kl_per_token(run.logprobs.policy, run.logprobs.reference, run.logprobs.mask)]
            for fig in figures:
                display(fig)
                plt.close(fig)
            display(per_sample(run).head(16))

    def widget(self) -> W.Widget:
        grid = W.GridBox(list(self.controls.values()), layout=W.Layout(grid_template_columns="repeat(3, 33%)"))
        return W.VBox([grid, self.status, self.out])
