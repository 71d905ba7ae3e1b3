"""The doctor: why a step does not learn, found, ranked and shown on the step itself.

    report = diagnose(step)   # a GRPOStep: the bundled one, or open_capture(path, task)

One module per part, in the order a diagnosis runs; this file only hands their names on.
1. `facts`: `examine` runs the step up to its update under its own config and measures what the detectors need
   beside it (two train-mode scorings where dropout is on, the mass top_p/top_k kept, the KL the update made,
   the exact KL to the reference, the weights' norm).
2. `detectors` (and `logprob_detectors`): one pure function per pitfall of `pitfalls.PITFALLS`, facts in, a
   `findings.Finding` out, each threshold a constant with where it comes from (`calibration`).
3. `flips`: each present finding whose pitfall has a switch is flipped on this very step (the cached rollout):
   what it does to loss, grad_norm, the update's direction and size, d loss / d logp, the held-out reward.
4. `chain`: the differential. The loud causes are fixed on the step one after another and every detector runs
   again after each fix; what a fix quiets is marked a symptom of that cause.
5. `horizon`: each cause's fix followed over a few steps against the run continued alike, from the same seeds.
6. `report` ranks them (causes first: severity, the fix's gain over steps, the chain's order, how far the flip
   moves the update; each symptom after its cause) and `present` shows the report; `diagnose` runs 1 to 6.
7. `without_model`: the detectors a capture's own tensors answer, without building its model (`--no-model`).
"""

from ..detectors.findings import SEVERITIES, Finding, StepFacts
from .diagnose import diagnose
from .facts import detect, examine, facts_of, held_out_prompts, held_out_side, moved_kl, update_vector, uses_vllm
from .flips import COSMETIC, REMOVES_GRADIENT, counterfactual
from .report import Report, fix_of, rank
from .without_model import WITHOUT_MODEL, diagnose_without_model

__all__ = [
    "COSMETIC",
    "REMOVES_GRADIENT",
    "SEVERITIES",
    "WITHOUT_MODEL",
    "Finding",
    "Report",
    "StepFacts",
    "facts_of",
    "held_out_side",
    "counterfactual",
    "detect",
    "diagnose",
    "diagnose_without_model",
    "examine",
    "fix_of",
    "held_out_prompts",
    "moved_kl",
    "rank",
    "update_vector",
    "uses_vllm",
]
