"""The KL estimator on the step's own distributions, against the exact KL they estimate.

At every scored position the policy's and the reference's full next-token distributions are known, so
the reverse KL the estimators target is exact there:  KL_t = sum_v pi(v) (log pi(v) - log ref(v)).
Each estimator's *expected* value and gradient at that position are exact too: the sampled token y ~ pi
(the sampling distribution held fixed, as on-policy) gives  E[k(y)] = sum_v sg(pi(v)) k(v).  Comparing the
expected gradient (with respect to the scored logits) with the exact KL's gradient shows the estimator's
bias on this step, free of sampling noise: k1's is 0, k3's points toward KL(ref || pi).
"""

from __future__ import annotations

import torch

from ..loss import per_token_kl

AT_REFERENCE = 1e-9  # a token-mean exact KL below this: the policy is the reference (step 0), nothing to compare


def _sums(
    policy_logps: torch.Tensor, reference_logps: torch.Tensor, chosen: torch.Tensor, mask: torch.Tensor, estimator: str
) -> torch.Tensor:
    """Over some rows: the mask-weighted sums of the exact KL, the estimate on the sampled tokens and its
    expectation, then <g, g_exact>, |g|^2 and |g_exact|^2 of the gradients with respect to the logits."""
    logits = policy_logps.detach().float().requires_grad_(True)  # log-probs are logits of the same softmax
    finite = reference_logps.isfinite() & logits.isfinite()
    logp = torch.where(finite, logits.log_softmax(-1), 0.0)
    ref = torch.where(finite, reference_logps.float(), 0.0)
    p = logp.exp() * finite
    weight = mask.float()
    exact = ((p * (logp - ref)).sum(-1) * weight).sum()
    (exact_grad,) = torch.autograd.grad(exact, logits, retain_graph=True)
    each = per_token_kl(logp, ref, None, estimator)  # (n, C, V): the estimate had v been the sampled token
    expected = ((p.detach() * each).sum(-1) * weight).sum()
    (expected_grad,) = torch.autograd.grad(expected, logits)
    sampled = (each.detach().gather(-1, chosen.unsqueeze(-1)).squeeze(-1) * weight).sum()
    a, b = expected_grad.flatten(), exact_grad.flatten()
    return torch.stack([exact.detach(), sampled, expected.detach(), a @ b, a @ a, b @ b])


def at_reference() -> dict:
    """The comparison where the policy is the reference (step 0): KL 0, its gradient 0, no cosine."""
    nothing = float("nan")
    return dict(
        exact_kl=0.0, estimate_on_sampled_tokens=0.0, expected_estimate=0.0, grad_cosine=nothing, grad_rel_error=nothing
    )


def estimator_against_exact(score_rows, chosen: torch.Tensor, mask: torch.Tensor, estimator: str) -> dict:
    """`score_rows([row])` -> ((1, C, V) policy log-probs, (1, C, V) reference log-probs) of that row, both
    as the trainer scores (tempered); `chosen`: (N, C) sampled tokens; `mask`: (N, C) scored tokens. One
    row at a time, so memory stays at a few (C, V) slabs. Returns the token-mean exact KL, the estimator's
    token mean on the sampled tokens (what TRL logs as kl), its expected value, and the cosine and relative
    error of its expected gradient against the exact KL's (with respect to the logits)."""
    total = torch.zeros(6, dtype=torch.float64, device=mask.device)
    for row in range(chosen.shape[0]):
        rows = slice(row, row + 1)
        policy_logps, reference_logps = score_rows([row])
        total += _sums(policy_logps, reference_logps, chosen[rows], mask[rows], estimator).double()
    exact, sampled, expected, dot, aa, bb = total.tolist()
    tokens = max(mask.sum().item(), 1.0)
    moved = exact / tokens > AT_REFERENCE  # else the policy is the reference here: KL 0, its gradient 0
    no_pull = aa <= 1e-8 * bb  # an expected gradient that is rounding only (k1's, exactly 0 in theory)
    return {
        "exact_kl": exact / tokens,
        "estimate_on_sampled_tokens": sampled / tokens,
        "expected_estimate": expected / tokens,
        "grad_cosine": (0.0 if no_pull else dot / (aa * bb) ** 0.5) if moved else float("nan"),
        "grad_rel_error": (max(aa - 2 * dot + bb, 0.0) / bb) ** 0.5 if moved else float("nan"),
    }
