"""The flight recorder's health in the trackers the run already reports to (`report_to`): each step's findings and
the recorder's own numbers under `grpo_debug/`, at the trainer's step, and a step that triggers (a finding turning
loud, a grad_norm spike, a reward drop) as an alert where the tracker has one, else a text entry.

    tensorboard  the trainer's own writer (its run in TensorBoard), else an event file of its own in
                 OUTPUT_DIR/runs/grpo_debug: scalars, and the alert as text under grpo_debug/alert
    wandb        the run the trainer opened (`wandb.run`): scalars with train/global_step beside them, as the
                 trainer logs its own, and `wandb.alert` (which a run in offline mode keeps with it)
    mlflow       the run the trainer opened (`mlflow.active_run()`): metrics at the step, the alert as a text
                 artifact grpo_debug/alert-step-K.txt
    trackio      the run the trainer opened: metrics at the step, and `trackio.alert`

Nothing is logged where `report_to` is none, or to a tracker whose run the trainer did not open. A tracker that
fails (a full disk, a closed run) is switched off with one warning; the run and the other trackers go on. The
trainer's own metrics are not touched: what is logged here is logged beside them, under its own names.
"""

from __future__ import annotations

import os
import warnings

PREFIX = "grpo_debug/"
LEVELS = {"ok": 0.0, "info": 0.0, "warning": 1.0, "problem": 2.0}
OWN_METRICS = ("update/relative_norm", "grad_norm/running_median")  # the recorder's, beside TRL's own
OWN_SUFFIXES = ("/length_correlation", "/length_p")
SUPPORTED = ("tensorboard", "wandb", "mlflow", "trackio")


def health_scalars(line: dict) -> dict[str, float]:
    """A health line's numbers under PREFIX: each finding's level (0 ok, 1 warning, 2 problem) and value, and the
    recorder's own metrics (TRL logs its own under its names already); None and non-numbers left out."""
    out = {}
    for name, finding in (line.get("findings") or {}).items():
        out[f"{PREFIX}findings/{name}"] = LEVELS.get(finding.get("severity"), 0.0)
        if _number(finding.get("value")):
            out[f"{PREFIX}values/{name}"] = float(finding["value"])
    for name, value in (line.get("metrics") or {}).items():
        if (name in OWN_METRICS or name.endswith(OWN_SUFFIXES)) and _number(value):
            out[f"{PREFIX}{name}"] = float(value)
    out[f"{PREFIX}triggered"] = float(bool(line.get("trigger")))
    return out


def alert_of(line: dict) -> tuple[str, str] | None:
    """(title, text) where the step triggered: what fired, and where it was captured or why not; else None."""
    reasons = line.get("trigger") or []
    if not reasons:
        return None
    where = f"captured in {line['capture']}" if line.get("capture") else f"not captured: {line.get('not_captured')}"
    said = "; ".join(_reason(r) for r in reasons)
    return f"grpo_debug: step {line['step']} triggered", f"step {line['step']}: {said} ({where})"


def _reason(reason) -> str:
    """One trigger as a line: a finding's `id (severity): summary`, or what else fired, as written."""
    if isinstance(reason, dict) and "id" in reason:
        return f"{reason['id']} ({reason.get('severity')}): {reason.get('summary', '')}"
    return str(reason)


def _number(value) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and value == value
        and abs(value) != float("inf")
    )


class TensorBoard:
    """The trainer's own writer where its TensorBoardCallback opened one (`writer`), else one of ours in
    OUTPUT_DIR/runs/grpo_debug, opened at the first line and closed at the end."""

    name = "tensorboard"

    def __init__(self, output_dir: str, writer=None):
        self.folder, self.writer, self.ours = os.path.join(output_dir, "runs", "grpo_debug"), writer, writer is None

    def active(self) -> bool:
        return True

    def log(self, scalars: dict[str, float], step: int) -> None:
        if self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=self.folder)
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def alert(self, title: str, text: str, step: int) -> None:
        self.writer.add_text(f"{PREFIX}alert", f"**{title}**: {text}", step)
        self.writer.flush()

    def close(self) -> None:
        if self.ours and self.writer is not None:
            self.writer.close()


class Wandb:
    name = "wandb"

    def active(self) -> bool:
        import wandb

        return wandb.run is not None

    def log(self, scalars: dict[str, float], step: int) -> None:
        import wandb

        wandb.log({**scalars, "train/global_step": step})

    def alert(self, title: str, text: str, step: int) -> None:
        import wandb

        wandb.alert(title=title, text=text, level=wandb.AlertLevel.WARN)

    def close(self) -> None:
        pass


class MLflow:
    name = "mlflow"

    def active(self) -> bool:
        import mlflow

        return mlflow.active_run() is not None

    def log(self, scalars: dict[str, float], step: int) -> None:
        import mlflow

        mlflow.log_metrics(scalars, step=step)

    def alert(self, title: str, text: str, step: int) -> None:
        import mlflow

        mlflow.log_text(f"{title}\n{text}\n", f"grpo_debug/alert-step-{step}.txt")

    def close(self) -> None:
        pass


class Trackio:
    name = "trackio"

    def active(self) -> bool:
        from trackio import context_vars

        return context_vars.current_run.get() is not None

    def log(self, scalars: dict[str, float], step: int) -> None:
        import trackio

        trackio.log(scalars, step=step)

    def alert(self, title: str, text: str, step: int) -> None:
        import trackio

        trackio.alert(title=title, text=text, level=trackio.AlertLevel.WARN)

    def close(self) -> None:
        pass


def trackers_for(trainer) -> list:
    """The trackers of the trainer's `report_to` (a list, "all" or "none") this module logs to, whose library is
    installed; others are left alone. TensorBoard writes through the trainer's own writer where it has one."""
    import importlib.util

    report_to, output_dir = trainer.args.report_to, trainer.args.output_dir
    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    if "all" in names:
        names = list(SUPPORTED)
    writer = next((getattr(c, "tb_writer", None) for c in trainer.callback_handler.callbacks
                   if type(c).__name__ == "TensorBoardCallback"), None)  # fmt: skip
    made = {
        "tensorboard": lambda: TensorBoard(output_dir, writer),
        "wandb": Wandb,
        "mlflow": MLflow,
        "trackio": Trackio,
    }
    return [made[n]() for n in names if n in made and importlib.util.find_spec(n) is not None]


class TrackerLog:
    """Health lines logged to each tracker (`trackers_for`); a tracker that raises is switched off, one warning."""

    def __init__(self, trackers: list):
        self.trackers = list(trackers)

    def log_line(self, line: dict, step: int) -> None:
        scalars, alert = health_scalars(line), alert_of(line)
        for tracker in list(self.trackers):
            try:
                if not tracker.active():
                    continue
                tracker.log(scalars, step)
                if alert:
                    tracker.alert(*alert, step)
            except Exception as e:  # a tracker of the user's that fails: theirs to see, never the run's end
                self.trackers.remove(tracker)
                warnings.warn(
                    f"FlightRecorder: stopped logging health to {tracker.name} ({type(e).__name__}: {e}); "
                    "the run and health.jsonl go on",
                    stacklevel=2,
                )

    def close(self) -> None:
        for tracker in self.trackers:
            try:
                tracker.close()
            except Exception:  # closing our own writer: nothing of the run's depends on it
                pass
