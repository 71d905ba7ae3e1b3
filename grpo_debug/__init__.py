"""grpo-debug: one GRPO step on a RookWorld chess model, taken apart phase by phase."""

import os

# Same seed, same numbers, on every x86 machine: torch's own CPU kernels, and oneDNN's (bfloat16 matmuls),
# pick their vector width at the first op (AVX512 where the CPU has it), and AVX512 and AVX2 round
# differently, so a notebook executed on one kind of machine would not reproduce on the other. Both are
# pinned to AVX2, which every x86-64 machine here has; set the variables yourself (before torch runs an op)
# to choose otherwise.
os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")
os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")

__all__ = ["load_model"]


def __getattr__(name: str):
    """`grpo_debug.load_model`, imported on first use: `import grpo_debug` (and the command line's argument
    checks) stay free of torch and transformers until a model is needed."""
    if name == "load_model":
        from .model import load_model

        return load_model
    raise AttributeError(f"module 'grpo_debug' has no attribute {name!r}")
