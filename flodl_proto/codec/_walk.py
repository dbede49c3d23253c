"""The RoundFrame reader's structure walk and its memory of recent frame layouts.

:class:`_FrameWalk` applies every check upstream's reader makes before the tag, in its order,
without creating payload views (:mod:`.round_frame` builds the frame from what it found; the
stream decoders resume it as bytes trickle in). :class:`_Layout` remembers what a walk found, so
that a later frame carrying the same metadata bytes (every round of a run has the same layout) is
not walked again: its bytes are compared with the remembered ones instead, and only its weight is
checked.

Upstream: ``flodl/src/distributed/controller/round_frame.rs`` ``read_round_frame_streamed``.
"""

from __future__ import annotations

import math
import struct as _struct
from decimal import Decimal
from hmac import compare_digest as _compare_digest
from typing import Any, Final

from ..errors import protocol_error
from ..spec import (
    AUTH_TAG_LEN,
    MAX_ROUND_FRAME_TENSORS,
    ROUND_FRAME_HEADER_LEN,
    ROUND_FRAME_MAGIC,
    ROUND_KIND_CONTROL,
    ROUND_KIND_MODEL,
)
from ._common import check_ceiling
from .auth import Premac, check_salt, new_mac
from .structs import PACKED, dims_packed

_HEADER = PACKED["ROUND_FRAME_HEADER"]
_KIND = PACKED["ROUND_FRAME_KIND"]
_WEIGHT = PACKED["ROUND_FRAME_WEIGHT"]
_META = PACKED["TENSOR_META"]
_NBYTES = PACKED["TENSOR_NBYTES"]


def _rust_f64(x: float) -> str:
    """Format an f64 the way Rust's Display (``{}``) does for the values the reader rejects:
    the shortest digits that read back as ``x``, written out without an exponent (``-1``,
    ``-0.5``, ``-25000000000000000``, ``-0.0000001``), ``NaN``, ``inf``, ``-inf``."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    r = format(Decimal(repr(x)), "f")
    return r[:-2] if r.endswith(".0") else r


_META_UNPACK = _META.unpack_from
_WEIGHT_UNPACK = _WEIGHT.unpack_from
_NBYTES_UNPACK = _NBYTES.unpack_from


class _FrameWalk:
    """Resumable walk over a frame's structure, applying every pre-tag check in upstream's
    order (magic, tensor cap, kind, weight; per tensor meta, shape, nbytes, ceiling, data;
    footer). Never creates payload views.

    :meth:`advance` may be called again with a longer buffer holding the same leading bytes: it
    resumes at the last completed tensor, so trickled input is walked in linear time.
    """

    __slots__ = ("ceiling", "entries", "kind", "num_tensors", "pos", "total", "weight")

    def __init__(self, ceiling: int) -> None:
        self.ceiling = check_ceiling(ceiling)
        self.num_tensors = -1  # header not parsed yet
        self.kind = -1
        self.weight = 0.0
        self.pos = 0
        self.total = 0
        self.entries: list[tuple[int, tuple[int, ...], int, int]] = []

    def advance(self, mv: memoryview, partial: bool) -> int | None:
        """Walk as far as ``mv`` allows.

        Returns None when the body and the footer are present (``pos`` is the body end), else the
        minimum total length needed to go on (with ``partial``; without it, the truncation error
        naming the field is raised — except inside the 8-byte header, which returns 8).
        """
        end = len(mv)
        if self.num_tensors < 0:
            if end < ROUND_FRAME_HEADER_LEN:
                return ROUND_FRAME_HEADER_LEN  # END_OF_STREAM for a whole-buffer reader
            magic, num_tensors = _HEADER.unpack_from(mv, 0)
            if magic != ROUND_FRAME_MAGIC:
                raise protocol_error("frame.bad_magic", got=magic, expected=ROUND_FRAME_MAGIC)
            if num_tensors > MAX_ROUND_FRAME_TENSORS:
                raise protocol_error("frame.too_many_tensors", count=num_tensors,
                                     cap=MAX_ROUND_FRAME_TENSORS)
            self.num_tensors = num_tensors
            self.pos = ROUND_FRAME_HEADER_LEN
        if self.kind < 0:
            pos = self.pos
            if end < pos + 1:
                return _short(partial, pos + 1, "frame.kind_read_failed", offset=pos)
            (kind_byte,) = _KIND.unpack_from(mv, pos)
            if kind_byte not in (ROUND_KIND_MODEL, ROUND_KIND_CONTROL):
                raise protocol_error("frame.unknown_kind", value=kind_byte)
            if end < pos + 9:
                return _short(partial, pos + 9, "frame.weight_read_failed", offset=pos + 1)
            (weight,) = _WEIGHT.unpack_from(mv, pos + 1)
            if not math.isfinite(weight) or weight < 0.0:
                raise protocol_error("frame.bad_weight", weight=_rust_f64(weight))
            self.kind, self.weight, self.pos = kind_byte, weight, pos + 9
        entries, ceiling = self.entries, self.ceiling
        ti, pos, total = len(entries), self.pos, self.total
        while ti < self.num_tensors:  # pos and total: the last completed tensor's, as stored
            if end < pos + 2:
                return _short(partial, pos + 2, "frame.meta_read_failed", index=ti, offset=pos)
            dtype, ndim = _META_UNPACK(mv, pos)
            at = pos + 2
            if end < at + 4 * ndim:
                return _short(partial, at + 4 * ndim, "frame.shape_read_failed", index=ti,
                              offset=at)
            dims = dims_packed(ndim).unpack_from(mv, at) if ndim else ()
            at += 4 * ndim
            if end < at + 8:
                return _short(partial, at + 8, "frame.nbytes_read_failed", index=ti, offset=at)
            (nbytes,) = _NBYTES_UNPACK(mv, at)
            at += 8
            total += nbytes
            if total > ceiling:
                raise protocol_error("frame.past_ceiling", index=ti, ceiling=ceiling,
                                     nbytes=nbytes, total=total)
            if end < at + nbytes:
                return _short(partial, at + nbytes, "frame.data_read_failed", index=ti,
                              got=end - at, need=nbytes, offset=at)
            entries.append((dtype, dims, at, nbytes))
            ti, pos = ti + 1, at + nbytes
            self.total, self.pos = total, pos
        if end < self.pos + AUTH_TAG_LEN:
            return _short(partial, self.pos + AUTH_TAG_LEN, "frame.footer_read_failed",
                          offset=self.pos)
        return None


def _short(partial: bool, at_least: int, error_id: str, **fields: Any) -> int:
    """A walk that ran out of input: with ``partial``, the total length needed to go on;
    without it, the truncation error ``error_id`` naming the field."""
    if partial:
        return at_least
    raise protocol_error(error_id, **fields)


#: frames of at most this many tensors have their layout remembered (:class:`_Layout`)
LAYOUT_CACHE_MAX_TENSORS: Final = 1024
#: how many layouts are remembered, most recently used first
LAYOUT_CACHE_SIZE: Final = 4


class _Layout:
    """What a successful walk learned about one frame layout, to skip the walk of a later frame
    whose metadata bytes are the same.

    A frame's metadata are every byte before its tag except the weight and the payloads: magic,
    tensor count and kind, then each tensor's dtype, ndim, dims and nbytes. ``meta`` unpacks
    exactly those bytes of a buffer (the weight and each payload are pad bytes it skips) and
    ``key`` is what it unpacked from the walked frame, so ``meta.unpack_from(mv) == key`` holds
    exactly when ``mv`` carries the same metadata bytes at the same offsets. For such a frame
    every check of the walk but the weight's gives the same outcome (the walk reads nothing
    else, and the ceiling is the same), so only the weight is checked again. Nothing here
    refers to the walked buffer: the entries hold offsets, and the key holds copies of the
    metadata bytes (about 20 bytes a tensor).
    """

    __slots__ = ("body_end", "ceiling", "entries", "key", "kind", "meta")

    def __init__(self, mv: memoryview, walk: _FrameWalk) -> None:
        fmt = ["<", f"{ROUND_FRAME_HEADER_LEN + 1}s8x"]  # magic, count, kind; the weight skipped
        run = 0  # metadata bytes not yet in the format (tensor heads with nothing between)
        pos = ROUND_FRAME_HEADER_LEN + 1 + 8
        for _, _, start, nbytes in walk.entries:
            run += start - pos
            if nbytes:
                fmt.append(f"{run}s{nbytes}x")
                run = 0
            pos = start + nbytes
        if run:
            fmt.append(f"{run}s")
        self.meta = _struct.Struct("".join(fmt))
        self.key = self.meta.unpack_from(mv, 0)
        self.ceiling = walk.ceiling
        self.body_end = walk.pos
        self.kind = walk.kind
        self.entries = tuple([(d, s, a, a + n) for d, s, a, n in walk.entries])


#: the remembered layouts (a tuple replaced whole, never mutated: threads may read it while
#: another one replaces it)
_layouts: tuple[_Layout, ...] = ()


def _known_layout(mv: memoryview, ceiling: int) -> _Layout | None:
    """The remembered layout whose metadata bytes ``mv`` carries, with ``ceiling`` and room for
    the tag, or None.

    No upstream counterpart: a fast path of this package (a remembered layout); the checks it keeps
    are those of ``controller/round_frame.rs`` ``read_round_frame_streamed``.
    """
    global _layouts
    layouts = _layouts
    n = len(mv)
    for i, lay in enumerate(layouts):
        if (n >= lay.body_end + AUTH_TAG_LEN and ceiling == lay.ceiling
                and lay.meta.unpack_from(mv, 0) == lay.key):
            if i:
                _layouts = (lay, *layouts[:i], *layouts[i + 1:])
            return lay
    return None


def read_known_frame(mv: memoryview, salt: bytes, ceiling: int, premac: Premac | None
                     ) -> tuple[_Layout, float, int] | None:
    """The frame at the start of ``mv``, read without building it, when it carries a remembered
    layout: ``(layout, weight, consumed)`` when :func:`_known_layout` finds the layout whose
    metadata bytes ``mv`` carries with ``ceiling``, the weight is finite and not below zero, and
    the tag verifies (against ``premac`` when it covers the frame's bytes before the tag, else
    the MAC computed here with ``salt``, the checked 16-byte session salt); else None, having
    raised nothing: the full decode (``round_frame.decode_round_frame_or_eos``) must run, and
    gives the frame or the error, in upstream's order.

    These are every check that decode makes of a frame of a remembered layout (the metadata
    bytes decide every other check of the walk, see :class:`_Layout`), so that decode would
    return the frame of the layout's kind, this weight and the layout's tensors (payloads
    ``mv[start:stop]`` per entry), and ``consumed`` bytes.

    No upstream counterpart: a fast path of this package (a remembered layout); the checks it keeps
    are those of ``controller/round_frame.rs`` ``read_round_frame_streamed``.
    """
    lay = _known_layout(mv, ceiling)
    if lay is None:
        return None
    (weight,) = _WEIGHT_UNPACK(mv, ROUND_FRAME_HEADER_LEN + 1)
    if not 0.0 <= weight < math.inf:  # NaN, inf, below zero (-0.0 passes, as in the walk)
        return None
    covered = lay.body_end
    if premac is not None and premac.covered == covered:
        computed = premac.digest[:AUTH_TAG_LEN]
    else:
        mac = new_mac(check_salt(salt))
        mac.update(mv[:covered])
        computed = mac.digest()[:AUTH_TAG_LEN]
    # ``tags_equal`` without its copies: both are 8 bytes (a digest holds at least 8, and the
    # layout's length check leaves room for the carried tag)
    if len(computed) != AUTH_TAG_LEN \
            or not _compare_digest(computed, mv[covered:covered + AUTH_TAG_LEN]):
        return None
    return lay, weight, covered + AUTH_TAG_LEN


def _remember(mv: memoryview, walk: _FrameWalk) -> None:
    """Remember the layout of the frame ``walk`` completed on ``mv`` (small frames only)."""
    global _layouts
    if walk.num_tensors <= LAYOUT_CACHE_MAX_TENSORS:
        _layouts = (_Layout(mv, walk), *_layouts[:LAYOUT_CACHE_SIZE - 1])
