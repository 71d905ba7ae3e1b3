"""Phase 2, log-probs: per-token log-probs of the sampled completions under policy and reference.

How each row is scored is `scoring.Scoring` (the temperature, dropout, position_ids, the dtype, the
gather); here, which tokens count (the completion mask: a value mask cannot tell the EOS from padding when
pad == eos), and the policy and the reference scored over a whole rollout.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from .choices import MASKS
from .rollout import ROWS_PER_PASS, Rollout, row_chunks
from .scoring import Scoring, per_token_logps, per_token_logps_and_entropies


@dataclass(frozen=True)
class TokenLogProbs:
    policy: torch.Tensor  # (N, C) detached: the "old" log-probs of the step; 0 after the EOS unless PAD is scored
    reference: torch.Tensor  # (N, C)
    mask: torch.Tensor  # (N, C) float, 1 on scored completion tokens
    entropies: torch.Tensor  # (N, C) entropy of the policy's next-token distribution (at the scoring temperature)
    sampler_gap: torch.Tensor  # (N, C) |sampler - recomputed policy| on the TRL mask, over the scoring's support
    max_sampler_gap: float
    top_p_gap: float  # max |sampler with top_p - sampler temperature-only|: what no recomputation removes
    eos_kept: float  # fraction of finished completions whose EOS is inside the mask
    seconds: float

    def rows(self, index: torch.Tensor | list[int]) -> TokenLogProbs:
        """The same samples as `Rollout.rows(index)`."""
        index = torch.as_tensor(index).flatten()
        return dataclasses.replace(
            self,
            policy=self.policy[index],
            reference=self.reference[index],
            mask=self.mask[index],
            entropies=self.entropies[index],
            sampler_gap=self.sampler_gap[index],
        )


def completion_mask(rollout: Rollout, mode: str = "keep_first_eos") -> torch.Tensor:
    """(N, C) float: which completion tokens count.

    keep_first_eos    positions up to and including the first EOS, from the lengths (TRL's mask).
    drop_eos_and_pad  positions before the first EOS, and no token equal to the pad id (the critical-fixes report's fix):
                      the EOS is dropped, and with pad == eos a value mask drops every EOS the model
                      produced anyway; the model is never taught to stop.
    all_positions     every position, PAD after the EOS included.
    """
    ids = rollout.completion_ids
    positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
    if mode == "keep_first_eos":
        return (positions < rollout.completion_lengths.unsqueeze(1)).float()
    if mode == "drop_eos_and_pad":
        is_eos = ids == rollout.eos_token_id
        first_eos = torch.where(is_eos.any(1), is_eos.int().argmax(1), ids.shape[1])
        return ((positions < first_eos.unsqueeze(1)) & (ids != rollout.pad_token_id)).float()
    if mode == "all_positions":
        return torch.ones_like(ids, dtype=torch.float)
    raise ValueError(f"mask must be one of {MASKS}, got {mode!r}")


def chunked_logps(
    model, rollout: Rollout, scoring: Scoring, score=per_token_logps_and_entropies
) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, C) log-probs and (N, C) entropies a few rows at a time (no grad), cut along groups so that each
    piece shares its prompt. `score`: the readable scoring or its fast twin (`speed.kernels`)."""
    pieces = [score(model, rollout.rows(rows), scoring) for rows in group_chunks(rollout)]
    return torch.cat([p[0] for p in pieces]), torch.cat([p[1] for p in pieces])


def chunked_token_logps(model, rollout: Rollout, scoring: Scoring, score=per_token_logps) -> torch.Tensor:
    """(N, C) log-probs alone, in `chunked_logps`'s pieces (the same numbers, no entropy computed). `score`:
    `scoring.per_token_logps` or its fast twin (`speed.kernels(...).score_logps`)."""
    return torch.cat([score(model, rollout.rows(rows), scoring) for rows in group_chunks(rollout)])


def group_chunks(rollout: Rollout) -> list[list[int]]:
    """The rows in pieces of ROWS_PER_PASS at most, a group (G rows sharing a prompt) to a piece where G fits."""
    G = rollout.num_generations
    return row_chunks(rollout.num_samples, G if 1 < G <= ROWS_PER_PASS else ROWS_PER_PASS)


def compute_logprobs(
    policy,
    reference,
    rollout: Rollout,
    scoring: Scoring,
    *,
    seed: int = 0,
    reference_is_policy: bool = False,
    scored: TokenLogProbs | None = None,
    score=per_token_logps_and_entropies,
) -> TokenLogProbs:
    """Policy scored as `scoring` says; the reference always in eval mode, as TRL keeps it (no dropout).

    `reference_is_policy=True` (step 0: the reference is a frozen copy of these very weights) reuses the
    policy's log-probs for the reference when dropout is off: the same weights on the same inputs give
    the same numbers, so the second forward is skipped. `scored`: log-probs of this rollout scored the
    same way except for the mask, reused without any forward.
    """
    start = time.perf_counter()
    torch.manual_seed(seed)  # dropout masks, when dropout is on
    with torch.no_grad():
        if scored is not None:
            policy_logps, reference_logps, entropies = scored.policy, scored.reference, scored.entropies
        else:
            policy_logps, entropies = chunked_logps(policy, rollout, scoring, score)
            if reference_is_policy and not scoring.dropout:
                reference_logps = policy_logps.clone()
            else:
                reference_logps = chunked_logps(reference, rollout, scoring.without_dropout(), score)[0]
            kept = completion_mask(rollout, "all_positions" if scoring.score_after_eos else "keep_first_eos")
            policy_logps, reference_logps, entropies = policy_logps * kept, reference_logps * kept, entropies * kept
    mask = completion_mask(rollout, scoring.mask)
    if scoring.mask_truncated_completions:
        mask = mask * rollout.finished.unsqueeze(1).float()
    trl_mask = completion_mask(rollout, "keep_first_eos")
    # the sampler's log-probs over the support the scoring uses: renormalised over what top_p/top_k kept, or not
    sampler = rollout.sampler_logps if scoring.support == "sampler_support" else rollout.sampler_logps_temperature_only
    gap = (sampler - policy_logps).abs() * trl_mask
    top_p_gap = ((rollout.sampler_logps - rollout.sampler_logps_temperature_only).abs() * trl_mask).max()
    eos_positions = (rollout.completion_lengths - 1).unsqueeze(1)
    eos_in_mask = mask.gather(1, eos_positions).squeeze(1)[rollout.finished]
    return TokenLogProbs(
        policy=policy_logps,
        reference=reference_logps,
        mask=mask,
        entropies=entropies,
        sampler_gap=gap,
        max_sampler_gap=gap.max().item(),
        top_p_gap=top_p_gap.item(),
        eos_kept=eos_in_mask.mean().item() if len(eos_in_mask) else float("nan"),
        seconds=time.perf_counter() - start,
    )
