"""A captured TRL step (`grpo_debug.capture`) read from disk and checked, and the `StepConfig` it implies.

A capture is a file from outside: `load_capture` verifies the SHA-256 of every file it wrote (`checksums.json`)
before parsing any, reads tensors with `weights_only=True` and checks every piece (files, JSON, tensor names,
shapes, masks, NaN, the schedule, the random states, and the policy folder as `model_folder` checks a model,
before any model is built); a problem names the file. The config
is the `trl` preset with the capture's own `GRPOConfig` settings, None values resolved as the trainer
resolved them (`config_from_capture`).
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from .checksums import checksum_problem
from .choices import SAME_NAME as TRL_SAME_NAME
from .config import StepConfig
from .model_folder import check_model_folder
from .task import register_task, task_names

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

    @property
    def num_samples(self) -> int:
        return len(self.batch["completion_ids"])

    @property
    def schedule(self) -> dict | None:
        """The captured optimizer step's micro-batches (rows of the generation batch) and pass; None for a
        multi-process capture or one written before format 2."""
        return self.meta.get("schedule")

    @property
    def step_metrics(self) -> dict:
        """The step's own numbers from the trainer (format 2), else what TRL logged at the step."""
        return self.meta.get("step_metrics") or self.meta.get("logged") or {}

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
        meta = json.loads((path / "capture.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CaptureError(f"{path / 'capture.json'} is not valid JSON: {e}") from None
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
    capture = Capture(path, meta, batch)
    check_capture(capture)
    return capture


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


def _check_meta(meta, js: Path) -> tuple[dict, int]:
    """capture.json's entries and their types; its grpo_config and num_generations."""
    _need(isinstance(meta, dict), js, "not a JSON object")
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
    if schedule is not None:
        micro = schedule.get("micro_batches") if isinstance(schedule, dict) else None
        shaped = isinstance(micro, list) and all(
            isinstance(mb, dict) and isinstance(mb.get("rows"), list) for mb in micro
        )
        _need(shaped, js, "'schedule' is not {micro_batches: [{rows: [...]}, ...]}")
        rows = [r for mb in schedule["micro_batches"] for r in mb["rows"]]
        _need(
            bool(rows) and all(isinstance(r, int) and 0 <= r < N for r in rows) and len(set(rows)) == len(rows),
            js,
            "schedule rows are not distinct rows of the batch",
        )
        if "rng_states" in b:
            states = b["rng_states"]
            _need(
                states.dtype == torch.uint8 and states.dim() == 2 and states.shape[1] == torch.get_rng_state().numel(),
                pt,
                "rng_states are not CPU random states",
            )


def check_policy_folder(capture: Capture) -> None:
    """The policy folder, inside the capture, checked before any model is built (`model_folder`): its config
    against its stored weights' headers, bounded by them, floating and finite weights, a tokenizer; then the
    batch's token ids against the config's vocabulary."""
    folder_name = capture.meta["policy"].get("folder")
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
    config = check_model_folder(folder, CaptureError)
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
    if (
        task_name(capture) not in task_names()
    ):  # a StepConfig.task choice from here on; `GRPOStep.from_capture` fills it

        def not_opened():
            raise RuntimeError(f"{task_name(capture)}: open the capture (GRPOStep.from_capture) for its task")

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
    return json.loads((capture.path / capture.meta["policy"]["folder"] / "config.json").read_text()).get(
        "model_type", ""
    )


def task_name(capture: Capture) -> str:
    return f"capture:{capture.path.resolve()}"


# ---- the rewards: stored, or your own functions
