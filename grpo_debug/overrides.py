"""The command line's `KEY=VALUE` strings into typed StepConfig fields (`--set`, an arm's changes) and the
`--help` text of every key. Imports neither torch nor transformers: a typo is answered at once."""

import dataclasses
import difflib

from .config import StepConfig, allowed_values, base_type


def describe_fields() -> str:
    """Every key with its phase, default, allowed values and help: the CLI's --help epilog."""
    lines = []
    for f in dataclasses.fields(StepConfig):
        lines.append(
            f"  {f.name} ({f.metadata['phase']}; default {f.default!r}; {allowed_values(f)})\n      {f.metadata['help']}"
        )
    return "\n".join(lines)


TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def parse_value(key: str, text: str):
    """One `key=value` value from the command line, typed by the field; a bad value names the key."""
    f = StepConfig.__dataclass_fields__[key]
    base, optional = base_type(f)
    if optional and text.lower() in ("none", "null", ""):
        return None
    if base == "bool":
        if text.lower() not in TRUE_WORDS + FALSE_WORDS:
            raise ValueError(f"StepConfig.{key} = {text!r} is not allowed: it must be true or false")
        return text.lower() in TRUE_WORDS
    try:
        return {"int": int, "float": float}.get(base, str)(text)
    except ValueError:
        raise ValueError(f"StepConfig.{key} = {text!r} is not allowed: it must be {allowed_values(f)}") from None


def parse_overrides(pairs: list[str]) -> dict:
    """`key=value` strings into typed StepConfig fields."""
    fields = StepConfig.__dataclass_fields__
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=3)
            raise ValueError(
                f"{key!r} is not a StepConfig key"
                + (f": did you mean {', '.join(close)}?" if close else f" (keys: {', '.join(sorted(fields))})")
            )
        if not sep:
            raise ValueError(f"{pair!r} has no value: write {key}=VALUE ({allowed_values(fields[key])})")
        out[key] = parse_value(key, value)
    return out
