"""The zero-loss notes' questions answered from a step's numbers: is a loss of 0.0000 a failure? where does the time go?
does torch.compile make the scoring faster, and give the same numbers?"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from ..config import StepConfig
from ..logprobs import chunked_logps
from ..loss import KL_ESTIMATORS, per_token_kl
from ..specs import scoring_of
from ..speed import kernels
from ..step import GRPOStep, StepRun


def triage_zero_loss(run: StepRun, tol: float = 1e-6) -> str:
    """Tell "loss ~0, normal" from the failures that also print 0.0000."""
    adv, lp, loss, upd = run.advantages, run.logprobs, run.loss, run.update
    if lp.mask.sum() == 0:
        return "FAILURE: no completion token is scored (empty mask): check the completion mask"
    if adv.frac_reward_zero_std == 1.0:
        return (
            "FAILURE: every group has identical rewards, so every advantage is 0 and there is no signal "
            "(frac_reward_zero_std = 1): make the reward graded, raise the temperature, or drop such groups"
        )
    if adv.rounding_std_groups and len(adv.zero_std_groups) + len(adv.rounding_std_groups) == len(adv.group_std):
        return (
            f"FAILURE: every group has identical rewards, yet frac_reward_zero_std = {adv.frac_reward_zero_std:.2f}: "
            f"in {len(adv.rounding_std_groups)} group(s) float rounding of the mean leaves a std of ~1e-8, which "
            f"TRL's isclose(std, 0) counts as varied, so their advantages (max |A| = "
            f"{adv.max_abs_advantage:.1e}) and the gradient are rounding noise: make the reward graded, raise the "
            f"temperature, or drop such groups"
        )
    if (lp.policy * lp.mask).abs().sum() == 0:
        return "FAILURE: all log-probs are 0: the log-prob computation is broken"
    grad = f"grad_norm = {upd.grad_norm:.3g}" if upd is not None else "run the update to see grad_norm"
    value, loss_type = loss.loss.item(), run.config.loss_type
    at_ratio_one = bool((loss.ratio == 1).all())
    if not at_ratio_one:
        return f"loss = {value:.4g}: off-policy (ratio != 1), the value depends on how far the policy moved"
    if loss_type == "grpo":
        why = (
            "under grpo at ratio 1 the policy term is -mean_i(A_i) over sequences, and advantages centred "
            "per group sum to 0, so the value is ~0 whatever the model does"
        )
    elif loss_type in ("bnpo", "dapo", "dr_grpo", "luspo"):
        why = (
            f"under {loss_type} at ratio 1 the policy term is -sum_i(A_i * T_i) / normaliser (T_i: scored "
            "tokens of sample i): it is 0 only when advantages do not correlate with lengths"
        )
    elif loss_type == "sapo":
        why = (
            "under sapo at ratio 1 each token's term is -2 A / tau, averaged per sequence then over sequences: "
            "~0 for centred advantages, off by the two temperatures' difference"
        )
    elif loss_type in ("cispo", "vespo"):
        why = (
            f"under {loss_type} the policy term is -weight * A * logp per token (the weight detached): its "
            "value is sized by the log-probs, not a sign of learning"
        )
    else:
        why = f"under {loss_type} the value is -A * sum(logp), sized by the log-probs, not a sign of learning"
    verdict = "~0" if abs(value) < tol else "not 0"
    return (
        f"NORMAL: loss = {value:.2e} ({verdict}); {why}. The gradient is what moves the model ({grad}); "
        f"{adv.frac_reward_zero_std:.0%} of groups have zero reward std"
    )


@dataclass
class CompileComparison:
    """Log-prob scoring of the cached rollout's first `rows` samples, eager and under `torch.compile`."""

    rows: int
    backend: str
    eager_first_seconds: float
    eager_seconds: float  # median of the later calls
    compiled_first_seconds: float  # tracing and compiling included (inductor's on-disk cache shortens reruns)
    compiled_seconds: float
    max_abs_diff: float  # max |eager - compiled| log-prob over every completion position: the correctness check
    error: str = ""  # why torch.compile failed on this machine; the compiled fields are then nan

    @property
    def speedup(self) -> float:
        return self.eager_seconds / self.compiled_seconds

    def __str__(self) -> str:
        if self.error:
            return f"torch.compile ({self.backend}) failed here: {self.error}"
        return (
            f"{self.rows} rows scored. eager: first call {self.eager_first_seconds:.2f} s, then "
            f"{self.eager_seconds:.3f} s; compiled ({self.backend}): first call {self.compiled_first_seconds:.1f} s "
            f"(compilation), then {self.compiled_seconds:.3f} s, {self.speedup:.2f}x; "
            f"max |eager - compiled| {self.max_abs_diff:.1e}"
        )


def _timed_calls(score, repeats: int) -> tuple[torch.Tensor, float, float]:
    """The result of the first call, its seconds and the median seconds of `repeats` more calls."""
    start = time.perf_counter()
    logps = score()
    first = time.perf_counter() - start
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        score()
        seconds.append(time.perf_counter() - start)
    return logps, first, statistics.median(seconds)


def inductor_vector_width_as_pinned() -> None:
    """Inductor's C++ at torch's own kernel width: with torch pinned to AVX2 on an AVX512 machine
    (grpo_debug/__init__.py), inductor's default AVX512 code crashed here (an out-of-range index)."""
    import torch._inductor.config

    if torch.backends.cpu.get_cpu_capability() == "AVX2":
        torch._inductor.config.cpp.simdlen = 256


def compile_comparison(step: GRPOStep, rows: int = 8, repeats: int = 3, backend: str = "inductor") -> CompileComparison:
    """Score the step's cached rollout (its first `rows` samples) with the policy as it is and with
    `torch.compile(policy)`, as `step.cfg` says; time both and compare the numbers. The step is not re-run.

    Dropout is off in both (their random masks would differ). Dynamo's in-memory cache is reset first, so
    that the first compiled call pays the compilation; a multiple of 8 rows keeps one compiled shape.
    """
    rollout = step.result.rollout or step.run(until="rollout").rollout
    rollout = rollout.rows(range(min(rows, rollout.num_samples)))
    scoring = scoring_of(step.cfg).without_dropout()
    with torch.no_grad():
        eager, eager_first, eager_seconds = _timed_calls(
            lambda: chunked_logps(step.policy, rollout, scoring, kernels(step.cfg.fast).score)[0], repeats
        )
        torch._dynamo.reset()
        try:
            inductor_vector_width_as_pinned()
            compiled_policy = torch.compile(step.policy, backend=backend)
            compiled, compiled_first, compiled_seconds = _timed_calls(
                lambda: chunked_logps(compiled_policy, rollout, scoring, kernels(step.cfg.fast).score)[0], repeats
            )
        except Exception as exc:  # no C++ compiler, an unsupported op, an unknown backend: a result, not a crash
            nan = float("nan")
            return CompileComparison(
                rollout.num_samples, backend, eager_first, eager_seconds, nan, nan, nan, f"{type(exc).__name__}: {exc}"
            )
    return CompileComparison(
        rollout.num_samples,
        backend,
        eager_first,
        eager_seconds,
        compiled_first,
        compiled_seconds,
        (eager - compiled).abs().max().item(),
    )


NULL_STEP_VARIANTS = {
    "fixed, fast paths": {},
    "fixed, readable paths": {"fast": False},
    "fixed, bfloat16 scoring": {"dtype": "bfloat16"},
    "dropout on": {"dropout": True},
    "trl preset": "trl",
}


ON_POLICY = 1e-3  # |ratio - 1| below this is the fast path's float rounding, not a policy change


def first_pass_ratio_gap(run: StepRun) -> float:
    """max |ratio - 1| over the scored tokens in the first pass of the run's update. Below ON_POLICY that pass
    is on-policy: at mu = 1 TRL takes pi_old = pi.detach(), so the ratio is 1 by construction; at mu >= 2 pi_old
    was scored at generation, so dropout (other masks) or weights a captured generation already moved take it
    off 1, and pass 1 clips too."""
    ratio = run.update.iterations[0].ratio[run.logprobs.mask.bool()]
    return (ratio - 1).abs().max().item() if ratio.numel() else 0.0


def null_step(step: GRPOStep, variants: dict[str, dict | str] | None = None, base: StepConfig | None = None):
    """The same rollout optimised with learning rate 0 and num_iterations = 2: the weights never change, so
    any ratio != 1, clipped token or KL is numerics (or dropout) alone, the floor a real failure must clear.

    One row per variant (a dict of StepConfig changes, or a preset name): for each pass, the largest
    |log ratio| and its standard deviation over the scored tokens, TRL's clip_ratio/region_mean, and the
    k3 estimate of KL(pi_old || pi) between the rollout-time scoring and the pass's own.
    """
    import pandas as pd

    base = base or step.cfg
    base_run = step.run(base, until="advantages")
    rows = {}
    for name, change in (variants or NULL_STEP_VARIANTS).items():
        cfg = base.with_preset(change) if isinstance(change, str) else base.replace(**change)
        cfg = cfg.replace(learning_rate=0.0, num_iterations=2, per_sample_grad_norms=False)
        run = step.run(cfg, until="update", base=base_run, remember=False)
        rows[name] = null_step_row(run)
    return pd.DataFrame.from_dict(rows, orient="index")


def null_step_row(run: StepRun) -> dict[str, float]:
    mask, old = run.logprobs.mask.bool(), run.logprobs.policy
    row = {}
    for i, it in enumerate(run.update.iterations, start=1):
        log_ratio = (it.logps - old)[mask]
        row[f"pass {i}: max |log ratio|"] = log_ratio.abs().max().item()
        row[f"pass {i}: std log ratio"] = log_ratio.std().item()
        row[f"pass {i}: clip_ratio/region_mean"] = it.metrics.get("clip_ratio/region_mean", float("nan"))
        row[f"pass {i}: KL(old || new) k3"] = (torch.exp(log_ratio) - log_ratio - 1).mean().item()
    row["update_norm"] = run.update.update_norm
    return row


def kl_estimator_check(vocab: int = 8, num_samples: int = 200_000, seed: int = 0) -> dict[str, dict[str, float]]:
    """Each estimator's value and autograd gradient against the exact reverse KL(pi || ref) and its gradient.

    A categorical policy pi = softmax(theta) and a fixed reference; samples come from pi (on-policy,
    old = pi detached). The estimator's loss is the sample mean of its per-token KL; its gradient is
    compared with the exact gradient of KL(pi || ref). Relative errors well above the Monte-Carlo noise
    mark a biased gradient: k1 (expected gradient 0) and k3 (the gradient of KL(ref || pi)). Per estimator:
    value, exact_kl, grad_rel_error (|grad - exact| / |exact|), grad_cosine, grad_norm_ratio (|grad| / |exact|)
    and forward_grad_rel_error (the relative error against the exact gradient of the forward KL(ref || pi)).
    """
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(vocab, generator=g).requires_grad_(True)
    ref_logp = torch.log_softmax(torch.randn(vocab, generator=g), 0)
    logp_all = torch.log_softmax(theta, 0)
    exact_kl = (logp_all.exp() * (logp_all - ref_logp)).sum()
    (exact_grad,) = torch.autograd.grad(exact_kl, theta)
    logp_all = torch.log_softmax(theta, 0)  # again: the graph above is freed
    (forward_grad,) = torch.autograd.grad((ref_logp.exp() * (ref_logp - logp_all)).sum(), theta)  # KL(ref || pi)'s
    samples = torch.multinomial(logp_all.detach().exp(), num_samples, replacement=True, generator=g)
    out = {}
    for estimator in KL_ESTIMATORS:
        logp = torch.log_softmax(theta, 0)[samples]
        value = per_token_kl(logp, ref_logp[samples], None, estimator).mean()
        (grad,) = torch.autograd.grad(value, theta)
        out[estimator] = {
            "value": value.item(),
            "exact_kl": exact_kl.item(),
            "grad_rel_error": ((grad - exact_grad).norm() / exact_grad.norm()).item(),
            "grad_cosine": torch.nn.functional.cosine_similarity(grad, exact_grad, 0).item(),
            "grad_norm_ratio": (grad.norm() / exact_grad.norm()).item(),
            "forward_grad_rel_error": ((grad - forward_grad).norm() / forward_grad.norm()).item(),
        }
    return out
