"""How a capture is written: the folder of one optimizer step, and the lines of the health log beside it.

A capture is a folder holding `README.md`, `capture.json` (the config, texts, rewards, metrics), `batch.pt`
(the tensors), `policy/` (weights and tokenizer, `save_pretrained`), `optimizer.safetensors` (the trainer's
optimizer state before the step, `optimizer_state.py`) and `checksums.json` (the SHA-256 of every other file, which
reading the capture verifies first). It is written into a hidden folder beside its place, TRL's log of the step
in it where TRL logs the step, and renamed into place when whole, checksums last; nothing in it changes after, so
no reader, even after a kill, sees a capture.json its checksums do not match. A disk without room for it is
refused before anything is written. The reference model (TRL has one when beta != 0) is named, not copied: TRL
loads it frozen from the policy's own name, recorded here as an absolute path where it is a local folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import torch

from ..checksums import write_checksums
from ..files import write_text_atomically
from ..kernels import kernels_in_use
from . import optimizer_state
from .lora import adapter_state, is_adapter_model, tensor_bytes, write_adapter
from .rows import random_states
from .trainer_state import FORMAT, README, jsonable, layout, policy_model, resolved_name, resolved_settings
from .trl_bridge import PositionIdsGRPOTrainer

MAX_WEIGHT_BYTES = 2 * 1024**3
HEALTH_FILE = "health.jsonl"


def write_capture(
    out_dir: Path, trainer, step: int, capture: dict, generation: dict, logged: dict, max_weight_bytes: int
) -> Path:
    """out_dir/step-<k>: written whole into a hidden folder beside it, then renamed into place; a disk without
    room for it is refused before anything is written (OSError). `capture`: what the callback recorded of the
    step; `generation`: the generation batch it trains on; `logged`: TRL's log of it (`course.logged_fields`)."""
    final = out_dir / f"step-{step}"
    check_room(out_dir, capture, generation)
    path = out_dir / f".step-{step}.partial"  # renamed to `final` once whole: no reader sees half of it
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    try:
        write_into(path, final, trainer, step, capture, generation, logged, max_weight_bytes)
        replace_folder(path, final)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    return final


def remove_partials(out_dir: Path) -> list[str]:
    """The hidden `.step-<k>.partial` and `.crash-step-<k>.partial` folders a run killed mid-capture left in
    `out_dir`, removed (called with the folder's lock held: no live run is writing them); their names. Only our
    own names, only folders, never followed through a symlink; a failure leaves them (never raises)."""
    removed = []
    try:
        found = [p for p in out_dir.iterdir() if re.fullmatch(r"\.(crash-)?step-\d+\.partial", p.name)]
    except OSError:
        return removed
    for p in found:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p.name)
    return removed


def check_room(out_dir: Path, capture: dict, generation: dict) -> None:
    """Refuse (OSError) a capture the disk has no room for: its weights, optimizer state and batch, and 10%."""
    weights = capture["weights"] or {}
    expected = sum(t.numel() * t.element_size() for t in weights.values())
    if capture.get("optimizer") is not None:
        expected += capture["optimizer"][0]["bytes"]
    expected += sum(t.numel() * t.element_size() for t in generation["tensors"].values())
    out_dir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(out_dir).free
    if free < 1.1 * expected:
        raise OSError(f"{free / 1e6:.0f} MB free in {out_dir}, the capture needs about {expected / 1e6:.0f} MB")


def write_into(
    path: Path, final: Path, trainer, step: int, capture: dict, generation: dict, logged: dict, max_weight_bytes: int
) -> None:
    """Every file of the capture in `path` (the folder it will be renamed to: `final`), checksums last."""
    import trl

    tensors = dict(generation["tensors"])
    tensors["trainer_per_token_logps"] = capture["trainer_logps"]
    states = random_states(capture["rng"], capture["ranks"])
    if states is not None:
        tensors["rng_states"] = states
    torch.save(tensors, path / "batch.pt")
    policy, note = write_policy(path, trainer, step, capture["weights"], max_weight_bytes)
    meta = {**capture_meta(trainer, step, capture, generation, policy, trl.__version__), **logged}
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
            trainer_class=type(trainer).__name__,
            when=time.strftime("%Y-%m-%d %H:%M:%S"),
            num_generations=trainer.args.num_generations,
            tensors=", ".join(f"`{k}` {tuple(v.shape)}" for k, v in tensors.items()),
            policy_note=note,
            path=final.resolve(),
            reference=meta["reference"]["name_or_path"] or "none (beta = 0)",
            optimizer_note=optimizer_note(meta.get("optimizer")),
        )
        + trigger_note(capture["trigger"]),
    )
    write_checksums(path)  # last: every file the capture wrote, which reading it verifies first


def kept_weights(model, max_weight_bytes: int) -> dict[str, torch.Tensor] | None:
    """A CPU copy of the policy's weights as they are (before the optimizer steps), None past `max_weight_bytes`."""
    if is_adapter_model(model):  # a LoRA run (`peft_config`): the adapter alone, the base named (`lora.py`)
        weights = adapter_state(model)
        return weights if tensor_bytes(weights) <= max_weight_bytes else None
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    if size > max_weight_bytes:
        return None
    return _copied(model.state_dict())


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


def write_policy(path: Path, trainer, step: int, weights: dict | None, max_weight_bytes: int) -> tuple[dict, str]:
    """The policy's weights and tokenizer in `path/policy` (or where to reload them, past max_weight_bytes):
    capture.json's `policy` entry and the README's note."""
    model = policy_model(trainer)
    name = resolved_name(model.config._name_or_path)
    if weights is not None and is_adapter_model(model):
        return write_adapter(model, trainer.processing_class, path / "policy", weights, step)
    trainable = trainable_names(model)
    if weights is not None:
        model.save_pretrained(path / "policy", state_dict=weights)
        trainer.processing_class.save_pretrained(path / "policy")
        note = f"the policy's weights before optimizer step {step}, and its tokenizer (`save_pretrained`)."
        return {"folder": "policy", "name_or_path": name, "trainable": trainable}, note
    output_dir = str(Path(trainer.args.output_dir).resolve())
    note = (
        f"not written: the weights are larger than {max_weight_bytes} bytes. Reload the "
        f"checkpoint of step {step - 1} from `{trainer.args.output_dir}`."
    )
    entry = {"folder": None, "name_or_path": name, "checkpoint_step": step - 1, "output_dir": output_dir}
    return {**entry, "trainable": trainable}, note


def trainable_names(model) -> list[str] | None:
    """The parameters the run trains, by name (`requires_grad`), or None where it trains all of them: a run that
    froze part of its model is replayed with the same part frozen (`captured_inputs.captured_models`)."""
    params = list(model.named_parameters())
    trainable = [n for n, p in params if p.requires_grad]
    return None if len(trainable) == len(params) else trainable


def capture_meta(trainer, step: int, capture: dict, generation: dict, policy: dict, trl_version: str) -> dict:
    """capture.json: the trainer, its config and settings, the batch's texts and rewards, the schedule."""
    t, model = trainer, policy_model(trainer)
    reference = getattr(t, "ref_model", None)
    if reference is None and t.beta != 0 and is_adapter_model(model):
        reference = model.get_base_model()  # TRL's reference: the model with its adapter disabled, the base
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
        "columns": generation.get("columns", {}),  # the dataset's columns TRL passed to the reward functions
        "columns_dropped": generation.get("columns_dropped", {}),
        "advantages": jsonable(generation["advantages"]),
        "processes": generation["processes"],
        "schedule": schedule(t, capture, generation),
        "step_metrics": jsonable(capture["step_metrics"]),
        "trigger": jsonable(capture["trigger"]) or None,  # why FlightRecorder wrote it; None: it was asked for
        "run": capture.get("run"),  # the recorder's id of the run: two captures of one run share it
        "kernels": kernels_in_use(),
    }


def schedule(trainer, capture: dict, generation: dict) -> dict:
    """capture.json's `schedule`: the step's micro-batches (rows, pass) and the layout that made them; in several
    processes each one's own schedule, in process order."""
    S, mu, GA = layout(trainer)
    out = {
        "micro_batches": capture["micro_batches"],
        "steps_per_generation": S,
        "num_iterations": mu,
        "gradient_accumulation_steps": GA,
        "generation_first_step": generation["first_step"],
        "forwards": len(capture["rng"]),
    }
    if capture["ranks"] is not None:  # several processes: each one's own schedule, in process order
        del out["micro_batches"], out["forwards"]
        out["ranks"] = [{k: v for k, v in rank.items() if k != "rng"} for rank in capture["ranks"]]
    return out


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


def could_be_folder(path: Path) -> bool:
    """`path` is a folder, or could be made one: the nearest part of it that exists is a folder (not a file)."""
    existing = next((p for p in (path, *path.absolute().parents) if p.exists()), None)
    return existing is None or existing.is_dir()


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


def append_line(path: Path, record: dict) -> None:
    """One JSON line appended and on disk before this returns: a run killed after it keeps the line. A write that
    fails part-way (a full disk) is cut back to where the file ended, so that no torn line stays for the next one to
    be appended onto (OSError, as the write's); a file that ended without its newline (a run killed mid-line) gets
    one first, so that the new line stands on its own. A symlink is not followed (OSError)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(record, allow_nan=False) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        end = os.fstat(fd).st_size
        if end and os.pread(fd, 1, end - 1) != b"\n":
            data = b"\n" + data
        try:
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
            os.fsync(fd)
        except OSError:
            try:
                os.ftruncate(fd, end)
            except OSError:
                pass
            raise
    finally:
        os.close(fd)
