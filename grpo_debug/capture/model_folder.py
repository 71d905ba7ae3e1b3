"""A model folder from outside (a capture's policy, the reference a capture names) checked before any model is
built from it:

1. its weights' headers (safetensors: names, shapes, dtypes, read without loading a tensor) are floating point;
2. its config is bounded by those headers, so no config can make the check itself slow or large: no more
   layers than stored tensors, no embedding larger than every stored weight together;
3. the architecture the config names, built on the meta device (allocating nothing), has exactly the stored
   shapes;
4. every stored weight is finite (read one tensor at a time);
5. a tokenizer is there.
Each problem raises `error` with one sentence naming the file.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

FLOATING = {"F16", "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2"}  # safetensors' dtype names
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model", "spiece.model")


def weight_headers(folder: Path, error=ValueError) -> dict[str, tuple[tuple[int, ...], str, Path]]:
    """name -> (shape, safetensors dtype, file) over every .safetensors file, from the headers alone."""
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise error(f"{folder}: no .safetensors weights")
    stored = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                for k in f.keys():
                    part = f.get_slice(k)
                    stored[k] = (tuple(part.get_shape()), part.get_dtype(), file)
        except Exception as e:
            raise error(f"{file} is not a readable safetensors file ({type(e).__name__}: {e})") from None
    return stored


def _bounded(config, stored: dict, config_file: Path, error) -> None:
    """Refuse a config larger than the weights could hold, before anything is built from it."""
    elements = sum(math.prod(shape) for shape, _, _ in stored.values())
    layers = getattr(config, "num_hidden_layers", None)
    if isinstance(layers, int) and not 0 < layers <= len(stored):
        raise error(f"{config_file}: {layers} layers, but the weights hold only {len(stored)} tensors")
    width, vocab = getattr(config, "hidden_size", None), getattr(config, "vocab_size", None)
    if isinstance(width, int) and isinstance(vocab, int) and not 0 < width * vocab <= elements:
        raise error(
            f"{config_file}: an embedding of {vocab} x {width} is larger than all {elements} stored weights together"
        )


def check_model_folder(folder: str | Path, error=ValueError, finite: bool = True):
    """The folder's config, checked against its weights (module docstring); returns the config."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = Path(folder)
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise error(f"{folder}: no config.json")
    stored = weight_headers(folder, error)
    odd = next(((k, d, f) for k, (_, d, f) in stored.items() if d not in FLOATING), None)
    if odd:
        raise error(f"{odd[2]}: weight {odd[0]} is stored as {odd[1]}, not floating point")
    try:
        config = AutoConfig.from_pretrained(folder)
    except Exception as e:
        raise error(f"{config_file} is not a readable model config ({type(e).__name__}: {e})") from None
    _bounded(config, stored, config_file, error)
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception as e:
        raise error(f"{config_file} does not describe a causal LM ({type(e).__name__}: {e})") from None
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    missing = [k for k in expected if k not in stored and k not in tied and not k.endswith("lm_head.weight")]
    wrong = [f"{k} {stored[k][0]} vs {expected[k]}" for k in expected if k in stored and stored[k][0] != expected[k]]
    if missing or wrong:
        raise error(
            f"{config_file}: the architecture it names does not match the stored weights: {len(missing)} missing "
            f"({', '.join(missing[:3])}), {len(wrong)} of another shape ({', '.join(wrong[:3])})"
        )
    if finite:
        check_finite(stored, error)
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise error(f"{folder}: no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
    return config


def check_finite(stored: dict, error) -> None:
    """Every stored weight (`weight_headers`) free of NaN and inf, read one tensor at a time."""
    from safetensors import safe_open

    for file in sorted({f for _, _, f in stored.values()}):
        with safe_open(str(file), framework="pt") as f:
            for k in f.keys():
                if not bool(f.get_tensor(k).isfinite().all()):
                    raise error(f"{file}: weight {k} holds NaN or inf")
