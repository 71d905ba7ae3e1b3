"""grpo-debug: one GRPO step on a RookWorld chess model, taken apart phase by phase."""

from .model import load_model

__all__ = ["load_model"]
