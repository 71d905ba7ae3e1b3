"""Capture optimizer steps of a real TRL `GRPOTrainer` run, to open them here phase by phase.

    trainer.add_callback(CaptureCallback("captures", steps=[2]))
    trainer.train()                     # writes captures/step-2/

(`FlightRecorder`, in `flight.py`, is this class recording every step and writing the ones that go wrong.)

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

A capture is a folder holding `README.md`, `capture.json` (the config, texts, rewards, metrics), `batch.pt`
(the tensors), `policy/` (weights and tokenizer, `save_pretrained`), `optimizer.safetensors` (the trainer's
optimizer state before the step, `optimizer_state.py`) and `checksums.json` (the SHA-256 of every other file, which
reading the capture verifies first). It is written into a hidden folder beside its place, TRL's log of the step
in it where TRL logs the step, and renamed into place when whole, checksums last; nothing in it changes after, so
no reader, even after a kill, sees a capture.json its checksums do not match. Whatever of ours fails (a full disk,
a read-only folder, a bug anywhere in the callback or the wrappers) stops at the callback's edge: the run goes on
with its own numbers, one warning names the step and the cause. The reference model (TRL has one
when beta != 0) is named, not copied: TRL loads it frozen from the policy's own name, recorded here as an
absolute path where it is a local folder.
"""

from __future__ import annotations

import functools
import json
import linecache
import math
import os
import reprlib
import shutil
import sys
import sysconfig
import time
import traceback
import warnings
from pathlib import Path

import torch
from transformers import TrainerCallback

from ..files import write_text_atomically
from ..kernels import kernels_in_use
from . import folder_lock, optimizer_state
from .checksums import write_checksums
from .lora import adapter_state, is_adapter_model, no_base_reason, tensor_bytes, write_adapter
from .trainer_state import (
    FORMAT,
    HISTORY_KEYS,
    LOGGED_KL_STEPS,
    README,
    TENSORS,
    find_trainer,
    gathered,
    gathered_batch_tensor,
    jsonable,
    logged_history,
    logged_kl,
    resolved_name,
    resolved_settings,
)
from .trl_bridge import PositionIdsGRPOTrainer
from .trl_step import mean_like_trl_log

MAX_WEIGHT_BYTES = 2 * 1024**3
HEALTH_FILE = "health.jsonl"
CRASH_FILE = "crash.json"
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
        self.marks: dict[
            str, tuple[int, int]
        ] = {}  # identities and lengths of the trainer's metric lists at the step's start
        self.written: dict[int, Path] = {}
        self.skipped: dict[int, str] = {}
        self.course: list[dict] = []  # every step's own numbers (`remember_step`), whatever logging_steps is
        self.open_step: dict | None = None  # a step that ended, closed once TRL logged it (its log goes in whole)
        self.off: str | None = None  # why nothing is recorded in this run (no trainer found, or not wrapped)
        self.warned: set[int] = set()  # steps already warned about: one warning per step
        self.said: set[str] = set()  # warnings outside any step, each given once
        self.seconds = 0.0  # time spent capturing, for the overhead benchmark
        self.crash: BaseException | None = None  # the user's error already recorded (each wrapper it passes sees it)
        self.lock = folder_lock.lock_for(self)  # one run per folder: FolderInUse where a live run holds it

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
                self._record_crash(error)
                self.seconds += time.perf_counter() - start
        except Exception:  # a bug of ours while recording: the user's error goes on as it is
            pass
        self.close()  # the run's train() ends with this error: the folder is let go (never raises)

    def _record_crash(self, error: Exception) -> None:
        """The crash, on disk before the error goes on (the main process writes): `out_dir/crash-step-<k>/` with
        the failing batch and where the user's code raised it, and a health line saying so; then a note on the
        error naming the user's function and the folder. A write that fails (a full disk, a read-only folder) is
        said in the note, never raised."""
        t = self.trainer
        step = t.state.global_step + 1
        entries = traceback_entries(error.__traceback__)
        record = crash_record(error, entries, step, list(getattr(t, "reward_func_names", [])))
        if record["prompts"] is None:  # raised after the rewards (the loss, the optimizer): the step's batch
            record.update(self._kept_batch(step))
        folder, problems = None, []
        if t.is_world_process_zero():
            try:
                folder = write_crash(self.out_dir, record, error)
            except Exception as e:
                problems.append(f"the crash folder was not written ({type(e).__name__}: {e})")
            try:
                append_line(self.out_dir / HEALTH_FILE, crash_line(record, folder, problems))
            except Exception as e:
                problems.append(f"no health line was written ({type(e).__name__}: {e})")
        error.add_note(crash_note(record, folder, problems))

    def _kept_batch(self, step: int) -> dict:
        """The prompts and completions of the generation batch kept for `step`, where one was."""
        g = self.generation
        if g is None or step not in g["fed_steps"]:
            return {}
        return {"prompts": jsonable(g["prompts"]), "completions": jsonable(g["completions"]),
                "batch_from": "the generation batch this step trains on"}  # fmt: skip

    def _kept_generation(self, output: dict, *args, **kwargs) -> None:
        if self.trainer.model.training:
            self._on_generation(output)

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
        return self.trainer.accelerator.unwrap_model(self.trainer.model)

    def _layout(self) -> tuple[int, int, int]:
        t = self.trainer
        return t.args.steps_per_generation, t.num_iterations, t.current_gradient_accumulation_steps

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
        self.marks = {k: (id(v), len(v)) for k, v in self.trainer._metrics["train"].items()}

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
                capture["weights"] = self._weights()
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
            if state.is_world_process_zero:
                logged = logged_fields(step, logs, state, self.course)
                self.written[step] = self._write(step, capture, self.generation, logged)
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

    def _on_generation(self, output: dict) -> None:
        """Keep the generation batch if it feeds a wanted step: the optimizer steps its micro-batches belong to."""
        S, mu, GA = self._layout()
        t = self.trainer
        first = t.state.global_step + 1
        done_in_step = t._step % GA  # micro-batches of the current step already taken (0 unless a step spans)
        micro = [done_in_step + i for i in range(S * mu)]
        fed = sorted({first + m // GA for m in micro})
        spanning = set()
        if done_in_step:
            spanning.add(first)
        if (done_in_step + S * mu) % GA:
            spanning.add(fed[-1])
        if not self._keeps(fed):
            return
        tensors = {
            k: gathered_batch_tensor(t, k, output[k]) for k in TENSORS if isinstance(output.get(k), torch.Tensor)
        }
        n = len(tensors["completion_ids"])
        rewards = {name: list(t._logs["rewards"][name])[-n:] for name in t.reward_func_names}
        weights_of = t.reward_weights.tolist() if isinstance(t.reward_weights, torch.Tensor) else list(t.reward_weights)
        local = {k: output[k].detach().cpu() for k in ("prompt_ids", "completion_ids", "advantages")}
        self.generation = {
            "tensors": tensors,
            "prompts": list(t._logs["prompt"])[-n:],
            "completions": list(t._logs["completion"])[-n:],
            "rewards": rewards,
            "reward_weights": dict(zip(t.reward_func_names, weights_of)),
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
        S, mu, GA = self._layout()
        local = self.generation["local"] if self.generation else None
        if local is None:
            return
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1).detach().cpu()
        advantages = inputs["advantages"].detach().cpu()
        if "row_index" not in self.generation:  # built once per generation batch: a dict look-up per row
            rows = torch.cat([local["prompt_ids"], local["completion_ids"]], 1)
            self.generation["row_index"] = _row_index(rows, local["advantages"])
        index = micro - self.generation["first_micro_batch"]
        # identical rows take the generation's copies in order, across the micro-batches of a pass: a copy
        # taken by an earlier micro-batch is not taken again
        where, picked = self.generation["row_index"], []
        taken = self.generation.setdefault("taken", {}).setdefault(index // S, {})
        for key in _row_keys(ids, advantages):
            n = taken.get(key, 0)
            if n >= len(where.get(key, ())):
                raise RuntimeError("CaptureCallback: a micro-batch row is not in the kept generation batch")
            taken[key] = n + 1
            picked.append(where[key][n])
        self.current["micro_batches"].append({"rows": picked, "index": index % S, "pass": index // S})

    def _weights(self) -> dict[str, torch.Tensor] | None:
        model = self._model()
        if is_adapter_model(model):  # a LoRA run (`peft_config`): the adapter alone, the base named (`lora.py`)
            weights = adapter_state(model)
            return weights if tensor_bytes(weights) <= self.max_weight_bytes else None
        size = sum(p.numel() * p.element_size() for p in model.parameters())
        if size > self.max_weight_bytes:
            return None
        return _copied(model.state_dict())

    def _step_metrics(self, capture: dict) -> dict:
        """Step k's own numbers, as TRL logs them with logging_steps=1: the loss (the micro-batches' sum, the
        mean over processes), grad_norm, and each metric TRL appended during the step, averaged."""
        t = self.trainer
        out = {key: mean_like_trl_log([float(v) for v in new]) for key, new in self._new_metrics().items()}
        loss = torch.tensor([float(sum(capture["losses"]))], device=t.accelerator.device)
        out["loss"] = t.accelerator.gather(loss).mean().item()
        if capture["grad_norm"] is not None:
            out["grad_norm"] = capture["grad_norm"]
        return out

    def _new_metrics(self) -> dict[str, list]:
        """Each metric's values TRL appended since the step began."""
        out = {}
        for key, values in self.trainer._metrics["train"].items():
            same, length = self.marks.get(key, (id(values), 0))
            new = values[length:] if same == id(values) else values  # TRL replaces num_tokens' list
            if new:
                out[key] = new
        return out

    def _trainer_logps(self, capture: dict) -> torch.Tensor:
        """(N, C) the log-probs the loss of the step took, row by row in generation order (NaN: not trained on).
        Each process matches the rows its loss scored to its own share of the batch; then the shares are gathered."""
        local = self.generation["local"]
        rows = torch.cat([local["prompt_ids"], local["completion_ids"]], dim=1)
        out = torch.full(local["completion_ids"].shape, float("nan"))
        free = list(range(len(rows)))
        for ids, logps in capture["scored"]:
            for row_ids, row_logps in zip(ids, logps):
                match = next((j for j in free if torch.equal(rows[j], row_ids)), None)
                if match is not None:  # identical rows (same prompt and completion) are interchangeable
                    free.remove(match)
                    out[match] = row_logps
        return gathered(self.trainer, out, pad_index=float("nan"))

    def _ranks(self, capture: dict) -> list[dict] | None:
        """Each process's own share of the step, in process order (None in a one-process run): its micro-batches
        (rows of the gathered generation batch), its losses, the random state of each of its training forwards
        and the widths of its own generation batch. Every process calls it: the shares are gathered."""
        t = self.trainer
        if t.accelerator.num_processes == 1:
            return None
        from accelerate.utils import gather_object

        local = self.generation["local"]
        mine = {
            "micro_batches": capture["micro_batches"],
            "losses": capture["losses"],
            "rng": capture["rng"],
            "generation_rows": len(local["completion_ids"]),
            "prompt_width": int(local["prompt_ids"].shape[1]),
            "completion_width": int(local["completion_ids"].shape[1]),
        }
        return rows_in_generation_order(gather_object([mine]))

    def _write(self, step: int, capture: dict, generation: dict, logged: dict) -> Path:
        """out_dir/step-<k>: written whole into a hidden folder beside it, then renamed into place; a disk without
        room for it is refused before anything is written (OSError)."""
        final = self.out_dir / f"step-{step}"
        self._check_room(capture, generation)
        path = self.out_dir / f".step-{step}.partial"  # renamed to `final` once whole: no reader sees half of it
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        try:
            self._write_into(path, final, step, capture, generation, logged)
            replace_folder(path, final)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        return final

    def _check_room(self, capture: dict, generation: dict) -> None:
        """Refuse (OSError) a capture the disk has no room for: its weights, optimizer state and batch, and 10%."""
        weights = capture["weights"] or {}
        expected = sum(t.numel() * t.element_size() for t in weights.values())
        if capture.get("optimizer") is not None:
            expected += capture["optimizer"][0]["bytes"]
        expected += sum(t.numel() * t.element_size() for t in generation["tensors"].values())
        self.out_dir.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.out_dir).free
        if free < 1.1 * expected:
            raise OSError(
                f"{free / 1e6:.0f} MB free in {self.out_dir}, the capture needs about {expected / 1e6:.0f} MB"
            )

    def _write_into(self, path: Path, final: Path, step: int, capture: dict, generation: dict, logged: dict) -> None:
        """Every file of the capture in `path` (the folder it will be renamed to: `final`), checksums last."""
        import trl

        t = self.trainer
        tensors = dict(generation["tensors"])
        tensors["trainer_per_token_logps"] = capture["trainer_logps"]
        states = random_states(capture["rng"], capture["ranks"])
        if states is not None:
            tensors["rng_states"] = states
        torch.save(tensors, path / "batch.pt")
        policy, note = self._write_policy(path, step, capture["weights"])
        meta = {**self._meta(step, capture, generation, policy, trl.__version__), **logged}
        optimizer = capture.get("optimizer")
        if optimizer is not None:
            optimizer_state.write(path, optimizer[1])
            meta["optimizer"] = jsonable(optimizer[0])
        write_text_atomically(path / "capture.json", json.dumps(meta, indent=1))
        write_text_atomically(
            path / "README.md",
            README.format(
                step=step,
                trl_version=trl.__version__,
                trainer_class=type(t).__name__,
                when=time.strftime("%Y-%m-%d %H:%M:%S"),
                num_generations=t.args.num_generations,
                tensors=", ".join(f"`{k}` {tuple(v.shape)}" for k, v in tensors.items()),
                policy_note=note,
                path=final.resolve(),
                reference=meta["reference"]["name_or_path"] or "none (beta = 0)",
                optimizer_note=optimizer_note(meta.get("optimizer")),
            )
            + trigger_note(capture["trigger"]),
        )
        write_checksums(path)  # last: every file the capture wrote, which reading it verifies first

    def _write_policy(self, path: Path, step: int, weights: dict | None) -> tuple[dict, str]:
        """The policy's weights and tokenizer in `path/policy` (or where to reload them, past max_weight_bytes):
        capture.json's `policy` entry and the README's note."""
        t, model = self.trainer, self._model()
        name = resolved_name(model.config._name_or_path)
        if weights is not None and is_adapter_model(model):
            return write_adapter(model, t.processing_class, path / "policy", weights, step)
        if weights is not None:
            model.save_pretrained(path / "policy", state_dict=weights)
            t.processing_class.save_pretrained(path / "policy")
            note = f"the policy's weights before optimizer step {step}, and its tokenizer (`save_pretrained`)."
            return {"folder": "policy", "name_or_path": name}, note
        output_dir = str(Path(t.args.output_dir).resolve())
        note = (
            f"not written: the weights are larger than {self.max_weight_bytes} bytes. Reload the "
            f"checkpoint of step {step - 1} from `{t.args.output_dir}`."
        )
        return {"folder": None, "name_or_path": name, "checkpoint_step": step - 1, "output_dir": output_dir}, note

    def _meta(self, step: int, capture: dict, generation: dict, policy: dict, trl_version: str) -> dict:
        """capture.json: the trainer, its config and settings, the batch's texts and rewards, the schedule."""
        t, model = self.trainer, self._model()
        reference = getattr(t, "ref_model", None)
        if reference is None and t.beta != 0 and is_adapter_model(model):
            reference = model.get_base_model()  # TRL's reference: the model with its adapter disabled, the base
        S, mu, GA = self._layout()
        schedule = {
            "micro_batches": capture["micro_batches"],
            "steps_per_generation": S,
            "num_iterations": mu,
            "gradient_accumulation_steps": GA,
            "generation_first_step": generation["first_step"],
            "forwards": len(capture["rng"]),
        }
        if capture["ranks"] is not None:  # several processes: each one's own schedule, in process order
            del schedule["micro_batches"], schedule["forwards"]
            schedule["ranks"] = [{k: v for k, v in rank.items() if k != "rng"} for rank in capture["ranks"]]
        return {
            "format": FORMAT,
            "step": step,
            "trl_version": trl_version,
            "trainer_class": type(t).__name__,
            "model_class": type(model).__name__,
            "position_ids": isinstance(t, PositionIdsGRPOTrainer),
            "policy": policy,
            "reference": {
                "beta": t.beta,  # TRL loads it frozen from the same name as the policy
                "name_or_path": resolved_name(reference.config._name_or_path) if reference is not None else None,
            },
            "grpo_config": jsonable(t.args.to_dict()),
            "resolved": jsonable(resolved_settings(t)),
            "prompts": jsonable(generation["prompts"]),
            "completions": jsonable(generation["completions"]),
            "rewards": jsonable(generation["rewards"]),
            "reward_weights": generation["reward_weights"],
            "advantages": jsonable(generation["advantages"]),
            "processes": generation["processes"],
            "schedule": schedule,
            "step_metrics": jsonable(capture["step_metrics"]),
            "trigger": jsonable(capture["trigger"]) or None,  # why FlightRecorder wrote it; None: it was asked for
            "kernels": kernels_in_use(),
        }


def could_be_folder(path: Path) -> bool:
    """`path` is a folder, or could be made one: the nearest part of it that exists is a folder (not a file)."""
    existing = next((p for p in (path, *path.absolute().parents) if p.exists()), None)
    return existing is None or existing.is_dir()


# ---- a crash of the run: what the user's code raised, where, on which batch

SHOWN = reprlib.Repr()  # a local's value in a crash record: short, whatever its size
SHOWN.maxstring = SHOWN.maxother = 200
MAX_LOCALS = 30
NOT_THE_USERS = ("site-packages", "dist-packages")  # folders of installed packages, wherever they are


def without_frame(tb, frame):
    """`tb` without its first entry where that entry is `frame`: a wrapper of ours the error passed on its way
    out. A bare `raise` in that frame adds no entry back, so the user never reads a frame of ours."""
    return tb.tb_next if tb is not None and tb.tb_frame is frame else tb


def traceback_entries(tb) -> list[tuple]:
    """(frame, line) of each entry of `tb`, outermost first (where the error was raised: last)."""
    out = []
    while tb is not None:
        out.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    return out


def library_folders() -> tuple[str, ...]:
    """Where code that is not the user's lives: Python's own library, the installed packages, this package."""
    paths = sysconfig.get_paths()
    folders = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    folders.add(str(Path(__file__).resolve().parents[1]))
    return tuple(os.path.realpath(f) + os.sep for f in folders)


def is_users_file(filename: str, libraries: tuple[str, ...]) -> bool:
    """A file of the user's: not Python's, not an installed package's, not ours. Code with no file (`exec`, a
    notebook cell) is the user's; Python's frozen modules are not."""
    if filename.startswith("<"):
        return not filename.startswith("<frozen")
    real = os.path.realpath(filename)
    return not real.startswith(libraries) and not any(part in NOT_THE_USERS for part in Path(real).parts)


def frame_fields(frame, line: int) -> dict:
    """A traceback entry as the user reads it: file, line, function and the line's code."""
    code = frame.f_code
    return {"file": code.co_filename, "line": line, "function": code.co_name,
            "code": linecache.getline(code.co_filename, line).strip() or None}  # fmt: skip


def shown_locals(frame) -> dict[str, str]:
    """The frame's local variables, each shortened (`SHOWN`): the row a reward failed on is often one of them."""
    out = {}
    for name, value in list(frame.f_locals.items())[:MAX_LOCALS]:
        try:
            out[name] = SHOWN.repr(value)
        except Exception as e:  # a __repr__ of the user's that fails
            out[name] = f"<repr failed: {type(e).__name__}>"
    return out


def reward_function_in(entries: list[tuple], names: list[str]) -> str | None:
    """The reward function TRL was calling when the error came: TRL's loop names it (`reward_func_name`, or
    `func_name` for an async one)."""
    for frame, _ in reversed(entries):
        for key in ("reward_func_name", "func_name"):
            name = frame.f_locals.get(key)
            if isinstance(name, str) and name in names:
                return name
    return None


def batch_in_frames(entries: list[tuple]) -> dict:
    """The prompts and completions the failing call was handed (the innermost frame holding both as lists of one
    length: the reward function, or TRL's `_calculate_rewards`), and the dataset's other columns TRL passed with
    them (`reward_kwargs`' lists of that length)."""
    for frame, _ in reversed(entries):
        prompts, completions = frame.f_locals.get("prompts"), frame.f_locals.get("completions")
        if isinstance(prompts, list) and isinstance(completions, list) and len(prompts) == len(completions):
            n = len(prompts)
            kwargs = next((f.f_locals["reward_kwargs"] for f, _ in reversed(entries)
                           if isinstance(f.f_locals.get("reward_kwargs"), dict)), {})  # fmt: skip
            columns = {k: v for k, v in kwargs.items() if isinstance(v, list) and len(v) == n}
            return {"prompts": jsonable(prompts), "completions": jsonable(completions), "columns": jsonable(columns),
                    "batch_from": f"the call to {frame.f_code.co_name} that raised"}  # fmt: skip
    return {}


def said(error: BaseException) -> str:
    """The error's message (str), or what kept it from being read."""
    try:
        return str(error)
    except Exception as e:
        return f"<its message could not be read: {type(e).__name__}>"


def crash_record(error: Exception, entries: list[tuple], step: int, reward_names: list[str]) -> dict:
    """crash.json: the error (type, message), the user's frame it was raised in or under (`frame`: file, line,
    function, code, locals; None where no frame is the user's), the frame that raised it (`raised_at`), the
    reward function TRL was calling, and the batch it was called on."""
    libraries = library_folders()
    users = [entry for entry in entries if is_users_file(entry[0].f_code.co_filename, libraries)]
    frame = {**frame_fields(*users[-1]), "locals": shown_locals(users[-1][0])} if users else None
    batch = batch_in_frames(entries)
    return {
        "step": step,
        "time": time.time(),
        "exception": {"type": type(error).__name__, "module": type(error).__module__, "message": said(error)},
        "frame": frame,
        "raised_at": frame_fields(*entries[-1]) if entries else None,
        "reward_function": reward_function_in(entries, reward_names),
        "prompts": batch.get("prompts"),
        "completions": batch.get("completions"),
        "columns": batch.get("columns", {}),
        "batch_from": batch.get("batch_from"),
    }


def write_crash(out_dir: Path, record: dict, error: BaseException) -> Path:
    """out_dir/crash-step-<k>/: crash.json (`crash_record`) and traceback.txt (the frames from the trainer's
    method down, as the user reads them), written whole into a hidden folder and renamed into place."""
    final = out_dir / f"crash-step-{record['step']}"
    partial = out_dir / f".{final.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        write_text_atomically(partial / CRASH_FILE, json.dumps(jsonable(record), indent=1))
        write_text_atomically(partial / "traceback.txt", "".join(traceback.format_exception(error)))
        replace_folder(partial, final)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return final


def crash_line(record: dict, folder: Path | None, problems: list[str]) -> dict:
    """The health line of the step the run crashed on: `crashed` says what was raised, in which reward function,
    where, and the folder holding the batch; `failed`, what of ours could not be written."""
    where = record["frame"] or record["raised_at"] or {}
    line = {"step": record["step"], "time": record["time"], "metrics": {}, "findings": {}, "trigger": [],
            "capture": None}  # fmt: skip
    line["crashed"] = {
        **record["exception"],
        "reward_function": record["reward_function"],
        **{k: where.get(k) for k in ("file", "line", "function")},
        "folder": folder.name if folder is not None else None,
    }
    if problems:
        line["failed"] = "; ".join(problems)
    return jsonable(line)


def crash_note(record: dict, folder: Path | None, problems: list[str]) -> str:
    """The note under the user's error: whose code raised it (their reward function, by name, where TRL was
    calling one), where, on which step; that we let it through; where the batch is kept."""
    where = record["frame"] or record["raised_at"]
    at = f"{where['file']}, line {where['line']}, in {where['function']}" if where else "no frame"
    name, step = record["reward_function"], record["step"]
    if name and record["frame"]:
        head = f"grpo_debug: this error is in your reward function {name!r} ({at}), which TRL called on step {step}"
    elif name:
        head = (
            f"grpo_debug: TRL raised this error on what your reward function {name!r} returned ({at}), on step {step}"
        )
    elif record["frame"]:
        head = f"grpo_debug: this error is in your code ({at}), which the trainer ran on step {step}"
    else:
        head = f"grpo_debug: the trainer raised this error on step {step} ({at})"
    kept = f"; the failing batch is in {folder}{os.sep}{CRASH_FILE}" if folder is not None else ""
    return f"{head}. grpo_debug let it through as it was raised{kept}" + "".join(f"; {p}" for p in problems)


def append_line(path: Path, record: dict) -> None:
    """One JSON line appended and on disk before this returns: a run killed after it keeps the line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record, allow_nan=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def new_record(step: int) -> dict:
    """What a step being recorded collects as it trains."""
    return {"step": step, "weights": None, "trigger": None, "micro_batches": [], "rng": [], "scored": [],
            "losses": [], "grad_norm": None}  # fmt: skip


def remember_step(course: list[dict], step: int, new: dict[str, list]) -> list[dict]:
    """`course` with step `step`'s own numbers added: this process's mean of each of HISTORY_KEYS that TRL appended
    during the step (what TRL would log with logging_steps=1), the last LOGGED_KL_STEPS steps."""
    values = {k: mean_like_trl_log([float(v) for v in new[k]]) for k in HISTORY_KEYS if new.get(k)}
    record = {"step": step, **{k: v for k, v in values.items() if v is not None and math.isfinite(v)}}
    return [*course, record][-LOGGED_KL_STEPS:]


def logged_fields(step: int, logs: dict | None, state, course: list[dict] = ()) -> dict:
    """capture.json's record of TRL's log: what TRL logged at the step (`logged`, None where it did not log it)
    and how many steps its numbers average (`logged_window`), the kl it logged up to the step, and the run's course
    (`logged_history`): TRL's log where it logged every step, else the callback's own record of each step."""
    history = state.log_history  # TRL's log of this step is in it already (appended before on_log)
    trl_course = logged_history(history)
    kept = {"logged_kl": logged_kl(history), "logged_history": trl_course if len(trl_course) >= len(course) else course}
    if not logs or "loss" not in logs:
        return {"logged": None, **kept}
    earlier = [h["step"] for h in history[:-1] if "loss" in h]
    return {"logged": jsonable(dict(logs)), "logged_window": step - max(earlier + [0]), **kept}


def replace_folder(new: Path, final: Path) -> None:
    """`new` renamed to `final`; an earlier `final` (a run resumed into the same folder) is first renamed out of
    sight whole, then removed: a reader finds the old folder, or none, or the new one, never a half of one."""
    if final.exists():
        old = final.with_name(f".{final.name}.replaced")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(new, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(new, final)


def optimizer_note(optimizer: dict | None) -> str:
    """The README's line on the optimizer's state (or its absence)."""
    if optimizer is None:
        return (
            "not written (`CaptureCallback(..., optimizer_state=False)`, or no optimizer yet): a replay's update "
            "starts from a fresh AdamW."
        )
    lrs = ", ".join(f"{lr:.6g}" for lr in optimizer["learning_rate"])
    return (
        f"`{optimizer['file']}` ({optimizer['bytes'] / 1e6:.1f} MB): the trainer's `{optimizer['class']}` state before "
        f"this step, its {len(optimizer['groups'])} parameter group(s) in capture.json's `optimizer`, stepping at "
        f"learning rate {lrs} (the scheduler's rate for this step)."
    )


def trigger_note(trigger: list[dict] | None) -> str:
    """The README's paragraph on why the step was written, where a trigger wrote it (`FlightRecorder`)."""
    if not trigger:
        return ""
    reasons = "\n".join(f"- `{r['id']}` ({r['severity']}): {r['summary']}" for r in trigger)
    return (
        "\n## Why this step was captured\n\n`grpo_debug.capture.FlightRecorder` wrote it when, before the "
        f"optimizer stepped, it saw (capture.json's `trigger`):\n\n{reasons}\n"
    )


def rows_in_generation_order(shares: list[dict]) -> list[dict]:
    """Each process's share (process order) with its micro-batches' rows made rows of the gathered generation
    batch: process r's local row i is row i + the rows of processes 0..r-1 (the gather concatenates them in
    process order). Each share: micro_batches [{rows, index, pass}], losses [float], rng [M tensors], generation_rows
    (its generation batch's size), prompt_width, completion_width; out: the same with `forwards` (M) added."""
    out, offset = [], 0
    for share in shares:
        micro = [{**mb, "rows": [offset + r for r in mb["rows"]]} for mb in share["micro_batches"]]
        out.append({**share, "micro_batches": micro, "forwards": len(share["rng"])})
        offset += share["generation_rows"]
    return out


def random_states(rng: list[torch.Tensor], ranks: list[dict] | None) -> torch.Tensor | None:
    """batch.pt's `rng_states`: (M, S) uint8, the M training forwards' CPU random states, in one process;
    (P, M, S), process by process, in several (None where no forward was recorded, or where the processes
    recorded different numbers of forwards, which TRL's lock-step training does not do)."""
    if ranks is None:
        return torch.stack(rng) if rng else None
    counts = {len(rank["rng"]) for rank in ranks}
    if len(counts) != 1 or counts == {0}:
        return None
    return torch.stack([torch.stack(rank["rng"]) for rank in ranks])


def _copied(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A CPU copy of a state dict in which tensors that share memory (tied embeddings) stay one tensor, so that
    `save_pretrained` writes them once (a copy each would store a 0.5B Qwen2's 545 MB embedding twice)."""
    copies: dict[tuple, torch.Tensor] = {}
    out = {}
    for k, v in state.items():
        key = (v.device, v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape), tuple(v.stride()))
        if key not in copies:
            copies[key] = v.detach().cpu().clone()
        out[k] = copies[key]
    return out


def _row_keys(ids: torch.Tensor, advantages: torch.Tensor) -> list[bytes]:
    """Each row's token ids and advantage as bytes: equal keys, equal rows (both tensors on the CPU)."""
    ids, advantages = ids.contiguous().numpy(), advantages.float().contiguous().numpy()
    return [row.tobytes() + adv.tobytes() for row, adv in zip(ids, advantages)]


def _row_index(rows: torch.Tensor, advantages: torch.Tensor) -> dict[bytes, list[int]]:
    """Where each distinct row of the generation batch is, in generation order."""
    where: dict[bytes, list[int]] = {}
    for j, key in enumerate(_row_keys(rows, advantages)):
        where.setdefault(key, []).append(j)
    return where
