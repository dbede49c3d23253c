"""RankClient's small-round shortcuts give what the general path gives: a round whose arguments
fit the kept template skips their checks (``RankClient._fits``), a whole reply of a remembered
layout is read without a parse (``read_known_frame``), a reply carrying every destination's own
bits is copied without the general loop's lists (``decode_into``), and a template is sealed
without the weight check for a float in range. Each is compared with the general path on the
same inputs: the bytes written, the values adopted, the reply, and every error."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from flodl_proto.codec import (
    Dtype,
    RoundFrame,
    RoundKind,
    TensorPayload,
    encode_round_frame_bytes,
)
from flodl_proto.codec.template import FrameTemplate
from flodl_proto.runner import rank as rank_mod
from flodl_proto.runner._rank_payloads import decode_into
from flodl_proto.runner.rank import RankClient
from flodl_proto.spec import DEFAULT_FRAME_CEILING

from .cluster_util import SALT

pytestmark = pytest.mark.timeout(60)


class EchoPeer:
    """The relay's side of the loopback as the client's socket: every record written is the
    next reply (the frame is signed with the session salt, so it is a valid consensus of the
    request's layout, of weight the request's). ``replies`` replaces the echo when set: each
    record written takes the next scripted reply instead."""

    def __init__(self, replies: Sequence[bytes] | None = None) -> None:
        self.sent: list[bytes] = []
        self.pending = b""
        self.replies = None if replies is None else list(replies)

    def sendmsg(self, buffers: Sequence[Any], ancdata: Any = (), flags: int = 0) -> int:
        data = b"".join(bytes(b) for b in buffers)
        self.sent.append(data)
        self.pending += data if self.replies is None else self.replies.pop(0)
        return len(data)

    def recv_into(self, view: memoryview, n: int) -> int:
        take = self.pending[:n]
        self.pending = self.pending[len(take):]
        view[:len(take)] = take
        return len(take)

    def close(self) -> None:
        pass


def _client(peer: EchoPeer, version: int, bf16: bool = False) -> RankClient:
    return RankClient(peer, 0, 1, SALT, version=version,  # type: ignore[arg-type]
                      wire_dtype=Dtype.BF16 if bf16 else Dtype.F32,
                      ceiling=DEFAULT_FRAME_CEILING)


def _outcome(call: Callable[[], Any]) -> tuple[Any, ...]:
    try:
        got = call()
    except Exception as e:  # the error itself is what is compared
        return ("error", type(e).__name__, str(e))
    return ("ok", bytes(got.raw), got.adopted, got.frame.weight)


def _arrays(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    big = rng.standard_normal((6, 10)).astype(np.float32)
    big[0, :4] = [np.nan, np.inf, -np.inf, -0.0]
    return [big, rng.standard_normal(257).astype(np.float32),
            np.array(rng.standard_normal(), np.float32), np.zeros((0, 3), np.float32)]


def _bits(arrays: Sequence[Any]) -> list[bytes]:
    return [np.ascontiguousarray(a).tobytes() for a in arrays]


# each step: (what to do to the client and the arrays before the call, the call's arguments)
def _steps() -> list[tuple[str, Callable[[RankClient, list[np.ndarray]], Any]]]:
    def call(*args: Any, **kwargs: Any) -> Callable[[RankClient, list[np.ndarray]], Any]:
        return lambda c, arrs: c.all_reduce_scaled(arrs, *args, **kwargs)

    def readonly(c: RankClient, arrs: list[np.ndarray]) -> Any:
        arrs[1].flags.writeable = False
        try:
            return c.all_reduce_scaled(arrs, 0.5)
        finally:
            arrs[1].flags.writeable = True

    def readonly_no_adopt(c: RankClient, arrs: list[np.ndarray]) -> Any:
        arrs[1].flags.writeable = False
        try:
            return c.all_reduce_scaled(arrs, 0.5, adopt=False)
        finally:
            arrs[1].flags.writeable = True

    def swapped(c: RankClient, arrs: list[np.ndarray]) -> Any:
        return c.all_reduce_scaled([arrs[0].astype(">f4"), *arrs[1:]], 0.5)

    def bf16_one(c: RankClient, arrs: list[np.ndarray]) -> Any:
        return c.all_reduce_scaled([arrs[0].astype(ml_dtypes.bfloat16), *arrs[1:]], 0.5)

    def subclass(c: RankClient, arrs: list[np.ndarray]) -> Any:
        class Sub(np.ndarray):
            pass
        return c.all_reduce_scaled([arrs[0].view(Sub), *arrs[1:]], 0.5)

    def reshaped(c: RankClient, arrs: list[np.ndarray]) -> Any:
        return c.all_reduce_scaled([arrs[0].reshape(10, 6), *arrs[1:]], 0.5)

    def fewer(c: RankClient, arrs: list[np.ndarray]) -> Any:
        return c.all_reduce_scaled(arrs[:3], 0.5)

    def as_tuple(c: RankClient, arrs: list[np.ndarray]) -> Any:
        return c.all_reduce_scaled(tuple(arrs), 0.25)

    def as_iter(c: RankClient, arrs: list[np.ndarray]) -> Any:
        return c.all_reduce_scaled(iter(arrs), 0.25)  # type: ignore[arg-type]

    def other_wire(c: RankClient, arrs: list[np.ndarray]) -> Any:
        c.wire_dtype = Dtype.BF16
        try:
            return c.all_reduce_scaled(arrs, 0.5)
        finally:
            c.wire_dtype = Dtype.F32

    def low_ceiling(c: RankClient, arrs: list[np.ndarray]) -> Any:
        c.ceiling = 100
        try:
            return c.all_reduce_scaled(arrs, 0.5)
        finally:
            c.ceiling = DEFAULT_FRAME_CEILING

    return [
        ("first", call(0.5)), ("again", call(0.5)), ("scale", call(1 / 7)),
        ("zero", call(0.0)), ("after-zero", call(2.0)), ("nan", call(math.nan)),
        ("inf", call(math.inf)), ("negative", call(-1.0)), ("minus-zero", call(-0.0)),
        ("np-scale", call(np.float64(0.5))), ("int-scale", call(2)),
        ("weight", call(0.5, weight=3.0)), ("no-adopt", call(0.5, adopt=False)),
        ("kind-int", call(0.5, 0)), ("control", call(0.5, RoundKind.CONTROL)),
        ("control-again", call(1.5, RoundKind.CONTROL)), ("model", call(0.5)),
        ("wire-arg", call(0.5, wire_dtype=Dtype.F32)), ("bad-kind", call(0.5, 7)),
        ("readonly", readonly), ("readonly-no-adopt", readonly_no_adopt),
        ("big-endian", swapped), ("bf16-array", bf16_one), ("subclass", subclass),
        ("reshaped", reshaped), ("fewer", fewer), ("tuple", as_tuple), ("iterator", as_iter),
        ("bf16-wire", other_wire), ("after-wire", call(0.5)), ("ceiling", low_ceiling),
        ("after-ceiling", call(0.5)),
    ]


def _run(version: int, bf16: bool) -> tuple[list[tuple[Any, ...]], list[bytes], int]:
    peer = EchoPeer()
    c = _client(peer, version, bf16)
    arrs = _arrays(0)
    out = []
    for name, step in _steps():
        res = _outcome(lambda step=step: step(c, arrs))  # type: ignore[misc]
        out.append((name, res, _bits(arrs), c.rounds, c.closed))
    c.close()
    return out, peer.sent, c.bytes_received


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("bf16", [False, True], ids=["f32-wire", "bf16-wire"])
def test_a_round_that_fits_the_kept_template_is_the_checked_round(
        monkeypatch: pytest.MonkeyPatch, version: int, bf16: bool) -> None:
    taken: list[bool] = []
    real_fits = RankClient._fits

    def spy(self: RankClient, *args: Any) -> bool:
        ok = real_fits(self, *args)
        taken.append(ok)
        return ok

    monkeypatch.setattr(RankClient, "_fits", spy)
    fast = _run(version, bf16)
    assert sum(taken) >= 10  # the shortcut was taken (and refused) on the way
    assert not all(taken)
    monkeypatch.setattr(RankClient, "_fits", lambda *args: False)  # every round checked
    checked = _run(version, bf16)
    assert fast[0] == checked[0]
    assert fast[1] == checked[1] and fast[2] == checked[2]
    errors = {name for name, res, *_ in fast[0] if res[0] == "error"}
    assert {"nan", "inf", "negative", "bad-kind", "readonly", "big-endian", "ceiling"} <= errors


# -- the reply read -------------------------------------------------------------------------------
def _record(body: bytes, prefix: int | None = None) -> bytes:
    return (len(body) if prefix is None else prefix).to_bytes(4, "little") + body


def _frame(k: float, weight: float = 2.0, n: int = 64) -> RoundFrame:
    return RoundFrame(RoundKind.MODEL, weight, [
        TensorPayload.from_array(np.arange(n, dtype=np.float32) + np.float32(k), 0),
        TensorPayload.from_array(np.full((3, 2), k, np.float32), 0)])


def _resigned(body: bytearray) -> bytes:
    from flodl_proto.codec.auth import compute_tag
    return bytes(body[:-8]) + compute_tag(SALT, [bytes(body[:-8])])


def _replies() -> list[tuple[str, bytes, int]]:
    """``(name, reply record, the request's first tensor's length)``: a request as long as the
    reply's prefix says (the reply read in the one recv of its expected length), except for
    the truncated reply and the one over the ceiling."""
    good = encode_round_frame_bytes(_frame(1.0), SALT)
    weight_at = 8 + 1
    bad_tag = bytearray(good)
    bad_tag[-1] ^= 1
    nan_w = bytearray(good)
    nan_w[weight_at:weight_at + 8] = np.float64(np.nan).tobytes()
    neg_w = bytearray(good)
    neg_w[weight_at:weight_at + 8] = np.float64(-1.0).tobytes()
    minus0 = bytearray(good)
    minus0[weight_at:weight_at + 8] = np.float64(-0.0).tobytes()
    bad_kind = bytearray(good)
    bad_kind[8] = 7
    flipped = bytearray(good)
    flipped[40] ^= 0x40  # a payload byte: the tag no longer covers it
    return [
        ("good", _record(good), 64),
        ("good-again", _record(encode_round_frame_bytes(_frame(2.0, 0.5), SALT)), 64),
        ("zero-weight", _record(encode_round_frame_bytes(_frame(3.0, 0.0), SALT)), 64),
        ("bad-tag", _record(bytes(bad_tag)), 64),
        ("payload-flipped", _record(bytes(flipped)), 64),
        ("nan-weight", _record(_resigned(nan_w)), 64),
        ("negative-weight", _record(_resigned(neg_w)), 64),
        ("minus-zero-weight", _record(_resigned(minus0)), 64),
        ("bad-kind", _record(_resigned(bad_kind)), 64),
        ("underrun", _record(good + b"\0" * 8), 66),  # a known frame, shorter than its prefix
        ("other-layout", _record(encode_round_frame_bytes(_frame(4.0, 1.0, 65), SALT)), 65),
        ("other-size", _record(encode_round_frame_bytes(_frame(4.0, 1.0, 65), SALT)), 64),
        ("truncated", _record(good[:-3], len(good)), 64),
        ("over-ceiling", _record(good, 1 << 31), 64),
    ]


def _read(name: str, reply: bytes, n0: int) -> tuple[Any, ...]:
    warm = _record(encode_round_frame_bytes(_frame(0.0), SALT))  # the layout, remembered
    peer = EchoPeer([warm, reply])
    c = _client(peer, 2)
    arrays = [np.zeros(64, np.float32), np.zeros((3, 2), np.float32)]
    c.all_reduce_scaled(arrays, 1.0)
    if n0 != 64:
        arrays[0] = np.zeros(n0, np.float32)
    res = _outcome(lambda: c.all_reduce_scaled(arrays, 1.0))
    got = c.last_reply
    frame = None if got is None else (
        got.frame.kind, got.frame.weight,
        [(p.dtype, p.shape, bytes(p.data)) for p in got.frame.tensors])
    c.close()
    return (name, res, _bits(arrays), frame, c.rounds, c.bytes_received, c.closed_reason)


def test_a_whole_reply_of_a_known_layout_reads_as_the_decode_reads_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    hits: list[bool] = []
    real = rank_mod.read_known_frame

    def spy(*args: Any) -> Any:
        got = real(*args)
        hits.append(got is not None)
        return got

    monkeypatch.setattr(rank_mod, "read_known_frame", spy)
    fast = [_read(*case) for case in _replies()]
    assert hits.count(True) >= 8 and hits.count(False) >= 4
    monkeypatch.setattr(rank_mod, "read_known_frame", lambda *args: None)  # always decoded
    decoded = [_read(*case) for case in _replies()]
    assert fast == decoded
    outcomes = {row[0]: row[1] for row in fast}
    assert outcomes["good"][0] == outcomes["minus-zero-weight"][0] == "ok"
    for name in ("bad-tag", "payload-flipped", "nan-weight", "negative-weight", "bad-kind",
                 "underrun", "truncated", "over-ceiling"):
        assert outcomes[name][0] == "error", name


# -- the copy into the caller's arrays -----------------------------------------------------------
def _payload(a: np.ndarray, dtype: int) -> TensorPayload:
    return TensorPayload.from_array(a, dtype)


def test_a_reply_of_the_destinations_own_bits_is_copied_as_the_general_copy_copies() -> None:
    rng = np.random.default_rng(5)
    vals = [rng.standard_normal((4, 5)).astype(np.float32),
            rng.standard_normal(9).astype(np.float32),
            np.float32(2.5).reshape(()), np.zeros((0, 2), np.float32)]
    bf = rng.standard_normal(6).astype(np.float32).astype(ml_dtypes.bfloat16)
    frame = RoundFrame(RoundKind.MODEL, 1.0, [
        *[_payload(v, 0) for v in vals], TensorPayload(1, (6,), bf.view(np.uint8).data)])

    def dests() -> list[np.ndarray]:
        strided = np.full((5, 4), 7.0, np.float32).T  # not contiguous, no flat view
        return [strided, np.zeros(9, np.float32), np.zeros((), np.float32),
                np.zeros((0, 2), np.float32), np.zeros(6, ml_dtypes.bfloat16)]

    own = dests()
    decode_into(frame, own)  # every payload carries its destination's bits
    for d, v in zip(own, [*vals, bf], strict=True):
        assert d.shape == v.shape and d.tobytes() == v.tobytes()
    # one payload that is not its destination's bits (a bf16 payload into an f32 array): the
    # general copy handles every tensor, with the same values for the others
    mixed = dests()
    mixed[4] = np.zeros(6, np.float32)
    decode_into(frame, mixed)
    for d, v in zip(mixed, [*vals, bf.astype(np.float32)], strict=True):
        assert d.tobytes() == v.tobytes()
    # a shape that does not fit is refused before anything is written
    bad = dests()
    bad[1] = np.zeros(8, np.float32)
    before = _bits(bad)
    with pytest.raises(Exception, match="does not fit"):
        decode_into(frame, bad)
    assert _bits(bad) == before
    # a consensus payload (read from the relay's bytes) of an unknown dtype tag as long as its
    # destination: refused as the peer's fault, nothing written
    odd = RoundFrame(RoundKind.MODEL, 1.0,
                     [TensorPayload.trusted(2, (9,), memoryview(bytes(36)))])
    dst = np.ones(9, np.float32)
    with pytest.raises(Exception, match="unsupported wire dtype tag 2"):
        decode_into(odd, [dst])
    assert (dst == 1.0).all()


# -- the template's seal ---------------------------------------------------------------------------
@pytest.mark.parametrize("weight", [0.0, -0.0, 1.5, 5e-324, 1.7976931348623157e308,
                                    np.float64(2.5), np.float32(0.5), 3, np.int64(4)],
                         ids=repr)
def test_seal_writes_the_weight_the_frame_carries(weight: Any) -> None:
    x = np.arange(5, dtype=np.float32)
    tpl = FrameTemplate(RoundKind.MODEL, [(0, (5,))])
    tpl.payloads[0][...] = x
    want = encode_round_frame_bytes(RoundFrame(RoundKind.MODEL, weight, [_payload(x, 0)]), SALT)
    assert bytes(tpl.seal(weight, SALT)) == want


@pytest.mark.parametrize("weight", [math.nan, math.inf, -math.inf, -1.0, -5e-324, True,
                                    "1.0", None, np.float64(-2.0), 10**400],
                         ids=repr)
def test_seal_refuses_the_weights_a_frame_refuses(weight: Any) -> None:
    tpl = FrameTemplate(RoundKind.MODEL, [(0, (5,))])
    before = bytes(tpl.seal(1.0, SALT))
    with pytest.raises(Exception) as want:
        RoundFrame(RoundKind.MODEL, weight, [_payload(np.zeros(5, np.float32), 0)])
    with pytest.raises(type(want.value)) as got:
        tpl.seal(weight, SALT)
    assert str(got.value) == str(want.value)
    assert bytes(tpl.seal(1.0, SALT)) == before


# -- the reply object ------------------------------------------------------------------------------
def test_the_reply_object_is_the_dataclass_built_by_its_constructor() -> None:
    import dataclasses

    f = _frame(1.0)
    raw = memoryview(b"abc")
    fast = rank_mod._new_reply(f, raw, True)
    want = rank_mod.ReduceReply(f, raw, True)
    assert type(fast) is rank_mod.ReduceReply
    assert [getattr(fast, k.name) for k in dataclasses.fields(want)] == [f, raw, True]
    assert fast.frame is f and fast.raw is raw and fast.adopted is True
    assert repr(fast) == repr(want) and fast.weight == want.weight == 2.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.adopted = False  # type: ignore[misc]


@pytest.mark.parametrize("bf16", [False, True], ids=["f32", "bf16"])
def test_a_small_round_silences_float_warnings_without_building_errstate(
        bf16: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A small round pre-scales into its template with every float warning off (an overflow
    to an infinity, a NaN) and the caller's warning state back afterwards, as
    ``np.errstate(all="ignore")`` gives, without building that object: the first round (the
    checked one, which keeps the template) and the next (the kept template's shortcut)."""
    peer = EchoPeer()
    client = _client(peer, 2, bf16)
    big = np.array([3e38, -3e38, 1.0, np.nan], dtype=np.float32)
    arrays = [big.astype(ml_dtypes.bfloat16) if bf16 else big.copy()]

    def no_errstate(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("np.errstate built on a small round")

    old = np.seterr(all="raise")
    try:
        monkeypatch.setattr(np, "errstate", no_errstate)
        first = client.all_reduce_scaled(arrays, 4.0, adopt=False)
        second = client.all_reduce_scaled(arrays, 4.0, adopt=False)
        monkeypatch.undo()
        assert np.geterr() == {"divide": "raise", "over": "raise", "under": "raise",
                               "invalid": "raise"}
    finally:
        np.seterr(**old)
    for reply in (first, second):
        got = reply.frame.tensors[0].array()
        assert got.dtype == (ml_dtypes.bfloat16 if bf16 else np.float32)
        vals = got.astype(np.float32)
        assert vals[0] == np.inf and vals[1] == -np.inf and vals[2] == 4.0
        assert math.isnan(float(vals[3]))
    assert peer.sent[0] == peer.sent[1]
