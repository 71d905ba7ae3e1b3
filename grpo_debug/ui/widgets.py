"""ipywidgets controls bound to StepConfig fields, and the step's panel (TracIn's panel: `ui.influence`). The
callbacks are plain functions (unit-tested): a change builds a new config, re-runs only the phases after the one
the field belongs to, on the cached rollout, and redraws.

Each control's options come from the field's metadata: a dropdown of its `choices`, a slider over its
allowed range (`low`/`high`; an upper end is set here where the field has none), a checkbox for a bool, and
for a field that may be None (`delta`) a dropdown whose first entry "off" stands for None. A panel with an
update-phase control (`num_iterations`) runs the update too once num_iterations >= 2, so that the
off-policy controls (the clip range, delta, the importance-sampling level) act on something: in the first
pass pi == pi_old and the ratio is exactly 1 (every clip ratio 0, as the loss phase shows); from the second
pass on it is not. A change of the clip range or delta then re-reads the passes' cached log-probs instead
of re-running them, where that is exact (`ui.passes.passes_under`)."""

from __future__ import annotations

import dataclasses
import html
import time
from dataclasses import dataclass

import ipywidgets as W
import matplotlib.pyplot as plt
import traitlets
from IPython.display import display

from ..config import PRESETS, StepConfig
from ..pitfalls import panel_fields
from ..sampler import health_line
from ..show.metrics import metrics
from ..step import GRPOStep, StepRun
from ..update import Iteration
from . import plots
from .passes import passes_under
from .tables import per_sample

FIELDS = StepConfig.__dataclass_fields__
CHOICES = {f.name: list(f.metadata["choices"]) for f in dataclasses.fields(StepConfig) if f.metadata["choices"]}


def _range(name: str, step: float, high: float | None = None) -> tuple[float, float, float]:
    """(min, max, step) of a slider: the field's allowed range, `high` where the field has no upper bound."""
    m = FIELDS[name].metadata
    return m["low"], m["high"] if m["high"] is not None else high, step


SLIDERS = {
    "beta": (0.0, 0.5, 0.01),
    "std_floor": (0.0, 0.5, 0.01),
    "epsilon_low": _range("epsilon_low", 0.01),
    "epsilon_high": _range("epsilon_high", 0.01, high=5.0),  # 5: TRL's recommendation for cispo
    "top_entropy_quantile": _range("top_entropy_quantile", 0.05),
    "num_iterations": _range("num_iterations", 1, high=4),
}  # mu: each pass costs about one update
OFF = "off"  # the menu entry of None in a field that may be None
OPTIONAL = {"delta": [1.25, 1.5, 2.0, 4.0]}  # offered after "off" (delta > 0; TRL suggests > 1 + epsilon_high)
# Each panel offers the toggles of its pitfalls (`pitfalls.py` names the panel), then the knobs beside them.
PITFALL_FIELDS = panel_fields("pitfalls") + ["dtype", "gather", "std_floor", "beta"]
OFF_POLICY_FIELDS = [
    "num_iterations",
    "epsilon_low",
    "epsilon_high",
    "delta",
    "importance_sampling_level",
    "top_entropy_quantile",
    *panel_fields("off_policy"),
    "vllm_importance_sampling_mode",
]
DEFAULT_FIELDS = PITFALL_FIELDS + OFF_POLICY_FIELDS


def may_be_none(field: str) -> bool:
    return FIELDS[field].type.endswith("| None")


def options(field: str) -> list:
    """The config values a dropdown offers (None first where the field may be None)."""
    if field in CHOICES:
        return list(CHOICES[field])
    if field in OPTIONAL:
        return [None, *OPTIONAL[field]] if may_be_none(field) else list(OPTIONAL[field])
    raise ValueError(f"StepConfig field {field!r} has no menu")


def widget_value(field: str, value):
    """The control's value of a config value: "off" for None."""
    return OFF if value is None and may_be_none(field) else value


def config_value(field: str, value):
    """The config value of a control's value: None for "off"."""
    return None if isinstance(value, str) and value == OFF and may_be_none(field) else value


@dataclass
class ChangeResult:
    run: StepRun
    rerun: list[str]
    seconds: float
    passes: tuple[Iteration, ...] | None = None  # the update's passes when re-read, not re-run (`passes_under`)


def apply_change(step: GRPOStep, field: str, value, until: str = "loss") -> ChangeResult:
    """Set one StepConfig field and re-run what it touches."""
    start = time.perf_counter()
    run = step.run(step.cfg.replace(**{field: value}), until=until)
    return ChangeResult(run, list(step.last_rerun), time.perf_counter() - start)


def apply_preset(step: GRPOStep, name: str, until: str = "loss") -> ChangeResult:
    """Switch to a preset's fields (sampling and optimiser settings kept) and re-run what they touch."""
    start = time.perf_counter()
    run = step.run(step.cfg.with_preset(name), until=until)
    return ChangeResult(run, list(step.last_rerun), time.perf_counter() - start)


LABEL = {"description_width": "initial"}  # the whole field name, never "scale_rew..."


class SliderEntry(W.HBox):
    """A slider to drag within a useful range and a box to type any value: `value` is whatever was set last,
    never clamped (an ipywidgets slider clamps a typed -5 to its minimum without a word); the config then
    accepts the value or refuses it, naming the field, and the panel puts the control back."""

    value = traitlets.Any()

    def __init__(self, field: str, value):
        lo, hi, step = SLIDERS[field]
        whole = FIELDS[field].type == "int"
        self.slider = (W.IntSlider if whole else W.FloatSlider)(
            value=min(max(value, lo), hi),
            min=lo,
            max=max(hi, value),
            step=step,
            description=field,
            readout=False,
            continuous_update=False,
            style=LABEL,
        )
        self.entry = (W.IntText if whole else W.FloatText)(value=value, layout=W.Layout(width="7em"))
        super().__init__([self.slider, self.entry])
        self.value = value
        self.slider.observe(lambda change: setattr(self, "value", change["new"]), names="value")
        self.entry.observe(lambda change: setattr(self, "value", change["new"]), names="value")

    @traitlets.observe("value")
    def _show(self, change) -> None:
        value = change["new"]
        self.entry.value = value
        if value > self.slider.max:
            self.slider.max = value
        if value >= self.slider.min:  # below it the slider stays put: the config will refuse the value
            self.slider.value = value

    @property
    def min(self):
        return self.slider.min

    @property
    def max(self):
        return self.slider.max


def make_control(field: str, value) -> W.Widget:
    """The field's widget showing `value` (a config value)."""
    if field in CHOICES or field in OPTIONAL:
        values = options(field)
        if value not in values:  # e.g. delta=3.0 from the command line: offered too
            values = [v for v in values if v is None] + sorted([v for v in values if v is not None] + [value])
        labels = [(OFF if v is None else v if isinstance(v, str) else f"{v:g}", widget_value(field, v)) for v in values]
        return W.Dropdown(options=labels, value=widget_value(field, value), description=field, style=LABEL)
    if field in SLIDERS:
        return SliderEntry(field, value)
    if isinstance(value, bool):
        return W.Checkbox(value=value, description=field, style=LABEL)
    raise ValueError(f"no widget for StepConfig field {field!r}")


ITERATION_METRICS = ("clip_ratio/region_mean", "cispo_clip_ratio", "entropy")  # TRL's names, those the loss type logs


def summary(run: StepRun, passes: tuple[Iteration, ...] | None = None) -> dict[str, float]:
    """The panel's numbers; with the update (or its `passes` re-read), each optimizer pass's clip ratio and
    entropy (`iteration_k/`, TRL's metric names): the first pass is on-policy (ratio 1), the clip range
    bites from the second."""
    lp, adv, loss = run.logprobs, run.advantages, run.loss
    out = {
        "max |sampler - recomputed|": lp.max_sampler_gap,
        "EOS inside mask": lp.eos_kept,
        "reward": adv.reward,
        "frac_reward_zero_std": adv.frac_reward_zero_std,
        "max |advantage|": adv.max_abs_advantage,
        "loss": loss.loss.item(),
        "kl": loss.metrics["kl"],
    }
    if "entropy" in loss.metrics:
        out["entropy"] = loss.metrics["entropy"]
    passes = passes if passes is not None else run.update.iterations if run.update is not None else ()
    if passes:
        for k, iteration in enumerate(passes, start=1):
            out.update(
                {
                    f"iteration_{k}/{name}": iteration.metrics[name]
                    for name in ITERATION_METRICS
                    if name in iteration.metrics
                }
            )
    return out


FIGURES = {  # name -> (the phase result it draws, how): a figure is redrawn only when that result changed
    "logprob gap": ("logprobs", lambda run: plots.logprob_gap_heatmap(run.logprobs)),
    "advantages": ("advantages", lambda run: plots.advantages_bars(run.advantages, run.rollout.num_generations)),
    "kl per token": (
        "loss",
        lambda run: plots.kl_per_token(
            run.logprobs.policy, run.logprobs.reference, run.logprobs.mask, chosen=run.config.kl_estimator
        ),
    ),
}


def panel_until(fields: list[str], cfg: StepConfig | None = None) -> str:
    """The last phase a panel runs: the update when one of its fields is read by the update (and, given
    `cfg`, there is a second pass for the clip range to act on: num_iterations >= 2), else the loss."""
    reads_update = any(StepConfig.phase_of(f) == "update" for f in fields)
    return "update" if reads_update and (cfg is None or cfg.num_iterations > 1) else "loss"


def change_panel(step: GRPOStep, field: str, value, until: str, updated: StepRun | None) -> ChangeResult:
    """`apply_change`, but where the panel shows the update and `updated` (its last run with the update)
    can be re-read under the change (`passes_under`), the loss alone re-runs and the passes are re-read."""
    cfg = step.cfg.replace(**{field: value})
    if until == "update" and updated is not None and updated.config.num_iterations == cfg.num_iterations:
        start = time.perf_counter()
        passes = passes_under(updated, cfg)
        if passes is not None:
            run = step.run(cfg, until="loss")
            return ChangeResult(run, [*step.last_rerun, "passes re-read"], time.perf_counter() - start, passes)
    return apply_change(step, field, value, until)


class StepPanel:
    """Every toggle in one panel; results redrawn below it after each change. `until`: the last phase each
    change runs (default: `panel_until(fields, config)`, decided again at each change)."""

    def __init__(self, step: GRPOStep, fields: list[str] = DEFAULT_FIELDS, until: str | None = None):
        self.step, self.fields, self.fixed_until = step, list(fields), until
        self.updated: StepRun | None = None  # the last run with the update, whose passes a change may re-read
        self._run(step.cfg)
        self.controls = {f: make_control(f, getattr(step.cfg, f)) for f in fields}
        self.preset = W.Dropdown(
            options=[*PRESETS, "custom"], value=step.cfg.preset_name() or "custom", description="preset"
        )
        self.status = W.HTML()
        self.outputs = {name: W.Output() for name in [*FIGURES, "table"]}
        self.drawn: dict[str, object] = {}  # figure -> the phase result it shows
        self._syncing = False
        for field, control in self.controls.items():
            control.observe(lambda change, field=field: self.on_change(field, change["new"]), names="value")
        self.preset.observe(lambda change: self.on_preset(change["new"]), names="value")
        self.redraw(ChangeResult(step.result, [], 0.0))

    def until_for(self, cfg: StepConfig) -> str:
        return self.fixed_until or panel_until(self.fields, cfg)

    @property
    def until(self) -> str:
        return self.until_for(self.step.cfg)

    def _run(self, cfg: StepConfig) -> StepRun:
        run = self.step.run(cfg, until=self.until_for(cfg))
        self.updated = run if run.update is not None else None
        return run

    def on_change(self, field: str, value) -> ChangeResult | None:
        """Apply a control's value (None where the config refuses it: the control goes back, the status
        says why, nothing re-runs)."""
        if self._syncing:
            return None
        if field not in StepConfig.__dataclass_fields__:
            self.status.value = f"<b>no StepConfig field {html.escape(repr(field), quote=False)}</b>; nothing re-ran"
            return None
        try:
            value = config_value(field, value)
            until = self.until_for(self.step.cfg.replace(**{field: value}))
            result = change_panel(self.step, field, value, until, self.updated)
            if result.passes is None:  # re-ran: the passes shown are this run's, if any
                self.updated = result.run if result.run.update is not None else None
        except ValueError as error:  # e.g. vespo with a sequence-level sampler correction
            self._show_config()
            self.status.value = f"<b>{html.escape(str(error))}</b>; nothing re-ran"
            return None
        self._show_config()
        self.redraw(result)
        return result

    def on_preset(self, name: str) -> ChangeResult | None:
        if self._syncing or name == "custom":
            return None
        if name not in PRESETS:
            self.status.value = (
                f"<b>no preset {html.escape(repr(name), quote=False)}</b> (presets: {', '.join(PRESETS)}); "
                "nothing re-ran"
            )
            return None
        result = apply_preset(self.step, name, self.until_for(self.step.cfg.with_preset(name)))
        self.updated = result.run if result.run.update is not None else None
        self._show_config()
        self.redraw(result)
        return result

    def _show_config(self) -> None:
        """Controls and the preset menu show the step's config, without triggering another run."""
        self._syncing = True
        try:
            for field, control in self.controls.items():
                value = widget_value(field, getattr(self.step.cfg, field))
                if isinstance(control, W.Dropdown) and value not in [v for _, v in control.options]:  # set elsewhere
                    control.options = make_control(field, getattr(self.step.cfg, field)).options
                control.value = value
            self.preset.value = self.step.cfg.preset_name() or "custom"
        finally:
            self._syncing = False

    def stale_figures(self, run: StepRun) -> list[str]:
        return [name for name, (phase, _) in FIGURES.items() if self.drawn.get(name) is not getattr(run, phase)]

    def redraw(self, result: ChangeResult) -> None:
        run = result.run
        self.status.value = (
            f"re-ran <b>{', '.join(result.rerun) or 'nothing'}</b> in {result.seconds:.2f} s; "
            + ", ".join(f"{k} = {v:.4g}" for k, v in summary(run, result.passes).items())
            + f"<br>{html.escape(health_line(metrics(run)))}"
        )
        for name in self.stale_figures(run):
            phase, draw = FIGURES[name]
            self.drawn[name] = getattr(run, phase)
            self.outputs[name].clear_output(wait=True)
            with self.outputs[name]:
                fig = draw(run)
                display(fig)
                plt.close(fig)
        self.outputs["table"].clear_output(wait=True)
        with self.outputs["table"]:
            display(per_sample(run).head(16))

    def widget(self) -> W.Widget:
        grid = W.GridBox(list(self.controls.values()), layout=W.Layout(grid_template_columns="repeat(3, 33%)"))
        return W.VBox([self.preset, grid, self.status, *self.outputs.values()])
