"""Capture steps of a real TRL `GRPOTrainer` run, to open them here phase by phase.

    trainer.add_callback(CaptureCallback("captures", steps=[2]))
    trainer.train()                     # writes captures/step-2/

Step k is the k-th optimizer step (TRL's `global_step`). The callback keeps the generation batch whose first
optimizer step is k: the policy's weights as they were when it was generated (before step k), the prompts
and completion token ids, the per-token log-probs the trainer computed (`old_per_token_logps`,
`ref_per_token_logps`, and the sampler's `sampling_per_token_logps` where an engine such as vLLM generated),
the rewards of every reward function with their weights, the advantages, the `GRPOConfig`, and, once TRL
logs step k, the metrics it logged. With `steps_per_generation` or `num_iterations` above 1 that batch also
feeds the next optimizer steps; the capture is of its first.

A callback is handed the model, not the trainer. So at `on_train_begin` the callback finds the
`GRPOTrainer` whose `train()` is running: it is the nearest caller frame whose `self` is one. It then wraps
that trainer's `_generate_and_score_completions`. `CaptureCallback.attach(trainer)` does the same
explicitly. In a multi-process run each process's share of the batch is gathered, and only the main
process writes.

A capture is a folder holding:
- `README.md`: what it holds and how to open it.
- `capture.json`: the config, the texts, the rewards and the logged metrics.
- `batch.pt`: the tensors.
- `policy/`: the weights and tokenizer, saved with `save_pretrained`. The reference model (TRL has one
  when beta != 0) is named, not copied: TRL loads it frozen from the policy's own name. Weights larger than
  `max_weight_bytes` are not copied; `capture.json` then names the checkpoint to reload instead.
"""

from __future__ import annotations

import inspect
import json
import time
from pathlib import Path

import torch
from transformers import TrainerCallback

TENSORS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "old_per_token_logps",
           "ref_per_token_logps", "sampling_per_token_logps", "importance_sampling_ratio")
# plus `trainer_per_token_logps`: the policy's log-probs of each row as the trainer's loss of step k took them
# (its own `_get_per_token_logps_and_entropies`, with gradients, dropout as it was), kept from that forward
# and put back in generation order (TRL shuffles the rows first); NaN for a row step k did not train on
MAX_WEIGHT_BYTES = 2 * 1024 ** 3


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
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return repr(value)


README = """# A captured GRPO step

Step {step} of a TRL {trl_version} `{trainer_class}` run, captured by `grpo_debug.capture.CaptureCallback`
on {when}.

- `capture.json`: the `GRPOConfig` (`grpo_config`), the prompts and completions, each reward function's
  rewards and weight, the advantages, the metrics TRL logged for this step (`logged`), and where the
  weights are (`policy`).
- `batch.pt`: the tensors of the generation batch, in generation order (groups of {num_generations}
  consecutive rows): {tensors}.
- `policy/`: {policy_note} The reference model: {reference}.

Open it:

    python -m grpo_debug replay {path} --json out.json
    python -m grpo_debug replay {path} --set dropout=false --json out.json

or, in Python and in every notebook, `GRPOStep.from_capture("{path}")`.
"""


class CaptureCallback(TrainerCallback):
    """Write one capture folder per optimizer step in `steps` under `out_dir` (`step-<k>/`)."""

    def __init__(self, out_dir: str | Path, steps: list[int], max_weight_bytes: int = MAX_WEIGHT_BYTES):
        if not steps or any(not isinstance(k, int) or k < 1 for k in steps):
            raise ValueError(f"steps must be optimizer steps >= 1, got {steps!r}")
        self.out_dir, self.steps, self.max_weight_bytes = Path(out_dir), sorted(set(steps)), max_weight_bytes
        self.trainer = None
        self.pending: dict[int, dict] = {}
        self.written: dict[int, Path] = {}
        self.seconds = 0.0  # time spent capturing, for the overhead benchmark

    def attach(self, trainer) -> None:
        if self.trainer is trainer:
            return
        self.trainer = trainer
        generate = trainer._generate_and_score_completions

        def generate_and_capture(inputs):
            step = trainer.state.global_step + 1
            wanted = trainer.model.training and step in self.steps and step not in self.pending \
                and step not in self.written
            start = time.perf_counter()
            weights = self._weights() if wanted else None
            self.seconds += time.perf_counter() - start
            output = generate(inputs)
            if wanted:
                start = time.perf_counter()
                self.pending[step] = self._batch(output, weights)
                self.seconds += time.perf_counter() - start
            return output

        trainer._generate_and_score_completions = generate_and_capture
        score = trainer._get_per_token_logps_and_entropies

        def score_and_keep(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
            out = score(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
            step = trainer.state.global_step + 1
            policy = trainer.accelerator.unwrap_model(model)  # DDP wraps the policy in a multi-process run
            if step in self.pending and torch.is_grad_enabled() and policy is self._model():  # the loss's forward
                self.pending[step]["scored"].append((input_ids.detach().cpu(), out[0].detach().cpu()))
            return out

        trainer._get_per_token_logps_and_entropies = score_and_keep

    def on_train_begin(self, args, state, control, **kwargs):
        if self.trainer is None:
            trainer = find_trainer()
            if trainer is None:
                raise RuntimeError("CaptureCallback found no GRPOTrainer running train(); call "
                                   "callback.attach(trainer) before trainer.train()")
            self.attach(trainer)

    def on_log(self, args, state, control, logs=None, **kwargs):
        step = state.global_step
        if step in self.pending and logs and "loss" in logs:
            start = time.perf_counter()
            capture = self.pending.pop(step)
            capture["tensors"]["trainer_per_token_logps"] = self._trainer_logps(capture)
            if state.is_world_process_zero:
                self.written[step] = self._write(step, capture, dict(logs))
            self.seconds += time.perf_counter() - start

    # ---- what is kept

    def _model(self):
        return self.trainer.accelerator.unwrap_model(self.trainer.model)

    def _weights(self) -> dict[str, torch.Tensor] | None:
        model = self._model()
        size = sum(p.numel() * p.element_size() for p in model.parameters())
        if size > self.max_weight_bytes:
            return None
        return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}

    def _trainer_logps(self, capture: dict) -> torch.Tensor:
        """(N, C) the log-probs the loss of the step took, row by row in generation order (NaN: not trained on).
        Each process matches the rows its loss scored to its own share of the batch; then the shares are gathered."""
        local = capture["local"]
        rows = torch.cat([local["prompt_ids"], local["completion_ids"]], dim=1)
        out = torch.full(local["completion_ids"].shape, float("nan"))
        free = list(range(len(rows)))
        for ids, logps in capture["scored"]:
            for row_ids, row_logps in zip(ids.cpu(), logps.float().cpu()):
                match = next((j for j in free if torch.equal(rows[j], row_ids)), None)
                if match is not None:  # identical rows (same prompt and completion) are interchangeable
                    free.remove(match)
                    out[match] = row_logps
        return gathered(self.trainer, out, pad_index=float("nan"))

    def _batch(self, output: dict, weights) -> dict:
        t = self.trainer
        tensors = {k: gathered_batch_tensor(t, k, output[k]) for k in TENSORS if isinstance(output.get(k), torch.Tensor)}
        local = {k: output[k].detach().cpu() for k in ("prompt_ids", "completion_ids")}
        n = len(tensors["completion_ids"])
        rewards = {name: list(t._logs["rewards"][name])[-n:] for name in t.reward_func_names}
        weights_of = t.reward_weights.tolist() if isinstance(t.reward_weights, torch.Tensor) else list(t.reward_weights)
        return {"tensors": tensors, "weights": weights, "prompts": list(t._logs["prompt"])[-n:],
                "completions": list(t._logs["completion"])[-n:], "rewards": rewards,
                "reward_weights": dict(zip(t.reward_func_names, weights_of)),
                "advantages": list(t._logs["advantages"])[-n:], "processes": t.accelerator.num_processes,
                "local": local, "scored": []}

    def _write(self, step: int, capture: dict, logged: dict) -> Path:
        import trl
        from .trl_bridge import PositionIdsGRPOTrainer
        t, model = self.trainer, self._model()
        path = self.out_dir / f"step-{step}"
        path.mkdir(parents=True, exist_ok=True)
        torch.save(capture["tensors"], path / "batch.pt")
        reference = getattr(t, "ref_model", None)
        if capture["weights"] is not None:
            model.save_pretrained(path / "policy", state_dict=capture["weights"])
            t.processing_class.save_pretrained(path / "policy")
            policy = {"folder": "policy", "name_or_path": model.config._name_or_path}
            note = "the policy's weights before this step, and its tokenizer (`save_pretrained`)."
        else:
            policy = {"folder": None, "name_or_path": model.config._name_or_path,
                      "checkpoint_step": step - 1, "output_dir": t.args.output_dir}
            note = (f"not written: the weights are larger than {self.max_weight_bytes} bytes. Reload the "
                    f"checkpoint of step {step - 1} from `{t.args.output_dir}`.")
        meta = {"step": step, "trl_version": trl.__version__, "trainer_class": type(t).__name__,
                "position_ids": isinstance(t, PositionIdsGRPOTrainer), "policy": policy,
                "reference": {"beta": t.args.beta,  # TRL loads it frozen from the same name as the policy
                              "name_or_path": reference.config._name_or_path if reference is not None else None},
                "grpo_config": _jsonable(t.args.to_dict()), "prompts": _jsonable(capture["prompts"]),
                "completions": _jsonable(capture["completions"]), "rewards": capture["rewards"],
                "reward_weights": capture["reward_weights"], "advantages": capture["advantages"],
                "processes": capture["processes"], "logged": logged}
        (path / "capture.json").write_text(json.dumps(meta, indent=1))
        (path / "README.md").write_text(README.format(
            step=step, trl_version=trl.__version__, trainer_class=type(t).__name__,
            when=time.strftime("%Y-%m-%d %H:%M:%S"), num_generations=t.args.num_generations,
            tensors=", ".join(f"`{k}` {tuple(v.shape)}" for k, v in capture["tensors"].items()),
            policy_note=note, path=path, reference=meta["reference"]["name_or_path"] or "none (beta = 0)"))
        return path
