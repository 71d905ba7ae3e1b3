"""Text a run holds (a completion, a reward function's name, a finding), made safe to show on a page: each
control character that would be invisible there, or would reorder the text after it (a bidi override), is
shown as its escape instead (`\\x00`, `\\u202e`)."""

from __future__ import annotations

import html
import re

# C0 controls but tab and newline, DEL, C1 controls, and the bidi embeddings, overrides, isolates and marks: invisible
# on a page, and a bidi one reorders the text after it (a completion could make itself read as another)
CONTROL = re.compile(r"([\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069])")


def escape_code(char: str) -> str:
    """`\\x00`, `\\u202e`: the character as Python's repr writes it."""
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str) -> str:
    """`text` with each control character (`CONTROL`) replaced by its escape; html.escape it after."""
    return CONTROL.sub(lambda m: escape_code(m.group(1)), str(text))


def page_text(text) -> str:
    """Text of the run on a page: markup escaped, control characters shown as their escapes (`visible`)."""
    return html.escape(visible(str(text)))
