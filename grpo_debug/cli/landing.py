"""`python -m grpo_debug landing STEP_K STEP_K+1`: where the replayed update of captured step k lands against the
weights the trainer captured at step k+1 (`grpo_debug.capture.landing`). Before anything loads, the two folders are
checked, torch-free, to be two consecutive captures of one run, in order; each refusal is one line."""

from __future__ import annotations

import math

from .checks import capture_meta

# what two captures of one run share: the run's GRPOConfig, the model's class and where its weights came from
SAME_RUN = ("grpo_config", "trainer_class", "model_class")


def pair_problem(first: str, second: str) -> str | None:
    """Why `first` and `second` are not steps k and k+1 of one run, in one line; None where they are."""
    a, b = capture_meta(first), capture_meta(second)
    for path, meta in ((first, a), (second, b)):
        if type(meta.get("step")) is not int:  # a bool is no step
            return f"{path} is not a capture: no readable capture.json with its step (CaptureCallback writes step-<k>/)"
    if isinstance(a.get("run"), str) and isinstance(b.get("run"), str) and a["run"] != b["run"]:
        return f"{first} and {second} are not captures of one run: their recorders' run ids differ ({a['run']}, {b['run']})"
    for key in SAME_RUN:
        if a.get(key) != b.get(key):
            return (
                f"{first} and {second} are not captures of one run: their {key} {_difference(a.get(key), b.get(key))}"
            )
    k, later = a["step"], b["step"]
    if later == k:
        return f"{first} and {second} are both step {k}: give step k, then step k+1"
    if later < k:
        return f"wrong order: {first} is step {k}, {second} is step {later}: give the earlier step first"
    if later != k + 1:
        return (
            f"steps {k} and {later} are not consecutive: landing compares step k's replayed update with step k+1's "
            f"weights (capture step {k + 1} too: CaptureCallback(steps=[{k}, {k + 1}]))"
        )
    return None


def _difference(a, b) -> str:
    """What differs between two captures' values, in a few words: the first differing key of two dicts."""
    if isinstance(a, dict) and isinstance(b, dict):
        key = next(k for k in sorted({*a, *b}) if a.get(k) != b.get(k))
        return f"differs at {key}: {a.get(key)!r} and {b.get(key)!r}"
    return f"differs: {a!r} and {b!r}"


def scheduled_rate(meta: dict) -> list[float] | None:
    """The learning rate the trainer's scheduler set for the captured step, one per parameter group (None: the
    capture holds no optimizer)."""
    entry = meta.get("optimizer")
    rates = entry.get("learning_rate") if isinstance(entry, dict) else None
    return list(rates) if isinstance(rates, list) else None


def landing_lines(out: dict, first: str, second: str) -> list[str]:
    """What `landing` prints: the two updates' cosine and norm ratio, the largest weight difference after, exact
    or not, and the rate as scheduled."""
    rate = out["scheduled_learning_rate"]
    rates = "not in the capture" if rate is None else ", ".join(f"{r:.6g}" for r in rate)
    cosine = "no update to compare (one of them did not move)" if math.isnan(out["cosine"]) else f"{out['cosine']:+.6f}"
    exact = "the trainer's, rebuilt exactly" if out["exact"] else "not the trainer's"
    ratio = "-" if math.isnan(out["norm_ratio"]) else f"{out['norm_ratio']:.6f}"
    return [
        f"step {out['step']} of {first} replayed, against step {out['step'] + 1}'s weights ({second})",
        f"  {'update cosine':28s} {cosine}   (ours against the trainer's theta_k+1 - theta_k)",
        f"  {'update norm ratio':28s} {ratio}   (ours / the trainer's {out['trainer_norm']:.6g})",
        f"  {'max |weight difference|':28s} {out['max_abs_difference']:.3g}",
        f"  {'bit-equal':28s} {'yes' if out['bit_equal'] else 'no'}",
        f"  {'learning rate as scheduled':28s} {rates}",
        f"  {'optimizer':28s} {exact}: {out['optimizer']}",
    ]
