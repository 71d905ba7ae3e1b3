"""A captured step's starting weights read back from the capture's own weight files, one tensor at a time: the step
restores its policy (`GRPOStep.restore_policy`) without holding a second copy of the weights in memory.

    start = saved_start(policy, capture.path / "policy")    # name -> tensor, read on demand
    GRPOStep(cfg, task, loaded, start=start, ...)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

from .model_folder import weight_headers


class SavedWeights(Mapping):
    """name -> the tensor saved under that name in `files[name]`, read each time it is asked for (safetensors: the
    file is mapped for the read alone, so only the tensor being copied is in memory), on the device and in the
    dtype of the parameter it starts (`like[name]`: the model's, wherever the model was moved)."""

    def __init__(self, files: dict[str, Path], like: dict[str, torch.Tensor] | None = None):
        self.files = files
        self.like = like or {}

    def __getitem__(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        with safe_open(str(self.files[name]), framework="pt") as f:
            value = f.get_tensor(name)
        like = self.like.get(name)
        return value if like is None else value.to(device=like.device, dtype=like.dtype)

    def __iter__(self) -> Iterator[str]:
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)


def saved_start(model, folder: Path) -> SavedWeights | None:
    """The trained parameters' values as `folder`'s weight files hold them, read on demand where each one is saved
    under its parameter's name with its shape; None where one is not (a tied weight saved under its twin's name,
    say): the step then copies them (`step.trained_state`)."""
    stored = weight_headers(folder)
    trained = {name: p for name, p in model.named_parameters() if p.requires_grad}
    if all(name in stored and stored[name][0] == tuple(p.shape) for name, p in trained.items()):
        return SavedWeights({name: stored[name][2] for name in trained}, trained)
    return None


def stored_key(name: str, stored: dict) -> str:
    """A trained parameter's name as its capture stores it (peft drops the adapter's name, `default`)."""
    for key in (name, name.replace(".default.", "."), name.replace("base_model.model.", "", 1)):
        if key in stored:
            return key
    raise KeyError(f"{name} is not in the captured weights")
