"""The command line's `KEY=VALUE` strings into typed StepConfig fields (`--set`, an arm's changes) and the
`--help` text of every key. Imports neither torch nor transformers: a typo is answered at once."""

import dataclasses
import difflib
import re

from .config import StepConfig, _check, allowed_values, base_type


def describe_fields() -> str:
    """Every key with its phase, default, allowed values and help: the CLI's --help epilog."""
    lines = []
    for f in dataclasses.fields(StepConfig):
        lines.append(
            f"  {f.name} ({f.metadata['phase']}; default {f.default!r}; {allowed_values(f)})\n      {f.metadata['help']}"
        )
    return "\n".join(lines)


TRUE_WORDS, FALSE_WORDS = ("true",), ("false",)  # any case; 1/0, yes/no, on/off are refused, not guessed
INTEGER = re.compile(r"[+-]?[0-9]+")  # ASCII digits only: int() would also read other scripts' digits
NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def parse_bool(text: str, what: str) -> bool:
    """`true` or `false` (any case); `what` names the setting in the error."""
    if text.lower() not in TRUE_WORDS + FALSE_WORDS:
        raise ValueError(f"{what} = {text!r} is not allowed: it must be true or false")
    return text.lower() in TRUE_WORDS


def parse_value(key: str, text: str):
    """One `key=value` value from the command line, typed by the field and checked against the field's own range
    and choices (`config._check`, as StepConfig checks it), so that a capture's `--set` is refused before the
    capture is read; a bad value names the key. What depends on other fields is checked with the whole config."""
    f = StepConfig.__dataclass_fields__[key]
    base, optional = base_type(f)
    if optional and text.lower() in ("none", "null", ""):
        return None
    if base == "bool":
        return parse_bool(text, f"StepConfig.{key}")
    if base in ("int", "float") and not (INTEGER if base == "int" else NUMBER).fullmatch(text):
        raise ValueError(f"StepConfig.{key} = {text!r} is not allowed: it must be {allowed_values(f)} (ASCII digits)")
    value = {"int": int, "float": float}.get(base, str)(text)
    _check(f, value)
    return value


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
        if key in out:
            raise ValueError(f"{key!r} is given twice ({key}={out[key]!r} and {pair!r}): give each key once")
        out[key] = parse_value(key, value)
    return out
