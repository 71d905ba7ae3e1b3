"""ipywidgets controls bound to StepConfig fields, and for TracIn to InfluenceChoice fields. The
callbacks are plain functions (unit-tested): a change builds a new config, re-runs only the phases after the one the field belongs to, on the
cached rollout, and redraws."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, replace

import ipywidgets as W
import matplotlib.pyplot as plt
import torch
from IPython.display import display

from . import plots
from ..tracin.influence import (PARAMETER_SETS, VAL_ADVANTAGES, VAL_LOSSES, VAL_SOURCES, ZERO_TOLERANCE, InfluenceChoice,
                        InfluenceExplorer, sign_fractions)
from ..config import PRESETS, StepConfig
from ..step import GRPOStep, StepRun
from .tables import per_sample

CHOICES = {f.name: list(f.metadata["choices"]) for f in dataclasses.fields(StepConfig) if f.metadata["choices"]}
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


def apply_preset(step: GRPOStep, name: str, until: str = "loss") -> ChangeResult:
    """Switch to a preset's fields (sampling and optimiser settings kept) and re-run what they touch."""
    start = time.perf_counter()
    run = step.run(step.cfg.with_preset(name), until=until)
    return ChangeResult(run, list(step.last_rerun), time.perf_counter() - start)


LABEL = {"description_width": "initial"}  # the whole field name, never "scale_rew..."


def make_control(field: str, value) -> W.Widget:
    if field in CHOICES:
        return W.Dropdown(options=CHOICES[field], value=value, description=field, style=LABEL)
    if field in SLIDERS:
        lo, hi, step = SLIDERS[field]
        return W.FloatSlider(value=value, min=lo, max=hi, step=step, description=field, continuous_update=False,
                             style=LABEL)
    if isinstance(value, bool):
        return W.Checkbox(value=value, description=field, style=LABEL)
    raise ValueError(f"no widget for StepConfig field {field!r}")


def summary(run: StepRun) -> dict[str, float]:
    lp, adv, loss = run.logprobs, run.advantages, run.loss
    return {"max |sampler - recomputed|": lp.max_sampler_gap, "EOS inside mask": lp.eos_kept,
            "reward": adv.reward, "frac_reward_zero_std": adv.frac_reward_zero_std,
            "max |advantage|": adv.max_abs_advantage, "loss": loss.loss.item(), "kl": loss.metrics["kl"]}


FIGURES = {  # name -> (the phase result it draws, how): a figure is redrawn only when that result changed
    "logprob gap": ("logprobs", lambda run: plots.logprob_gap_heatmap(run.logprobs)),
    "advantages": ("advantages", lambda run: plots.advantages_bars(run.advantages, run.rollout.num_generations)),
    "kl per token": ("loss", lambda run: plots.kl_per_token(run.logprobs.policy, run.logprobs.reference,
                                                            run.logprobs.mask, chosen=run.config.kl_estimator)),
}


class StepPanel:
    """Every toggle in one panel; results redrawn below it after each change."""

    def __init__(self, step: GRPOStep, fields: list[str] = DEFAULT_FIELDS, until: str = "loss"):
        self.step, self.until = step, until
        step.run(step.cfg, until=until)
        self.controls = {f: make_control(f, getattr(step.cfg, f)) for f in fields}
        self.preset = W.Dropdown(options=[*PRESETS, "custom"], value=step.cfg.preset_name() or "custom",
                                 description="preset")
        self.status = W.HTML()
        self.outputs = {name: W.Output() for name in [*FIGURES, "table"]}
        self.drawn: dict[str, object] = {}  # figure -> the phase result it shows
        self._syncing = False
        for field, control in self.controls.items():
            control.observe(lambda change, field=field: self.on_change(field, change["new"]), names="value")
        self.preset.observe(lambda change: self.on_preset(change["new"]), names="value")
        self.redraw(ChangeResult(step.result, [], 0.0))

    def on_change(self, field: str, value) -> ChangeResult | None:
        if self._syncing:
            return None
        result = apply_change(self.step, field, value, self.until)
        self._show_config()
        self.redraw(result)
        return result

    def on_preset(self, name: str) -> ChangeResult | None:
        if self._syncing or name == "custom":
            return None
        result = apply_preset(self.step, name, self.until)
        self._show_config()
        self.redraw(result)
        return result

    def _show_config(self) -> None:
        """Controls and the preset menu show the step's config, without triggering another run."""
        self._syncing = True
        try:
            for field, control in self.controls.items():
                control.value = getattr(self.step.cfg, field)
            self.preset.value = self.step.cfg.preset_name() or "custom"
        finally:
            self._syncing = False

    def stale_figures(self, run: StepRun) -> list[str]:
        return [name for name, (phase, _) in FIGURES.items() if self.drawn.get(name) is not getattr(run, phase)]

    def redraw(self, result: ChangeResult) -> None:
        run = result.run
        self.status.value = (f"re-ran <b>{', '.join(result.rerun) or 'nothing'}</b> in {result.seconds:.2f} s; "
                             + ", ".join(f"{k} = {v:.4g}" for k, v in summary(run).items()))
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


ENGINE_FIELDS = ["logprob_temperature", "kl_estimator", "beta"]  # StepConfig fields: re-run from their phase
INFLUENCE_CHOICES = {"kind": list(VAL_LOSSES), "source": list(VAL_SOURCES), "size": [16, 64, 128],
                     "param_set": list(PARAMETER_SETS), "val_advantages": list(VAL_ADVANTAGES)}


@dataclass(frozen=True)
class InfluenceView:
    label: str
    scores: torch.Tensor
    recomputed: bool  # False: served from the cache (the sign flip never recomputes)
    seconds: float
    kind: str = "seqloss-lastadv"  # the validation loss: scores of one kind share a scale


def _label(cfg, choice: InfluenceChoice) -> str:
    sign = "flipped, " if choice.flip_sign else ""
    source = "same batch" if choice.source == "same_batch" else f"{choice.source} {choice.size}"
    advantages = "" if choice.kind == "seqloss-reward" else f" ({choice.val_advantages.replace('_', ' ')} A)"
    kl = f"{cfg.kl_estimator} beta={cfg.beta:g}" if cfg.beta else "beta=0"
    fixes = "" if cfg.logprob_temperature else ", no T fix"
    return f"{sign}{choice.kind}, {source}{advantages}, {choice.param_set} params, {kl}{fixes}"


class InfluencePanel:
    """Influence histograms side by side: the previous choice next to the current one, same samples."""

    def __init__(self, explorer: InfluenceExplorer, choice: InfluenceChoice = InfluenceChoice()):
        self.explorer, self.choice, self.previous = explorer, choice, None
        step = explorer.step
        self.controls = {"flip_sign": W.Checkbox(value=choice.flip_sign, description="flip_sign (seed 000)")}
        self.controls.update({f: W.Dropdown(options=opts, value=getattr(choice, f), description=f)
                              for f, opts in INFLUENCE_CHOICES.items()})
        self.controls.update({f: make_control(f, getattr(step.cfg, f)) for f in ENGINE_FIELDS})
        self.status = W.HTML()
        self.out = W.Output()
        for field, control in self.controls.items():
            control.observe(lambda change, field=field: self.on_change(field, change["new"]), names="value")
        self.current = self.view()
        self.redraw()

    def view(self) -> InfluenceView:
        start = time.perf_counter()
        cached = self.explorer.is_cached(self.choice)
        scores = self.explorer.scores(self.choice)
        return InfluenceView(_label(self.explorer.step.cfg, self.choice), scores, not cached,
                             time.perf_counter() - start, self.choice.kind)

    def on_change(self, field: str, value) -> InfluenceView:
        if field in ENGINE_FIELDS:
            apply_change(self.explorer.step, field, value, until="loss")
            view = self.view()
        else:
            choice, self.choice = self.choice, replace(self.choice, **{field: value})
            try:
                view = self.view()
            except ValueError as error:  # e.g. topk 128 from a pool of 128: say so, keep the last choice
                self.choice = choice
                self.status.value = f"<b>{error}</b>"
                return self.current
        self.previous, self.current = self.current, view
        self.redraw()
        return self.current

    def redraw(self) -> None:
        v = self.current
        signs = sign_fractions(v.scores)
        self.status.value = (f"{'recomputed' if v.recomputed else 'from cache'} in {v.seconds:.2f} s; "
                             f"fraction > 0 = {signs['> 0']:.2f}, = 0 = {signs['= 0']:.2f} "
                             f"(|score| <= {ZERO_TOLERANCE:g} x max counts as 0), mean = {v.scores.mean():.4g}")
        self.out.clear_output(wait=True)
        with self.out:
            views = [self.previous, v] if self.previous is not None else [v]
            same_scale = len({w.kind for w in views}) == 1
            fig = plots.influence_histograms({w.label: w.scores.numpy() for w in views}, bins=15,
                                             title="influence of the same training samples", sharex=same_scale)
            display(fig)
            plt.close(fig)

    def widget(self) -> W.Widget:
        grid = W.GridBox(list(self.controls.values()), layout=W.Layout(grid_template_columns="repeat(3, 33%)"))
        return W.VBox([grid, self.status, self.out])
