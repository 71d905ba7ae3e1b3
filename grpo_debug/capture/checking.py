"""A capture checked before anything is built from it: capture.json's entries and their types, batch.pt's tensors
(present, integer ids, shapes that agree, groups of num_generations, masks of 0 and 1, finite where read), the
rewards, the schedule (distinct rows, the layout, each process's share), the random states, the policy folder as
`model_folder` checks a model (a LoRA adapter as `lora` checks it) and the optimizer's state as `optimizer_schema`
checks it. A problem is one `CaptureError` naming the file."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from .captured import Capture, CaptureError
from .columns import check_columns
from .lora import check_adapter_capture
from .model_folder import check_model_folder
from .optimizer_schema import optimizer_problem
from .trainer_state import FORMAT

REQUIRED = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "trainer_per_token_logps")


def need(ok: bool, where: Path, problem: str) -> None:
    """Refuse (`CaptureError`, naming `where`) unless `ok`."""
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
    need(isinstance(meta, dict), js, "not a JSON object")
    version = meta.get("format")
    need(
        type(version) is int and 3 <= version <= FORMAT,
        js,
        f"format {version!r}: this release reads capture formats 3 to {FORMAT} (the format with checksums.json on)",
    )
    for key in ("step", "grpo_config", "prompts", "completions", "rewards", "reward_weights", "policy", "reference"):
        need(key in meta, js, f"no {key!r} entry")
    kinds = {"grpo_config": dict, "prompts": list, "completions": list, "rewards": dict, "reward_weights": dict}
    kinds.update(policy=dict, reference=dict)
    for key, kind in kinds.items():
        need(isinstance(meta[key], kind), js, f"{key!r} is not a JSON {'object' if kind is dict else 'list'}")
    need(isinstance(meta["step"], int), js, f"step = {meta['step']!r} is not an integer")
    number = (int, float)
    for name, values in meta["rewards"].items():
        ok = isinstance(values, list) and all(v is None or isinstance(v, number) for v in values)
        need(ok, js, f"rewards of {name!r} are not a list of numbers (or null)")
    trainable = meta["policy"].get("trainable")
    need(
        trainable is None or (isinstance(trainable, list) and all(isinstance(n, str) for n in trainable)),
        js,
        f"policy.trainable = {str(trainable)[:60]!r} is neither null nor a list of parameter names",
    )
    for name, w in meta["reward_weights"].items():
        need(
            isinstance(w, number) and not isinstance(w, bool), js, f"reward weight of {name!r} = {w!r} is not a number"
        )
    history = meta.get("logged_kl", [])
    ok = isinstance(history, list) and all(
        isinstance(h, list) and len(h) == 2 and type(h[0]) is int and isinstance(h[1], number) and math.isfinite(h[1])
        for h in history
    )
    need(ok, js, "logged_kl is not a list of [step, kl] pairs")
    history = meta.get("logged_history", [])
    ok = isinstance(history, list) and all(
        isinstance(h, dict)
        and type(h.get("step")) is int
        and all(isinstance(v, number) and not isinstance(v, bool) and math.isfinite(v) for v in h.values())
        for h in history
    )
    need(ok, js, "logged_history is not a list of {step, name: finite number} records")
    g = meta["grpo_config"]
    for key in ("num_generations", "max_completion_length", "epsilon", "disable_dropout", "loss_type", "beta"):
        need(key in g, js, f"grpo_config has no {key!r}")
    G = g["num_generations"]
    need(isinstance(G, int) and G >= 1, js, f"num_generations = {G!r} is not a positive integer")
    return g, G


def _check_batch(b, pt: Path, meta: dict, js: Path, g: dict, G: int) -> int:
    """batch.pt's tensors: present, integer ids, shapes that agree, groups of G, finite where read; N rows."""
    need(isinstance(b, dict), pt, "not a dict of tensors")
    for name in REQUIRED:
        need(isinstance(b.get(name), torch.Tensor), pt, f"no tensor {name!r}")
    for name in ("prompt_ids", "completion_ids", "prompt_mask", "completion_mask"):
        need(
            not b[name].is_floating_point() and not b[name].is_complex(),
            pt,
            f"{name} holds {b[name].dtype}, not integers",
        )
    N, C = b["completion_ids"].shape if b["completion_ids"].dim() == 2 else (-1, -1)
    need(N > 0, pt, f"completion_ids has shape {tuple(b['completion_ids'].shape)}, not (N, C)")
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
            need(tuple(b[name].shape) == shape, pt, f"{name} has shape {tuple(b[name].shape)}, expected {shape}")
    need(N % G == 0, pt, f"{N} rows are not groups of num_generations = {G}")
    need(
        len(meta["completions"]) == N and len(meta["prompts"]) == N,
        js,
        f"{len(meta['prompts'])} prompts and {len(meta['completions'])} completions for {N} rows in batch.pt",
    )
    problem = check_columns(meta, N)
    need(problem is None, js, problem)
    for name in ("prompt_mask", "completion_mask"):
        need(bool(((b[name] == 0) | (b[name] == 1)).all()), pt, f"{name} holds values other than 0 and 1")
    mask = b["completion_mask"].bool()
    need(
        bool(mask.any(1).all()) or g.get("mask_truncated_completions") is True,
        pt,
        "completion_mask has rows with no token, which TRL writes only under mask_truncated_completions",
    )
    need(bool(b["advantages"].isfinite().all()), pt, "advantages hold NaN or inf")
    for name in ("old_per_token_logps", "ref_per_token_logps", "sampling_per_token_logps"):
        if name in b:
            need(bool(b[name][mask].isfinite().all()), pt, f"{name} holds NaN or inf on completion tokens")
    trainer = b["trainer_per_token_logps"]
    scored_rows = trainer.isfinite().any(1)
    need(
        bool(trainer[scored_rows][mask[scored_rows]].isfinite().all()),
        pt,
        "trainer_per_token_logps holds NaN or inf on completion tokens of a row the trainer scored",
    )
    return N


def _check_rows_and_schedule(meta: dict, b: dict, js: Path, pt: Path, N: int) -> None:
    """One reward per row, weights naming the reward functions, a schedule of distinct rows and CPU states."""
    for name, values in meta["rewards"].items():
        need(isinstance(values, list) and len(values) == N, js, f"rewards of {name!r} are not one per row")
    need(set(meta["reward_weights"]) == set(meta["rewards"]), js, "reward_weights do not name the reward functions")
    schedule = meta.get("schedule")
    if schedule is None:
        return
    need(isinstance(schedule, dict), js, "'schedule' is not a JSON object")
    first = schedule.get("generation_first_step")
    need(isinstance(first, int) and not isinstance(first, bool), js, "schedule.generation_first_step is not a step")
    for key in ("steps_per_generation", "num_iterations", "gradient_accumulation_steps", "forwards"):
        value = schedule.get(key, 1)
        need(_count(value), js, f"schedule.{key} = {value!r} is not a positive integer")
    if "ranks" in schedule:
        _check_ranks(schedule["ranks"], meta, js, N, (b["prompt_ids"].shape[1], b["completion_ids"].shape[1]))
    else:
        need(_micro_batches_shaped(schedule.get("micro_batches")), js, _SHAPE)
        rows = [r for mb in schedule["micro_batches"] for r in mb["rows"]]
        need(bool(rows) and _distinct_rows(rows, 0, N), js, "schedule rows are not distinct rows of the batch")
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
    need(len(micro) == GA, js, f"the schedule has {len(micro)} micro-batches for gradient_accumulation_steps {GA}")
    if N % S == 0:
        sizes = sorted({len(mb["rows"]) for mb in micro})
        need(sizes == [N // S], js, f"schedule micro-batches of {sizes} rows: each is {N // S} ({N} rows / S = {S})")
    for mb in micro:
        for key, high in (("pass", mu or 1), ("index", S)):
            value = mb.get(key, 0)
            ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < high
            need(ok, js, f"a schedule micro-batch's {key} = {value!r} is outside 0 to {high - 1}")


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
    need(
        isinstance(ranks, list) and len(ranks) >= 2 and isinstance(P, int) and P == len(ranks),
        js,
        f"schedule.ranks is not one entry per process (processes = {P!r})",
    )
    need(N % P == 0, js, f"{N} rows cannot be {P} processes' equal shares")
    share = N // P
    for r, rank in enumerate(ranks):
        need(isinstance(rank, dict) and _micro_batches_shaped(rank.get("micro_batches")), js, f"process {r}: {_SHAPE}")
        rows = [i for mb in rank["micro_batches"] for i in mb["rows"]]
        need(
            bool(rows) and _distinct_rows(rows, r * share, (r + 1) * share),
            js,
            f"process {r}'s schedule rows are not distinct rows of its share (rows {r * share} to {(r + 1) * share - 1})",
        )
        losses = rank.get("losses")
        need(
            isinstance(losses, list)
            and len(losses) == len(rank["micro_batches"])
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in losses),
            js,
            f"process {r}'s losses are not one number per micro-batch",
        )
        for key, most in zip(("prompt_width", "completion_width"), widths):
            value = rank.get(key)
            ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= most
            need(ok, js, f"process {r}'s {key} = {value!r} is not a width from 1 to the batch's {most}")
    counts = {len(rank["micro_batches"]) for rank in ranks}
    need(len(counts) == 1, js, f"the processes have different numbers of micro-batches ({sorted(counts)})")


def _check_random_states(states, schedule: dict, pt: Path) -> None:
    """(M, S) CPU random states, one per forward, in one process; (P, M, S) in several."""
    S = torch.get_rng_state().numel()
    ranks = schedule.get("ranks")
    dims = 2 if ranks is None else 3
    need(
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
    need(
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
    need(
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
            need(
                bool(((b[name] >= 0) & (b[name] < vocab)).all()),
                capture.path / "batch.pt",
                f"{name} holds token ids outside the model's vocabulary of {vocab}",
            )
