"""LoRA runs: a `GRPOTrainer(..., peft_config=LoraConfig(...))` step captured as its adapter, not the merged model.

TRL wraps the model it loads in a peft `PeftModel` (`get_peft_model`) and, when beta != 0, takes the reference
log-probs from that same model with its adapters disabled (`use_adapter(model, None)`): the reference is the
base model. So a capture of such a run holds

- `policy/`: the adapter's weights before the optimizer step (peft `save_pretrained`: `adapter_config.json`,
  `adapter_model.safetensors`) and the trainer's tokenizer;
- capture.json's `policy.base`: the base model's identity, where the trainer loaded it from (`name_or_path`, an
  absolute path where it is a local folder), the folder its files are in (`folder`), and `sha256`: the SHA-256
  of its files (`files`: the weight files and config.json, `base_digest` says how they are combined).

Reading such a capture (`check_adapter_capture`) recomputes the base's digest before anything is built and
refuses a base that changed; then checks the base folder as `model_folder` checks a model, and the adapter's
stored shapes against the LoRA its config describes on that base (built on the meta device). Replaying it
(`load_adapter_capture`) loads the base and the adapter on it, trainable (`PeftModel.from_pretrained`), and, as
the reference, the same model with its adapters off (`AdapterDisabled`): what TRL scored the reference with, and
no second copy of the base.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch

from ..checksums import sha256

BASE_FILES = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json", "config.json")
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
_digests: dict[tuple, str] = {}  # (folder, each file's name, size, mtime) -> digest: a run's base is hashed once


def is_adapter_model(model) -> bool:
    """Whether `model` is a peft model (what TRL trains under `peft_config`)."""
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def adapter_state(model) -> dict[str, torch.Tensor]:
    """A CPU copy of the active adapter's entries of `model.state_dict()`, under their full names (peft's
    `save_pretrained(state_dict=...)` reads those): LoRA's A and B (and any modules_to_save)."""
    name = model.active_adapter
    return {
        k: v.detach().cpu().clone() for k, v in model.state_dict().items() if f".{name}." in k or k.endswith(f".{name}")
    }


def tensor_bytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(v.numel() * v.element_size() for v in tensors.values())


# ---- the base model's identity


def base_files(folder: Path) -> list[str]:
    """The names of `folder`'s files the model is built from (weights, their index, config.json), sorted."""
    return sorted({p.name for pattern in BASE_FILES for p in folder.glob(pattern) if p.is_file()})


def base_digest(folder: str | Path, cached: bool = False) -> tuple[str, list[str]]:
    """(SHA-256 over the base's files, their names): the hash of the lines `<name> <sha256 of the file>\\n`, one
    per file of `base_files` in sorted order. `cached` (the callback, writing several steps of one run): reused
    while every file keeps its size and modification time; reading a capture always hashes."""
    folder = Path(folder)
    names = base_files(folder)
    key = (str(folder.resolve()), *((n, (folder / n).stat().st_size, (folder / n).stat().st_mtime_ns) for n in names))
    if not cached or key not in _digests:
        lines = "".join(f"{n} {sha256(folder / n)}\n" for n in names)
        _digests[key] = hashlib.sha256(lines.encode()).hexdigest()
    return _digests[key], names


def base_folder(name: str | None) -> Path | None:
    """The local folder holding the base model `name` (a folder, or a hub id in the Hugging Face cache), or None."""
    if not name:
        return None
    if Path(name).is_dir():
        return Path(name).resolve()
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True)).resolve()
    except Exception:  # not a hub id, or not in the cache
        return None


def base_name(model) -> str | None:
    """The name or path TRL loaded the base model of the peft `model` from."""
    return model.get_base_model().config._name_or_path


def no_base_reason(model) -> str | None:
    """Why a LoRA step cannot be captured (its base model's files are not on this machine to hash), or None."""
    folder = base_folder(base_name(model))
    if folder is None or "config.json" not in base_files(folder):
        return f"its LoRA base model {base_name(model)!r} is not a local folder or cached hub model to hash"
    return None


def base_identity(model) -> dict:
    """capture.json's `policy.base` entry of a peft `model`."""
    from .trainer_state import resolved_name

    folder = base_folder(base_name(model))
    digest, names = base_digest(folder, cached=True)
    return {
        "name_or_path": resolved_name(base_name(model)),
        "folder": str(folder),
        "sha256": digest,
        "files": names,
        "base_digest": "sha256 of the lines '<file name> <sha256 of the file>' of the files, sorted by name",
    }


def write_adapter(model, tokenizer, folder: Path, weights: dict[str, torch.Tensor], step: int) -> tuple[dict, str]:
    """The adapter's weights (as they were before the step) and the tokenizer in `folder`: capture.json's `policy`
    entry and the README's note."""
    base = base_identity(model)
    with warnings.catch_warnings():  # peft looks the base's config up (by its relative name) for resized embeddings
        warnings.filterwarnings("ignore", message="Could not find a config file", category=UserWarning)
        model.save_pretrained(folder, state_dict=weights)
    tokenizer.save_pretrained(folder)
    note = (
        f"the LoRA adapter's weights before optimizer step {step} and the tokenizer (peft `save_pretrained`); the "
        f"base model is not copied: `{base['name_or_path']}`, SHA-256 {base['sha256'][:16]}... over its "
        f"{len(base['files'])} weight and config files, checked when the capture is read."
    )
    return {"folder": folder.name, "name_or_path": base["name_or_path"], "adapter": "lora", "base": base}, note


# ---- reading: checked before anything is built


@contextmanager
def _quiet_peft():
    """peft's warnings on wrapping a base: a property transformers 5 deprecates, the adapter config's base name
    (relative, as the user gave it) replaced by the folder it is loaded on."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        warnings.filterwarnings("ignore", message=".*base_model_name_or_path.*renamed", category=UserWarning)
        yield


def check_base(base, where: Path, error) -> Path:
    """The base folder the capture names, its files hashed against the recorded digest; the folder."""
    if not isinstance(base, dict) or not all(isinstance(base.get(k), str) for k in ("folder", "sha256")):
        raise error(f"{where}: policy.base is not {{folder, sha256, ...}}")
    folder = Path(base["folder"])
    if not folder.is_dir():
        raise error(f"{where}: the LoRA base model folder {folder} does not exist here")
    digest, names = base_digest(folder)
    if digest != base["sha256"]:
        raise error(
            f"{where}: the LoRA base model {folder} is not the run's: the SHA-256 of its files is {digest[:16]}..., "
            f"the capture recorded {base['sha256'][:16]}... (files now: {', '.join(names) or 'none'})"
        )
    return folder


def check_adapter_capture(capture_path: Path, policy: dict, error):
    """The base (its digest, then as `model_folder` checks a model) and the adapter folder inside the capture
    (a LoRA config, floating and finite weights of the shapes that config gives on that base, a tokenizer), before
    anything is built; returns the base's config."""
    from .model_folder import TOKENIZER_FILES, check_model_folder

    js = capture_path / "capture.json"
    base = check_base(policy.get("base"), js, error)
    config = check_model_folder(base, error)
    folder = capture_path / str(policy.get("folder"))
    inside = capture_path.resolve()
    if not (folder.resolve().is_relative_to(inside) and folder.resolve() != inside and folder.is_dir()):
        raise error(f"{js}: policy.folder {policy.get('folder')!r} is not a folder inside the capture")
    expected = _expected_adapter_shapes(folder, config, error)
    _check_adapter_weights(folder / ADAPTER_WEIGHTS, expected, error)
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise error(f"{folder}: no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
    return config


def _expected_adapter_shapes(folder: Path, config, error) -> dict[str, tuple[int, ...]]:
    """name -> shape of the adapter weights the folder's LoRA config gives on a model of `config` (built on the
    meta device: nothing is allocated), under the names peft saves them."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    file = folder / ADAPTER_CONFIG
    try:
        raw = json.loads(file.read_text())
        if raw.get("peft_type") != "LORA":
            raise ValueError(f"peft_type {raw.get('peft_type')!r}, not 'LORA'")
        lora = LoraConfig.from_pretrained(folder)
        with torch.device("meta"), _quiet_peft():
            model = get_peft_model(AutoModelForCausalLM.from_config(config), lora)
    except Exception as e:
        said = (str(e).strip().splitlines() or [""])[0][:300]  # peft's message can carry the whole model's printout
        raise error(f"{file} is not a LoRA config for this base ({type(e).__name__}: {said})") from None
    return {k: tuple(v.shape) for k, v in get_peft_model_state_dict(model).items()}


def _check_adapter_weights(file: Path, expected: dict[str, tuple[int, ...]], error) -> None:
    """The stored adapter: exactly the expected names and shapes, floating point, finite (as a model folder's)."""
    from .model_folder import FLOATING, check_finite, weight_headers

    if not file.is_file():
        raise error(f"{file.parent}: no {ADAPTER_WEIGHTS}")
    stored = {k: v for k, v in weight_headers(file.parent, error).items() if v[2].name == ADAPTER_WEIGHTS}
    shapes = {k: shape for k, (shape, _, _) in stored.items()}
    if shapes != expected:
        odd = sorted(set(shapes.items()) ^ set(expected.items()))[:3]
        raise error(f"{file}: the adapter's weights are not those its config gives on the base ({odd})")
    odd = next(((k, dtype) for k, (_, dtype, _) in stored.items() if dtype not in FLOATING), None)
    if odd:
        raise error(f"{file}: adapter weight {odd[0]} is stored as {odd[1]}, not floating point")
    check_finite(stored, error)


# ---- replaying


class AdapterDisabled(torch.nn.Module):
    """The LoRA policy with its adapters off, as TRL scores the reference (`use_adapter(model, None)`): the base
    model without a second copy of it. Not a submodule holder: its parameters are the policy's, never its own,
    and its train/eval mode is its own (the policy takes it for the call, then gets its own back)."""

    def __init__(self, policy):
        super().__init__()
        object.__setattr__(self, "policy", policy)
        self.train(False)

    @contextmanager
    def _adapters_off(self):
        was = self.policy.training
        self.policy.train(self.training)
        try:
            with self.policy.disable_adapter():
                yield
        finally:
            self.policy.train(was)

    def forward(self, *args, **kwargs):
        with self._adapters_off():
            return self.policy(*args, **kwargs)

    def generate(self, *args, **kwargs):
        with self._adapters_off():
            return self.policy.generate(*args, **kwargs)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(object.__getattribute__(self, "policy"), name)  # config, device, generation_config


def load_adapter_capture(capture_path: Path, policy: dict, beta: float):
    """(LoadedModel, at_reference): the base with the captured adapter on it, trainable, as the policy; the same
    model with its adapters off as the reference (`AdapterDisabled`: TRL's reference, no copy of the base); the
    capture's tokenizer. `at_reference` as for a full capture: True when beta = 0 (TRL has no reference)."""
    from peft import PeftModel

    from ..model import LoadedModel, load_model, load_tokenizer

    loaded = load_model(policy["base"]["folder"], reference=False)
    folder = capture_path.resolve() / policy["folder"]
    with _quiet_peft():
        policy_model = PeftModel.from_pretrained(loaded.policy, folder, is_trainable=True).eval()
    tokenizer = load_tokenizer(folder)
    return LoadedModel(policy_model, AdapterDisabled(policy_model), tokenizer, str(folder)), beta == 0
