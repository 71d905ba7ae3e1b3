"""The doctor's report: its findings ranked (causes first, each symptom after its cause), the fix that applies to
the run, and the report as strict-JSON-ready data. `present` shows it as text, a table and a page.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from ..choices import grpo_config_changes
from ..detectors.findings import SEVERITIES, Finding
from ..detectors.signal_path import stage_of
from ..pitfalls import PITFALLS
from .chain import order


@dataclass(frozen=True)
class Report:
    findings: tuple[Finding, ...]  # ranked: causes (most severe, then most moving) first, each symptom after its cause
    config: dict
    seconds: float
    uses_vllm: bool = False  # the run sampled with vLLM: vLLM's settings are advice that applies to it
    horizon: dict | None = None  # how the fixes were followed over steps (`horizon`), or why they were not
    not_run: tuple[str, ...] = ()  # detectors not run: they need the model (`doctor --no-model`)
    exhibits: dict | None = None  # the step's numbers the report's figures draw (`exhibits`); None: not measured
    probe: dict | None = None  # the probe reward trained on the run's pipeline (`probe.run_probe`); None: not run
    budget: dict | None = None  # {seconds, phases, cut}: the diagnosis's budget and what it cut (`deadline`)

    def causes(self, at_least: str = "warning") -> list[Finding]:
        """The findings at `at_least` or more severe that are no symptom of another."""
        return [f for f in self.present(at_least) if not f.symptom_of]

    def present(self, at_least: str = "info") -> list[Finding]:
        """The findings at `at_least` or more severe."""
        return [f for f in self.findings if SEVERITIES.index(f.severity) <= SEVERITIES.index(at_least)]

    def to_json(self) -> dict:
        return {
            "findings": [_finding_json(f, self.uses_vllm) for f in self.findings],
            "config": self.config,
            "seconds": self.seconds,
            "uses_vllm": self.uses_vllm,
            "horizon": self.horizon,
            "not_run": list(self.not_run),
            "exhibits": self.exhibits,
            "probe": self.probe,
            "budget": self.budget,
        }


def fix_of(f: Finding, uses_vllm: bool) -> str:
    """The fix shown for a finding: none for a symptom (fix its causes) or an absent one; vLLM's settings only
    for a run that sampled with vLLM; a finding's own where its evidence says which (the signal's stage)."""
    if f.symptom_of or f.severity == "absent":
        return ""
    return f.evidence.get("fix") or PITFALLS[f.id].fix_for(uses_vllm)


def flip_measurable(effect: dict) -> bool:
    """Whether a flip could show on its step: a gradient with it or without it (`flips.counterfactual`'s
    `measurable`; an effect written before that was recorded counts as measurable)."""
    return effect.get("measurable", True)


def applied_fix(f: Finding) -> tuple[tuple[str, object], ...]:
    """The config changes the doctor fixed a finding with, as StepConfig fields: those its horizon followed, else
    those the differential fixed it with, else its flip's switch (not one refused, nor one that takes the gradient
    away, nor one not measurable); () where it applied none."""
    if f.learning and f.learning.get("changes"):
        return tuple(f.learning["changes"].items())
    if f.fixed_with:
        return f.fixed_with
    e = f.effect
    if e and "error" not in e and not e.get("removes_gradient") and flip_measurable(e):
        return tuple(e["toggle"].items())
    return ()


def _python(value) -> str:
    if isinstance(value, float):
        return repr(float(f"{value:.6g}"))  # a scaled rate reads 1e-06, not 1.0000000000000002e-06
    return json.dumps(value) if isinstance(value, str) else repr(value)


def config_fix(f: Finding, uses_vllm: bool) -> str:
    """The fix the doctor applied as the user writes it, `GRPOConfig(..., max_completion_length=64)`; "" where
    it applied none, the finding has no fix of its own (`fix_of`), or the fix is no GRPOConfig setting (a trainer
    class, a reward function: its words say it)."""
    changes = grpo_config_changes(dict(applied_fix(f))) if fix_of(f, uses_vllm) else None
    if not changes:
        return ""
    return "GRPOConfig(..., " + ", ".join(f"{k}={_python(v)}" for k, v in changes.items()) + ")"


def _finding_json(f: Finding, uses_vllm: bool) -> dict:
    p = PITFALLS[f.id]
    return {
        **dataclasses.asdict(f),
        "title": p.title,
        "fix": fix_of(f, uses_vllm),
        "origin": p.origin,
        "teach": p.teach,
        "toggle": None if p.toggle is None else {"field": p.toggle[0], "value": p.toggle[1]},
        "stage": stage_of(f),
    }


def _moves(f: Finding) -> float:
    """How far the finding's flip moves the update (1 - cosine); -1 where it was not flipped, where the flip
    takes the gradient away (it deletes the update rather than correcting it), or where it is not measurable."""
    if not f.effect or "update_cosine" not in f.effect or f.effect.get("removes_gradient"):
        return -1.0
    if not flip_measurable(f.effect):  # no gradient on either side: the cosine of two momenta says nothing
        return -1.0
    return 1 - f.effect["update_cosine"]


def _gain(f: Finding) -> float | None:
    """What the finding's fix did to learning over the horizon (the fixed arm's batch reward minus the run's), where
    its interval excludes 0; None where it was not followed or the difference was not detected (a point estimate
    inside its noise ranks nothing)."""
    if not f.learning or "difference" not in f.learning:
        return None
    d = f.learning["difference"]
    return d["mean"] if d["ci_low"] > 0 or d["ci_high"] < 0 else None


def rank(findings: list[Finding], chained: list[str] = ()) -> tuple[Finding, ...]:
    return order(list(findings), list(chained), _moves, _gain)
