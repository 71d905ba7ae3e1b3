"""The TRL side: capture a real `GRPOTrainer` step (`CaptureCallback`), record the health of every step and
capture the ones that go wrong (`FlightRecorder`), read a capture back (`reading`) and open it as a step
(`open_capture`), replay TRL's own loop on it (`replay`, `trl_step`), run TRL's trainer from a StepConfig
(`trl_bridge`).

`from grpo_debug.capture import CaptureCallback` (or `FlightRecorder`, `open_capture`) imports it on first use:
reading a capture (what the core step does) loads neither TRL nor the callbacks."""

__all__ = ["CaptureCallback", "FlightRecorder", "open_capture"]


def __getattr__(name: str):
    if name == "CaptureCallback":
        from .callback import CaptureCallback

        return CaptureCallback
    if name == "FlightRecorder":
        from .flight import FlightRecorder

        return FlightRecorder
    if name == "open_capture":
        from .opening import open_capture

        return open_capture
    raise AttributeError(f"module 'grpo_debug.capture' has no attribute {name!r}")
