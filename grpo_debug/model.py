"""Load a policy, its frozen reference copy and the tokenizer, from the bundled folder or a hub id."""

from __future__ import annotations

import copy
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .files import DEFAULT_MODEL, DEFAULT_MODEL_DIR, HUB_MODEL


class ModelUnavailable(RuntimeError):
    pass


@dataclass
class LoadedModel:
    policy: PreTrainedModel
    reference: PreTrainedModel | None  # None: loaded without one (`load_model(reference=False)`), until given one
    tokenizer: PreTrainedTokenizerBase
    name: str

    def __iter__(self):  # `policy, reference, tokenizer = load_model()`
        return iter((self.policy, self.reference, self.tokenizer))

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> LoadedModel:
        """The policy and the reference moved to `device` (and cast to `dtype` where given), in place: once,
        before anything runs; every tensor of a step then lives where the policy does."""
        for model in (self.policy, self.reference):
            if model is not None:
                model.to(device=device, dtype=dtype)
        return self


def pick_device(name: str | None = None) -> torch.device:
    """`name` ("cpu", "cuda", "cuda:1"), or None: the GPU where torch sees one, else the CPU. A device this
    machine does not have is refused in one line."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device {name!r} is not a device torch knows (cpu, cuda, cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: torch sees no GPU on this machine (use --device cpu)")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"--device {name}: this machine has {torch.cuda.device_count()} GPU(s)")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {name}: only cpu and cuda are supported")
    return device


def pick_dtype(name: str | None) -> torch.dtype | None:
    """The weights' dtype by name ("float32", "bfloat16", "float16"), or None: as they were saved (the run's own)."""
    if name is None:
        return None
    if name not in PRECISIONS:
        raise ValueError(f"--dtype must be one of {tuple(PRECISIONS)}, got {name!r}")
    return PRECISIONS[name]


def _how_to_get(name: str) -> str:
    return (
        f"Model {name!r} is neither a local folder nor in the Hugging Face cache, and the hub could not "
        f"be reached. On a machine with internet run `huggingface-cli download {name}` (or "
        f"`python -c \"from transformers import AutoModelForCausalLM as M; M.from_pretrained('{name}')\"`), "
        f"then copy the folder it prints (or ~/.cache/huggingface) here and pass that path; or use the bundled "
        f"model: {DEFAULT_MODEL}"
    )


def hub_reachable(timeout: float = 3.0) -> bool:
    """One quick TCP connection instead of transformers' minute of retries on an offline machine."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def padded_left(tokenizer):
    """The tokenizer as the step uses it: left padding, and the EOS as pad where it has none."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_tokenizer(folder: str | os.PathLike):
    """A local folder's tokenizer alone (`padded_left`), without its model."""
    return padded_left(AutoTokenizer.from_pretrained(str(folder), local_files_only=True))


def _from_pretrained(name: str, dtype: torch.dtype, local_files_only: bool):
    tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=local_files_only)
    policy = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, local_files_only=local_files_only)
    return tokenizer, policy


def load_model(
    name_or_path: str | os.PathLike | None = None,
    dtype: torch.dtype = torch.float32,
    hub: bool = True,
    reference: bool = True,
) -> LoadedModel:
    """Policy (train mode off, as after `from_pretrained`), a frozen deep copy as reference, tokenizer. A hub id
    is read from the local cache first, then from the hub where it is reachable; `hub=False`: never from the hub
    (a name read from an untrusted file must not make this machine download what it names). `reference=False`:
    no copy (`reference` is None) where the caller brings its own reference, or needs none.

    GPT-2 tokenizers have no pad token: the EOS is used as pad, which is exactly the pad == eos
    situation the completion-mask pitfall is about.
    """
    name = str(name_or_path or DEFAULT_MODEL)
    if Path(name).expanduser().exists():
        name = str(Path(name).expanduser())
        if not (Path(name) / "config.json").is_file():
            raise ModelUnavailable(f"{name} is not a model folder: it has no config.json (save_pretrained writes one)")
    elif name.startswith((".", "/", "~")) or name.count("/") != 1:
        origin = " (from GRPO_DEBUG_MODEL)" if name_or_path is None and os.environ.get("GRPO_DEBUG_MODEL") else ""
        raise ModelUnavailable(
            f"no model folder at {name!r}{origin}. The bundled model is {DEFAULT_MODEL_DIR}; "
            f"a hub id looks like {HUB_MODEL!r}."
        )
    try:
        tokenizer, policy = _from_pretrained(name, dtype, local_files_only=True)
    except OSError as e:
        if Path(name).exists():
            raise ModelUnavailable(f"{name} is not a loadable model folder: {str(e).splitlines()[0]}") from None
        if not hub or not hub_reachable():
            raise ModelUnavailable(_how_to_get(name)) from None
        try:
            tokenizer, policy = _from_pretrained(name, dtype, local_files_only=False)
        except OSError as e:
            raise ModelUnavailable(_how_to_get(name) + f"\n(underlying error: {str(e).splitlines()[0]})") from None
    tokenizer = padded_left(tokenizer)
    policy.generation_config.pad_token_id = tokenizer.pad_token_id
    policy.eval()
    if not reference:
        return LoadedModel(policy, None, tokenizer, name)
    copied = copy.deepcopy(policy).eval()
    copied.requires_grad_(False)
    return LoadedModel(policy, copied, tokenizer, name)


# ---- what a model's architecture does that a step can get wrong


def absolute_positions(model) -> bool:
    """Whether the model adds learned absolute position embeddings (GPT-2's wpe), which left padding shifts."""
    return any(
        isinstance(m, torch.nn.Embedding) and (name.endswith("wpe") or "position_embedding" in name)
        for name, m in model.named_modules()
    )


UNUSED_DROPOUT_FIELDS = ("summary_", "classifier_")  # heads a causal LM does not run (GPT-2's summary_first_dropout)


def dropout_sources(model) -> list[str]:
    """Every place the model drops activations in train mode: `nn.Dropout` modules with p > 0, and config fields
    that attention functions read directly (Qwen2's and Llama's `attention_dropout`, no module of their own)."""
    modules = sorted(
        {f"{type(m).__name__}(p={m.p:g})" for m in model.modules() if isinstance(m, torch.nn.Dropout) and m.p > 0}
    )
    fields = [
        f"config.{k}={v:g}"
        for k, v in model.config.to_dict().items()
        if ("dropout" in k or k.endswith("_pdrop"))
        and not k.startswith(UNUSED_DROPOUT_FIELDS)
        and isinstance(v, (int, float))
        and not isinstance(v, bool)
        and v > 0
    ]
    return modules + fields


def has_dropout(model) -> bool:
    return bool(dropout_sources(model))


PRECISIONS = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def at_precision(dtype: str, role: str, device_type: str = "cpu"):
    """The context a forward runs in, the sampler's (`rollout.sample`) and the trainer's (`completion_logits`)
    alike: autocast to `dtype` ("bfloat16", "float16") on `device_type` (the model's: "cpu", "cuda"); "float32"
    is autocast off, the plain forward. `role` ("sampler", "trainer") names whose precision a bad value was."""
    if dtype not in PRECISIONS:
        raise ValueError(f"{role} dtype must be one of {tuple(PRECISIONS)}, got {dtype!r}")
    return torch.autocast(device_type, dtype=PRECISIONS[dtype], enabled=dtype != "float32")


HALVES = ("float16", "bfloat16")


def mixed_halves_problem(device: torch.device, weights_dtype: str | None, cfg) -> str | None:
    """Why weights of one 16-bit type cannot run on this device under `cfg`'s autocast to the other (None: they
    can): on a CPU, torch's layer norm refuses float16 weights under bfloat16 autocast, and bfloat16 under
    float16 ("RuntimeError: mixed dtype (CPU)"); a GPU's autocast runs it in float32. Said before any model loads."""
    if torch.device(device).type != "cpu" or weights_dtype not in HALVES:
        return None
    for field in ("dtype", "sampler_dtype"):
        autocast = getattr(cfg, field)
        if autocast in HALVES and autocast != weights_dtype:
            return (
                f"--dtype {weights_dtype} on the CPU under {field}={autocast} (autocast, the step's precision): "
                f"torch's CPU layer norm cannot take {weights_dtype} weights under {autocast} autocast; use --dtype "
                f"{autocast} or float32, or --set {field}=float32 (no autocast), or a GPU"
            )
    return None
