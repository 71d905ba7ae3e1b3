"""Speed, decided in one place: which function does each piece of the work. The phase modules take these
functions as arguments and default to their readable versions; `kernels(fast)` hands the fast twins
(`grpo_debug/fast/`), each tested equal to its readable function in tests/test_fast_paths.py.

  generate     G samples of each prompt          rollout.generate_repeated   fast.decode.decode_per_prompt (a GPT-2;
                                                                              else fast.shared_prompt.generate_per_prompt)
  score        per-token log-probs, entropies    scoring.per_token_logps_and_entropies  fast.scoring.*_fast
  score_update the update's, no per-sample norms  scoring.per_token_logps_and_entropies  fast.scoring.*_per_group
  score_logps  per-token log-probs only          scoring.per_token_logps     fast.scoring.per_token_logps_fast
  norms        each sample's gradient norm      update.OneBackwardPerSample fast.backward.HookedNorms
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from .rollout import generate_repeated
from .scoring import per_token_logps, per_token_logps_and_entropies
from .update import OneBackwardPerSample, SampleNorms


@dataclass(frozen=True)
class Kernels:
    generate: Callable
    score: Callable
    score_update: Callable  # the update's scoring where no per-sample gradient norm is taken
    score_logps: Callable
    norms: SampleNorms


READABLE = Kernels(
    generate_repeated,
    per_token_logps_and_entropies,
    per_token_logps_and_entropies,
    per_token_logps,
    OneBackwardPerSample(),
)


@functools.cache
def fast_kernels() -> Kernels:
    """The fast twins, imported on first use: a step with every fast path off never loads `grpo_debug.fast`."""
    from .fast.backward import HookedNorms
    from .fast.decode import decode_per_prompt
    from .fast.scoring import (
        per_token_logps_and_entropies_fast,
        per_token_logps_and_entropies_per_group,
        per_token_logps_fast,
    )

    return Kernels(
        decode_per_prompt,
        per_token_logps_and_entropies_fast,
        per_token_logps_and_entropies_per_group,
        per_token_logps_fast,
        HookedNorms(),
    )


def kernels(fast: bool) -> Kernels:
    return fast_kernels() if fast else READABLE


def sampling_kernels(fast: bool, dropout: bool) -> Kernels:
    """Sampling with dropout on takes the readable `generate`: a prompt computed once for its G samples would
    share one dropout mask among them."""
    return kernels(fast and not dropout)
