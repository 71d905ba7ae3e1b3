"""A captured TRL step (`grpo_debug.capture`) read from disk and checked, and the `StepConfig` it implies.

A capture is a file from outside: `load_capture` verifies the SHA-256 of every file it wrote (`checksums.json`)
before parsing any, reads tensors with `weights_only=True` and checks every piece (files, JSON, tensor names,
shapes, masks, NaN, the schedule, the random states, and the policy folder as `model_folder` checks a model,
before any model is built); a problem names the file. The config
is the `trl` preset with the capture's own `GRPOConfig` settings, None values resolved as the trainer
resolved them (`config_from_capture`).

Opened as a step's inputs: a capture's batch as the step's rollout, and its rewards as a task: the stored values (`StoredReward`),
or your own reward functions (`task=[f, g]`, `task="my_rewards.py:funcs"`, or a registered task name), which
can also score new completions.
"""

from __future__ import annotations

import json
import math
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from ..choices import SAME_NAME as TRL_SAME_NAME
from ..config import StepConfig
from ..files import MAX_READ_BYTES, read_bounded
from ..model import LoadedModel, ModelUnavailable, load_model
from ..rewards import StoredReward
from ..rollout import Rollout
from ..task import Task, callable_name, import_user_file, load_task, register_task, task_names
from . import optimizer_state
from .checksums import checksum_problem
from .lora import check_adapter_capture, load_adapter_capture
from .model_folder import check_model_folder
from .optimizer_schema import optimizer_problem
from .trainer_state import FORMAT

# GRPOConfig fields read back under the same StepConfig name: the bridge's own list, plus sampling,
# batch layout and optimiser fields it sets explicitly
SAME_NAME = TRL_SAME_NAME + (
    "steps_per_generation",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "num_generations",
    "learning_rate",
    "max_grad_norm",
    "weight_decay",
    "seed",
)
REQUIRED = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "trainer_per_token_logps")


class CaptureError(ValueError):
    """A capture folder that cannot be opened: the message names the file and the problem."""


@dataclass(frozen=True)
class Capture:
    path: Path
    meta: dict  # capture.json
    batch: dict[str, torch.Tensor]  # batch.pt
    optimizer_file: Path | None = None  # optimizer.safetensors (`optimizer_state`), if written

    @property
    def optimizer_tensors(self) -> dict[str, torch.Tensor] | None:
        """The trainer's optimizer state, read from its file at each call (checked when the capture was read):
        a fresh copy the caller owns, and no copy held between updates."""
        if self.optimizer_file is None:
            return None
        try:
            return optimizer_state.read(self.path, self.meta["optimizer"])
        except Exception as e:  # safetensors refuses a damaged header in several ways
            raise CaptureError(f"{self.optimizer_file} cannot be read as tensors ({type(e).__name__}: {e})") from None

    @property
    def num_samples(self) -> int:
        return len(self.batch["completion_ids"])

    @property
    def schedule(self) -> dict | None:
        """The captured optimizer step's micro-batches (rows of the generation batch) and pass: `micro_batches`
        in a one-process capture; `ranks`, each process's own (its micro-batches, losses and widths), in a
        multi-process one. None for a capture written before format 2, or a multi-process capture written
        before each process's schedule was recorded."""
        return self.meta.get("schedule")

    @property
    def step_metrics(self) -> dict:
        """The step's own numbers from the trainer (format 2), else what TRL logged at the step."""
        return self.meta.get("step_metrics") or self.meta.get("logged") or {}

    @property
    def logged_kl(self) -> list[tuple[int, float]]:
        """[(step, kl)] as TRL logged them up to the captured step (the last 50; empty before this was recorded,
        or where beta = 0)."""
        return [(int(step), float(kl)) for step, kl in self.meta.get("logged_kl", [])]

    @property
    def logged_history(self) -> list[dict]:
        """[{"step": k, "kl": ..., "completions/clipped_ratio": ...}] as TRL logged them up to the captured step
        (`trainer_state.HISTORY_KEYS`; empty in a capture recorded before this was kept)."""
        return [dict(h) for h in self.meta.get("logged_history", [])]

    @property
    def step_metrics_source(self) -> str:
        """What `step_metrics` are: the trainer's own numbers for this one step, or what TRL logged (an
        average over its logging window, `logging_steps` defaults to 10)."""
        if self.meta.get("step_metrics"):
            return "trainer's step metrics"
        return "TRL logged" if self.meta.get("logged") else "nothing recorded"

    @property
    def conversational(self) -> bool:
        return bool(self.meta["prompts"]) and isinstance(self.meta["prompts"][0], list)


# ---- reading and checking a capture


def load_capture(path: str | Path) -> Capture:
    path = Path(path)
    if not path.is_dir():
        raise CaptureError(f"{path} is not a capture: no such folder (CaptureCallback writes step-<k>/ folders)")
    for name in ("capture.json", "batch.pt"):
        if not (path / name).is_file():
            raise CaptureError(f"{path} is not a capture: no {name} (CaptureCallback writes step-<k>/ folders)")
    problem = checksum_problem(path)  # before any file is parsed: what the capture wrote, unchanged
    if problem:
        raise CaptureError(problem)
    try:
        meta = json.loads(read_bounded(path / "capture.json", MAX_READ_BYTES))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CaptureError(f"{path / 'capture.json'} is not valid JSON: {e}") from None
    except ValueError as e:  # past its bound
        raise CaptureError(str(e)) from None
    try:
        with zipfile.ZipFile(path / "batch.pt") as archive:  # torch.save's format: the CRCs catch a corrupted byte
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError) as e:
        raise CaptureError(f"{path / 'batch.pt'} is not a torch.save archive ({e})") from None
    if bad is not None:
        raise CaptureError(f"{path / 'batch.pt'} is corrupted: {bad} fails its checksum")
    try:
        batch = torch.load(path / "batch.pt", weights_only=True, map_location="cpu")
    except Exception as e:  # a truncated or edited file fails in many ways inside torch
        raise CaptureError(f"{path / 'batch.pt'} cannot be read as tensors ({type(e).__name__}: {e})") from None
    capture = Capture(path, meta, batch, _optimizer_file(path, meta))
    check_capture(capture)
    return capture


def _optimizer_file(path: Path, meta) -> Path | None:
    """optimizer.safetensors, where capture.json has an `optimizer` entry (its tensors are checked with the rest)."""
    if not isinstance(meta, dict) or meta.get("optimizer") is None:
        return None
    entry = meta["optimizer"]
    name = entry.get("file") if isinstance(entry, dict) else None
    _need(
        name == optimizer_state.FILE, path / "capture.json", f"optimizer.file = {name!r}, not {optimizer_state.FILE!r}"
    )
    _need((path / name).is_file(), path / name, "missing (capture.json has an 'optimizer' entry)")
    return path / name


def _need(ok: bool, where: Path, problem: str) -> None:
    if not ok:
        raise CaptureError(f"{where}: {problem}")


def check_capture(capture: Capture) -> None:
    """Refuse a damaged or edited capture before anything is built, naming the file and the problem."""
    meta, b, path = capture.meta, capture.batch, capture.path
    js, pt = path / "capture.json", path / "batch.pt"
    g, G = _check_meta(meta, js)
    N = _check_batch(b, pt, meta, js, g, G)
    _check_rows_and_schedule(meta, b, js, pt, N)
    check_policy_folder(capture)
    if meta.get("optimizer") is not None:  # its tensors against the weights' headers, checked just above
        problem = optimizer_problem(path, meta, capture.optimizer_tensors)
        if problem:
            raise CaptureError(problem)


def _check_meta(meta, js: Path) -> tuple[dict, int]:
    """capture.json's entries and their types; its grpo_config and num_generations."""
    _need(isinstance(meta, dict), js, "not a JSON object")
    version = meta.get("format")
    _need(
        type(version) is int and 3 <= version <= FORMAT,
        js,
        f"format {version!r}: this release reads capture formats 3 to {FORMAT} (the format with checksums.json on)",
    )
    for key in ("step", "grpo_config", "prompts", "completions", "rewards", "reward_weights", "policy", "reference"):
        _need(key in meta, js, f"no {key!r} entry")
    kinds = {"grpo_config": dict, "prompts": list, "completions": list, "rewards": dict, "reward_weights": dict}
    kinds.update(policy=dict, reference=dict)
    for key, kind in kinds.items():
        _need(isinstance(meta[key], kind), js, f"{key!r} is not a JSON {'object' if kind is dict else 'list'}")
    _need(isinstance(meta["step"], int), js, f"step = {meta['step']!r} is not an integer")
    number = (int, float)
    for name, values in meta["rewards"].items():
        ok = isinstance(values, list) and all(v is None or isinstance(v, number) for v in values)
        _need(ok, js, f"rewards of {name!r} are not a list of numbers (or null)")
    for name, w in meta["reward_weights"].items():
        _need(
            isinstance(w, number) and not isinstance(w, bool), js, f"reward weight of {name!r} = {w!r} is not a number"
        )
    history = meta.get("logged_kl", [])
    ok = isinstance(history, list) and all(
        isinstance(h, list) and len(h) == 2 and type(h[0]) is int and isinstance(h[1], number) and math.isfinite(h[1])
        for h in history
    )
    _need(ok, js, "logged_kl is not a list of [step, kl] pairs")
    history = meta.get("logged_history", [])
    ok = isinstance(history, list) and all(
        isinstance(h, dict)
        and type(h.get("step")) is int
        and all(isinstance(v, number) and not isinstance(v, bool) and math.isfinite(v) for v in h.values())
        for h in history
    )
    _need(ok, js, "logged_history is not a list of {step, name: finite number} records")
    g = meta["grpo_config"]
    for key in ("num_generations", "max_completion_length", "epsilon", "disable_dropout", "loss_type", "beta"):
        _need(key in g, js, f"grpo_config has no {key!r}")
    G = g["num_generations"]
    _need(isinstance(G, int) and G >= 1, js, f"num_generations = {G!r} is not a positive integer")
    return g, G


def _check_batch(b, pt: Path, meta: dict, js: Path, g: dict, G: int) -> int:
    """batch.pt's tensors: present, integer ids, shapes that agree, groups of G, finite where read; N rows."""
    _need(isinstance(b, dict), pt, "not a dict of tensors")
    for name in REQUIRED:
        _need(isinstance(b.get(name), torch.Tensor), pt, f"no tensor {name!r}")
    for name in ("prompt_ids", "completion_ids", "prompt_mask", "completion_mask"):
        _need(
            not b[name].is_floating_point() and not b[name].is_complex(),
            pt,
            f"{name} holds {b[name].dtype}, not integers",
        )
    N, C = b["completion_ids"].shape if b["completion_ids"].dim() == 2 else (-1, -1)
    _need(N > 0, pt, f"completion_ids has shape {tuple(b['completion_ids'].shape)}, not (N, C)")
    P = b["prompt_ids"].shape[1] if b["prompt_ids"].dim() == 2 else -1
    shapes = {
        "prompt_ids": (N, P),
        "prompt_mask": (N, P),
        "completion_mask": (N, C),
        "advantages": (N,),
        "trainer_per_token_logps": (N, C),
        "old_per_token_logps": (N, C),
        "ref_per_token_logps": (N, C),
        "sampling_per_token_logps": (N, C),
    }
    for name, shape in shapes.items():
        if name in b:
            _need(tuple(b[name].shape) == shape, pt, f"{name} has shape {tuple(b[name].shape)}, expected {shape}")
    _need(N % G == 0, pt, f"{N} rows are not groups of num_generations = {G}")
    _need(
        len(meta["completions"]) == N and len(meta["prompts"]) == N,
        js,
        f"{len(meta['prompts'])} prompts and {len(meta['completions'])} completions for {N} rows in batch.pt",
    )
    for name in ("prompt_mask", "completion_mask"):
        _need(bool(((b[name] == 0) | (b[name] == 1)).all()), pt, f"{name} holds values other than 0 and 1")
    mask = b["completion_mask"].bool()
    _need(
        bool(mask.any(1).all()) or g.get("mask_truncated_completions") is True,
        pt,
        "completion_mask has rows with no token, which TRL writes only under mask_truncated_completions",
    )
    _need(bool(b["advantages"].isfinite().all()), pt, "advantages hold NaN or inf")
    for name in ("old_per_token_logps", "ref_per_token_logps", "sampling_per_token_logps"):
        if name in b:
            _need(bool(b[name][mask].isfinite().all()), pt, f"{name} holds NaN or inf on completion tokens")
    trainer = b["trainer_per_token_logps"]
    scored_rows = trainer.isfinite().any(1)
    _need(
        bool(trainer[scored_rows][mask[scored_rows]].isfinite().all()),
        pt,
        "trainer_per_token_logps holds NaN or inf on completion tokens of a row the trainer scored",
    )
    return N


def _check_rows_and_schedule(meta: dict, b: dict, js: Path, pt: Path, N: int) -> None:
    """One reward per row, weights naming the reward functions, a schedule of distinct rows and CPU states."""
    for name, values in meta["rewards"].items():
        _need(isinstance(values, list) and len(values) == N, js, f"rewards of {name!r} are not one per row")
    _need(set(meta["reward_weights"]) == set(meta["rewards"]), js, "reward_weights do not name the reward functions")
    schedule = meta.get("schedule")
    if schedule is None:
        return
    _need(isinstance(schedule, dict), js, "'schedule' is not a JSON object")
    first = schedule.get("generation_first_step")
    _need(isinstance(first, int) and not isinstance(first, bool), js, "schedule.generation_first_step is not a step")
    for key in ("steps_per_generation", "num_iterations", "gradient_accumulation_steps", "forwards"):
        value = schedule.get(key, 1)
        _need(_count(value), js, f"schedule.{key} = {value!r} is not a positive integer")
    if "ranks" in schedule:
        _check_ranks(schedule["ranks"], meta, js, N, (b["prompt_ids"].shape[1], b["completion_ids"].shape[1]))
    else:
        _need(_micro_batches_shaped(schedule.get("micro_batches")), js, _SHAPE)
        rows = [r for mb in schedule["micro_batches"] for r in mb["rows"]]
        _need(bool(rows) and _distinct_rows(rows, 0, N), js, "schedule rows are not distinct rows of the batch")
        _check_layout(schedule, js, N)
    if "rng_states" in b:
        _check_random_states(b["rng_states"], schedule, pt)


_SHAPE = "'schedule' is not {micro_batches: [{rows: [...]}, ...]}"


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _check_layout(schedule: dict, js: Path, N: int) -> None:
    """One process: the optimizer step is `gradient_accumulation_steps` micro-batches, each a 1/S share of the
    generation batch (TRL splits its N rows into S = steps_per_generation equal micro-batches per pass), with its
    pass in [0, num_iterations) and its index in [0, S): a micro-batch that skips a row is refused."""
    S = schedule.get("steps_per_generation")
    mu, GA = schedule.get("num_iterations"), schedule.get("gradient_accumulation_steps")
    micro = schedule["micro_batches"]
    if S is None or GA is None:  # written before the layout was recorded
        return
    _need(len(micro) == GA, js, f"the schedule has {len(micro)} micro-batches for gradient_accumulation_steps {GA}")
    if N % S == 0:
        sizes = sorted({len(mb["rows"]) for mb in micro})
        _need(sizes == [N // S], js, f"schedule micro-batches of {sizes} rows: each is {N // S} ({N} rows / S = {S})")
    for mb in micro:
        for key, high in (("pass", mu or 1), ("index", S)):
            value = mb.get(key, 0)
            ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < high
            _need(ok, js, f"a schedule micro-batch's {key} = {value!r} is outside 0 to {high - 1}")


def _micro_batches_shaped(micro) -> bool:
    return isinstance(micro, list) and all(isinstance(mb, dict) and isinstance(mb.get("rows"), list) for mb in micro)


def _distinct_rows(rows: list, low: int, high: int) -> bool:
    """Every row an integer in [low, high), none twice."""
    return all(isinstance(r, int) and not isinstance(r, bool) and low <= r < high for r in rows) and len(
        set(rows)
    ) == len(rows)


def _check_ranks(ranks, meta: dict, js: Path, N: int, widths: tuple[int, int]) -> None:
    """A multi-process schedule: one entry per process, each with micro-batches of rows inside its own share of
    the generation batch (process r holds rows r*N/P .. (r+1)*N/P - 1, as the gather concatenates them), one
    loss per micro-batch, as many micro-batches as every other process, and widths that fit the batch's
    (`widths`: batch.pt's prompt and completion widths)."""
    P = meta.get("processes")
    _need(
        isinstance(ranks, list) and len(ranks) >= 2 and isinstance(P, int) and P == len(ranks),
        js,
        f"schedule.ranks is not one entry per process (processes = {P!r})",
    )
    _need(N % P == 0, js, f"{N} rows cannot be {P} processes' equal shares")
    share = N // P
    for r, rank in enumerate(ranks):
        _need(isinstance(rank, dict) and _micro_batches_shaped(rank.get("micro_batches")), js, f"process {r}: {_SHAPE}")
        rows = [i for mb in rank["micro_batches"] for i in mb["rows"]]
        _need(
            bool(rows) and _distinct_rows(rows, r * share, (r + 1) * share),
            js,
            f"process {r}'s schedule rows are not distinct rows of its share (rows {r * share} to {(r + 1) * share - 1})",
        )
        losses = rank.get("losses")
        _need(
            isinstance(losses, list)
            and len(losses) == len(rank["micro_batches"])
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in losses),
            js,
            f"process {r}'s losses are not one number per micro-batch",
        )
        for key, most in zip(("prompt_width", "completion_width"), widths):
            value = rank.get(key)
            ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= most
            _need(ok, js, f"process {r}'s {key} = {value!r} is not a width from 1 to the batch's {most}")
    counts = {len(rank["micro_batches"]) for rank in ranks}
    _need(len(counts) == 1, js, f"the processes have different numbers of micro-batches ({sorted(counts)})")


def _check_random_states(states, schedule: dict, pt: Path) -> None:
    """(M, S) CPU random states, one per forward, in one process; (P, M, S) in several."""
    S = torch.get_rng_state().numel()
    ranks = schedule.get("ranks")
    dims = 2 if ranks is None else 3
    _need(
        isinstance(states, torch.Tensor)
        and states.dtype == torch.uint8
        and states.dim() == dims
        and states.shape[-1] == S,
        pt,
        "rng_states are not CPU random states" + ("" if ranks is None else " (P, M, S), process by process"),
    )
    per_process = [schedule["micro_batches"]] if ranks is None else [rank["micro_batches"] for rank in ranks]
    wanted = (len(per_process), len(per_process[0]))  # processes, micro-batches each
    have = (1, states.shape[0]) if ranks is None else tuple(states.shape[:2])
    _need(
        have[0] == wanted[0] and have[1] >= wanted[1],
        pt,
        f"rng_states hold {have[1]} forwards for each of {have[0]} processes, fewer than the {wanted[1]} "
        f"micro-batches of each of {wanted[0]}",
    )


def check_policy_folder(capture: Capture) -> None:
    """The policy folder, inside the capture, checked before any model is built (`model_folder`): its config
    against its stored weights' headers, bounded by them, floating and finite weights, a tokenizer; then the
    batch's token ids against the config's vocabulary. A LoRA capture: its base and adapter (`lora.py`)."""
    folder_name = capture.meta["policy"].get("folder")
    if folder_name is not None and capture.meta["policy"].get("adapter"):
        _check_vocabulary(capture, check_adapter_capture(capture.path, capture.meta["policy"], CaptureError))
        return
    if folder_name is None:
        raise CaptureError(
            f"{capture.path} holds no weights ({capture.meta['policy']}): reload that checkpoint and "
            f"save it to {capture.path / 'policy'} with save_pretrained"
        )
    folder = capture.path / str(folder_name)
    inside = capture.path.resolve()
    _need(
        folder.resolve().is_relative_to(inside) and folder.resolve() != inside,
        capture.path / "capture.json",
        f"policy.folder {folder_name!r} is not a folder inside the capture",
    )
    _check_vocabulary(capture, check_model_folder(folder, CaptureError))


def _check_vocabulary(capture: Capture, config) -> None:
    vocab = getattr(config, "vocab_size", None)
    b = capture.batch
    if vocab:
        for name in ("prompt_ids", "completion_ids"):
            _need(
                bool(((b[name] >= 0) & (b[name] < vocab)).all()),
                capture.path / "batch.pt",
                f"{name} holds token ids outside the model's vocabulary of {vocab}",
            )


# ---- the config


def resolved_grpo_config(capture: Capture) -> dict:
    """The GRPOConfig as the trainer ran it: None values resolved as TRL resolves them at run time
    (epsilon_high -> epsilon, steps_per_generation -> gradient_accumulation_steps), or read from the values
    the trainer itself recorded (`resolved`, format 2)."""
    g = dict(capture.meta["grpo_config"])
    resolved = capture.meta.get("resolved") or {}
    if g.get("epsilon_high") is None:
        g["epsilon_high"] = resolved.get("epsilon_high", g["epsilon"])
    if g.get("steps_per_generation") is None:
        g["steps_per_generation"] = resolved.get("steps_per_generation", g.get("gradient_accumulation_steps", 1))
    if g.get("bf16") is None:
        g["bf16"] = resolved.get("mixed_precision") == "bf16" if resolved else not g.get("fp16", False)
    return g


def config_from_capture(capture: Capture, **changes) -> StepConfig:
    """The `trl` preset with the capture's GRPOConfig: sampling, loss, batch layout and optimiser settings,
    dropout (`disable_dropout`), precision (`bf16`), the KL estimator (`use_bias_correction_kl`), and
    position_ids where the trainer passed them (`PositionIdsGRPOTrainer`). `changes` apply after."""
    g, meta = resolved_grpo_config(capture), capture.meta
    if task_name(capture) not in task_names():  # a StepConfig.task choice from here on; `open_capture` fills it

        def not_opened():
            raise RuntimeError(f"{task_name(capture)}: open the capture (open_capture) for its task")

        register_task(task_name(capture), not_opened)
    fields = {k: g[k] for k in SAME_NAME if k in g and g[k] is not None}
    dropout = not g["disable_dropout"]
    fields.update(
        model=str(capture.path.resolve() / capture.meta["policy"]["folder"]),
        task=task_name(capture),
        num_prompts=capture.num_samples // g["num_generations"],
        max_new_tokens=g["max_completion_length"],
        epsilon_low=g["epsilon"],
        kl_estimator="k3_corrected" if g.get("use_bias_correction_kl") else "k3",
        dropout=dropout,
        sample_dropout=dropout,
        position_ids=meta["position_ids"],
        dtype="bfloat16" if g.get("bf16") else "float32",
        vllm_importance_sampling_correction=bool(g.get("use_vllm") and g.get("vllm_importance_sampling_correction")),
        per_sample_grad_norms=False,
        fast=_model_type(capture) == "gpt2" and not dropout,
    )
    try:
        captured = StepConfig.preset("trl", **fields)
    except ValueError as e:
        raise CaptureError(f"{capture.path / 'capture.json'}: its GRPOConfig has no StepConfig here: {e}") from None
    try:
        return captured.replace(**changes)
    except (ValueError, TypeError) as e:  # the caller's change, not the capture, is at fault
        raise ValueError(f"your change to the captured step ({', '.join(map(str, changes))}): {e}") from None


def _model_type(capture: Capture) -> str:
    policy = capture.meta["policy"]
    folder = Path(policy["base"]["folder"]) if policy.get("adapter") else capture.path / policy["folder"]
    return json.loads((folder / "config.json").read_text()).get("model_type", "")


def task_name(capture: Capture) -> str:
    return f"capture:{capture.path.resolve()}"


# ---- the rewards: stored, or your own functions


# ---- a capture as the step's inputs


def captured_texts(capture: Capture, tokenizer) -> tuple[list[str], list[str]]:
    """The B prompts and B*G completions as our rollout decodes them (special tokens removed)."""
    b, G = capture.batch, capture.meta["grpo_config"]["num_generations"]
    prompts = [
        tokenizer.decode(ids[m.bool()], skip_special_tokens=True)
        for ids, m in zip(b["prompt_ids"][::G], b["prompt_mask"][::G])
    ]
    completions = [
        tokenizer.decode(ids[m.bool()], skip_special_tokens=True)
        for ids, m in zip(b["completion_ids"], b["completion_mask"])
    ]
    return prompts, completions


def reward_functions(spec) -> list:
    """Your reward functions: a list of callables, or "file.py:name" naming one function or a list of them."""
    if callable(spec):
        return [spec]
    if isinstance(spec, (list, tuple)) and spec and all(callable(f) for f in spec):
        return list(spec)
    if isinstance(spec, str) and ".py:" in spec:
        file, _, name = spec.rpartition(":")
        if not Path(file).is_file():
            raise ValueError(f"task {spec!r}: no file {file}")
        module = import_user_file(file, f"task {spec!r}")
        if not hasattr(module, name):
            raise ValueError(f"task {spec!r}: {file} defines no {name!r}")
        return reward_functions(getattr(module, name))
    raise ValueError(f"task must be a registered task name, a Task, reward functions or 'file.py:name', got {spec!r}")


def _as_messages(func, prompt_messages: dict[str, list]):
    """`func` called as TRL calls it in a conversational run: message lists, not strings."""

    def reward(prompts, completions, **kwargs):
        return func(
            prompts=[prompt_messages.get(p, [{"role": "user", "content": p}]) for p in prompts],
            completions=[[{"role": "assistant", "content": c}] for c in completions],
            **kwargs,
        )

    reward.__name__ = callable_name(func)
    return reward


def captured_task(capture: Capture, tokenizer, rewards_from=None) -> Task:
    """The capture as a task: its train prompts are the captured prompts. Without `rewards_from` its reward
    functions replay the stored values (the captured completions only). With your task or reward functions, new
    completions (evaluation, validation sets) are rewarded too; a Task also brings its validation and test
    prompts. In a conversational capture, your functions get message lists, as TRL gave them."""
    prompts, completions = captured_texts(capture, tokenizer)
    names = list(capture.meta["rewards"])
    weights = [capture.meta["reward_weights"][name] for name in names]
    has_sets = isinstance(rewards_from, Task) or (isinstance(rewards_from, str) and ".py:" not in rewards_from)
    yours = _your_task(capture, rewards_from, prompts, weights)
    prompt_set = _prompt_sets(prompts, yours, has_sets)
    if yours is None:
        funcs = tuple(_stored_rewards(capture, prompts, completions))
        return Task(task_name(capture), prompt_set, funcs, tuple(weights), held_out=False)
    theirs = list(yours.reward_weights or [1.0] * len(yours.reward_funcs))
    if list(yours.reward_names) != names or theirs != weights:
        raise ValueError(
            f"{yours.name!r} has the reward functions {list(yours.reward_names)} weighted {theirs}; "
            f"the captured run had {names} weighted {weights}: not the run's reward functions"
        )
    return Task(
        name=task_name(capture),
        prompts=prompt_set,
        reward_funcs=yours.reward_funcs,
        reward_weights=tuple(weights),
        held_out=has_sets and yours.held_out,
    )


def _your_task(capture: Capture, rewards_from, prompts: list[str], weights: list[float]) -> Task | None:
    """`rewards_from` as a Task: a registered task's name, a Task, or your reward functions (given message lists
    where the capture is conversational); None without it."""
    if isinstance(rewards_from, str) and ".py:" not in rewards_from:
        try:
            return load_task(rewards_from)
        except ValueError:
            names = ", ".join(n for n in task_names() if not n.startswith("capture:"))
            raise ValueError(
                f"task {rewards_from!r} is neither a registered task ({names}) nor "
                "'file.py:NAME' naming your reward functions; pass the functions themselves "
                "(task=[f, g]) or register a Task (grpo_debug.task.register_task)"
            ) from None
    if isinstance(rewards_from, Task) or rewards_from is None:
        return rewards_from
    funcs = reward_functions(rewards_from)
    if capture.conversational:
        G = capture.meta["grpo_config"]["num_generations"]
        messages = {p: capture.meta["prompts"][i * G] for i, p in enumerate(prompts)}
        funcs = [_as_messages(f, messages) for f in funcs]
    return Task(
        name="your reward functions",
        prompts=lambda s, n: prompts[:n],
        reward_funcs=tuple(funcs),
        reward_weights=tuple(weights),
    )


def _prompt_sets(prompts: list[str], yours: Task | None, has_sets: bool):
    """The captured task's prompt sets: the captured train prompts, your task's other sets where it has them,
    the train prompts repeated (said once) for your reward functions alone, else a clear refusal."""
    told = []

    def prompt_set(name: str, n: int) -> list[str]:
        if name == "train" and n <= len(prompts):
            return prompts[:n]
        if has_sets and name != "train":
            return yours.prompts(name, n)
        if yours is not None and name != "train":  # your reward functions, no prompt sets of yours
            if not told:
                told.append(name)
                warnings.warn(
                    f"the capture has no {name} prompts of its own: new completions are sampled on its "
                    f"{len(prompts)} train prompts, repeated (open it with a Task for separate sets)",
                    stacklevel=2,
                )
            return [prompts[i % len(prompts)] for i in range(n)]
        raise ValueError(
            f"a capture holds its own {len(prompts)} train prompts only, not {n} {name!r} prompts: to "
            "sample new completions on other prompts, open it with a task that has them, "
            "open_capture(path, task=NAME)"
        )

    return prompt_set


def _stored_rewards(capture: Capture, prompts: list[str], completions: list[str]) -> list[StoredReward]:
    """One reward function per captured reward, replaying its stored value of each (prompt, completion)."""
    G = capture.meta["grpo_config"]["num_generations"]
    funcs = []
    for name, values in capture.meta["rewards"].items():
        table = {
            (prompts[i // G], c): (None if v is None or (isinstance(v, float) and math.isnan(v)) else v)
            for i, (c, v) in enumerate(zip(completions, values))
        }
        funcs.append(StoredReward(name, table))
    return funcs


def captured_rollout(capture: Capture, tokenizer):
    """The captured batch as a Rollout. The sampler's log-probs are the engine's (`sampling_per_token_logps`)
    where one generated, else the trainer's own scoring (NaN rows, not trained on at this step, as 0)."""

    b, G = capture.batch, capture.meta["grpo_config"]["num_generations"]
    prompts, completions = captured_texts(capture, tokenizer)
    lengths = b["completion_mask"].sum(1).long()
    lengths = lengths.masked_fill(lengths == 0, b["completion_ids"].shape[1])  # mask_truncated_completions: no EOS
    last = b["completion_ids"].gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    sampler = b.get("sampling_per_token_logps", b.get("old_per_token_logps", b["trainer_per_token_logps"]))
    sampler = sampler.float().nan_to_num(0.0)
    groups = [g for g in range(len(prompts)) if len(set(completions[g * G : (g + 1) * G])) == 1]
    return Rollout(
        prompts=prompts,
        completions=completions,
        prompt_ids=b["prompt_ids"],
        prompt_mask=b["prompt_mask"],
        completion_ids=b["completion_ids"],
        completion_lengths=lengths,
        finished=(last == tokenizer.eos_token_id) & (lengths > 0),
        sampler_logps=sampler * b["completion_mask"],
        sampler_logps_temperature_only=sampler * b["completion_mask"],
        num_generations=G,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        identical_groups=groups,
        seconds=0.0,
    )


def _check_tokenizer(capture: Capture, tokenizer) -> None:
    if len(tokenizer) <= int(capture.batch["completion_ids"].max()):
        raise CaptureError(
            f"{capture.path / 'policy'}: its tokenizer has {len(tokenizer)} tokens, fewer than the "
            "batch's token ids need"
        )


def captured_models(capture: Capture) -> tuple[LoadedModel, bool]:
    """The captured policy (its weights before the step) and TRL's frozen reference, loaded as TRL loaded it
    (beta != 0), else the policy's own copy; and whether that copy is it (beta = 0: TRL has no reference).
    A LoRA capture: the base with the adapter, and the base as the reference (`lora.load_adapter_capture`)."""
    if capture.meta["policy"].get("adapter"):
        loaded, at_reference = load_adapter_capture(
            capture.path, capture.meta["policy"], capture.meta["reference"]["beta"]
        )
        _check_tokenizer(capture, loaded.tokenizer)
        return loaded, at_reference
    reference_name = capture.meta["reference"]["name_or_path"]
    policy_folder = str(capture.path.resolve() / capture.meta["policy"]["folder"])
    loaded = load_model(policy_folder, reference=reference_name is None)  # beta = 0: its start is the reference
    _check_tokenizer(capture, loaded.tokenizer)
    if reference_name is None:
        return loaded, True
    if Path(str(reference_name)).is_dir():  # a local folder from outside the capture: checked like the policy's
        check_model_folder(reference_name, CaptureError)
    try:
        reference = load_model(reference_name, hub=False, reference=False).policy  # from a file: never downloaded
    except ModelUnavailable as e:
        reason = str(e).splitlines()[0]
        raise CaptureError(
            f"{capture.path / 'capture.json'}: the run's reference model {reference_name!r} is not here "
            f"({reason}); copy it to that path, or point the capture at the folder holding it: set "
            f"reference.name_or_path in capture.json, then reseal the capture (python -m grpo_debug reseal "
            f"{capture.path}: its checksums then trust the capture as you edited it)"
        ) from None
    reference.requires_grad_(False)
    return LoadedModel(loaded.policy, reference, loaded.tokenizer, loaded.name), False
