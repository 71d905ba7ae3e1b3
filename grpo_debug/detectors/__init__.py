"""The detectors: one pure function per pitfall, from a step's facts (`StepFacts`) to a `Finding`, and the probes
that call a run's reward functions on changed completions. A layer below the wings that use it: the capture's
health line (`capture.health`, each recorded step) and the doctor (`doctor`, which measures the facts, flips each
finding's toggle and ranks them) both read it; it reads neither.
"""

from .detectors import DETECTORS
from .findings import LOUD, SEVERITIES, Finding, StepFacts
from .probes import RewardProbe, probe_rewards

__all__ = ["DETECTORS", "LOUD", "SEVERITIES", "Finding", "RewardProbe", "StepFacts", "probe_rewards"]
