"""The RoundFrame reader's layout memory (``codec/_walk.py`` ``_Layout``).

A frame whose metadata bytes (magic, tensor count, kind, and every tensor's dtype, ndim, dims and
nbytes) equal a remembered frame's is decoded without walking its structure again; any other
frame is walked as before. These tests count the walks and compare every outcome (frame,
consumed length, carried tag, or the error's class and message) with a reader that remembers
nothing.
"""

from __future__ import annotations

import gc
import math
import struct
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import flodl_proto.codec._walk as walk_mod
import flodl_proto.codec.round_frame as rf
from flodl_proto.codec import (
    RoundFrame,
    TensorPayload,
    decode_round_frame,
    encode_round_frame_bytes,
)
from flodl_proto.codec.auth import Premac, new_mac
from flodl_proto.codec.round_frame import parse_round_frame_or_eos
from flodl_proto.errors import ProtocolError

SALT = bytes(range(16))
HEAD = 4 + 4 + 1 + 8  # magic, count, kind, weight


def _frame(weight: float = 1.5, kind: int = 0, fill: int = 1,
           tensors: list[tuple[int, tuple[int, ...], int | None]] | None = None) -> bytes:
    """A signed frame; ``tensors``: (dtype, shape, nbytes or None for numel * 4)."""
    specs = tensors if tensors is not None else [(0, (3,), None), (1, (2, 2), 8), (0, (), 4)]
    ts = []
    for dtype, shape, nbytes in specs:
        n = 4 * math.prod(shape) if nbytes is None else nbytes
        ts.append(TensorPayload(dtype, shape, bytes((fill + i) % 256 for i in range(n))))
    return encode_round_frame_bytes(RoundFrame(kind, weight, ts, check_nbytes=False), SALT)


class Walks:
    """Counts frame walks and tensor-header parses."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.walks = 0
        self.headers = 0
        real_advance = walk_mod._FrameWalk.advance
        real_meta = walk_mod._META_UNPACK

        def advance(walk: Any, mv: memoryview, partial: bool) -> int | None:
            self.walks += 1
            return real_advance(walk, mv, partial)

        def meta(data: Any, offset: int = 0) -> Any:
            self.headers += 1
            return real_meta(data, offset)

        monkeypatch.setattr(walk_mod._FrameWalk, "advance", advance)
        monkeypatch.setattr(walk_mod, "_META_UNPACK", meta)

    def reset(self) -> None:
        self.walks = self.headers = 0


@pytest.fixture()
def walks(monkeypatch: pytest.MonkeyPatch) -> Iterator[Walks]:
    monkeypatch.setattr(walk_mod, "_layouts", ())
    yield Walks(monkeypatch)


def _outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    """A call's result as comparable values, or its error's class, id and message."""
    try:
        res = fn()
    except ProtocolError as e:
        return ("error", (type(e), e.error_id, str(e)))
    if res is rf.END_OF_STREAM:
        return ("eos", None)
    frame, consumed, *tag = res
    tensors = [(t.dtype, t.shape, bytes(t.data)) for t in frame.tensors]
    weight = struct.pack("<d", frame.weight)
    return ("frame", (frame.kind, weight, tensors, consumed, tag))


def _cold(fn: Callable[[], Any], monkeypatch: pytest.MonkeyPatch) -> tuple[str, Any]:
    """The outcome with nothing remembered (the remembered layouts are put back after)."""
    saved = walk_mod._layouts
    monkeypatch.setattr(walk_mod, "_layouts", ())
    try:
        return _outcome(fn)
    finally:
        monkeypatch.setattr(walk_mod, "_layouts", saved)


def test_a_repeated_layout_is_walked_once(walks: Walks) -> None:
    first = _frame()
    frame, consumed = decode_round_frame(first, SALT)
    assert (walks.walks, walks.headers) == (1, 3)
    assert consumed == len(first)
    walks.reset()
    later = _frame(weight=0.25, fill=77)  # same metadata, other weight and payload bytes
    frame, consumed = decode_round_frame(later, SALT)
    assert (walks.walks, walks.headers) == (0, 0)
    assert consumed == len(later)
    assert frame.weight == 0.25 and int(frame.kind) == 0
    assert [(t.dtype, t.shape, t.nbytes) for t in frame.tensors] == [
        (0, (3,), 12), (1, (2, 2), 8), (0, (), 4)]
    body = later[HEAD:]
    # the payloads are views of ``later`` at the walked offsets: after each head of
    # 2 + 4 * ndim + 8 bytes
    assert bytes(frame.tensors[0].data) == body[14:26]
    assert bytes(frame.tensors[1].data) == body[26 + 18:26 + 18 + 8]
    assert bytes(frame.tensors[2].data) == body[52 + 10:52 + 10 + 4]
    assert frame == decode_round_frame(later, SALT)[0]
    for _ in range(5):
        decode_round_frame(_frame(weight=2.0, fill=5), SALT)
    assert (walks.walks, walks.headers) == (0, 0)
    # a weight of zero (a rank without realized work this round) is a valid weight too
    frame, _ = decode_round_frame(_frame(weight=0.0, fill=6), SALT)
    assert frame.weight == 0.0 and (walks.walks, walks.headers) == (0, 0)


@pytest.mark.parametrize(("name", "tensors", "kind"), [
    ("dtype", [(1, (3,), None), (1, (2, 2), 8), (0, (), 4)], 0),
    ("ndim", [(0, (3, 1), None), (1, (2, 2), 8), (0, (), 4)], 0),
    ("a dim", [(0, (3,), None), (1, (2, 3), 8), (0, (), 4)], 0),
    ("nbytes", [(0, (3,), None), (1, (2, 2), 6), (0, (), 4)], 0),
    ("tensor count", [(0, (3,), None), (1, (2, 2), 8)], 0),
    ("one more tensor", [(0, (3,), None), (1, (2, 2), 8), (0, (), 4), (0, (1,), 4)], 0),
    ("elision", [(0, (3,), 0), (1, (2, 2), 8), (0, (), 4)], 0),
    ("all elided", [(0, (3,), 0), (1, (2, 2), 0), (0, (), 0)], 0),
    ("kind", [(0, (3,), None), (1, (2, 2), 8), (0, (), 4)], 1),
])
def test_a_changed_layout_is_walked_afresh(walks: Walks, monkeypatch: pytest.MonkeyPatch,
                                           name: str, tensors: Any, kind: int) -> None:
    decode_round_frame(_frame(), SALT)
    changed = _frame(kind=kind, tensors=tensors, fill=9)
    walks.reset()
    warm = _outcome(lambda: parse_round_frame_or_eos(changed))
    assert (walks.walks, walks.headers) == (1, len(tensors)), name
    assert warm == _cold(lambda: parse_round_frame_or_eos(changed), monkeypatch)
    assert warm[0] == "frame"
    walks.reset()
    again = _outcome(lambda: parse_round_frame_or_eos(changed))
    assert again == warm and walks.walks == 0  # now remembered too


def test_every_metadata_byte_is_compared(walks: Walks, monkeypatch: pytest.MonkeyPatch) -> None:
    """Flip each byte of a frame (without the tag): a metadata byte makes the reader walk, a
    weight or payload byte does not (unless the weight turns invalid); every outcome, error or
    frame, is the one of a reader that remembers nothing."""
    base = _frame(tensors=[(0, (3,), None), (1, (2, 2), 0), (0, (), 4), (1, (1, 1, 2), 4)])
    parse_round_frame_or_eos(base)
    meta: set[int] = set(range(9))
    pos = HEAD
    for ndim, nbytes in ((1, 12), (2, 0), (0, 4), (3, 4)):
        meta.update(range(pos, pos + 10 + 4 * ndim))
        pos += 10 + 4 * ndim + nbytes
    assert pos == len(base) - 8
    walked_for_weight = 0
    for at in range(len(base) - 8):
        for flip in (0x01, 0x80):
            data = bytearray(base)
            data[at] ^= flip
            walks.reset()
            warm = _outcome(lambda d=data: parse_round_frame_or_eos(d))  # type: ignore[misc]
            walked = walks.walks
            assert warm == _cold(lambda d=data: parse_round_frame_or_eos(d),  # type: ignore[misc]
                                 monkeypatch), (at, flip)
            if at in meta:
                assert walked == 1, (at, flip)
            elif 9 <= at < HEAD:
                walked_for_weight += walked
                (w,) = struct.unpack_from("<d", data, 9)
                assert walked == (0 if 0.0 <= w < math.inf else 1), (at, flip)
            else:
                assert walked == 0, (at, flip)
            # the remembered layout is still the base's (a changed one was remembered first)
            parse_round_frame_or_eos(base)
    assert walked_for_weight == 1  # only 0x80 on the top weight byte (the sign) makes it bad


@pytest.mark.parametrize("case", ["short", "tag", "weight nan", "weight -1", "weight inf",
                                  "ceiling"])
def test_a_bad_frame_with_a_known_layout_fails_as_before(
        walks: Walks, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    good = _frame()
    decode_round_frame(good, SALT)
    ceiling = 1 << 30
    data = bytearray(_frame(fill=3))
    if case == "short":
        data = data[:-1]
    elif case == "tag":
        data[-1] ^= 1
    elif case == "weight nan":
        data = bytearray(rf.encode_round_frame_bytes(
            rf.RoundFrame.trusted(rf.RoundKind.MODEL, math.nan,
                                  decode_round_frame(data, SALT)[0].tensors), SALT))
    elif case == "weight -1":
        struct.pack_into("<d", data, 9, -1.0)
    elif case == "weight inf":
        struct.pack_into("<d", data, 9, math.inf)
    else:
        ceiling = 12 + 8 + 4 - 1  # one byte below the frame's payload total
    warm = _outcome(lambda: (*decode_round_frame(data, SALT, ceiling=ceiling),))
    cold = _cold(lambda: (*decode_round_frame(data, SALT, ceiling=ceiling),), monkeypatch)
    assert warm == cold
    assert warm[0] == "error"
    expected = {"short": "frame.footer_read_failed", "tag": "frame.auth_failed",
                "weight nan": "frame.bad_weight", "weight -1": "frame.bad_weight",
                "weight inf": "frame.bad_weight", "ceiling": "frame.past_ceiling"}[case]
    assert warm[1][1] == expected


def test_the_ceiling_is_part_of_the_layout(walks: Walks) -> None:
    data = _frame()
    parse_round_frame_or_eos(data, ceiling=100)
    walks.reset()
    parse_round_frame_or_eos(data, ceiling=101)
    assert walks.walks == 1
    walks.reset()
    parse_round_frame_or_eos(data, ceiling=100)
    parse_round_frame_or_eos(data, ceiling=101)
    assert walks.walks == 0


def test_the_memory_is_bounded_and_holds_no_buffer(walks: Walks) -> None:
    for n in range(walk_mod.LAYOUT_CACHE_SIZE + 3):
        parse_round_frame_or_eos(_frame(tensors=[(0, (n,), None)]))
    assert len(walk_mod._layouts) == walk_mod.LAYOUT_CACHE_SIZE
    assert [lay.entries[0][1] for lay in walk_mod._layouts] == [
        (n,) for n in range(walk_mod.LAYOUT_CACHE_SIZE + 2, 2, -1)]
    # a frame of exactly the limit's tensor count is remembered
    limit = _frame(tensors=[(0, (), 0)] * walk_mod.LAYOUT_CACHE_MAX_TENSORS)
    walks.reset()
    parse_round_frame_or_eos(limit)
    parse_round_frame_or_eos(limit)
    assert walks.walks == 1
    assert len(walk_mod._layouts[0].entries) == walk_mod.LAYOUT_CACHE_MAX_TENSORS
    # a frame of more tensors than the limit is walked every time and not remembered
    many = _frame(tensors=[(0, (), 0)] * (walk_mod.LAYOUT_CACHE_MAX_TENSORS + 1))
    before = walk_mod._layouts
    walks.reset()
    parse_round_frame_or_eos(many)
    parse_round_frame_or_eos(many)
    assert walks.walks == 2 and walk_mod._layouts == before
    # the frames' buffers are not kept alive by the remembered layouts
    buf = np.frombuffer(_frame(fill=11), dtype=np.uint8).copy()
    ref = weakref.ref(buf)
    frame, _ = decode_round_frame(buf, SALT)
    frame2, _ = decode_round_frame(buf, SALT)
    assert frame == frame2
    del frame, frame2, buf
    gc.collect()
    assert ref() is None


def test_a_hit_moves_its_layout_first(walks: Walks) -> None:
    a = _frame(tensors=[(0, (1,), None)])
    b = _frame(tensors=[(0, (2,), None)])
    parse_round_frame_or_eos(a)
    parse_round_frame_or_eos(b)
    assert [lay.entries[0][1] for lay in walk_mod._layouts] == [(2,), (1,)]
    walks.reset()
    parse_round_frame_or_eos(a)
    assert walks.walks == 0
    assert [lay.entries[0][1] for lay in walk_mod._layouts] == [(1,), (2,)]
    c = _frame(tensors=[(0, (3,), None)])
    parse_round_frame_or_eos(c)
    assert [lay.entries[0][1] for lay in walk_mod._layouts] == [(3,), (1,), (2,)]
    parse_round_frame_or_eos(a)  # a hit in the middle: the others keep their order
    assert [lay.entries[0][1] for lay in walk_mod._layouts] == [(1,), (3,), (2,)]
    walks.reset()
    for frame in (a, b, c):
        parse_round_frame_or_eos(frame)
    assert walks.walks == 0


def test_known_layout_is_the_readers_public_lookup(walks: Walks) -> None:
    """``round_frame.known_layout`` is public and is the reader's own lookup (no wrapper, so no
    extra call per frame); the host fold takes it from there, not from the private module. It
    finds the layout of a frame read before (whatever its weight and payload bytes), with the
    same ceiling and room for the tag, and walks nothing."""
    import inspect

    from flodl_proto.reduce import _host_sums, host_fold
    from flodl_proto.spec import DEFAULT_FRAME_CEILING as CEIL

    assert "known_layout" in rf.__all__ and rf.known_layout is walk_mod._known_layout
    assert host_fold._known_layout is rf.known_layout
    assert "codec._walk" not in inspect.getsource(host_fold)
    assert "codec._walk" not in inspect.getsource(_host_sums)
    data = _frame()
    mv = memoryview(data)
    assert rf.known_layout(mv, CEIL) is None
    parse_round_frame_or_eos(data)
    walks.reset()
    lay = rf.known_layout(mv, CEIL)
    assert lay is not None and lay is walk_mod._layouts[0]
    assert rf.known_layout(memoryview(_frame(weight=0.25, fill=9)), CEIL) is lay
    assert rf.known_layout(mv, CEIL + 1) is None
    assert rf.known_layout(mv[:-1], CEIL) is None  # no room for the tag
    assert rf.known_layout(memoryview(_frame(tensors=[(0, (4,), None)])), CEIL) is None
    assert (walks.walks, walks.headers) == (0, 0)


def _signed(data: bytes | bytearray, salt: bytes = SALT) -> bytes:
    """``data`` with its last 8 bytes replaced by the tag of the bytes before them."""
    mac = new_mac(salt)
    mac.update(bytes(data[:-8]))
    return bytes(data[:-8]) + mac.digest()[:8]


def _known_outcome(data: bytes, *, ceiling: int = 1 << 30, salt: bytes = SALT,
                   premac: Premac | None = None) -> Any:
    """``read_known_frame`` with the good frame's layout the only one remembered (with the
    ceiling 1 GiB), as values:
    None, or (the layout is the remembered one, weight bits, consumed, the frame it names)."""
    walk_mod._layouts = ()
    parse_round_frame_or_eos(_frame(), ceiling=1 << 30)
    (lay,) = walk_mod._layouts
    mv = memoryview(data)
    res = walk_mod.read_known_frame(mv, salt, ceiling, premac)
    if res is None:
        return None
    got, weight, consumed = res
    frame = rf.known_round_frame(got, weight, mv)
    return (got is lay, struct.pack("<d", weight), consumed,
            (frame.kind, [(t.dtype, t.shape, bytes(t.data)) for t in frame.tensors]))


def _decoded(data: bytes, *, ceiling: int = 1 << 30, salt: bytes = SALT) -> Any:
    """What the full decode gives with nothing remembered, in ``_known_outcome``'s terms for a
    frame of the good frame's metadata, else None."""
    walk_mod._layouts = ()
    try:
        res = rf.decode_round_frame_or_eos(data, salt, ceiling=ceiling)
    except ProtocolError:
        return None
    if res is rf.END_OF_STREAM:
        return None
    frame, consumed = res
    good = decode_round_frame(_frame(), SALT)[0]
    if (frame.kind, [(t.dtype, t.shape, t.nbytes) for t in frame.tensors]) != (
            good.kind, [(t.dtype, t.shape, t.nbytes) for t in good.tensors]):
        return None  # other metadata bytes: not the remembered layout
    return (True, struct.pack("<d", frame.weight), consumed,
            (frame.kind, [(t.dtype, t.shape, bytes(t.data)) for t in frame.tensors]))


@pytest.mark.parametrize("flip", [0x01, 0x80, 0xFF])
def test_read_known_frame_takes_exactly_the_frames_the_decode_reads_at_the_layout(
        walks: Walks, flip: int) -> None:
    """Every byte of a frame changed (and the frame signed again, so that only the changed
    field decides): ``read_known_frame`` gives the layout, weight, length and (through
    ``known_round_frame``) the frame the full decode gives when that decode succeeds with the
    remembered layout's metadata (a payload byte, a valid weight), and None for every other
    frame (metadata bytes, a NaN / infinite / negative weight); a changed tag byte (not signed
    again) is None too."""
    good = _frame()
    taken = 0
    for i in range(len(good) - 8):
        data = bytearray(good)
        data[i] ^= flip
        signed = _signed(data)
        want = _decoded(signed)
        assert _known_outcome(signed) == want, i
        taken += want is not None
    for i in range(len(good) - 8, len(good)):
        data = bytearray(good)
        data[i] ^= flip
        assert _decoded(bytes(data)) is None
        assert _known_outcome(bytes(data)) is None, i
    # every payload byte and a few weight bytes (the low mantissa ones) are taken
    assert taken >= 24 + 6


@pytest.mark.parametrize("weight", [0.0, -0.0, 5e-324, 1.7976931348623157e308])
def test_read_known_frame_takes_the_edge_weights(walks: Walks, weight: float) -> None:
    data = _frame(weight=weight, fill=9)
    got = _known_outcome(data)
    assert got is not None and got == _decoded(data)
    assert got[1] == struct.pack("<d", weight) and got[2] == len(data)


@pytest.mark.parametrize("weight", [math.nan, -math.nan, math.inf, -math.inf, -5e-324, -1.0])
def test_read_known_frame_leaves_a_bad_weight_to_the_decode(walks: Walks, weight: float) -> None:
    data = bytearray(_frame())
    struct.pack_into("<d", data, 9, weight)
    data = bytearray(_signed(data))
    assert _known_outcome(bytes(data)) is None
    with pytest.raises(ProtocolError) as e:
        decode_round_frame(bytes(data), SALT)
    assert e.value.error_id == "frame.bad_weight"


def test_read_known_frame_length_ceiling_salt_and_trailing_bytes(walks: Walks) -> None:
    good = _frame(fill=5)
    for n in range(len(good)):  # every truncation, down to empty input
        assert _known_outcome(good[:n]) is None, n
    got = _known_outcome(good + b"xyz")  # bytes after the frame are left alone
    assert got is not None and got[2] == len(good) and got == _decoded(good + b"xyz")
    assert _known_outcome(good, ceiling=(1 << 30) - 1) is None  # the layout's ceiling only
    other = bytes(range(1, 17))
    assert _known_outcome(good, salt=other) is None
    assert _known_outcome(_signed(good, other), salt=other) is not None


def test_read_known_frame_trusts_a_premac_of_the_covered_length_only(walks: Walks) -> None:
    good = _frame(fill=6)
    n = len(good) - 8
    mac = new_mac(SALT)
    mac.update(good[:n])
    right = Premac(n, mac.digest())
    wrong = Premac(n, bytes(32))
    assert _known_outcome(good, premac=right) == _known_outcome(good) is not None
    assert _known_outcome(good, premac=Premac(n, mac.digest()[:8])) is not None
    # a digest for the covered length is used as it is, whatever it says (as the decode does)
    assert _known_outcome(good, premac=wrong) is None
    with pytest.raises(ProtocolError) as e:
        rf.decode_round_frame_or_eos(good, SALT, premac=wrong)
    assert e.value.error_id == "frame.auth_failed"
    # one for another length is not used: the MAC is computed
    assert _known_outcome(good, premac=Premac(n - 1, bytes(32))) is not None
    assert _known_outcome(good, premac=Premac(n + 1, bytes(32))) is not None
    forged = good[:-1] + bytes([good[-1] ^ 1])
    assert _known_outcome(forged, premac=right) is None  # the carried tag is compared
