"""TracIn behind the panel: what the influence is measured against (`InfluenceChoice`), the scores of a step's
samples cached per choice (`InfluenceCache`: the sign flip negates cached scores instead of recomputing),
the cache following a GRPOStep's current run (`InfluenceExplorer`), and the panel of histograms
(`InfluencePanel`). The maths is `tracin.influence`."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, replace

import ipywidgets as W
import matplotlib.pyplot as plt
import pandas as pd
import torch
from IPython.display import display

from ..config import PHASES, StepConfig
from ..fast.per_sample import SampleGradients
from ..stats import spearman
from ..tracin.influence import (
    PARAMETER_SETS,
    VAL_ADVANTAGES,
    VAL_LOSSES,
    VAL_SOURCES,
    ZERO_TOLERANCE,
    ValidationSet,
    influence_scores,
    lora_model,
    parameter_set,
    per_sample_train_gradients,
    sign_fractions,
    signs,
    validation_gradient,
    validation_pool,
    validation_set,
)
from ..tracin.specs import specs_of
from . import plots
from .widgets import apply_change, make_control


@dataclass(frozen=True)
class InfluenceChoice:
    """What the influence is measured against; every field is a toggle of notebook 07."""

    kind: str = "seqloss-lastadv"
    source: str = "random"
    size: int = 16
    param_set: str = "all"
    flip_sign: bool = False
    val_advantages: str = "per_group"


def _fields(cfg: StepConfig, phases: tuple[str, ...]) -> tuple:
    return tuple((f.name, getattr(cfg, f.name)) for f in dataclasses.fields(cfg) if cfg.phase_of(f.name) in phases)


def pool_key(cfg: StepConfig) -> tuple:
    """What a validation pool depends on: the rollout, scoring and advantage fields."""
    return _fields(cfg, PHASES[: PHASES.index("advantages") + 1])


def score_key(cfg: StepConfig) -> tuple:
    """What influence scores depend on: the pool's fields and the loss fields; with beta = 0 the KL
    estimator multiplies nothing, so it is left out (changing it recomputes nothing)."""
    fields = _fields(cfg, PHASES[: PHASES.index("loss") + 1])
    return tuple(kv for kv in fields if not (cfg.beta == 0 and kv[0] == "kl_estimator"))


class InfluenceCache:
    """Influence of a step's cached samples under any InfluenceChoice, for a `(model, run)` pair: `model`
    the weights that produced `run` (a StepRun up to the loss). Scores are cached per
    (`score_key(run.config)`, choice without the sign): flipping the sign negates L_val, hence its
    gradient, so it negates cached scores instead of recomputing. One pool per `pool_key` serves every set;
    `validation_run` (`GRPOStep.validation_run`) samples it."""

    def __init__(self, validation_run, pool_size: int = 128):
        self.validation_run, self.pool_size = validation_run, pool_size
        self._scores: dict = {}
        self._train: dict = {}  # (score key, parameter set) -> the batch's factored per-sample gradients
        self._pools: dict = {}
        self._lora = None

    def pool(self, cfg: StepConfig) -> ValidationSet:
        key = pool_key(cfg)
        if key not in self._pools:
            self._pools = {key: validation_pool(self.validation_run(self.pool_size, cfg))}  # one config kept
        return self._pools[key]

    def model_for(self, model, param_set: str):
        """`model` itself, or for 'lora' its LoRA copy (rebuilt when the model is another object)."""
        if param_set != "lora":
            return model
        if self._lora is None or self._lora[0] is not model:
            self._lora = (model, lora_model(model))
        return self._lora[1]

    def _key(self, run, choice: InfluenceChoice) -> tuple:
        return score_key(run.config), dataclasses.replace(choice, flip_sign=False)

    def is_cached(self, run, choice: InfluenceChoice) -> bool:
        return self._key(run, choice) in self._scores

    def validation_set(self, run, choice: InfluenceChoice) -> ValidationSet:
        if choice.source not in VAL_SOURCES or choice.size * (2 if choice.source == "topk" else 1) > self.pool_size:
            raise ValueError(f"{choice.source} {choice.size} needs more than the pool of {self.pool_size}")
        pool = None if choice.source == "same_batch" else self.pool(run.config)
        return validation_set(run, choice.source, choice.size, pool, choice.val_advantages)

    def train_gradients(self, model, run, param_set: str = "all") -> SampleGradients:
        """The batch's factored per-sample gradients (one backward serves every validation set)."""
        train_key = (score_key(run.config), param_set)
        if train_key not in self._train:
            self._train = {k: v for k, v in self._train.items() if k[0] == train_key[0]}  # memory: one config
            scored = self.model_for(model, param_set)
            with parameter_set(scored, param_set):
                self._train[train_key] = per_sample_train_gradients(
                    scored, run.rollout, run.logprobs, run.advantages.values, specs_of(run.config)
                )
        return self._train[train_key]

    def scores(self, model, run, choice: InfluenceChoice) -> torch.Tensor:
        key = self._key(run, choice)
        if key not in self._scores:
            val = self.validation_set(run, choice)
            train = self.train_gradients(model, run, choice.param_set)
            scored = self.model_for(model, choice.param_set)
            with parameter_set(scored, choice.param_set):
                _, val_grad = validation_gradient(scored, val, specs_of(run.config), choice.kind)
            self._scores[key] = influence_scores(train, val_grad)
        return -self._scores[key] if choice.flip_sign else self._scores[key]


class InfluenceExplorer:
    """The notebook- and panel-facing entry (`ui.widgets.InfluencePanel`): an `InfluenceCache` that follows
    a GRPOStep's current run, `(step.policy, step.result)`, so that the panel's engine toggles (which re-run
    the step) show the new run's scores. Pass `cache` to share one cache with a notebook's own calls."""

    def __init__(self, step, pool_size: int = 128, cache: InfluenceCache | None = None):
        self.step = step
        self.cache = cache or InfluenceCache(step.validation_run, pool_size)

    @property
    def pool_size(self) -> int:
        return self.cache.pool_size

    def _current(self):
        self.step.restore_policy()
        return self.step.policy, self.step.result

    def pool(self) -> ValidationSet:
        return self.cache.pool(self.step.result.config)

    def is_cached(self, choice: InfluenceChoice) -> bool:
        return self.cache.is_cached(self.step.result, choice)

    def validation_set(self, choice: InfluenceChoice) -> ValidationSet:
        return self.cache.validation_set(self.step.result, choice)

    def train_gradients(self, param_set: str = "all") -> SampleGradients:
        return self.cache.train_gradients(*self._current(), param_set)

    def scores(self, choice: InfluenceChoice) -> torch.Tensor:
        return self.cache.scores(*self._current(), choice)


ENGINE_FIELDS = ["logprob_temperature", "kl_estimator", "beta"]  # StepConfig fields: re-run from their phase
INFLUENCE_CHOICES = {
    "kind": list(VAL_LOSSES),
    "source": list(VAL_SOURCES),
    "size": [16, 64, 128],
    "param_set": list(PARAMETER_SETS),
    "val_advantages": list(VAL_ADVANTAGES),
}


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
    """Influence histograms side by side, the previous choice next to the current one on the same samples,
    and the paired view: each sample's two scores, the samples whose sign changed marked (`paired`)."""

    def __init__(self, explorer: InfluenceExplorer, choice: InfluenceChoice | None = None):
        choice = choice or InfluenceChoice()
        self.explorer, self.choice, self.previous = explorer, choice, None
        step = explorer.step
        self.controls = {
            "flip_sign": W.Checkbox(value=choice.flip_sign, description="flip_sign (as the TracIn-sign report)")
        }
        self.controls.update(
            {
                f: W.Dropdown(options=opts, value=getattr(choice, f), description=f)
                for f, opts in INFLUENCE_CHOICES.items()
            }
        )
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
        return InfluenceView(
            _label(self.explorer.step.cfg, self.choice),
            scores,
            not cached,
            time.perf_counter() - start,
            self.choice.kind,
        )

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

    def paired(self) -> pd.DataFrame | None:
        """Each training sample's influence under the previous choice and the current one, and whether its
        sign changed (a score within the zero tolerance has no sign); None before the first change."""
        if self.previous is None:
            return None
        before, now = signs(self.previous.scores), signs(self.current.scores)
        return pd.DataFrame(
            {
                "before": self.previous.scores.numpy(),
                "now": self.current.scores.numpy(),
                "sign changed": ((before * now) < 0).numpy(),
            }
        ).rename_axis("sample")

    def redraw(self) -> None:
        v = self.current
        fractions = sign_fractions(v.scores)
        paired = self.paired()
        moved = ""
        if paired is not None:
            moved = (
                f"; against the previous choice: {int(paired['sign changed'].sum())} of {len(paired)} samples changed "
                f"sign, Spearman {spearman(paired['before'], paired['now']):+.2f}"
            )
        self.status.value = (
            f"{'recomputed' if v.recomputed else 'from cache'} in {v.seconds:.2f} s; "
            f"fraction > 0 = {fractions['> 0']:.2f}, = 0 = {fractions['= 0']:.2f} "
            f"(|score| <= {ZERO_TOLERANCE:g} x max counts as 0), mean = {v.scores.mean():.4g}{moved}"
        )
        self.out.clear_output(wait=True)
        with self.out:
            views = [self.previous, v] if self.previous is not None else [v]
            same_scale = len({w.kind for w in views}) == 1
            fig = plots.influence_histograms(
                {w.label: w.scores.numpy() for w in views},
                bins=15,
                title="influence of the same training samples",
                sharex=same_scale,
            )
            display(fig)
            plt.close(fig)
            if paired is not None:  # the paired view: which samples moved, and where
                display(paired.style.apply(lambda row: ["color: red" if row["sign changed"] else ""] * 3, axis=1))

    def widget(self) -> W.Widget:
        grid = W.GridBox(list(self.controls.values()), layout=W.Layout(grid_template_columns="repeat(3, 33%)"))
        return W.VBox([grid, self.status, self.out])
