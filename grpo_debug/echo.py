"""A value from outside (a command-line argument, a field of a capture) as a one-line refusal shows it: on one line,
and no more than LIMIT characters of it, cut with an ellipsis and its length.

    shown("x" * 100_000)        # 160 x's, '…', 40 x's, ' (100000 characters)'
    bounded(message, argv)      # a refusal's message with every long or multi-line argument in it cut
"""

from __future__ import annotations

import re

LIMIT = 200
TAIL = 40
_LONG_RUN = re.compile(rf"[^\s…]{{{LIMIT + 1},}}+(?!…)")  # a run without a space, not one `shown` cut already


def shown(text: str, limit: int = LIMIT) -> str:
    """`text` on one line (line breaks and other control characters escaped), cut to `limit` characters: its start
    and its last TAIL (where a path names its file), an ellipsis between them, and its length."""
    flat = text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    if len(flat) <= limit:
        return flat
    return f"{flat[: limit - TAIL]}…{flat[-TAIL:]} ({len(text)} characters)"


def shown_value(value, limit: int = LIMIT) -> str:
    """A value read from a file (JSON), as Python writes it, cut as `shown` cuts it."""
    return shown(repr(value), limit)


def bounded(message: str, values=()) -> str:
    """`message` with each of `values` it echoes (the command line's arguments) shown as `shown` shows it where
    longer than LIMIT or not on one line, then any longer run without a space cut too (a part of an argument: the
    file of `--task FILE.py:NAME`, the value of `--set KEY=VALUE`)."""
    for value in sorted({v for v in values if isinstance(v, str)}, key=len, reverse=True):
        if value and (len(value) > LIMIT or not value.isprintable()) and value in message:
            message = message.replace(value, shown(value))
    return _LONG_RUN.sub(lambda m: shown(m.group()), message)
