"""Hex text back to bytes: the input of ``flodl-proto decode --hex``.

Reads plain hex (whitespace ignored) and the dumps people paste:

* ``xxd``: ``00000010: 0102 0304  ..``;
* ``hexdump -C``: ``00000010  01 02 ..  |..|``;
* ``od -Ax -tx1``: ``000010 01 02 ..``;
* the offset-prefixed dumps of ``docs/protocol.md``: ``0010  01 02 03 04``.

A dump may start past byte 0 (``xxd -s N``, ``hexdump -C -s N``, ``od -j N``), and the ``*`` line
of ``hexdump -C`` and ``od`` (lines equal to the one before, left out) is expanded.

No upstream counterpart: upstream flodl (``flodl/src/distributed``) reads no hex text.
"""

from __future__ import annotations

import operator
from typing import NamedTuple

from .errors import protocol_error, shown_type

__all__ = ["DEFAULT_LIMIT", "HexDump", "HexDumpTooLarge", "parse_hex_dump", "read_hex_dump"]

_HEX = frozenset("0123456789abcdefABCDEF")

#: the most bytes a hex text may stand for by default (4 GiB, ``decode``'s ``--max-input``): a
#: ``*`` line followed by a far offset stands for any number of them
DEFAULT_LIMIT = 4 << 30

#: the widest offset a dump line may carry, in hex digits (a 64-bit offset)
_OFFSET_DIGITS_MAX = 16


class HexDumpTooLarge(ValueError):
    """The hex text stands for more bytes than the limit it was read with (its ``*`` lines
    expanded); the message names the line and the count."""


class HexDump(NamedTuple):
    """The bytes of a hex text: ``data``, and ``start``, the offset its first line gives (0 for
    plain hex and a dump of a stream from its first byte)."""

    start: int
    data: bytes


def parse_hex_dump(text: str, limit: int = DEFAULT_LIMIT) -> bytes:
    """The bytes of the hex text ``text`` (:func:`read_hex_dump`'s ``data``), at most ``limit``
    of them.

    Raises:
        ValueError, HexDumpTooLarge: as :func:`read_hex_dump`.
        InvalidValue (local): as :func:`read_hex_dump` (``text`` is no str, ``limit`` is no
            byte count).

    No upstream counterpart: upstream flodl reads no hex text.
    """
    return read_hex_dump(text, limit).data


def _checked_limit(limit: object) -> int:
    """``limit`` as an int, once it is known to be a byte count.

    Raises:
        InvalidValue (local, ``capture.bad_limit``): ``limit`` is not a whole number >= 0 (a
            negative number, a bool, a float, text, None); the error names ``limit`` and the
            value.
    """
    try:  # the codec's integer rule (an int, a NumPy integer; no bool, float or text)
        n = None if isinstance(limit, bool) else operator.index(limit)  # type: ignore[arg-type]
    except TypeError:
        n = None
    if n is None or n < 0:
        raise protocol_error("capture.bad_limit", field="limit", value=limit)
    return n


def _check_text(text: object) -> None:
    """Refuse a ``text`` that is no str (bytes read from a file, None) as a local error naming
    the argument and its type."""
    if not isinstance(text, str):
        got = shown_type(text)
        hint = (": decode it first, e.g. data.decode('ascii')"
                if isinstance(text, bytes | bytearray | memoryview) else "")
        raise protocol_error("capture.bad_type", field="text", expected="hex text (a str)",
                             got=got, hint=hint)


#: the openings of a Markdown code fence line (no hex text starts so)
_FENCES = ("```", "~~~")


def read_hex_dump(text: str, limit: int = DEFAULT_LIMIT) -> HexDump:
    """Bytes from hex text: plain hex, ``xxd``, ``hexdump -C``, ``od -Ax -tx1`` output or the
    dumps of ``docs/protocol.md``.

    A line's leading token is an offset, not data, when it counts the bytes read so far (from the
    dump's start). The first line's offset may be past 0 when the dump's form says it is one: an
    ``xxd`` offset (``N:``), a ``hexdump -C`` line (``|ASCII|`` column) or an ``od`` line (6 or more
    digits, then bytes one by one); then ``start`` is that offset. A line holding only the offset
    (the dump's closing line: its length) is skipped; a ``*`` line repeats the line before it up to
    the next line's offset; the ASCII column of a dump (``xxd``'s after two spaces, ``hexdump -C``'s
    ``|..|``, ``od -c``-style ``>..<``) is ignored. A Markdown code fence line (```` ```text ````,
    ```` ``` ````, ``~~~``), copied with a dump from ``docs/protocol.md``, is skipped.

    ``limit``: the most bytes the text may stand for (:data:`DEFAULT_LIMIT`, 4 GiB), checked
    before a ``*`` line is expanded.

    Raises:
        ValueError: a line holds something other than hex digits, or, in a dump with offsets, a
            line's offset is not the count of bytes before it (a line left out, two dumps
            pasted one after the other) or has more than 16 hex digits, or a ``*`` line stands
            where it repeats nothing; the line number is named.
        HexDumpTooLarge (a ValueError): the text stands for more than ``limit`` bytes.
        InvalidValue (local): ``text`` is no str (bytes read from a file: decode them first),
            naming ``text`` and its type (``capture.bad_type``), or ``limit`` is no byte count
            (a negative number, a bool, a float: ``capture.bad_limit``, naming the value).
    """
    _check_text(text)
    limit = _checked_limit(limit)
    out = bytearray()
    start: int | None = None  # the first offset seen: the text is a dump
    last = b""  # the bytes of the line before, for a ``*`` line
    repeat_from: int | None = None  # line number of a ``*`` waiting for the next offset
    for lineno, raw_line in enumerate(text.splitlines(), 1):
        line = raw_line.strip()
        if not line or line.startswith(_FENCES):
            continue
        if line == "*":
            if start is None or not last:
                raise ValueError(f"line {lineno}: '*' repeats no dump line before it")
            repeat_from = lineno
            continue
        offset, body, sure = _split_offset(line)
        if offset is not None and offset >> (4 * _OFFSET_DIGITS_MAX):
            if sure or start is not None:
                raise ValueError(f"line {lineno}: an offset of {(offset.bit_length() + 3) // 4} "
                                 f"hex digits, wider than a 64-bit one ({_OFFSET_DIGITS_MAX})")
            offset, body = None, line  # plain hex whose first digits look like an offset
        if offset is not None and start is None:  # is the text a dump after all?
            if not out and (sure or offset == 0) and body:
                start = offset
            elif offset == len(out) and body:
                start = 0
            else:  # plain hex whose first digits look like an offset
                offset, body = None, line
        if offset is not None and start is not None:
            expected = start + len(out)
            gap = offset - expected
            if repeat_from is not None and last and gap > 0 and gap % len(last) == 0:
                if len(out) + gap > limit:
                    raise HexDumpTooLarge(
                        f"line {lineno}: the '*' of line {repeat_from} repeats the line before "
                        f"it up to offset {offset:x}: {len(out) + gap} bytes, more than the "
                        f"{limit} allowed")
                out += last * (gap // len(last))
                expected = offset
            repeat_from = None
            if offset != expected:
                width = len(line.split(None, 1)[0].rstrip(":"))
                raise ValueError(f"line {lineno}: offset {offset:0{width}x} where "
                                 f"{expected:0{width}x} was expected (a line left out, or two "
                                 "dumps one after the other)")
        elif repeat_from is not None:
            raise ValueError(f"line {lineno}: a dump line without its offset after the '*' of "
                             f"line {repeat_from}")
        digits = "".join(body.split())
        try:
            got = bytes.fromhex(digits)
        except ValueError:
            raise ValueError(f"line {lineno}: not hex: {line[:60]!r}") from None
        out += got
        if len(out) > limit:
            raise HexDumpTooLarge(f"line {lineno}: {len(out)} bytes, more than the {limit} "
                                  "allowed")
        last = got or last
    return HexDump(start or 0, bytes(out))


def _split_offset(line: str) -> tuple[int | None, str, bool]:
    """``(offset, hex body, sure)`` of a dump line by its form, or ``(None, line, False)`` when
    its leading token cannot be an offset. ``sure``: the form is one plain hex cannot take (an
    ``xxd`` ``N:``, a ``hexdump -C`` ``|..|`` column, ``od``'s 6+ digit offset followed by single
    bytes). A line holding a lone 6+ digit token (the
    closing line of ``hexdump -C`` or ``od``) has an empty body."""
    head, colon, rest = line.partition(":")
    if colon and _is_hex(head, 4):  # xxd: hex groups, two spaces, the ASCII column
        return int(head, 16), rest.strip().split("  ")[0], True
    parts = line.split(None, 1)
    token = parts[0]
    if not _is_hex(token, 4):
        return None, line, False
    if len(parts) == 1:
        return (int(token, 16), "", False) if len(token) >= 6 else (None, line, False)
    body = parts[1]
    if body.rstrip().endswith("|") and "|" in body[:-1]:  # hexdump -C
        return int(token, 16), body.split("|")[0], True
    if body.endswith("<") and ">" in body:  # od -tx1z
        body = body[:body.index(">")]
    columns = line[len(token):len(token) + 2] == "  "  # docs: offset, two spaces
    single_bytes = len(token) >= 6 and all(len(t) == 2 and _is_hex(t, 2) for t in body.split())
    if columns or single_bytes:  # od's form (an offset, then bytes one by one) is sure
        return int(token, 16), body, single_bytes and not columns
    return None, line, False


def _is_hex(token: str, min_len: int) -> bool:
    return len(token) >= min_len and all(c in _HEX for c in token)
