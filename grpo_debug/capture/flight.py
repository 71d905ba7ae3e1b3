"""A flight recorder for a TRL `GRPOTrainer` run: the health of every optimizer step, and the steps that go wrong
captured whole, as `CaptureCallback` captures a step asked for by number.

    trainer.add_callback(FlightRecorder("flight"))
    trainer.train()              # flight/health.jsonl: one line per step; flight/step-<k>/: each triggered step
    python -m grpo_debug timeline flight --html run.html

Every optimizer step appends one JSON line to `out_dir/health.jsonl` (opened, written, flushed, fsync'd and
closed per line: a killed run keeps every line it finished): `step`; `metrics`, TRL's numbers for the step under
TRL's names (its generation batch's reward, reward_std, frac_reward_zero_std, rewards/<f>/mean and /std,
completions/clipped_ratio, ...; the step's loss, entropy, clip_ratio/*, sampling/*, grad_norm), and beside them
`rewards/<f>/length_correlation` and its one-sided `rewards/<f>/length_p`, `update/relative_norm` and
`grad_norm/running_median`; `findings`, each
signal of `health` under the doctor's finding id with its severity (ok, warning, problem), value and thresholds;
`trigger`, the signals that fired; `capture`, the folder the step was written to, or `not_captured` and why;
`failed`, where something of the recorder's own failed on the step (the run went on; its line says what).

A step triggers when a finding's severity rises (ok -> warning -> problem: a condition that persists triggers
once, when it starts), when grad_norm exceeds `grad_spike` x its median over the last `window` steps, or when
the mean reward falls below the median of the last `window` generation batches' by more than `reward_drop` x
their median reward_std. Each of these is known before `optimizer.step()` runs (TRL computes grad_norm first),
when the model still holds the step's starting weights: the recorder copies them to the CPU only then, never
every step. What every step does keep is cheap: the generation batch, which rows made each micro-batch, the
random state of each training forward and the log-probs the loss took (`CaptureCallback`'s machinery, which
this class is, with `_records`, `_keeps` and `_trigger` changed). `update_size` is known only after the optimizer
stepped: it is recorded, and cannot trigger the capture of its own step (a grad_norm spike, before it, can). It is
||delta theta|| / ||theta|| measured at `update_sample` fixed coordinates of each parameter tensor (every
coordinate of a smaller one): a copy of a few values per tensor each step, not of the model.

Defaults and where they come from:
- every finding's threshold and severity: the doctor's (`grpo_debug.detectors`; see `health`);
- `grad_spike=3.0`: the multiplier of the 3-sigma rule that spike detectors use (rlwatch's gradient-norm
  detector fires 3 sigma above a rolling baseline, after 20 warm-up steps:
  https://varun1724.github.io/rlwatch/detectors/gradient-norm/), applied to the running median instead, which
  one spike does not move as it moves a mean and a sigma; `window=20` steps, from `min_history=5`: this module's
  choice, short enough for a short GRPO run to be judged;
- `reward_drop=1.0` (this module's choice, reasoned): the mean of n rewards has a standard error of
  reward_std / sqrt(n), so a fall of one reward_std is sqrt(n) standard errors (4 at a batch of 16 completions,
  8 at 64): not noise;
- `max_captures=5`: the first 4 triggered steps as they come and, in the last place, the worst triggered step
  after them (worst severity, then most signals; `health.admit`), replacing the one there when strictly worse.
  A step replaced, or refused, is named at the end of training (a warning) and in `out_dir/captures.json`.

Only the main process writes; each process records its share (see `CaptureCallback`).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import warnings
from collections import deque
from pathlib import Path

import torch

from ..files import write_text_atomically
from . import folder_lock, health
from .callback import CaptureCallback, at_the_edge
from .trackers import TrackerLog, trackers_for
from .trainer_state import jsonable
from .writing import HEALTH_FILE, MAX_WEIGHT_BYTES, append_line

INDEX_FILE = "captures.json"
GRAD_SPIKE = 3.0
REWARD_DROP = 1.0
WINDOW = 20
MIN_HISTORY = 5
MAX_CAPTURES = 5
UPDATE_SAMPLE = 1 << 16  # coordinates per parameter tensor for update/relative_norm (all of a smaller tensor)
KEEP_RULE = (
    "at most {n} captures: the first {first} triggered steps as they come, and in the last place the worst "
    "triggered step after them (worst severity, then most signals), replacing the one there only if strictly worse"
)
TRIGGERS = (
    "zero_std_groups",
    "constant_reward",
    "length_reward",
    "truncation",
    "entropy_collapse",
    "clip_saturated",
    "sampler_mismatch",
    "grad_norm_spike",
    "reward_collapse",
)


class FlightRecorder(CaptureCallback):
    """Health of every optimizer step in `out_dir/health.jsonl`; the steps that trigger captured in
    `out_dir/step-<k>/`, at most `max_captures` of them. `trigger_on`: the signal ids that may trigger (default
    `TRIGGERS`, every one)."""

    def __init__(
        self,
        out_dir: str | Path,
        max_captures: int = MAX_CAPTURES,
        grad_spike: float = GRAD_SPIKE,
        reward_drop: float = REWARD_DROP,
        window: int = WINDOW,
        min_history: int = MIN_HISTORY,
        trigger_on: tuple[str, ...] = TRIGGERS,
        update_sample: int = UPDATE_SAMPLE,
        max_weight_bytes: int = MAX_WEIGHT_BYTES,
        optimizer_state: bool = True,
        trackers: bool = True,
    ):
        if not isinstance(trackers, bool):
            raise ValueError(f"trackers must be True or False, got {trackers!r}")
        _check_settings(max_captures, grad_spike, reward_drop, window, min_history, trigger_on, update_sample)
        self._setup(out_dir, max_weight_bytes, optimizer_state)  # the folder locked first: a live run is named
        held = another_runs_file(Path(out_dir))
        if held:
            self.close()
            raise ValueError(
                f"{out_dir} holds another run's {held}: a FlightRecorder writes one run per folder "
                "(give this run a new out_dir)"
            )
        self.max_captures, self.grad_spike, self.reward_drop = max_captures, grad_spike, reward_drop
        self.min_history, self.trigger_on, self.update_sample = min_history, set(trigger_on), update_sample
        self.history = {name: deque(maxlen=window) for name in ("grad_norm", "reward", "reward_std")}
        self.severity: dict[str, str] = {}  # each signal's severity at the step before
        self.first_entropy: float | None = None  # TRL's entropy at the run's first step: a collapse is a fall from it
        self.first: list[int] = []  # the first max_captures - 1 steps captured
        self.last: tuple[int, tuple] | None = None  # (step, badness) in the last place
        self.triggered: dict[int, list[dict]] = {}
        self.not_captured: dict[int, str] = {}
        self.index = "never"  # captures.json: never written, written (up to date), or its last write failed
        self.sample: list[tuple[torch.nn.Parameter, torch.Tensor | None, float]] | None = None
        self.trackers, self.tracker_log = trackers, None  # the run's trackers, found at its first line

    # ---- CaptureCallback, with every step recorded

    def _records(self, step: int) -> bool:
        return True

    def _keeps(self, fed_steps: list[int]) -> bool:
        return True

    def _on_generation(self, output: dict, inputs: list | None = None) -> None:
        """Keep the batch (`CaptureCallback`, the dataset's columns with it), and what it says about the rewards,
        once per batch."""
        super()._on_generation(output, inputs)
        t, g = self.trainer, self.generation
        g["metrics"] = {k: float(v[-1]) for k, v in self._new_metrics().items() if health.is_generation_metric(k)}
        g["signals"] = health.generation_signals(g["rewards"], g["reward_weights"], g["tensors"], t.num_generations)
        g["new"] = True  # its first step judges its reward against the run's

    def _trigger(self, capture: dict) -> list[dict] | None:
        """The step's signals, before the optimizer steps; the reasons to capture it, where the budget admits it."""
        capture["before"] = self._sampled_weights()
        signals, metrics = self._signals(capture)
        capture["signals"], capture["metrics"] = signals, metrics
        reasons = []
        for s in signals:
            before = self.severity.get(s.id, "ok")
            self.severity[s.id] = s.severity
            if s.id in self.trigger_on and health.rank(s.severity) > health.rank(before):
                reasons.append({"id": s.id, "severity": s.severity, "summary": s.summary})
        capture["reasons"] = reasons
        if not reasons:
            return None
        step = capture["step"]
        self.triggered[step] = reasons
        capture["place"] = health.admit(self.first, self.last, self.max_captures, health.badness(reasons))
        if capture["place"] is None:
            self.not_captured[step] = (
                f"max_captures={self.max_captures} reached: the first {self.max_captures - 1} triggered steps are "
                f"kept, and step {self.last[0]}, in the last place, is at least as bad"
            )
            return None
        return reasons

    def _signals(self, capture: dict) -> tuple[list[health.Signal], dict]:
        """Every signal known before the optimizer steps, and the metrics they were read from."""
        g = self.generation or {"metrics": {}, "signals": None, "new": False}
        metrics = {**g["metrics"], **capture["step_metrics"]}
        out = []
        if g["signals"] is not None:
            s = g["signals"]
            out += [
                health.zero_std_groups(s["groups_without_signal"]),
                health.constant_reward(s["constant_functions"], s["functions"]),
                health.length_reward(s["length_correlation"], s["length_p"]),
            ]
            metrics.update({f"rewards/{k}/length_correlation": v for k, v in s["length_correlation"].items()})
            metrics.update({f"rewards/{k}/length_p": v for k, v in s["length_p"].items()})
            sampler = health.sampler_mismatch(s["sampler"])
            out += [sampler] if sampler is not None else []
            metrics.update({f"rollout_corr/{k}": v for k, v in (s["sampler"] or {}).items()})
        out += [
            health.truncation(metrics.get("completions/clipped_ratio")),
            health.entropy_collapse(metrics.get("entropy"), self.first_entropy),
            health.clip_saturated(metrics.get("clip_ratio/region_mean")),
            health.kl_blowup(metrics.get("kl")),
        ]
        out += self._run_signals(metrics, g)
        if self.first_entropy is None and metrics.get("entropy") is not None:
            self.first_entropy = metrics["entropy"]
        return out, metrics

    def _run_signals(self, metrics: dict, generation: dict) -> list[health.Signal]:
        """grad_norm against the last steps', the mean reward against the last generation batches'; then this
        step (and its batch, on its first step) joins the history."""
        grad_norm, h = metrics.get("grad_norm"), self.history
        spike = health.grad_norm_spike(grad_norm, list(h["grad_norm"]), self.grad_spike, self.min_history)
        if h["grad_norm"]:
            metrics["grad_norm/running_median"] = health.median(list(h["grad_norm"]))
        if grad_norm is not None and grad_norm == grad_norm:
            h["grad_norm"].append(grad_norm)
        out = [spike]
        reward, std = metrics.get("reward"), metrics.get("reward_std")
        if generation.get("new") and reward is not None and std is not None:
            rewards, stds = list(h["reward"]), list(h["reward_std"])
            out.append(health.reward_collapse(reward, rewards, stds, self.reward_drop, self.min_history))
            h["reward"].append(reward)
            h["reward_std"].append(std)
            generation["new"] = False
        return out

    # ---- update size, from a fixed sample of coordinates

    def _sampled_weights(self) -> list[torch.Tensor]:
        """The trained parameters at `update_sample` fixed coordinates each (all of a smaller one), drawn once
        from a generator of their own: the run's random numbers are left as they are."""
        if self.sample is None:
            generator, self.sample = torch.Generator().manual_seed(0), []
            for p in self._model().parameters():  # a tied weight is listed once
                if p.requires_grad:
                    n = p.numel()
                    index = None
                    if n > self.update_sample:
                        index = torch.randint(n, (self.update_sample,), generator=generator).sort().values
                        index = index.to(p.device)
                    self.sample.append((p, index, n / self.update_sample if index is not None else 1.0))
        return [
            (p.detach().reshape(-1) if i is None else p.detach().reshape(-1)[i]).to(torch.float32, copy=True)
            for p, i, _ in self.sample
        ]

    def _update_size(self, before: list[torch.Tensor]) -> float | None:
        """||theta_after - theta_before|| / ||theta_before||, each tensor's sum of squares scaled up from its
        sample (exact where a tensor has no more than `update_sample` coordinates)."""
        after = self._sampled_weights()
        moved = sum(s * (a - b).square().sum() for (_, _, s), a, b in zip(self.sample, after, before))
        size = sum(s * b.square().sum() for (_, _, s), b in zip(self.sample, before))
        return (moved / size).sqrt().item() if float(size) > 0 else None

    # ---- after the step: its line, the budget

    def _after_step(self, capture: dict, state) -> list[str]:
        """The step's health line, then captures.json where it triggered; what of them was not written."""
        if "signals" not in capture and "failed" not in capture:  # the trainer never reached its optimizer step
            return []
        line = self._line(capture) if "signals" in capture else failed_line(capture["step"], capture["failed"])
        if not state.is_world_process_zero:
            return []
        problems = []
        try:
            append_line(self.out_dir / HEALTH_FILE, jsonable(line))
        except Exception as e:  # a full disk, a read-only folder: the run goes on
            problems.append(f"left no health line ({type(e).__name__}: {e})")
        if self.trackers and self.trainer is not None:
            if self.tracker_log is None:
                self.tracker_log = TrackerLog(trackers_for(self.trainer))
            self.tracker_log.log_line(jsonable(line), state.global_step)
        if capture.get("reasons"):
            problems += self._index_problems()
        return problems

    def _line(self, capture: dict) -> dict:
        """The step's health line: its metrics, every signal, what triggered, where it was captured or why not,
        and what of ours failed on it (`failed`)."""
        step = capture["step"]
        relative = self._update_size(capture["before"])
        signals = [*capture["signals"], health.update_size(relative)]
        line = {
            "step": step,
            "time": time.time(),
            "metrics": {**capture["metrics"], "update/relative_norm": relative},
            "findings": {s.id: s.as_json() for s in signals},
            "trigger": capture["reasons"],
            "capture": self.written[step].name if step in self.written else None,
        }
        if capture["reasons"] and step not in self.written:
            self.not_captured.setdefault(step, self.skipped.get(step, "not written"))
            line["not_captured"] = self.not_captured[step]
        if capture.get("failed"):
            line["failed"] = capture["failed"]
        return line

    def _index_problems(self) -> list[str]:
        """captures.json rewritten; [] or what kept it from being written (said once, with the step)."""
        try:
            self._write_index()
        except Exception as e:
            self.index = "failed"
            return [f"left {INDEX_FILE} as it was ({type(e).__name__}: {e})"]
        self.index = "written"
        return []

    def _captured(self, step: int, path: Path, capture: dict) -> None:
        """The step is on disk: it takes its place; the step it replaces in the last place is removed."""
        if capture["place"] == "first":
            self.first.append(step)
        else:
            if self.last is not None:
                gone = self.last[0]
                self.written.pop(gone, None)
                self.not_captured[gone] = f"replaced by step {step}, which triggered worse (max_captures reached)"
                if self.trainer.accelerator.is_main_process:
                    remove_folder(self.out_dir / f"step-{gone}")
            self.last = (step, health.badness(capture["reasons"]))

    def _write_index(self) -> None:
        """out_dir/captures.json: each captured step, its folder and trigger; each triggered step not captured and
        why; the rule that chose."""
        if self.trainer is not None and not self.trainer.accelerator.is_main_process:
            return
        index = {
            "captured": {str(k): {"folder": p.name, "trigger": self.triggered.get(k)} for k, p in self.written.items()},
            "not_captured": {str(k): v for k, v in sorted(self.not_captured.items())},
            "rule": KEEP_RULE.format(n=self.max_captures, first=self.max_captures - 1),
            "max_captures": self.max_captures,
        }
        self.out_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomically(self.out_dir / INDEX_FILE, json.dumps(jsonable(index), indent=1))

    @folder_lock.let_go_after
    @at_the_edge
    def on_train_end(self, args, state, control, **kwargs):
        """The last step closed; captures.json written if it is not up to date; each triggered step not captured
        and not yet warned about, named (one warning per reason)."""
        self._close(state)
        if self.tracker_log is not None:
            self.tracker_log.close()
        if self.index != "written":
            before, problems = self.index, self._index_problems()
            if problems and before == "never":  # a failure already said with its step is not said again
                self._say_once(problems[0])
        by_reason: dict[str, list[int]] = {}
        for step, reason in sorted(self.not_captured.items()):
            if step not in self.warned:
                by_reason.setdefault(reason, []).append(step)
        for reason, steps in by_reason.items():
            named = ", ".join(map(str, steps))
            warnings.warn(
                f"FlightRecorder: step{'s' if len(steps) > 1 else ''} {named} triggered but "
                f"{'were' if len(steps) > 1 else 'was'} not captured: {reason}",
                stacklevel=2,
            )


def another_runs_file(folder: Path) -> str | None:
    """The first of what a FlightRecorder writes that `folder` already holds (a health log, a captures index, a
    step-<k> capture), or None."""
    if not folder.is_dir():
        return None
    if (folder / HEALTH_FILE).exists() or (folder / INDEX_FILE).exists():
        return HEALTH_FILE if (folder / HEALTH_FILE).exists() else INDEX_FILE
    return next((p.name for p in sorted(folder.glob("step-*")) if p.is_dir()), None)


def failed_line(step: int, reason: str) -> dict:
    """The health line of a step whose record failed before its signals were read: the failure, said."""
    return {"step": step, "time": time.time(), "metrics": {}, "findings": {}, "trigger": [], "capture": None,
            "failed": reason}  # fmt: skip


def remove_folder(folder: Path) -> None:
    """`folder` renamed out of sight whole, then removed: no reader finds half of it."""
    gone = folder.with_name(f".{folder.name}.removed")
    shutil.rmtree(gone, ignore_errors=True)
    try:
        os.replace(folder, gone)
    except FileNotFoundError:
        return
    shutil.rmtree(gone, ignore_errors=True)


def _integer(value) -> bool:
    """An int and not a bool (True is an int in Python; no setting here means 1 by it)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_settings(max_captures, grad_spike, reward_drop, window, min_history, trigger_on, update_sample) -> None:
    """One rule for every setting: integers are ints (no bools), thresholds are numbers, each in its range."""
    if not _integer(max_captures) or max_captures < 1:
        raise ValueError(f"max_captures must be an integer >= 1, got {max_captures!r}")
    if not (_number(grad_spike) and grad_spike > 1):
        raise ValueError(f"grad_spike must be above 1 (a multiple of the running median), got {grad_spike!r}")
    if not (_number(reward_drop) and reward_drop > 0):
        raise ValueError(f"reward_drop must be above 0 (in reward_std), got {reward_drop!r}")
    if not (_integer(window) and _integer(min_history) and 1 <= min_history <= window):
        raise ValueError(f"need 1 <= min_history <= window (integers), got {min_history!r} and {window!r}")
    unknown = sorted(set(trigger_on) - set(TRIGGERS))
    if unknown or isinstance(trigger_on, str):
        raise ValueError(f"trigger_on takes ids among {TRIGGERS}, got {trigger_on!r}")
    if not _integer(update_sample) or update_sample < 1:
        raise ValueError(f"update_sample must be an integer >= 1, got {update_sample!r}")
