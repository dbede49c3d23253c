"""The relay's per-record fast paths give what the general paths give, on the same inputs:
the loopback prefix read without re-checking its arguments (``whole_len_prefix``), the frame and
record digests keyed once (``plans.frame_premac_for`` / ``plans.record_premac_for``), the
upstream reader's one-read path for a small record (``UpstreamReader._read_small``) against its
general path, the folds' float-warning context (``reduce._quiet.quiet_enter``) against
``np.errstate``, the core's kept Broadcast prefix, the relay's upstream write counters, and the
core's per-round action builders against the constructors."""

from __future__ import annotations

import dataclasses
import socket
import threading
import warnings
from typing import Any

import numpy as np
import pytest

from flodl_proto.codec import RoundFrame, RoundKind, TensorPayload, encode_round_frame_bytes
from flodl_proto.codec.loopback import (
    decode_len_prefix_or_eos,
    encode_len_prefix,
    whole_len_prefix,
)
from flodl_proto.codec.mux import (
    HelloAck,
    MuxRecord,
    encode_mux_record_bytes,
    parse_mux_header,
)
from flodl_proto.codec.plans import (
    frame_premac,
    frame_premac_for,
    record_macs,
    record_premac_for,
)
from flodl_proto.errors import ProtocolError
from flodl_proto.fsm import relay_core
from flodl_proto.fsm.events import FanOut, SendUpstream, UpstreamKind
from flodl_proto.reduce import _quiet, host_fold
from flodl_proto.runner import _netio, relay_fanout
from flodl_proto.runner._prefixed import PrefixedReader
from flodl_proto.runner.relay_fanout import UpstreamReader

from .relay_core_util import connected_core, signed_record

SALT = bytes(range(16))


def _error(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return ("ok", fn(*args, **kwargs))
    except ProtocolError as e:
        return ("error", type(e).__name__, e.error_id, str(e))


@pytest.mark.parametrize("length", [0, 1, 9, 4096, 1 << 20, (1 << 32) - 1])
@pytest.mark.parametrize("ceiling", [0, 8, 4096, 1 << 30, 1 << 40])
def test_the_whole_prefix_read_is_the_stream_decoders(length: int, ceiling: int) -> None:
    mv = memoryview(length.to_bytes(4, "little") + b"tail")
    got = _error(whole_len_prefix, mv, ceiling)
    assert got == _error(decode_len_prefix_or_eos, mv, ceiling=ceiling)
    assert got == (("ok", length) if length <= ceiling else
                   ("error", "RemoteLimitExceeded", "len.too_large", got[3]))


@pytest.mark.parametrize("ceiling", [True, -1, 4096.0, "4096"])
def test_the_prefixed_reader_names_a_bad_ceiling_as_the_codec_does(ceiling: Any) -> None:
    a, b = socket.socketpair()
    with a, b:
        b.sendall((8).to_bytes(4, "little") + bytes(8))
        reader = PrefixedReader(SALT, None, lambda size, step: memoryview(bytearray(size)))
        with pytest.raises(ProtocolError) as e:
            reader.head(a, 8, ceiling)
        with pytest.raises(ProtocolError) as want:
            decode_len_prefix_or_eos(b"\x08\x00\x00\x00", ceiling=ceiling)
        assert (e.value.error_id, str(e.value)) == (want.value.error_id, str(want.value))
        assert e.value.error_id == "ceiling.invalid"


@pytest.mark.parametrize("n", [0, 1, 8, 9, 17, 4096, 70000])
def test_the_keyed_frame_digest_is_frame_premac(n: int) -> None:
    data = memoryview(bytes((i * 7) % 251 for i in range(n)))
    assert frame_premac_for(SALT)(data) == frame_premac(data, SALT)
    other = bytes(range(1, 17))  # bound to its own salt, whatever new_mac last keyed
    bound = frame_premac_for(other)
    frame_premac(data, SALT)
    assert bound(data) == frame_premac(data, other)


@pytest.mark.parametrize("n", [0, 1, 4096])
def test_the_keyed_record_digest_is_the_record_plans(n: int) -> None:
    rec = encode_mux_record_bytes(MuxRecord.broadcast(bytes((i * 3) % 256 for i in range(n))),
                                  SALT)
    mv = memoryview(rec)
    plan = record_macs(mv[:25], parse_mux_header(mv[:25]), SALT)
    for got in (n, n // 2):  # every payload byte, or what a cut stream left
        fed = record_macs(mv[:25], parse_mux_header(mv[:25]), SALT)
        fed.record.update(mv[25:25 + got])
        assert record_premac_for(SALT)(mv[:25], mv[25:25 + got]) == fed.premac(got)
    plan.record.update(mv[25:])
    assert record_premac_for(SALT)(mv[:25], mv[25:]) == plan.premac()


def _frame(n: int = 64, weight: float = 1.0) -> bytes:
    t = TensorPayload.from_array(np.arange(n, dtype=np.float32), 0)
    return encode_round_frame_bytes(RoundFrame(RoundKind.MODEL, weight, [t]), SALT)


def _broadcast(n: int = 64) -> bytes:
    return encode_mux_record_bytes(MuxRecord.broadcast(_frame(n)), SALT)


def _forged() -> bytes:
    rec = bytearray(_broadcast())
    rec[-1] ^= 1
    return bytes(rec)


def _read_outcome(data: bytes, *, close: bool = True, stop: bool = False,
                  starvation: float | None = None) -> Any:
    """What an UpstreamReader gives for a stream holding ``data`` (then closed, or left open
    for a starvation), with the counts it made."""
    counts: list[int] = []
    stop_flag = threading.Event()
    if stop:
        stop_flag.set()
    reader = UpstreamReader(SALT, 2, 1 << 30, stop_flag, lambda *args: None, counts.append)
    a, b = socket.socketpair()
    with a, b:
        a.settimeout(0.01)
        b.sendall(data)
        if close:
            b.shutdown(socket.SHUT_WR)
        try:
            rec = reader.read(a, starvation)
        except _netio.Stopped as e:
            out: Any = ("stopped", str(e))
        except ProtocolError as e:
            out = ("error", type(e).__name__, e.error_id, str(e))
        else:
            out = None if rec is None else (rec.kind, bytes(rec.payload), rec.control)
    return out, counts, reader.forwarding


_STREAMS: dict[str, tuple[bytes, dict[str, Any]]] = {
    "a broadcast": (_broadcast(), {}),
    "an empty-payload record": (encode_mux_record_bytes(MuxRecord.control_msg(HelloAck(), 2),
                                                        SALT), {}),
    "two records in a row": (_broadcast() + _broadcast(8), {}),
    "a forged tag": (_forged(), {}),
    "a stream ended inside the payload": (_broadcast()[:100], {}),
    "a stream ended inside the payload while stopping": (_broadcast()[:100], {"stop": True}),
    "a starved payload": (_broadcast()[:100], {"close": False, "starvation": 0.05}),
    "a stream ended inside the header": (_broadcast()[:10], {}),
}


@pytest.mark.parametrize("name", list(_STREAMS))
def test_a_small_record_read_in_one_step_is_the_general_reads_outcome(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    data, options = _STREAMS[name]
    taken = 0
    original = UpstreamReader._read_small

    def spy(self: UpstreamReader, *args: Any) -> Any:
        nonlocal taken
        taken += 1
        return original(self, *args)

    with monkeypatch.context() as m:
        m.setattr(UpstreamReader, "_read_small", spy)
        fast = _read_outcome(data, **options)
    with monkeypatch.context() as m:  # no record is small enough: the general read
        m.setattr(relay_fanout, "PARALLEL_MAC_MIN", 0)
        m.setattr(UpstreamReader, "_read_small", lambda *args: pytest.fail("taken"))
        general = _read_outcome(data, **options)
    assert fast == general
    assert taken == (0 if name == "a stream ended inside the header" else 1)


def test_the_small_read_gives_exactly_these_outcomes() -> None:
    """Not only the same as the general read: the values themselves."""
    out, counts, fwd = _read_outcome(_broadcast())
    assert out[1] == _frame() and counts == [len(_broadcast())] and fwd is None
    out, counts, _ = _read_outcome(_forged())
    assert out[2] == "mux.auth_failed" and counts == [len(_forged())]
    out, counts, _ = _read_outcome(_broadcast()[:100])
    assert out[2] == "mux.truncated" and counts == [100]
    out, counts, _ = _read_outcome(_broadcast()[:100], stop=True)
    assert out[0] == "stopped" and counts == [100]
    out, counts, _ = _read_outcome(_broadcast()[:100], close=False, starvation=0.05)
    assert out[2] == "mux.starved" and counts == [25]  # the whole record's bytes, not the step's
    assert out[3].endswith(f"for 0.05s (100 of {len(_broadcast())} bytes)")


def _float_warnings(enter: Any, leave: Any, *, fail: bool = False) -> Any:
    """The warnings float errors raise inside and after a context, with an exception raised
    inside it or not."""
    big = np.array([3e38], np.float32)
    inside: list[str] = []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        state = enter()
        try:
            np.add(big, big)
            np.add(np.array([np.inf]), np.array([-np.inf]))
            inner = enter()  # nested, as a kernel's own context inside the fold's
            np.add(big, big)
            leave(inner)
            np.add(big, big)
            inside = [str(w.message) for w in seen]
            if fail:
                raise KeyError("inside")
        except KeyError:
            pass
        finally:
            leave(state)
        np.add(big, big)
        after = [str(w.message) for w in seen][len(inside):]
    return inside, after, np.geterr()


@pytest.mark.parametrize("fail", [False, True])
def test_the_folds_quiet_context_is_errstate(fail: bool) -> None:
    def enter() -> Any:
        state = np.errstate(all="ignore")
        state.__enter__()
        return state

    def leave(state: Any) -> None:
        state.__exit__(None, None, None)

    got = _float_warnings(host_fold._quiet_enter, host_fold._quiet_exit, fail=fail)
    assert got == _float_warnings(enter, leave, fail=fail)
    assert got[0] == [] and got[1] == ["overflow encountered in add"]


def test_the_broadcast_prefix_is_encoded_for_each_length() -> None:
    core = connected_core((0, 1), 2, 2, SALT)
    lengths = [64, 64, 8, 64, 4096, 4096, 8]
    prefixes = []
    for n in lengths:
        rec = signed_record(MuxRecord.broadcast(_frame(n // 4 if n >= 4 else 1)), 2, SALT)
        (act,) = core.upstream_record(rec)
        assert isinstance(act, FanOut)
        prefixes.append((act.prefix, rec.payload.nbytes))
    assert [p for p, _ in prefixes] == [encode_len_prefix(n, ceiling=core.ceiling)
                                        for _, n in prefixes]
    assert [int.from_bytes(p, "little") for p, _ in prefixes] == [n for _, n in prefixes]


def _relay_writing_to(up: socket.socket) -> Any:
    """A relay (not started) whose upstream connection is ``up``."""
    from flodl_proto.runner.relay import Relay

    relay = Relay(("127.0.0.1", 9), [0, 1], 2, SALT, host="h0")
    relay._upstream = up
    return relay


@pytest.mark.parametrize("kind", ["HOST_FRAME", "RANK_EXIT"])
@pytest.mark.parametrize("path", ["whole", "partial", "queued"])
def test_an_upstream_record_is_counted_once_whichever_way_it_leaves(
        kind: str, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``host_frames`` counts every HostFrame; ``upstream_out`` the bytes written at once (the
    rest, and a record queued behind another, are the outbound writer's to count)."""
    from flodl_proto.fsm.events import SendUpstream, UpstreamKind
    from flodl_proto.runner import _relay_barrier

    parts = (b"h" * 25, memoryview(bytes(range(200))), b"t" * 8)
    if path == "partial":  # the socket takes 30 bytes, then nothing more
        monkeypatch.setattr(_relay_barrier, "send_at_once",
                            lambda sock, bufs, n: sock.send(b"".join(bytes(b) for b in bufs)[:30]))
        monkeypatch.setattr(_relay_barrier, "send_now", lambda sock, bufs: list(bufs))
    a, b = socket.socketpair()
    with a, b:
        relay = _relay_writing_to(a)
        if path == "queued":
            relay._out_queued = 1  # a record queued before it: it goes behind that one
        relay._send_upstream(SendUpstream(parts, UpstreamKind[kind]))
        s = relay.stats
        assert s.host_frames == (kind == "HOST_FRAME")
        queued = [] if relay._queue.empty() else [relay._queue.get_nowait()]
        if path == "whole":
            assert s.upstream_out == 233 and queued == []
            assert b.recv(1000) == b"".join(bytes(p) for p in parts)
        elif path == "partial":
            assert s.upstream_out == 30 and len(queued) == 1
            assert b"".join(bytes(x) for x in queued[0].buffers) == b"".join(
                bytes(p) for p in parts)[30:]
        else:
            assert s.upstream_out == 0 and len(queued) == 1
            assert [bytes(x) for x in queued[0].buffers] == [bytes(p) for p in parts]
        if queued:
            assert queued[0].host_frame_round == (-1 if kind == "HOST_FRAME" else None)
        relay._mac_pool.shutdown()


def test_the_private_context_is_checked_before_it_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """NumPy's private context names are used only when they do what ``np.errstate`` does: a
    NumPy whose ``_make_extobj`` sets another state, or takes other arguments, is found out at
    import and the fold uses ``np.errstate`` itself."""
    assert _quiet._private_context_works()  # this NumPy: the names are used
    real = _quiet._make_extobj
    monkeypatch.setattr(_quiet, "_make_extobj", lambda **kw: real(all="warn"))
    assert not _quiet._private_context_works()

    def other_signature(**kw: Any) -> Any:
        raise TypeError("_make_extobj() got an unexpected keyword argument 'all'")

    monkeypatch.setattr(_quiet, "_make_extobj", other_signature)
    assert not _quiet._private_context_works()
    assert np.geterr()["over"] == "warn"  # the caller's state is untouched


def _fields(obj: Any) -> tuple[Any, ...]:
    return tuple(getattr(obj, f.name) for f in dataclasses.fields(obj))


def test_the_relay_cores_round_builders_equal_the_constructors() -> None:
    """The two actions of every relay round (the HostFrame going upstream, a Broadcast's
    fan-out) are built without their frozen dataclasses' ``__init__``: the same type, fields and
    frozenness as the constructors give."""
    bufs = (b"head", memoryview(b"frame"))
    up = relay_core._host_frame_up(bufs)
    assert type(up) is SendUpstream
    assert _fields(up) == _fields(SendUpstream(bufs, UpstreamKind.HOST_FRAME))
    payload = memoryview(b"payload")
    fan = relay_core._fan_out(b"\x07\x00\x00\x00", payload, (0, 1))
    assert type(fan) is FanOut
    assert _fields(fan) == _fields(FanOut(b"\x07\x00\x00\x00", payload, (0, 1)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        up.kind = UpstreamKind.RANK_EXIT  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        fan.prefix = b""  # type: ignore[misc]


def test_a_relay_round_gives_the_constructed_actions(monkeypatch: pytest.MonkeyPatch) -> None:
    """A round of the core (both ranks' frames, then the controller's Broadcast) builds its
    HostFrame record and its fan-out through the builders, and they are what the constructors
    would build, field for field."""
    used: list[str] = []

    def spying(name: str) -> Any:
        real = getattr(relay_core, name)

        def spy(*args: Any) -> Any:
            used.append(name)
            return real(*args)
        return spy

    for name in ("_host_frame_up", "_fan_out"):
        monkeypatch.setattr(relay_core, name, spying(name))
    core = connected_core((0, 1), 2, 2, SALT)
    blobs = [encode_round_frame_bytes(RoundFrame(RoundKind.MODEL, 1.0 + r, [
        TensorPayload.from_array(np.arange(8, dtype=np.float32) + r)]), SALT) for r in (0, 1)]
    assert core.rank_frame(0, blobs[0]) == []
    (up,) = core.rank_frame(1, blobs[1])
    assert type(up) is SendUpstream and up.kind is UpstreamKind.HOST_FRAME
    assert _fields(up) == _fields(SendUpstream(up.buffers, UpstreamKind.HOST_FRAME))
    rec = signed_record(MuxRecord.broadcast(_frame(8)), 2, SALT)
    (fan,) = core.upstream_record(rec)
    assert type(fan) is FanOut
    assert _fields(fan) == (encode_len_prefix(rec.payload.nbytes, ceiling=core.ceiling),
                            rec.payload, (0, 1))
    assert used == ["_host_frame_up", "_fan_out"]
