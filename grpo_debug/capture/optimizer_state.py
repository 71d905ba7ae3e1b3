"""The trainer's optimizer at a captured step: its state, its parameter groups and the learning rate it steps at.

At `on_pre_optimizer_step` of step k the trainer's optimizer holds what steps 1..k-1 left (AdamW: each trained
parameter's `step`, `exp_avg`, `exp_avg_sq`) and its groups carry the learning rate the scheduler set for step k.
A capture keeps

- `optimizer.safetensors`: every state tensor, keyed `<parameter name>/<state key>` (the parameter's name in the
  trained model: the adapter's names in a LoRA run; one copy in a multi-process run, which DDP keeps identical);
- capture.json's `optimizer`: the class, each group's hyper-parameters (lr as scheduled for step k, betas, eps,
  weight_decay, fused/foreach, ...) and its parameters by name, the scheduler's class and state, `max_grad_norm`,
  and the file's size.

`trainer_optimizer(model, capture)` rebuilds it on a replayed model: the same class over the same groups, in the
same order, with that state; an optimizer it cannot rebuild (8-bit, paged, a class outside `torch.optim`) is named
by `rebuild_problem` and the replay's update is then a fresh AdamW, labelled so. The tensors are read with the
capture's other files (checksummed first) and checked field by field (`optimizer_schema`) before any is used.
"""

from __future__ import annotations

from pathlib import Path

import torch

FILE = "optimizer.safetensors"
REBUILT = ("AdamW", "Adam", "SGD")  # torch.optim classes whose state_dict is rebuilt as it is
FRESH = "the update starts from a fresh AdamW at the config's learning rate, not from the trainer's optimizer"


def snapshot(trainer, model) -> tuple[dict, dict[str, torch.Tensor]]:
    """The trainer's optimizer now (before its step): capture.json's `optimizer` entry and the state tensors by
    `<name>/<key>` (CPU copies). `model`: the unwrapped trained model, whose parameter names are used."""
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # accelerate wraps it
    names = {id(p): n for n, p in model.named_parameters()}
    state = optimizer.state_dict()
    index_to_name, groups = {}, []
    for group, live in zip(state["param_groups"], optimizer.param_groups):
        params = [names.get(id(p), f"<unnamed {i}>") for i, p in zip(group["params"], live["params"])]
        index_to_name.update(zip(group["params"], params))
        hyper = {k: _plain(v) for k, v in group.items() if k != "params"}
        groups.append({"params": params, **hyper})
    tensors = {}
    for index, entries in state["state"].items():
        for key, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{index_to_name[index]}/{key}"] = value.detach().cpu().clone().contiguous()
    scheduler = getattr(trainer, "lr_scheduler", None)
    meta = {
        "class": type(optimizer).__name__,
        "module": type(optimizer).__module__,
        "groups": groups,
        "learning_rate": [g["lr"] for g in groups],
        "scheduler": None
        if scheduler is None
        else {
            "class": type(scheduler).__name__,
            "last_epoch": getattr(scheduler, "last_epoch", None),
            "base_lrs": [_plain(v) for v in getattr(scheduler, "base_lrs", [])],
            "lr_scheduler_type": str(trainer.args.lr_scheduler_type),
        },
        "max_grad_norm": trainer.args.max_grad_norm,
        "file": FILE,
        "bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
    }
    return meta, tensors


def _plain(value):
    """A hyper-parameter as JSON (tuples of betas as lists, tensors as numbers)."""
    if isinstance(value, torch.Tensor):
        return value.item()
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def write(folder: Path, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(folder / FILE))


def read(folder: Path, meta: dict) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / meta.get("file", FILE)), device="cpu")


def rebuild_problem(meta: dict | None) -> str | None:
    """Why the trainer's optimizer cannot be rebuilt (None: it can)."""
    if meta is None:
        return "the capture holds no optimizer state (written before format 4, or with optimizer_state=False)"
    if meta.get("module", "").split(".")[:2] != ["torch", "optim"] or meta.get("class") not in REBUILT:
        return f"the trainer's optimizer {meta.get('module')}.{meta.get('class')} is not one this replay rebuilds"
    return None


def trainer_optimizer(model, meta: dict, tensors: dict[str, torch.Tensor], lr: list[float] | None = None):
    """The trainer's optimizer over `model`'s parameters, its groups and state as captured (`tensors`, a fresh read
    the optimizer owns from here: it steps them in place), each group at the
    learning rate the scheduler set for the captured step (`lr`: other rates, one per group). Raises ValueError
    naming a grouped parameter the model lacks, or a state tensor whose shape is not its parameter's."""
    params = dict(model.named_parameters())
    missing = [n for g in meta["groups"] for n in g["params"] if n not in params]
    if missing:
        raise ValueError(f"the captured optimizer trains {missing[0]!r}, which the replayed model does not have")
    trained = {n for n, p in params.items() if p.requires_grad}
    grouped = {n for g in meta["groups"] for n in g["params"]}
    if trained - grouped:
        raise ValueError(f"the replayed model trains {sorted(trained - grouped)[0]!r}, which no optimizer group holds")
    index = {n: i for i, n in enumerate(n for g in meta["groups"] for n in g["params"])}
    state: dict[int, dict] = {}
    for key, value in tensors.items():
        name, entry = key.rsplit("/", 1)
        if entry != "step" and value.shape != params[name].shape:
            raise ValueError(
                f"optimizer state {key!r} has shape {tuple(value.shape)}, its parameter {tuple(params[name].shape)}"
            )
        state.setdefault(index[name], {})[entry] = value.to(params[name].device)  # the optimizer's own from here
    groups, saved = [], []
    for i, g in enumerate(meta["groups"]):
        hyper = {k: (tuple(v) if k == "betas" else v) for k, v in g.items() if k != "params"}
        if lr is not None:
            hyper["lr"] = lr[i]
        groups.append({"params": [params[n] for n in g["params"]], **hyper})
        saved.append({**hyper, "params": [index[n] for n in g["params"]]})
    cls = getattr(torch.optim, meta["class"])
    optimizer = cls(groups)
    optimizer.load_state_dict({"state": state, "param_groups": saved})
    return optimizer
