"""Markdown building blocks that keep user-controlled text in its place.

Layer names, run names, split names, exception messages and evidence strings come
from the user's code. Rendered into a prompt, a checklist or an explanation they must
stay inert text: never start a table row, close a fence, become a line of their own
that an LLM would read as an instruction, or become Markdown structure (a heading, a
list item, a quote, an image a viewer would fetch, a link, raw HTML). Every piece of
such text goes through exactly one of:

- ``cell(text)``: one table cell or one line of prose. Pipes, backticks and
  backslashes are escaped, and a ``]`` before ``(``, ``[`` or ``:`` (no link, image or
  link definition can form), HTML is neutralised (``<`` as ``&lt;``), a leading block
  marker (``#``, ``>``, ``-``, ``1.``...) is escaped, and
  every kind of line break becomes ``<br>``, so the text can never leave the cell or
  the line.
- ``fence(text)``: a fenced code block whose backtick fence is longer than any run of
  backticks inside, so the text can never close it.

Both first remove the characters that carry no visible text but can hide or reorder
it (:func:`visible`): control characters, bidi overrides and isolates, zero-width
characters, Unicode tag characters.

Numbers go through ``num`` so that the same value always prints the same way.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from nndx.views.text import num

MAX_CELL_CHARS = 200

# Every line break a Markdown renderer or an LLM tokenizer may honour.
_LINE_BREAKS = re.compile(r"\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")
# Characters a reader cannot see that can hide or reorder text: C0 and C1 controls (tab
# kept; line breaks are handled above), soft hyphen, Arabic letter mark, Mongolian vowel
# separator, zero-width spaces and joiners, LRM/RLM, bidi embeddings, overrides and
# isolates, invisible operators, the BOM, interlinear annotation marks, and the tag
# characters that can smuggle ASCII past a reader.
_INVISIBLE = re.compile(
    "[\x00-\x08\x0e-\x1b\x1f\x7f-\x84\x86-\x9f\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e"
    "\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000e0000-\U000e007f]"
)
# At the start of a line these open a block (heading, list item, setext underline,
# thematic break, tilde fence; ">" and "`" are escaped anyway): escaped there.
_BLOCK_START = re.compile(
    r"^(?:#{1,6}(?:\s|$)|[-+*](?:\s|$)|\d{1,9}[.)](?:\s|$)|(?:=+|-+)\s*$|(?:[-*_]\s*){3,}$|~{3,})"
)
_CELL_ESCAPES = {
    "\\": "\\\\",
    "|": "\\|",
    "`": "\\`",
    "&": "&amp;",
    "<": "&lt;",
    ">": "&gt;",
}
_CELL_SPECIAL = re.compile(r"[\\|`&<>]")
# A ] right before ( or [ closes the text of a link or image, before : the label of a
# link definition: escaped, none can form.
_LINK_CLOSE = re.compile(r"\](?=[(\[:])")


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


def visible(text: str) -> str:
    """``text`` without the characters that carry no visible text (see ``_INVISIBLE``)."""
    return _INVISIBLE.sub("", text)


def cell(text: object, max_chars: int = MAX_CELL_CHARS) -> str:
    """Text safe inside one Markdown table cell or on one line of prose: inert,
    whatever it holds (see the module docstring)."""
    raw = value_text(text) if not isinstance(text, str) else text
    raw = visible(raw).strip()
    if len(raw) > max_chars:
        raw = raw[: max_chars - 1] + "…"
    escaped = _LINK_CLOSE.sub(r"\\]", _CELL_SPECIAL.sub(lambda m: _CELL_ESCAPES[m.group(0)], raw))
    if _BLOCK_START.match(escaped):
        escaped = re.sub(r"^(\d+)", r"\1\\", escaped) if escaped[0].isdigit() else "\\" + escaped
    return _LINE_BREAKS.sub("<br>", escaped)


def fence(text: str, info: str = "text") -> str:
    """A fenced code block holding ``text`` verbatim; nothing inside can close it."""
    body = visible(_LINE_BREAKS.sub("\n", text)).rstrip("\n")
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
