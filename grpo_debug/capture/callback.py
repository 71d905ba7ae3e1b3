"""Capture optimizer steps of a real TRL `GRPOTrainer` run, to open them here phase by phase.

    trainer.add_callback(CaptureCallback("captures", steps=[2]))
    trainer.train()                     # writes captures/step-2/ (`FlightRecorder`, flight.py: every step watched)

Step k is the k-th optimizer step (TRL's `global_step`). Every requested step is written, whatever
`logging_steps`, `num_iterations`, `steps_per_generation` and `gradient_accumulation_steps` are, with the
policy's weights before step k (a generation batch may feed several optimizer steps); the generation batch
step k trains on, in generation order (ids, the trainer's `old_`, `ref_` and `sampling_per_token_logps`
where it computed them, each reward function's rewards and weight, the advantages); which rows made each
micro-batch (TRL shuffles them) and which pass it is; the random state each training forward started from
(so that a replay draws the trainer's own dropout masks); the log-probs the loss took
(`trainer_per_token_logps`); step k's own metrics (`step_metrics`, averaged as TRL's log averages them with
logging_steps=1) and what TRL logged at step k (`logged`); the `GRPOConfig` and what the trainer resolved
from it (`resolved`). A requested step that cannot be written (it spans two generation batches, training
ended first) gets one warning naming it and the reason.

A callback is handed the model, not the trainer. So at `on_train_begin` the callback finds the
`GRPOTrainer` whose `train()` is running: it is the nearest caller frame whose `self` is one. It then wraps
that trainer's methods (`CaptureCallback.attach(trainer)` does the same explicitly). In a multi-process run
(torchrun, accelerate launch) each process's share of the batch is gathered in process order and only the main
process writes; each process's own schedule is gathered too (capture.json's `schedule.ranks`: its
micro-batches as rows of the gathered batch, their pass, its loss per micro-batch, the widths of its own
generation batch; batch.pt's `rng_states` (P, M, S): its random state at each of its M training forwards), so
that the replay takes each process's micro-batches as that process took them.

Whatever of ours fails (a full disk, a read-only folder, a bug anywhere in the callback or the wrappers) stops at
the callback's edge: the run goes on with its own numbers, one warning names the step and the cause; an error of
the run's own (a reward function of the user's that raises) goes on as it was raised, recorded first (`crash.py`).
This module is what is recorded at each of TRL's events; the folder a step is written to is `writing.py`'s, a
step's numbers `course.py`'s, the rows' bookkeeping `rows.py`'s.
"""

from __future__ import annotations

import functools
import sys
import time
import uuid
import warnings
from pathlib import Path

import torch
from transformers import TrainerCallback

from . import folder_lock, optimizer_state
from .columns import dataset_columns
from .course import logged_fields, metric_marks, new_metrics, new_record, remember_step, step_metrics
from .crash import record_crash, without_frame
from .lora import is_adapter_model, no_base_reason
from .rows import micro_batch_rows, own_share, rows_in_generation_order, scored_in_generation_order, steps_fed
from .trainer_state import TENSORS, find_trainer, gathered, gathered_batch_tensor, layout, policy_model
from .writing import MAX_WEIGHT_BYTES, could_be_folder, kept_weights, remove_partials, write_capture

WRAPPED = (  # the trainer's methods whose arguments and results a capture keeps
    "_generate_and_score_completions",
    "_prepare_inputs",
    "_get_per_token_logps_and_entropies",
    "training_step",
    "_get_grad_norm",
)


def at_the_edge(event):
    """A callback event of ours, guarded: whatever it raises never reaches the trainer. Inside a step it fails that
    step (warned once, when the step closes); outside one it is warned at once (each cause once). Nothing runs
    while the callback is off (its trainer could not be found or wrapped)."""

    @functools.wraps(event)
    def guarded(self, args, state, control, **kwargs):
        if self.off is not None:
            return None
        try:
            event(self, args, state, control, **kwargs)
        except Exception as e:
            reason = f"{event.__name__} failed ({type(e).__name__}: {e})"
            if self.current is not None:
                self.current.setdefault("failed", reason)
            else:
                self._say_once(reason)
        return None

    return guarded


class CaptureCallback(TrainerCallback):
    """Write one capture folder per optimizer step in `steps` under `out_dir` (`step-<k>/`).

    Which steps it records and which it writes are three methods, `_records`, `_keeps` and `_trigger`, so that
    `FlightRecorder` (which records every step and writes the ones that trigger) is this class with those three
    changed, not a copy of it."""

    def __init__(
        self,
        out_dir: str | Path,
        steps: list[int],
        max_weight_bytes: int = MAX_WEIGHT_BYTES,
        optimizer_state: bool = True,
    ):
        if not steps or any(not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in steps):
            raise ValueError(f"steps must be a list of optimizer steps >= 1, got {steps!r}")
        self._setup(out_dir, max_weight_bytes, optimizer_state)
        self.steps = sorted(set(steps))

    def _setup(self, out_dir: str | Path, max_weight_bytes: int, optimizer_state: bool = True) -> None:
        """`optimizer_state`: write the trainer's optimizer (its state, groups and scheduled learning rate) with
        each capture, so that a replay's update is the trainer's (`optimizer_state.py`); False: not written, and
        a replay's update starts from a fresh AdamW and says so."""
        if not isinstance(optimizer_state, bool):
            raise ValueError(f"optimizer_state must be True or False, got {optimizer_state!r}")
        if str(out_dir) == "" or not could_be_folder(Path(out_dir)):
            raise ValueError(f"out_dir {str(out_dir)!r} is not a folder: captures are folders inside it")
        self.out_dir, self.max_weight_bytes, self.steps = Path(out_dir), max_weight_bytes, []
        self.optimizer_state = optimizer_state
        self.trainer = None
        self.generation: dict | None = None  # the latest generation batch that feeds a wanted step
        self.current: dict | None = None  # the step being captured
        self.marks: dict[str, tuple[int, int]] = {}  # the trainer's metric lists at the step's start (`metric_marks`)
        self.written: dict[int, Path] = {}
        self.skipped: dict[int, str] = {}
        self.course: list[dict] = []  # every step's own numbers (`remember_step`), whatever logging_steps is
        self.open_step: dict | None = None  # a step that ended, closed once TRL logged it (its log goes in whole)
        self.off: str | None = None  # why nothing is recorded in this run (no trainer found, or not wrapped)
        self.warned: set[int] = set()  # steps already warned about: one warning per step
        self.said: set[str] = set()  # warnings outside any step, each given once
        self.seconds = 0.0  # time spent capturing, for the overhead benchmark
        self.crash: BaseException | None = None  # the user's error already recorded (each wrapper it passes sees it)
        self.run_id = uuid.uuid4().hex  # written in every capture: `landing` pairs two captures of one run by it
        self.lock = folder_lock.lock_for(self, remove_partials)  # one run per folder (FolderInUse where a live run
        # holds it); a killed run's half-written captures removed once it is ours

    def close(self) -> None:
        """Let go of out_dir (its lock, `folder_lock`): done at train end and after a crash; a train() after it
        takes the folder again."""
        if self.lock is not None:
            self.lock.release()

    # ---- wrapping the trainer

    def attach(self, trainer) -> None:
        """Wrap the trainer's methods whose arguments and results a capture keeps: each wrapper calls the trainer's
        own method as it is, then ours, whose failures never reach the trainer (`_timed`)."""
        if self.trainer is trainer:
            return
        originals = {name: getattr(trainer, name) for name in WRAPPED}  # all found before any is replaced
        self.trainer = trainer
        keep = {
            "_generate_and_score_completions": self._kept_generation,
            "_prepare_inputs": self._kept_micro_batch,
            "_get_per_token_logps_and_entropies": self._kept_scores,
            "training_step": self._kept_loss,
            "_get_grad_norm": self._kept_grad_norm,
        }
        for name, original in originals.items():
            setattr(trainer, name, self._then(original, keep[name]))
        self._model().register_forward_pre_hook(self._random_state)

    def _then(self, original, keep):
        """`original` (the trainer's method) called as it is, then `keep(result, *its arguments)` (ours), guarded.
        What `original` raises (a reward function of the user's that fails) is the run's: recorded, then raised on
        as it is, the same object, with this frame taken out of its traceback (`_let_through`)."""

        def wrapped(*args, **kwargs):
            try:
                out = original(*args, **kwargs)  # the trainer's own method: what it raises is the run's, let through
            except BaseException as e:
                self._let_through(e, sys._getframe())
                raise  # a bare raise adds no frame of ours: the traceback runs from the user's call to their code
            if self.off is None:
                self._timed(keep, out, *args, **kwargs)
            return out

        return wrapped

    def _let_through(self, error: BaseException, frame) -> None:
        """The run's own error passing a wrapper of ours: the first wrapper it reaches records it (an `Exception`,
        not an interrupt) and notes where the user's code raised it; every wrapper takes its own frame out of the
        traceback, so that the frames the user reads are the trainer's and theirs. Whatever of this fails is
        dropped: nothing of ours may replace the user's error."""
        try:
            error.__traceback__ = without_frame(error.__traceback__, frame)
        except Exception:
            pass
        try:
            if isinstance(error, Exception) and self.off is None and error is not self.crash:
                self.crash = error
                start = time.perf_counter()
                record_crash(error, self.trainer, self.out_dir, self.generation)
                self.seconds += time.perf_counter() - start
        except Exception:  # a bug of ours while recording: the user's error goes on as it is
            pass
        self.close()  # the run's train() ends with this error: the folder is let go (never raises)

    def _kept_generation(self, output: dict, *args, **kwargs) -> None:
        if self.trainer.model.training:
            self._on_generation(output, args[0] if args else kwargs.get("inputs"))

    def _kept_micro_batch(self, inputs: dict, *args, **kwargs) -> None:
        """The micro-batch TRL just prepared (TRL counts `_step` up after training_step: it is this one's)."""
        if self.current is not None and self.trainer.model.training:
            self._on_micro_batch(inputs, self.trainer._step)

    def _kept_scores(self, out, model, input_ids, *args, **kwargs) -> None:
        """The log-probs of the loss's forward (the policy's, with gradients) of the step being recorded."""
        t = self.trainer
        if self.current is not None and torch.is_grad_enabled() and t.accelerator.unwrap_model(model) is self._model():
            self._keep_scored(input_ids, out[0])

    def _kept_loss(self, loss, *args, **kwargs) -> None:
        if self.current is not None:
            self._keep_loss(loss)

    def _kept_grad_norm(self, norm, *args, **kwargs) -> None:
        if self.current is not None:
            self.current["grad_norm"] = float(norm.item() if isinstance(norm, torch.Tensor) else norm)

    def _timed(self, fn, *args, **kwargs):
        """One of our recording steps, timed; a failure of ours never reaches the trainer (`_failed`)."""
        start = time.perf_counter()
        try:
            fn(*args, **kwargs)
        except Exception as e:  # a bug of ours, or a batch we did not foresee: the run goes on without the capture
            self._failed(f"recording it failed in {getattr(fn, '__name__', fn)} ({type(e).__name__}: {e})")
        self.seconds += time.perf_counter() - start

    def _failed(self, reason: str) -> None:
        """What this callback was doing failed: the step being recorded is not written, with the reason, warned once
        when the step ends (`_say`); outside a step, the generation batch kept for the next ones is dropped and the
        reason warned at once (each reason once). Training is not touched. The step's collective parts still run
        (every process takes them together), only its write is dropped."""
        if self.current is not None:
            self.current.setdefault("failed", reason)
        else:
            self.generation = None
            self._say_once(f"{reason}; the generation batch kept for the next steps is dropped")

    def _say_once(self, text: str) -> None:
        """A warning outside any step, given once however often its cause comes back."""
        if text not in self.said:
            self.said.add(text)
            warnings.warn(f"{type(self).__name__}: {text}; training goes on", stacklevel=3)

    def _say(self, capture: dict, problems: list[str]) -> None:
        """The one warning of a step that failed: why it was not captured (or was recorded in part), then
        `problems` (what else of it was not written); nothing for a step that went well."""
        step = capture["step"]
        head = []
        if step in self.skipped and step not in self.written:
            head = [f"was not captured: {self.skipped[step]}"]
        elif capture.get("failed"):
            head = [f"was recorded in part: {capture['failed']}"]
        if (head or problems) and step not in self.warned:
            self.warned.add(step)
            warnings.warn(f"{type(self).__name__}: step {step} {'; '.join(head + problems)}; training goes on",
                          stacklevel=3)  # fmt: skip

    def _keep_scored(self, input_ids: torch.Tensor, logps: torch.Tensor) -> None:
        self.current["scored"].append((input_ids.detach().cpu(), logps.detach().float().cpu()))

    def _keep_loss(self, loss: torch.Tensor) -> None:
        self.current["losses"].append(float(loss.detach().float().item()))

    def _random_state(self, module, args):
        """Forward pre-hook: the random state a training forward of the captured step starts from (its dropout)."""
        if self.off is None and self.current is not None and module.training and torch.is_grad_enabled():
            self._timed(self._keep_random_state)

    def _keep_random_state(self) -> None:
        self.current["rng"].append(torch.get_rng_state())

    def _model(self):
        return policy_model(self.trainer)

    # ---- which steps are recorded and written (what FlightRecorder changes)

    def _records(self, step: int) -> bool:
        """Record step `step` as it trains (its micro-batches, random states, scored log-probs, losses)?"""
        return step in self.steps and step not in self.written and step not in self.skipped

    def _keeps(self, fed_steps: list[int]) -> bool:
        """Keep a generation batch whose micro-batches train these optimizer steps?"""
        return any(k in self.steps and k not in self.written for k in fed_steps)

    def _trigger(self, capture: dict) -> list[dict] | None:
        """Called before the optimizer steps, with every number of the step known: None, do not write this
        recorded step; else why it is written ([] here: it was asked for), which goes to capture.json's
        `trigger`. The weights are copied only when it is written: they are still those of before the step."""
        return []

    def _after_step(self, capture: dict, state) -> list[str]:
        """After the optimizer stepped and the step was written or skipped: what of it was not written, for its
        warning (nothing here)."""
        return []

    def _captured(self, step: int, path: Path, capture: dict) -> None:
        """Step `step` was just written to `path` (nothing more here)."""

    # ---- callback events, each at the edge: nothing of ours reaches the trainer (`at_the_edge`)

    def on_train_begin(self, args, state, control, **kwargs):
        """The trainer whose train() runs, found and wrapped; where it cannot be, this run records nothing, warned."""
        self.crash = None  # a train() called again after a crash records its own
        self.off = self.off or folder_lock.taken_again(self)
        if self.trainer is not None or self.off is not None:
            return
        try:
            trainer = find_trainer()
            if trainer is None:
                self.off = "it found no GRPOTrainer running train() (call callback.attach(trainer) before train())"
            else:
                self.attach(trainer)
        except Exception as e:  # a trainer of another shape (a TRL that renamed a method): the run goes on
            self.off = f"the trainer could not be wrapped ({type(e).__name__}: {e})"
        if self.off is not None:
            self._say_once(f"nothing is recorded in this run: {self.off}")

    @at_the_edge
    def on_step_begin(self, args, state, control, **kwargs):
        self._close(state)  # a step TRL did not log after all
        step = state.global_step + 1
        self.current = new_record(step)  # what fails from here on fails this step
        if not self._records(step):
            self.current = None
        self.marks = metric_marks(self.trainer._metrics["train"])

    @at_the_edge
    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        """Every number of the step is known (TRL computed grad_norm) and the weights are still those of before
        it: decide whether to write it, and copy the weights only then."""
        capture = self.current
        if capture is None:
            return
        start = time.perf_counter()
        try:
            self._before_optimizer_step(capture)
        except Exception as e:  # a bug of ours: the step is not written, the run goes on
            capture["trigger"] = None
            self._failed(f"recording it failed before the optimizer step ({type(e).__name__}: {e})")
            self.skipped.setdefault(capture["step"], capture["failed"])
        self.seconds += time.perf_counter() - start

    def _before_optimizer_step(self, capture: dict) -> None:
        capture["step_metrics"] = self._step_metrics(capture)  # collective: every process gathers
        trigger = self._trigger(capture)
        if trigger is not None:
            reason = capture.get("failed") or self._cannot_write(capture["step"])
            if reason:
                self.skipped[capture["step"]], trigger = reason, None
            else:
                capture["weights"] = kept_weights(self._model(), self.max_weight_bytes)
                if self.optimizer_state and self.trainer.is_world_process_zero() and self.trainer.optimizer is not None:
                    capture["optimizer"] = optimizer_state.snapshot(self.trainer, self._model())
        capture["trigger"] = trigger

    @at_the_edge
    def on_step_end(self, args, state, control, **kwargs):
        """The step stays open while TRL logs it right after (`control.should_log`): it is closed with that log
        (`on_log`), so that a capture is renamed into place once, whole, TRL's log in it; else closed now."""
        self.course = remember_step(self.course, state.global_step, self._new_metrics())
        capture, self.current = self.current, None
        if capture is None:
            return
        self.open_step = capture
        if not control.should_log:
            self._close(state)

    @at_the_edge
    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.open_step is not None and self.open_step["step"] == state.global_step and logs and "loss" in logs:
            self._close(state, logs)

    def _close(self, state, logs: dict | None = None) -> None:
        """The step that ended: written where it triggered (with `logs`, TRL's log of it, where TRL logged it), what
        follows it (`_after_step`), then its one warning if any of it failed."""
        capture, self.open_step = self.open_step, None
        if capture is None:
            return
        start = time.perf_counter()
        try:
            if capture["trigger"] is not None:
                self._capture(capture, state, logs)
            problems = self._after_step(capture, state)
        except Exception as e:  # a bug of ours: the run goes on
            problems = [f"failed once it ended ({type(e).__name__}: {e})"]
        self._say(capture, problems)
        self.seconds += time.perf_counter() - start

    def _cannot_write(self, step: int) -> str | None:
        """Why the step cannot be written (known before the optimizer steps), or None."""
        generation = self.generation
        if generation is None or step not in generation["fed_steps"]:
            return "no generation batch was kept for it"
        if step in generation["spanning"]:
            return (
                "it spans two generation batches (gradient_accumulation_steps is not a multiple "
                "of steps_per_generation x num_iterations)"
            )
        return no_base_reason(self._model()) if is_adapter_model(self._model()) else None

    def _capture(self, capture: dict, state, logs: dict | None) -> None:
        step = capture["step"]
        try:
            capture["trainer_logps"] = self._trainer_logps(capture)  # collective: every process gathers
            capture["ranks"] = self._ranks(capture)  # collective too: every process's own schedule
            capture["run"] = self.run_id
            if state.is_world_process_zero:
                logged = logged_fields(step, logs, state, self.course)
                self.written[step] = write_capture(
                    self.out_dir, self.trainer, step, capture, self.generation, logged, self.max_weight_bytes
                )
            else:
                self.written[step] = self.out_dir / f"step-{step}"
        except Exception as e:  # a full disk, a bad folder, a bug of ours: the run goes on, without this capture
            self.skipped[step] = f"writing it failed ({type(e).__name__}: {e})"
            return
        self._captured(step, self.written[step], capture)

    @folder_lock.let_go_after
    @at_the_edge
    def on_train_end(self, args, state, control, **kwargs):
        """The last step closed; each requested step not captured and not yet warned about, named."""
        self._close(state)
        for step in self.steps:
            if step not in self.written and step not in self.skipped:
                self.skipped[step] = f"training ended at step {state.global_step}"
        for step, reason in sorted(self.skipped.items()):
            if step not in self.warned:
                self.warned.add(step)
                warnings.warn(f"{type(self).__name__}: step {step} was not captured: {reason}", stacklevel=2)

    # ---- what is kept

    def _on_generation(self, output: dict, inputs: list | None = None) -> None:
        """Keep the generation batch if it feeds a wanted step: the optimizer steps its micro-batches belong to.
        `inputs`: TRL's dataset rows of the batch, whose columns it passes to the reward functions."""
        t = self.trainer
        S, mu, GA = layout(t)
        first = t.state.global_step + 1
        done_in_step = t._step % GA  # micro-batches of the current step already taken (0 unless a step spans)
        fed, spanning = steps_fed(first, done_in_step, S, mu, GA)
        if not self._keeps(fed):
            return
        tensors = {
            k: gathered_batch_tensor(t, k, output[k]) for k in TENSORS if isinstance(output.get(k), torch.Tensor)
        }
        n = len(tensors["completion_ids"])
        rewards = {name: list(t._logs["rewards"][name])[-n:] for name in t.reward_func_names}
        weights_of = t.reward_weights.tolist() if isinstance(t.reward_weights, torch.Tensor) else list(t.reward_weights)
        local = {k: output[k].detach().cpu() for k in ("prompt_ids", "completion_ids", "advantages")}
        columns, dropped = dataset_columns(t, inputs, n)
        self.generation = {
            "tensors": tensors,
            "prompts": list(t._logs["prompt"])[-n:],
            "completions": list(t._logs["completion"])[-n:],
            "rewards": rewards,
            "reward_weights": dict(zip(t.reward_func_names, weights_of)),
            "columns": columns,
            "columns_dropped": dropped,
            "advantages": list(t._logs["advantages"])[-n:],
            "processes": t.accelerator.num_processes,
            "local": local,
            "first_step": first,
            "first_micro_batch": t._step - done_in_step,
            "fed_steps": set(fed),
            "spanning": spanning,
        }

    def _on_micro_batch(self, inputs: dict, micro: int) -> None:
        """Which rows of the generation batch (local to this process) this micro-batch holds, in its order."""
        if not self.generation or self.generation["local"] is None:
            return
        S = layout(self.trainer)[0]
        index = micro - self.generation["first_micro_batch"]
        picked = micro_batch_rows(self.generation, inputs, index // S)
        self.current["micro_batches"].append({"rows": picked, "index": index % S, "pass": index // S})

    def _step_metrics(self, capture: dict) -> dict:
        """Step k's own numbers, as TRL logs them with logging_steps=1 (`course.step_metrics`; collective)."""
        return step_metrics(self.trainer, capture, self._new_metrics())

    def _new_metrics(self) -> dict[str, list]:
        """Each metric's values TRL appended since the step began."""
        return new_metrics(self.trainer._metrics["train"], self.marks)

    def _trainer_logps(self, capture: dict) -> torch.Tensor:
        """(N, C) the log-probs the loss of the step took, row by row in generation order (NaN: not trained on).
        Each process matches the rows its loss scored to its own share of the batch; then the shares are gathered."""
        scored = scored_in_generation_order(self.generation["local"], capture["scored"])
        return gathered(self.trainer, scored, pad_index=float("nan"))

    def _ranks(self, capture: dict) -> list[dict] | None:
        """Each process's own share of the step, in process order (None in a one-process run): its micro-batches
        (rows of the gathered generation batch), its losses, the random state of each of its training forwards
        and the widths of its own generation batch. Every process calls it: the shares are gathered."""
        if self.trainer.accelerator.num_processes == 1:
            return None
        from accelerate.utils import gather_object

        return rows_in_generation_order(gather_object([own_share(capture, self.generation["local"])]))
