"""The TRL side: capture a real `GRPOTrainer` step (`CaptureCallback`), read a capture back (`reading`),
replay TRL's own loop on it (`replay`, `trl_step`), run TRL's trainer from a StepConfig (`trl_bridge`).

`from grpo_debug.capture import CaptureCallback` imports the callback on first use: reading a capture (what
the core step does) loads neither TRL nor the callback."""

__all__ = ["CaptureCallback"]


def __getattr__(name: str):
    if name == "CaptureCallback":
        from .callback import CaptureCallback

        return CaptureCallback
    raise AttributeError(f"module 'grpo_debug.capture' has no attribute {name!r}")
