"""Markdown building blocks of the generated protocol reference: escaping, tables, anchors and
RFC-style byte diagrams (used by :mod:`flodl_proto.docs`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["DiagramItem", "byte_diagram"]

_ROW_BYTES = 4
_CELL = 16  # characters per byte in a diagram row (8 bits x 2 characters)
_ROW_CHARS = _ROW_BYTES * _CELL + 1


# -------------------------------------------------------------------------------------------------
# Markdown helpers
# -------------------------------------------------------------------------------------------------
#: a ``<`` that would open an HTML tag, a comment or a declaration
_TAG_OPEN = re.compile(r"<(?=[A-Za-z/?!])")
#: an inline code span: a run of backticks, its text, the same run (CommonMark's rule)
_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")


def _text(value: Any) -> str:
    """Render a spec scalar as one line of Markdown text (table-safe): a ``|`` escaped, and a
    ``<`` that would open an HTML tag (``Vec<T>``: GitHub drops the unknown tag ``<T>``) written
    ``&lt;`` (``v < 251`` and ``<=`` are left as they are), outside code spans only: inside
    one (```Vec<T>```) the text shows as written, an entity as its letters."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    s = " ".join(str(value).split()).replace("|", "\\|")
    out, pos = [], 0
    for span in _CODE_SPAN.finditer(s):
        out += [_TAG_OPEN.sub("&lt;", s[pos:span.start()]), span.group(0)]
        pos = span.end()
    return "".join(out) + _TAG_OPEN.sub("&lt;", s[pos:])


def _code(value: Any) -> str:
    """Render ``value`` as an inline code span that survives backticks and table pipes."""
    s = " ".join(str(value).split()).replace("|", "\\|")
    if "`" in s:
        return f"`` {s} ``"
    return f"`{s}`"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        out.append("| " + " | ".join(r) + " |")
    return out


def _anchor(title: str) -> str:
    """GitHub-style heading anchor of ``title``."""
    a = re.sub(r"[^\w\- ]", "", title.strip().lower())
    return a.replace(" ", "-")


def _hex_bytes_le(value: int, size: int) -> str:
    return " ".join(f"{b:02x}" for b in value.to_bytes(size, "little"))


def _human_bytes(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


# -------------------------------------------------------------------------------------------------
# RFC-style byte diagrams
# -------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class DiagramItem:
    """One field of a byte diagram.

    Attributes:
        name: the label drawn in the field's box.
        size: size in bytes, or ``None`` for a variable-length field (drawn open-ended with ``/``
            edges; the next field then starts on a fresh row).

    No upstream counterpart: a drawing helper of the generated docs.
    """

    name: str
    size: int | None


@dataclass(slots=True)
class _Cell:
    field: int  # index of the DiagramItem
    c0: int  # first byte column (0..3)
    c1: int  # one past the last byte column (1..4)
    label: str
    left: str = "|"
    right: str = "|"


def _fit(candidates: Sequence[str], width: int) -> str:
    for c in candidates:
        if len(c) <= width:
            return c
    return ""


def _layout(items: Sequence[DiagramItem]) -> list[list[_Cell]]:
    rows: list[list[_Cell]] = []
    row: list[_Cell] = []
    col = 0
    seen: set[int] = set()

    def flush() -> None:
        nonlocal row, col
        if row:
            rows.append(row)
        row, col = [], 0

    for idx, item in enumerate(items):
        if item.size is None:
            label = item.name
            row.append(_Cell(idx, col, _ROW_BYTES, label, right="/"))
            flush()
            rows.append([_Cell(idx, 0, _ROW_BYTES, "", left="/", right="/")])
            seen.add(idx)
            continue
        remaining = item.size
        while remaining > 0:
            take = min(remaining, _ROW_BYTES - col)
            first = idx not in seen
            seen.add(idx)
            row.append(_Cell(idx, col, col + take, item.name if first else "\0cont"))
            col += take
            remaining -= take
            if col == _ROW_BYTES:
                flush()
    flush()
    return rows


def _field_at(row: Sequence[_Cell] | None, byte: int) -> int | None:
    if row is None:
        return None
    for c in row:
        if c.c0 <= byte < c.c1:
            return c.field
    return None


def _separator(upper: Sequence[_Cell] | None, lower: Sequence[_Cell] | None) -> str:
    chars = [" "] * _ROW_CHARS
    for bit in range(_ROW_BYTES * 8):
        byte = bit // 8
        u, d = _field_at(upper, byte), _field_at(lower, byte)
        if u is None and d is None:
            continue
        chars[2 * bit + 1] = " " if (u is not None and u == d) else "-"
    extent = 0
    for r in (upper, lower):
        if r:
            extent = max(extent, max(c.c1 for c in r) * _CELL)
    for pos in range(0, extent + 1, 2):
        left = chars[pos - 1] if pos > 0 else " "
        right = chars[pos + 1] if pos + 1 < _ROW_CHARS else " "
        if left == "-" or right == "-" or pos in (0, extent):
            chars[pos] = "+"
    return "".join(chars).rstrip()


def _row_line(row: Sequence[_Cell], above: Sequence[_Cell] | None,
              items: Sequence[DiagramItem]) -> str:
    chars = [" "] * _ROW_CHARS
    chars[row[0].c0 * _CELL] = row[0].left
    for c in row:
        width = (c.c1 - c.c0) * _CELL - 1
        label = c.label
        if label == "\0cont":
            joined = above is not None and all(
                _field_at(above, b) == c.field for b in range(c.c0, c.c1)
            )
            name = items[c.field].name
            label = "" if joined else _fit((f"{name} (cont.)", "(cont.)", ""), width)
        else:
            label = _fit((label, label.split(" ")[0], ""), width)
        start = c.c0 * _CELL + 1 + (width - len(label)) // 2
        for i, ch in enumerate(label):
            chars[start + i] = ch
        chars[c.c1 * _CELL] = c.right
    return "".join(chars).rstrip()


def byte_diagram(items: Sequence[DiagramItem]) -> list[str]:
    """Draw ``items`` (in wire order) as an RFC-style box diagram, 32 bits (4 bytes) per row.

    Each byte takes 16 characters (two per bit), so a row is 65 characters wide. A field that
    spans several rows is continued with ``(cont.)`` or, when it fills whole rows below itself,
    with an open box. A variable-length field has ``/`` edges and is followed by a fresh row.

    Args:
        items: the fields, each with its size in bytes (``None`` for variable length).

    Returns:
        The diagram's lines (two ruler lines, then boxes), without a trailing newline.

    No upstream counterpart: a drawing helper of the generated docs (upstream's layouts are
    comments in ``controller/mod.rs`` and ``relay/mux.rs``).
    """
    rows = _layout(items)
    out = [
        " " + "".join(f"{i:<20}" for i in range(3)) + "3",
        " " + " ".join(str(i % 10) for i in range(32)),
    ]
    prev: list[_Cell] | None = None
    for row in rows:
        out.append(_separator(prev, row))
        out.append(_row_line(row, prev, items))
        prev = row
    out.append(_separator(prev, None))
    return [line.rstrip() for line in out]
