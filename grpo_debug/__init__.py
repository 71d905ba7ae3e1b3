"""grpo-debug: one GRPO step on a RookWorld chess model, taken apart phase by phase."""

__all__ = ["load_model"]


def __getattr__(name: str):
    """`grpo_debug.load_model`, imported on first use: `import grpo_debug` (and the command line's argument
    checks) stay free of torch and transformers until a model is needed."""
    if name == "load_model":
        from .model import load_model

        return load_model
    raise AttributeError(f"module 'grpo_debug' has no attribute {name!r}")
