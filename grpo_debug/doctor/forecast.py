"""Whether a fast-growing KL goes on: a growth rate read from a few logged steps is a forecast, and a forecast is
tested by running it. Where kl_blowup is loud from the logged kl's growth alone (the KL itself still below its
warning level), the run is continued as it is from the captured weights and the trainer's optimizer, sampling anew
with the user's reward functions, for as many steps as the forecast spans, and the KL the policy moves decides:

    findings = forecast_tested(step, findings)

Without reward functions for new completions (a capture's stored rewards) the forecast cannot be run, and the
finding is info that says so. One continuation, one seed: `horizon.continue_step` at seed 0.
"""

from __future__ import annotations

import dataclasses
import math

from ..detectors.detectors import KL_BLOWUP_WARNING, KL_GROWTH_STEPS
from ..detectors.findings import LOUD, Finding
from ..step import GRPOStep
from .horizon import continue_step


def grown_only(f: Finding) -> bool:
    """kl_blowup loud from the growth of the logged kl, its level still below the warning."""
    kl = f.evidence.get("kl")
    return (
        f.id == "kl_blowup"
        and f.severity in LOUD
        and "steps_to_problem" in f.evidence
        and kl is not None
        and kl < KL_BLOWUP_WARNING
    )


def forecast_tested(step: GRPOStep, findings: list[Finding]) -> list[Finding]:
    """Each kl_blowup loud from growth alone, continued as the run stands for up to KL_GROWTH_STEPS steps: a warning
    where the policy moved past KL_BLOWUP_WARNING nats per token from the captured weights, else info."""
    out = []
    for f in findings:
        if not grown_only(f):
            out.append(f)
            continue
        if step.stored_rewards:
            said = "; a forecast from the logged kl alone: pass --task to continue the run and measure it"
            out.append(dataclasses.replace(f, severity="info", summary=f.summary + said))
            continue
        steps = max(1, min(KL_GROWTH_STEPS, math.ceil(f.evidence["steps_to_problem"])))
        moved = continue_step(step, {}, steps, 0, end_reward=False).kl_to_start
        evidence = {**f.evidence, "continued_steps": steps, "continued_kl": moved}
        said = f"; continued as it stands for {steps} steps, the policy moved {moved:.3g} nats per token"
        if math.isfinite(moved) and moved < KL_BLOWUP_WARNING:
            said += f", below {KL_BLOWUP_WARNING:g}: the growth did not go on"
            out.append(dataclasses.replace(f, severity="info", summary=f.summary + said, evidence=evidence))
        else:
            out.append(dataclasses.replace(f, summary=f.summary + said, evidence=evidence))
    return out
