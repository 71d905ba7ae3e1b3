"""Capture optimizer steps of a real TRL `GRPOTrainer` run, to open them here phase by phase.

    trainer.add_callback(CaptureCallback("captures", steps=[2]))
    trainer.train()                     # writes captures/step-2/

Step k is the k-th optimizer step (TRL's `global_step`). Every requested step is written, whatever
`logging_steps`, `num_iterations`, `steps_per_generation` and `gradient_accumulation_steps` are, with:
- the policy's weights as they were before step k (not before the generation: with num_iterations or
  steps_per_generation above GA, a generation batch feeds several optimizer steps);
- the generation batch step k trains on, in generation order (groups of G consecutive rows): prompt and
  completion ids, the trainer's `old_`, `ref_` and `sampling_per_token_logps` where it computed them, every
  reward function's rewards with its weight, the advantages;
- which rows made each of step k's micro-batches (TRL shuffles the generation batch before splitting it)
  and which pass over the batch it is;
- the random state each of step k's training forwards started from (a forward pre-hook), so that a replay
  draws the trainer's own dropout masks;
- the per-token log-probs the trainer's loss of step k took (`trainer_per_token_logps`);
- step k's own metrics (`step_metrics`: the loss, grad_norm and every metric TRL appended during step k, each
  averaged as TRL's log averages them with logging_steps=1), and, where TRL logged at step k, what it logged
  (`logged`, an average over its logging window);
- the `GRPOConfig`, and the values the trainer resolved from it at run time (`resolved`).
A requested step that cannot be written (training ended first, or the step spans two generation batches)
gets a warning at the end of training that names it and the reason.

A callback is handed the model, not the trainer. So at `on_train_begin` the callback finds the
`GRPOTrainer` whose `train()` is running: it is the nearest caller frame whose `self` is one. It then wraps
that trainer's methods (`CaptureCallback.attach(trainer)` does the same explicitly). In a multi-process run
each process's share is gathered and only the main process writes; such a capture is replayed as one batch
(its micro-batches and dropout are per process, not recorded).

A capture is a folder holding `README.md`, `capture.json` (the config, texts, rewards, metrics), `batch.pt`
(the tensors) and `policy/` (weights and tokenizer, `save_pretrained`). The reference model (TRL has one
when beta != 0) is named, not copied: TRL loads it frozen from the policy's own name, recorded here as an
absolute path where it is a local folder.
"""

from __future__ import annotations

import inspect
import json
import math
import time
import warnings
from pathlib import Path

import torch
from transformers import TrainerCallback

from .files import write_atomically
from .trl_bridge import PositionIdsGRPOTrainer
from .trl_step import mean_like_trl_log

FORMAT = 2  # capture.json's "format": 2 adds the schedule, the random states, step_metrics and resolved
TENSORS = (
    "prompt_ids",
    "prompt_mask",
    "completion_ids",
    "completion_mask",
    "advantages",
    "old_per_token_logps",
    "ref_per_token_logps",
    "sampling_per_token_logps",
    "importance_sampling_ratio",
)
# plus `trainer_per_token_logps` (N, C): the policy's log-probs of each row as the trainer's loss of step k took
# them, put back in generation order; NaN for a row step k did not train on. And `rng_states` (M, S) uint8: the
# CPU random state at the start of each of step k's M training forwards.
MAX_WEIGHT_BYTES = 2 * 1024**3


def find_trainer(cls=None):
    """The nearest caller frame's `self` that is a GRPOTrainer (the trainer whose `train()` runs), or None."""
    from trl import GRPOTrainer

    cls = cls or GRPOTrainer
    frame = inspect.currentframe()
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, cls):
            return candidate
        frame = frame.f_back
    return None


def gathered(trainer, tensor: torch.Tensor, pad_first: bool = False, pad_index: float = 0) -> torch.Tensor:
    """Every process's rows of a per-process tensor, in process order, on the CPU. Along dim 1 each is padded
    to the longest: on the left (`pad_first`) for left-padded prompts, on the right for completions."""
    acc = trainer.accelerator
    if acc.num_processes > 1:
        if tensor.dim() > 1:
            tensor = acc.pad_across_processes(tensor, dim=1, pad_index=pad_index, pad_first=pad_first)
        tensor = acc.gather(tensor)
    return tensor.detach().cpu()


def gathered_batch_tensor(trainer, name: str, tensor: torch.Tensor) -> torch.Tensor:
    pad = trainer.processing_class.pad_token_id if name.endswith("_ids") else 0
    return gathered(trainer, tensor, pad_first=name.startswith("prompt"), pad_index=pad or 0)


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return repr(value)


def resolved_settings(trainer) -> dict:
    """The values the trainer resolved from its GRPOConfig at run time (the saved config keeps None for some)."""
    args = trainer.args
    return {
        "epsilon_low": trainer.epsilon_low,
        "epsilon_high": trainer.epsilon_high,
        "steps_per_generation": args.steps_per_generation,
        "num_iterations": trainer.num_iterations,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "beta": trainer.beta,
        "loss_type": trainer.loss_type,
        "temperature": trainer.temperature,
        "top_p": getattr(trainer, "top_p", args.top_p),
        "top_k": getattr(trainer, "top_k", args.top_k),
        "min_p": getattr(trainer, "min_p", args.min_p),
        "mixed_precision": str(trainer.accelerator.mixed_precision),
        "disable_dropout": args.disable_dropout,
        "processes": trainer.accelerator.num_processes,
    }


def _atomic_write_text(path: Path, text: str) -> None:
    write_atomically(path, lambda f: f.write(text))


README = """# A captured GRPO step

Optimizer step {step} of a TRL {trl_version} `{trainer_class}` run, captured by
`grpo_debug.capture.CaptureCallback` on {when}.

- `capture.json`: the `GRPOConfig` (`grpo_config`) and what the trainer resolved from it (`resolved`), the
  prompts and completions, each reward function's rewards and weight, the advantages, step {step}'s own
  metrics (`step_metrics`), what TRL logged at this step if it logged (`logged`: an average over its
  logging window), the micro-batches of this step (`schedule`) and where the weights are (`policy`).
- `batch.pt`: the tensors of the generation batch, in generation order (groups of {num_generations}
  consecutive rows): {tensors}.
- `policy/`: {policy_note} The reference model: {reference}.

Open it, from any directory:

    python -m grpo_debug replay {path} --json out.json
    python -m grpo_debug replay {path} --set position_ids=true --json out.json

or, in Python and in every notebook, `GRPOStep.from_capture("{path}", task=your_reward_funcs)`.
"""


class CaptureCallback(TrainerCallback):
    """Write one capture folder per optimizer step in `steps` under `out_dir` (`step-<k>/`)."""

    def __init__(self, out_dir: str | Path, steps: list[int], max_weight_bytes: int = MAX_WEIGHT_BYTES):
        if not steps or any(not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in steps):
            raise ValueError(f"steps must be a list of optimizer steps >= 1, got {steps!r}")
        self.out_dir, self.steps, self.max_weight_bytes = Path(out_dir), sorted(set(steps)), max_weight_bytes
        self.trainer = None
        self.generation: dict | None = None  # the latest generation batch that feeds a wanted step
        self.current: dict | None = None  # the step being captured
        self.marks: dict[
            str, tuple[int, int]
        ] = {}  # identities and lengths of the trainer's metric lists at the step's start
        self.written: dict[int, Path] = {}
        self.skipped: dict[int, str] = {}
        self.seconds = 0.0  # time spent capturing, for the overhead benchmark

    # ---- wrapping the trainer

    def attach(self, trainer) -> None:
        if self.trainer is trainer:
            return
        self.trainer = trainer
        generate, prepare = trainer._generate_and_score_completions, trainer._prepare_inputs
        score, training_step, grad_norm = (
            trainer._get_per_token_logps_and_entropies,
            trainer.training_step,
            trainer._get_grad_norm,
        )

        def generate_and_capture(inputs):
            output = generate(inputs)
            if trainer.model.training:
                self._timed(self._on_generation, output)
            return output

        def prepare_and_capture(inputs):
            micro = trainer._step  # the micro-batch about to train (TRL counts it up after training_step)
            out = prepare(inputs)
            if self.current is not None and trainer.model.training:
                self._timed(self._on_micro_batch, out, micro)
            return out

        def score_and_keep(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
            out = score(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
            if (
                self.current is not None
                and torch.is_grad_enabled()
                and trainer.accelerator.unwrap_model(model) is self._model()
            ):  # the loss's forward
                self.current["scored"].append((input_ids.detach().cpu(), out[0].detach().float().cpu()))
            return out

        def step_and_keep(model, inputs, *args, **kwargs):
            loss = training_step(model, inputs, *args, **kwargs)
            if self.current is not None:
                self.current["losses"].append(float(loss.detach().float().item()))
            return loss

        def grad_norm_and_keep(*args, **kwargs):
            norm = grad_norm(*args, **kwargs)
            if self.current is not None:
                self.current["grad_norm"] = float(norm.item() if isinstance(norm, torch.Tensor) else norm)
            return norm

        trainer._generate_and_score_completions = generate_and_capture
        trainer._prepare_inputs = prepare_and_capture
        trainer._get_per_token_logps_and_entropies = score_and_keep
        trainer.training_step = step_and_keep
        trainer._get_grad_norm = grad_norm_and_keep
        self._model().register_forward_pre_hook(self._random_state)

    def _timed(self, fn, *args):
        start = time.perf_counter()
        fn(*args)
        self.seconds += time.perf_counter() - start

    def _random_state(self, module, args):
        """Forward pre-hook: the random state a training forward of the captured step starts from (its dropout)."""
        if self.current is not None and module.training and torch.is_grad_enabled():
            self.current["rng"].append(torch.get_rng_state())

    def _model(self):
        return self.trainer.accelerator.unwrap_model(self.trainer.model)

    def _layout(self) -> tuple[int, int, int]:
        t = self.trainer
        return t.args.steps_per_generation, t.num_iterations, t.current_gradient_accumulation_steps

    # ---- callback events

    def on_train_begin(self, args, state, control, **kwargs):
        if self.trainer is None:
            trainer = find_trainer()
            if trainer is None:
                raise RuntimeError(
                    "CaptureCallback found no GRPOTrainer running train(); call "
                    "callback.attach(trainer) before trainer.train()"
                )
            self.attach(trainer)

    def on_step_begin(self, args, state, control, **kwargs):
        self.marks = {k: (id(v), len(v)) for k, v in self.trainer._metrics["train"].items()}
        step = state.global_step + 1
        if step in self.steps and step not in self.written and step not in self.skipped:
            start = time.perf_counter()
            self.current = {
                "step": step,
                "weights": self._weights(),
                "micro_batches": [],
                "rng": [],
                "scored": [],
                "losses": [],
                "grad_norm": None,
            }
            self.seconds += time.perf_counter() - start

    def on_step_end(self, args, state, control, **kwargs):
        capture, self.current = self.current, None
        if capture is None:
            return
        start = time.perf_counter()
        step = capture["step"]
        generation = self.generation
        if generation is None or step not in generation["fed_steps"]:
            self.skipped[step] = "no generation batch was kept for it"
        elif step in generation["spanning"]:
            self.skipped[step] = (
                "it spans two generation batches (gradient_accumulation_steps is not a multiple "
                "of steps_per_generation x num_iterations)"
            )
        else:
            capture["step_metrics"] = self._step_metrics(capture)  # collective: every process gathers
            capture["trainer_logps"] = self._trainer_logps(capture)
            if state.is_world_process_zero:
                self.written[step] = self._write(step, capture, generation)
            else:
                self.written[step] = self.out_dir / f"step-{step}"
        self.seconds += time.perf_counter() - start

    def on_log(self, args, state, control, logs=None, **kwargs):
        step = state.global_step
        path = self.written.get(step)
        if path is not None and logs and "loss" in logs and state.is_world_process_zero:
            meta = json.loads((path / "capture.json").read_text())
            meta["logged"] = _jsonable(dict(logs))
            meta["logged_window"] = step - max([h["step"] for h in state.log_history[:-1] if "loss" in h] + [0])
            _atomic_write_text(path / "capture.json", json.dumps(meta, indent=1))

    def on_train_end(self, args, state, control, **kwargs):
        for step in self.steps:
            if step not in self.written and step not in self.skipped:
                self.skipped[step] = f"training ended at step {state.global_step}"
        for step, reason in sorted(self.skipped.items()):
            warnings.warn(f"CaptureCallback: step {step} was not captured: {reason}", stacklevel=2)

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
        if not any(k in self.steps and k not in self.written for k in fed):
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
        rows = torch.cat([local["prompt_ids"], local["completion_ids"]], 1)
        free, picked = list(range(len(rows))), []
        for row, adv in zip(ids, advantages):
            match = next(
                (j for j in free if torch.equal(rows[j], row) and torch.equal(local["advantages"][j], adv)), None
            )
            if match is None:
                raise RuntimeError("CaptureCallback: a micro-batch row is not in the kept generation batch")
            free.remove(match)
            picked.append(match)
        index = micro - self.generation["first_micro_batch"]
        self.current["micro_batches"].append({"rows": picked, "index": index % S, "pass": index // S})

    def _weights(self) -> dict[str, torch.Tensor] | None:
        model = self._model()
        size = sum(p.numel() * p.element_size() for p in model.parameters())
        if size > self.max_weight_bytes:
            return None
        return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}

    def _step_metrics(self, capture: dict) -> dict:
        """Step k's own numbers, as TRL logs them with logging_steps=1: the loss (the micro-batches' sum, the
        mean over processes), grad_norm, and each metric TRL appended during the step, averaged."""
        t = self.trainer
        out = {}
        for key, values in t._metrics["train"].items():
            same, length = self.marks.get(key, (id(values), 0))
            new = values[length:] if same == id(values) else values  # TRL replaces num_tokens' list
            if new:
                out[key] = mean_like_trl_log([float(v) for v in new])
        loss = torch.tensor([sum(capture["losses"])], device=t.accelerator.device)
        out["loss"] = t.accelerator.gather(loss).mean().item()
        if capture["grad_norm"] is not None:
            out["grad_norm"] = capture["grad_norm"]
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

    def _write(self, step: int, capture: dict, generation: dict) -> Path:
        import trl

        t, model = self.trainer, self._model()
        path = self.out_dir / f"step-{step}"
        path.mkdir(parents=True, exist_ok=True)
        tensors = dict(generation["tensors"])
        tensors["trainer_per_token_logps"] = capture["trainer_logps"]
        single = generation["processes"] == 1
        if single and capture["rng"]:
            tensors["rng_states"] = torch.stack(capture["rng"])
        torch.save(tensors, path / "batch.pt")
        reference = getattr(t, "ref_model", None)
        if capture["weights"] is not None:
            model.save_pretrained(path / "policy", state_dict=capture["weights"])
            t.processing_class.save_pretrained(path / "policy")
            policy = {"folder": "policy", "name_or_path": _resolved_name(model.config._name_or_path)}
            note = f"the policy's weights before optimizer step {step}, and its tokenizer (`save_pretrained`)."
        else:
            policy = {
                "folder": None,
                "name_or_path": _resolved_name(model.config._name_or_path),
                "checkpoint_step": step - 1,
                "output_dir": str(Path(t.args.output_dir).resolve()),
            }
            note = (
                f"not written: the weights are larger than {self.max_weight_bytes} bytes. Reload the "
                f"checkpoint of step {step - 1} from `{t.args.output_dir}`."
            )
        S, mu, GA = self._layout()
        schedule = None
        if single:
            schedule = {
                "micro_batches": capture["micro_batches"],
                "steps_per_generation": S,
                "num_iterations": mu,
                "gradient_accumulation_steps": GA,
                "generation_first_step": generation["first_step"],
                "forwards": len(capture["rng"]),
            }
        meta = {
            "format": FORMAT,
            "step": step,
            "trl_version": trl.__version__,
            "trainer_class": type(t).__name__,
            "model_class": type(model).__name__,
            "position_ids": isinstance(t, PositionIdsGRPOTrainer),
            "policy": policy,
            "reference": {
                "beta": t.beta,  # TRL loads it frozen from the same name as the policy
                "name_or_path": _resolved_name(reference.config._name_or_path) if reference is not None else None,
            },
            "grpo_config": _jsonable(t.args.to_dict()),
            "resolved": _jsonable(resolved_settings(t)),
            "prompts": _jsonable(generation["prompts"]),
            "completions": _jsonable(generation["completions"]),
            "rewards": _jsonable(generation["rewards"]),
            "reward_weights": generation["reward_weights"],
            "advantages": _jsonable(generation["advantages"]),
            "processes": generation["processes"],
            "schedule": schedule,
            "step_metrics": _jsonable(capture["step_metrics"]),
            "logged": None,
        }
        _atomic_write_text(path / "capture.json", json.dumps(meta, indent=1))
        _atomic_write_text(
            path / "README.md",
            README.format(
                step=step,
                trl_version=trl.__version__,
                trainer_class=type(t).__name__,
                when=time.strftime("%Y-%m-%d %H:%M:%S"),
                num_generations=t.args.num_generations,
                tensors=", ".join(f"`{k}` {tuple(v.shape)}" for k, v in tensors.items()),
                policy_note=note,
                path=path.resolve(),
                reference=meta["reference"]["name_or_path"] or "none (beta = 0)",
            ),
        )
        return path


def _resolved_name(name: str | None) -> str | None:
    """A local folder as an absolute path (a capture opens from any directory); a hub id as it is."""
    if name and Path(name).exists():
        return str(Path(name).resolve())
    return name
