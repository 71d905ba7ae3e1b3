"""Same seed, same numbers on every x86 machine: which CPU kernels torch's numbers come from.

torch's own CPU kernels and oneDNN's (bfloat16 matmuls) pick their vector width at their first op, and MKL (the
float32 matmuls) picks its code path when it is first called: AVX512 where the CPU has it, and AVX512 rounds
differently from AVX2, so outputs stored on one machine would not reproduce on another. `pin()` asks all three for
AVX2 (every x86-64 machine here has it; MKL's conditional numerical reproducibility mode, `MKL_CBWR`, gives the
same bits on any CPU with AVX2). It is called where the suite itself runs (the notebooks' set-up, the command line,
the Makefile and the tests export the same), never on import: a debugger imported into someone's training must not
change the kernels that training runs. Variables already set are kept.
"""

import os

PINNED = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "AVX2"}


def pin() -> None:
    """Ask torch, oneDNN and MKL for AVX2 kernels; takes effect only before torch runs its first op."""
    for name, value in PINNED.items():
        os.environ.setdefault(name, value)


def in_use() -> dict[str, str | None]:
    """What this process runs: torch's CPU capability and the three variables (None: not set)."""
    import torch

    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), **{k: os.environ.get(k) for k in PINNED}}
