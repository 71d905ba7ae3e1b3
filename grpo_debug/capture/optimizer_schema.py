"""The trainer's optimizer as a capture holds it, checked field by field when the capture is opened, before any model
or optimizer is built (`optimizer_state` says what is recorded and how the replay rebuilds it).

capture.json's `optimizer` block: `module` and `class` strings; `groups`, each a list of parameter names and the
class's hyper-parameters (lr a rate from 0 to MAX_RATE, betas two numbers in [0, 1), eps finite > 0, weight_decay finite
>= 0, momentum and dampening finite >= 0, flags true or false); `learning_rate`, the rate the scheduler set for the
step, one per group and equal to that group's lr; `scheduler` (its base_lrs one per group and equal to each group's
initial_lr where both are stated); `bytes`, the size of the state written.

optimizer.safetensors, keyed `<parameter>/<key>`: every key names a grouped parameter and one of the keys its class
keeps (AdamW, Adam: step, exp_avg, exp_avg_sq, and max_exp_avg_sq under amsgrad; SGD: momentum_buffer); a parameter
with state holds all of them; `step` is one whole number from 0 to the steps the trainer had taken; the other
tensors are finite, floating, in their parameter's shape and dtype (read from the capture's weight headers), a
second moment is >= 0, and an Adam first moment within what Adam's recursion reaches beside its second
(`adam_moment_bound`: an exp_avg of 1e38 is no moment, and its update would overflow).

Decided here:
- dtype: torch's optimizers make a parameter's state with `zeros_like(param)`, so a float16 or bfloat16 state is
  the trainer's where its parameter is stored in that dtype, and refused where it is not (it is then not what the
  trainer held: torch would cast it silently); an integer moment is refused.
- a parameter with no state is one the optimizer never stepped (no gradient reached it yet: frozen, unused, or every
  step before this one skipped); torch starts it fresh at its first step, the replay does the same and says so
  (`state_note`). A state that is empty, or short of a parameter, where capture.json's `bytes` counted more than
  the file holds was removed after the capture: refused. An empty state with `bytes` 0 at a step past the first is
  what the trainer held (its earlier steps skipped: a float16 gradient scaler's overflow, say): replayed, said so.
- a class this replay does not rebuild (8-bit, paged, outside torch.optim) is typed and its tensors checked for
  names and finite values; the update then starts from a fresh AdamW, as `optimizer_state.rebuild_problem` says.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from ..echo import shown_value
from .model_folder import weight_headers
from .optimizer_state import FILE, REBUILT
from .saved_weights import stored_key

ADAM_KEYS = ("step", "exp_avg", "exp_avg_sq")
STATE_KEYS = {"AdamW": ADAM_KEYS, "Adam": ADAM_KEYS, "SGD": ("momentum_buffer",)}
ADAM_GROUP = ("lr", "betas", "eps", "weight_decay", "amsgrad")
GROUP_KEYS = {
    "AdamW": ADAM_GROUP,
    "Adam": ADAM_GROUP,
    "SGD": ("lr", "momentum", "dampening", "weight_decay", "nesterov"),
}
FLAGS = ("amsgrad", "maximize", "capturable", "differentiable", "nesterov", "decoupled_weight_decay")
OPTIONAL_FLAGS = ("foreach", "fused")  # true, false or null (torch picks)
SECOND_MOMENTS = ("exp_avg_sq", "max_exp_avg_sq")
TORCH_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}


def optimizer_problem(path: Path, meta: dict, tensors: dict[str, torch.Tensor] | None) -> str | None:
    """What is wrong with capture `path`'s optimizer block and state (`tensors`), in one line naming the file and the
    field; None: nothing. `meta`: capture.json, already checked but for its optimizer."""
    js, entry = path / "capture.json", meta["optimizer"]
    problem = _entry_problem(entry) or _groups_problem(entry) or _rates_problem(entry) or _scheduler_problem(entry)
    if problem:
        return f"{js}: {problem}"
    if tensors is None:
        return None
    problem = _state_problem(entry, tensors, trained_weights(path, meta), meta["step"])
    return problem and f"{path / FILE}: {problem}"


def trained_weights(path: Path, meta: dict) -> dict[str, tuple]:
    """name -> (shape, safetensors dtype, file) of the trained weights the capture's policy folder stores (a LoRA
    capture: its adapter's), from their headers alone."""
    return weight_headers(path / str(meta["policy"]["folder"]))


def rebuilt(entry: dict) -> bool:
    """Whether the replay rebuilds this optimizer (a torch.optim class of `REBUILT`)."""
    return entry["module"].split(".")[:2] == ["torch", "optim"] and entry["class"] in REBUILT


# ---- capture.json's optimizer block


def _entry_problem(entry) -> str | None:
    if not isinstance(entry, dict) or not isinstance(entry.get("groups"), list) or not entry["groups"]:
        return "'optimizer' is not {module, class, groups: [{params: [...], lr, ...}], learning_rate: [...], ...}"
    for key in ("module", "class"):
        if not isinstance(entry.get(key), str):
            return f"optimizer.{key} = {shown_value(entry.get(key))} is not a name (a string)"
    if not _count(entry.get("bytes"), low=0):
        return f"optimizer.bytes = {shown_value(entry.get('bytes'))} is not a size in bytes (an integer >= 0)"
    norm = entry.get("max_grad_norm")
    if norm is not None and not (_number(norm) and not math.isnan(norm)):
        return f"optimizer.max_grad_norm = {shown_value(norm)} is not a number"
    return None


def _groups_problem(entry: dict) -> str | None:
    names = []
    for i, group in enumerate(entry["groups"]):
        where = f"optimizer.groups[{i}]"
        if not isinstance(group, dict) or not _names(group.get("params")):
            return f"{where}.params is not a list of parameter names"
        names += group["params"]
        problem = _hyper_problem(group, entry["class"] if rebuilt(entry) else None)
        if problem:
            return f"{where}{problem}"
    twice = _repeated(names)
    return twice and f"optimizer.groups: a parameter is in two optimizer groups ({shown_value(twice)})"


def _hyper_problem(group: dict, cls: str | None) -> str | None:
    """A group's hyper-parameters: each one present typed and bounded; those `cls` needs, present."""
    missing = [key for key in GROUP_KEYS.get(cls, ("lr",)) if key not in group]
    if missing:
        return (
            f" has no {missing[0]!r}: {cls or 'an optimizer'}'s groups hold {', '.join(GROUP_KEYS.get(cls, ('lr',)))}"
        )
    checks = {
        "lr": (_sane_rate, f"a rate from 0 to {MAX_RATE:g}"),
        "betas": (_betas, "two numbers in [0, 1)"),
        "eps": (lambda v: _number(v) and math.isfinite(v) and v > 0, "a finite number > 0"),
        "weight_decay": (_rate, "a finite number >= 0"),
        "momentum": (_rate, "a finite number >= 0"),
        "dampening": (_rate, "a finite number >= 0"),
        **{flag: (lambda v: isinstance(v, bool), "true or false") for flag in FLAGS},
        **{flag: (lambda v: v is None or isinstance(v, bool), "true, false or null") for flag in OPTIONAL_FLAGS},
    }
    for key, (ok, what) in checks.items():
        if key in group and not ok(group[key]):
            return f".{key} = {shown_value(group[key])} is not {what}"
    together = [flag for flag in ("fused", "differentiable", "foreach") if group.get(flag) is True]
    if "fused" in together and len(together) > 1:  # torch refuses to build such an optimizer: no trainer held one
        return f" sets {' and '.join(together)}: torch's optimizers take fused with neither differentiable nor foreach"
    return None


def _rates_problem(entry: dict) -> str | None:
    """The top-level rates, what the replay steps at: one per group, each the group's own lr."""
    rates, groups = entry.get("learning_rate"), entry["groups"]
    if "learning_rate" not in entry:
        return "optimizer.learning_rate is missing: the rate the scheduler set for the step, one per parameter group"
    if not isinstance(rates, list) or len(rates) != len(groups):
        return f"optimizer.learning_rate = {shown_value(rates)} is not one rate per parameter group ({len(groups)})"
    for i, (rate, group) in enumerate(zip(rates, groups)):
        if not _sane_rate(rate):
            return f"optimizer.learning_rate[{i}] = {shown_value(rate)} is not a rate from 0 to {MAX_RATE:g}"
        if rate != group["lr"]:
            lr = group["lr"]
            return (
                f"optimizer.learning_rate[{i}] = {rate!r} is not optimizer.groups[{i}].lr = {lr!r}, the scheduled rate"
            )
    return None


def _scheduler_problem(entry: dict) -> str | None:
    """Where the scheduler is recorded: its base rates one per group, each the group's initial_lr where stated."""
    scheduler = entry.get("scheduler")
    if scheduler is None:
        return None
    if not isinstance(scheduler, dict):
        return f"optimizer.scheduler = {shown_value(scheduler)} is not {{class, last_epoch, base_lrs, ...}} or null"
    if not isinstance(scheduler.get("class"), str):
        return f"optimizer.scheduler.class = {shown_value(scheduler.get('class'))} is not a name (a string)"
    epoch = scheduler.get("last_epoch")
    if epoch is not None and not _count(epoch, low=-1):
        return f"optimizer.scheduler.last_epoch = {shown_value(epoch)} is not a step (an integer >= -1)"
    base, groups = scheduler.get("base_lrs", []), entry["groups"]
    if not isinstance(base, list) or (base and len(base) != len(groups)) or not all(map(_rate, base)):
        return f"optimizer.scheduler.base_lrs = {shown_value(base)} is not one finite rate >= 0 per parameter group"
    for i, (rate, group) in enumerate(zip(base, groups)):
        if "initial_lr" in group and rate != group["initial_lr"]:
            initial = group["initial_lr"]
            return f"optimizer.scheduler.base_lrs[{i}] = {rate!r}, but optimizer.groups[{i}].initial_lr = {initial!r}"
    return None


# ---- optimizer.safetensors


def _state_problem(entry: dict, tensors: dict[str, torch.Tensor], stored: dict, step: int) -> str | None:
    group_of = {name: group for group in entry["groups"] for name in group["params"]}
    for key in sorted(tensors):
        name, _, part = key.rpartition("/")
        if name not in group_of:
            return f"state {shown_value(key)} names no parameter of the optimizer's groups"
        kept, value = _kept(entry, group_of[name]), tensors[key]
        if kept is None:  # a class not rebuilt (8-bit state, say): its own layout, read by nobody here
            problem = "holds NaN or inf" if value.is_floating_point() and not bool(value.isfinite().all()) else None
        elif part not in kept:
            return f"{shown_value(key)} is not state a {entry['class']} keeps ({', '.join(kept)})"
        else:
            problem = _tensor_problem(part, value, _stored_as(name, stored), step, entry["class"])
        if problem:
            return f"{key} {problem}"
    return (
        _moments_problem(entry, tensors, group_of)
        or _missing_problem(entry, tensors, group_of)
        or _bytes_problem(entry, tensors, group_of)
    )


def adam_moment_bound(beta1: float, beta2: float) -> float | None:
    """The most |exp_avg| / sqrt(exp_avg_sq) Adam's recursion can reach, whatever the gradients: by Cauchy-Schwarz
    on m_t = (1 - b1) sum b1^k g and v_t = (1 - b2) sum b2^k g^2, (1 - b1) / sqrt((1 - b2) (1 - b1^2 / b2)). None
    where b1^2 >= b2 (no bound of this form) or b2 is 0."""
    if not (0 < beta2 < 1) or beta1**2 >= beta2:
        return None
    return (1 - beta1) / math.sqrt((1 - beta2) * (1 - beta1**2 / beta2))


def _moments_problem(entry: dict, tensors: dict[str, torch.Tensor], group_of: dict) -> str | None:
    """An Adam first moment its second could not have come with (`adam_moment_bound`, 1% of float slack): a state
    edited, or one whose update would overflow (an exp_avg of 1e38 beside a normal exp_avg_sq)."""
    if entry["class"] not in ("Adam", "AdamW"):
        return None
    for key in sorted(k for k in tensors if k.endswith("/exp_avg")):
        name = key.rpartition("/")[0]
        second = tensors.get(f"{name}/exp_avg_sq")
        bound = adam_moment_bound(*group_of[name]["betas"]) if second is not None else None
        if bound is None:
            continue
        steps = tensors.get(f"{name}/step")
        if steps is not None and steps.numel() == 1 and float(steps) == 0 and (tensors[key].any() or second.any()):
            return (f"{name}/step is 0 beside moments that are not: a state that never stepped holds zeros (torch "
                    "makes them so), so these moments are not the trainer's")  # fmt: skip
        first, second = tensors[key].double(), second.double()
        excess = (first.abs() - 1.01 * bound * second.sqrt()).max().item() if first.numel() else 0.0
        if excess > 1e-30:
            return (f"{key} is not an Adam first moment beside its exp_avg_sq: |exp_avg| passes {bound:.3g} x "
                    "sqrt(exp_avg_sq), the most Adam's recursion reaches with these betas")  # fmt: skip
    return None


def _kept(entry: dict, group: dict) -> tuple[str, ...] | None:
    """The state keys the optimizer keeps for a parameter of `group` (None: a class not rebuilt, not known here)."""
    if not rebuilt(entry):
        return None
    return STATE_KEYS[entry["class"]] + (("max_exp_avg_sq",) if group.get("amsgrad") is True else ())


def _stored_as(name: str, stored: dict) -> tuple | None:
    try:
        return stored[stored_key(name, stored)]
    except KeyError:  # saved under another name (a tied weight): its shape is checked against the model's instead
        return None


def _tensor_problem(part: str, value: torch.Tensor, stored: tuple | None, step: int, cls: str) -> str | None:
    if value.dtype == torch.bool or value.is_complex():
        return f"is stored as {value.dtype}, not a number"
    if part == "step":
        return _step_problem(value, step)
    if not value.is_floating_point():
        return f"is stored as {value.dtype}, not a floating dtype: an optimizer's state is floating point"
    if stored is not None:
        shape, dtype, file = stored
        if tuple(value.shape) != tuple(shape):
            return f"has shape {tuple(value.shape)}, its parameter {tuple(shape)} ({file.name})"
        if TORCH_DTYPES.get(dtype, value.dtype) != value.dtype:
            return (
                f"is {value.dtype}, its parameter {TORCH_DTYPES[dtype]} ({file.name}): torch's {cls} keeps a "
                "parameter's state in the parameter's dtype, so this is not the state the trainer held"
            )
    if not bool(value.isfinite().all()):
        return "holds NaN or inf"
    if part in SECOND_MOMENTS and bool((value < 0).any()):
        return f"has negative entries (min {float(value.min()):.3g}); an Adam second moment is >= 0"
    return None


def _step_problem(value: torch.Tensor, step: int) -> str | None:
    """A parameter's step count: one whole number, at most the optimizer steps the trainer took before `step`."""
    if value.dim() != 0:
        return f"has shape {tuple(value.shape)}, not a scalar: a parameter's step count is one number"
    count = float(value)
    if not (math.isfinite(count) and count >= 0 and count == int(count)):
        return f"= {count:g} is not a count of steps (a whole number >= 0)"
    if count > step - 1:
        return f"= {count:g}, but the trainer had taken {step - 1} optimizer step(s) before step {step}"
    return None


def _missing_problem(entry: dict, tensors: dict, group_of: dict) -> str | None:
    """A parameter with some state and not all of it."""
    held: dict[str, set] = {}
    for key in tensors:
        name, _, part = key.rpartition("/")
        held.setdefault(name, set()).add(part)
    for name in sorted(held):
        kept = _kept(entry, group_of[name])
        missing = [k for k in kept or () if k not in held[name]]
        if missing:
            return f"{name}/{missing[0]} is missing: a parameter with {entry['class']} state holds {', '.join(kept)}"
    return None


def _bytes_problem(entry: dict, tensors: dict, group_of: dict) -> str | None:
    """The file holds the bytes of state capture.json says were written: none removed after the capture."""
    held = sum(t.numel() * t.element_size() for t in tensors.values())
    if held == entry["bytes"]:
        return None
    without = unstepped(entry, tensors)
    lacking = f" (no state for {without[0]}, {len(without)} parameter(s) in all)" if without else ""
    return (
        f"holds {held} bytes of state{lacking}, but capture.json's optimizer.bytes = {entry['bytes']} were written: "
        "state was removed or changed after the capture"
    )


# ---- a partial state, as the trainer reads it


def unstepped(entry: dict, tensors: dict[str, torch.Tensor]) -> list[str]:
    """The grouped parameters that hold no state though their class keeps some (never stepped), in group order."""
    with_state = {key.rpartition("/")[0] for key in tensors}
    return [
        name
        for group in entry["groups"]
        if _kept(entry, group) and not (entry["class"] == "SGD" and group.get("momentum") == 0)
        for name in group["params"]
        if name not in with_state
    ]


def state_note(entry: dict, tensors: dict[str, torch.Tensor], step: int) -> str | None:
    """What the replay says of a partial state: the parameters the trainer's optimizer had not stepped start fresh
    at this step, as torch starts them (None: every parameter holds its state, or it is the first step, before
    which no state is possible)."""
    without = unstepped(entry, tensors)
    if not without or step <= 1:
        return None
    total = sum(len(group["params"]) for group in entry["groups"])
    fresh = f"each starts fresh at this step (no moments yet), as torch's {entry['class']} starts a parameter"
    if len(without) == total:
        return f"its state before step {step} is empty (no parameter had been stepped): {fresh}"
    return f"{len(without)} of {total} parameters hold no state (never stepped, e.g. {without[0]}): {fresh}"


# ---- small tests of a JSON value


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _rate(value) -> bool:
    return _number(value) and math.isfinite(value) and value >= 0


MAX_RATE = 10.0  # a learning rate above this moves every weight past its own size in one step: not a rate


def _sane_rate(value) -> bool:
    return _rate(value) and value <= MAX_RATE


def _betas(value) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(_number(b) and 0 <= b < 1 for b in value)


def _count(value, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _repeated(names: list[str]) -> str | None:
    seen = set()
    for name in names:
        if name in seen:
            return name
        seen.add(name)
    return None


def _names(value) -> bool:
    return isinstance(value, list) and all(isinstance(name, str) for name in value)
