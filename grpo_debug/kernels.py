"""Same seed, same numbers on every x86 machine: which CPU kernels torch's numbers come from.

torch's own CPU kernels and oneDNN's (bfloat16 matmuls) pick their vector width at their first op: AVX512 where the
CPU has it, and AVX512 rounds differently from AVX2, so outputs stored on one machine would not reproduce on another.
`pin()` asks both for AVX2, which every x86-64 machine here has. It is called where the suite itself runs (the
notebooks' set-up, the command line, the chess scripts; the Makefile and the tests export the same), never on
import: a debugger imported into someone's training must not change the kernels that training runs. Variables
already set are kept.

MKL (torch's float32 matmuls) is not pinned: it picks its own code path (AVX-512 on an Intel CPU that has it,
another on an AMD one), and each rounds the last bits differently. Pinning it (`MKL_CBWR`) would make the notebooks'
runs differ from the user's runs they replay. So the stored notebook outputs hold only the digits every path
computes alike (`digits.py`, `notebooks/sanitize.cfg`), and `make test-kernels` checks them under
`MKL_CBWR=COMPATIBLE` and at 2 threads.
"""

import os

PINNED = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
KERNEL_VARIABLES = (*PINNED, "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "OMP_NUM_THREADS")  # what a capture records


def pin() -> None:
    """Ask torch and oneDNN for AVX2 kernels; takes effect only before torch runs its first op."""
    for name, value in PINNED.items():
        os.environ.setdefault(name, value)


def kernels_in_use() -> dict:
    """The CPU kernels this process's numbers come from: torch's vector width, and the variables that choose it,
    as a capture records them (so that a replay can say when it runs other kernels than the run did)."""
    import torch  # here, not at the top: `pin` must run before torch is imported

    return {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "environment": {name: os.environ.get(name) for name in KERNEL_VARIABLES},
    }
