"""Markdown building blocks that keep user-controlled text in its place.

Layer names, run names, split names, exception messages and evidence strings come
from the user's code. Rendered into a prompt they must not be able to start a new
table row, close a fence, or become a line of their own that an LLM would read as an
instruction. Every piece of such text goes through exactly one of:

- ``cell(text)``: one table cell or one line of prose. Pipes, backticks and
  backslashes are escaped, HTML is neutralised, every kind of line break becomes
  ``<br>``, so the text can never leave the cell or the line.
- ``fence(text)``: a fenced code block whose backtick fence is longer than any run of
  backticks inside, so the text can never close it.

Numbers go through ``num`` so that the same value always prints the same way.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence

MISSING = "—"
MAX_CELL_CHARS = 200

# Every line break a Markdown renderer or an LLM tokenizer may honour.
_LINE_BREAKS = re.compile(r"\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")
# Other control characters carry nothing a reader needs and can hide text.
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1b\x7f]")
_CELL_ESCAPES = {
    "\\": "\\\\",
    "|": "\\|",
    "`": "\\`",
    "&": "&amp;",
    "<": "&lt;",
    ">": "&gt;",
}
_CELL_SPECIAL = re.compile(r"[\\|`&<>]")


def num(value: float | int | bool | None, digits: int = 4) -> str:
    """A number, compactly and stably: 4 significant digits, ``NaN``/``inf``/``-inf``
    for non-finite values, ``—`` for a missing one, a short exponent (``1e-5``)."""
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == 0:
        return "0"  # also for -0.0
    text = f"{value:.{digits}g}"
    mantissa, sep, exponent = text.partition("e")
    if sep:
        text = f"{mantissa}e{int(exponent)}"
    return text


def value_text(value: object, max_items: int = 8) -> str:
    """Any evidence value as plain (unescaped) text; long lists are shortened."""
    if isinstance(value, (list, tuple)):
        shown = [value_text(v) for v in value[:max_items]]
        if len(value) > max_items:
            shown.append(f"… ({len(value)} values)")
        return "[" + ", ".join(shown) + "]"
    if value is None or isinstance(value, (bool, int, float)):
        return num(value)
    return str(value)


def cell(text: object, max_chars: int = MAX_CELL_CHARS) -> str:
    """Text safe inside one Markdown table cell or on one line of prose."""
    raw = value_text(text) if not isinstance(text, str) else text
    raw = _CONTROL.sub("", raw)
    if len(raw) > max_chars:
        raw = raw[: max_chars - 1] + "…"
    escaped = _CELL_SPECIAL.sub(lambda m: _CELL_ESCAPES[m.group(0)], raw)
    return _LINE_BREAKS.sub("<br>", escaped)


def fence(text: str, info: str = "text") -> str:
    """A fenced code block holding ``text`` verbatim; nothing inside can close it."""
    body = _CONTROL.sub("", _LINE_BREAKS.sub("\n", text)).rstrip("\n")
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{info}\n{body}\n{ticks}"


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A Markdown table; every cell, header included, goes through ``cell``."""
    head = [cell(h) for h in headers]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for row in rows:
        if len(row) != len(head):
            raise ValueError(f"table row has {len(row)} cells, header has {len(head)}")
        lines.append("| " + " | ".join(cell(v) for v in row) + " |")
    return "\n".join(lines)
