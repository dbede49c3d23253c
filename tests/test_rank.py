"""RankClient: local checks, the handshake, the framed reply, the fused pre-scale, decoding into
caller arrays, and upstream's client behaviours (cpu_reduce_tests.rs) through a real relay and
controller."""

from __future__ import annotations

import errno
import os
import re
import socket
import struct
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from flodl_proto.codec import (
    Dtype,
    RoundFrame,
    RoundKind,
    TensorPayload,
    decode_round_frame,
    encode_ack,
    encode_round_frame_bytes,
)
from flodl_proto.errors import (
    BadMagic,
    InvalidValue,
    LimitExceeded,
    LocalProtocolError,
    ProtocolError,
    SchemaMismatch,
    SequenceError,
    TruncatedInput,
    VersionMismatch,
)
from flodl_proto.reduce import bf16_from_f32
from flodl_proto.runner.controller import ReferenceController
from flodl_proto.runner.rank import RankClient
from flodl_proto.runner.relay import Relay

from .cli_util import stdout_pipe_writes
from .cluster_util import SALT, frame, in_thread, leak_guard, recv_exact, tensor, values
from .conftest import closed_port

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _no_leaks() -> Iterator[None]:
    with leak_guard():
        yield


# -- a scripted relay (server side of the loopback) ----------------------------------------------
Script = Callable[["FakeRelay", socket.socket], Any]


class FakeRelay:
    """Accepts one client; ``script(self, conn)`` runs in a thread and talks raw bytes."""

    def __init__(self, script: Script) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1)
        self.listener.settimeout(20)
        self.port = self.listener.getsockname()[1]
        self.requests: list[RoundFrame] = []
        self.result: dict[str, Any] = {}

        def body() -> None:
            conn, _ = self.listener.accept()
            conn.settimeout(20)
            try:
                self.result["value"] = script(self, conn)
            except BaseException as e:
                self.result["error"] = e
            finally:
                conn.close()

        self.thread = threading.Thread(target=body, name="fake-relay")
        self.thread.start()

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def read_request(self, conn: socket.socket) -> RoundFrame:
        n = int.from_bytes(recv_exact(conn, 4), "little")
        body = recv_exact(conn, n)
        res = decode_round_frame(body, SALT)
        assert res[1] == n
        self.requests.append(res[0])
        return res[0]

    def close(self) -> None:
        self.thread.join()
        self.listener.close()
        if "error" in self.result:
            raise self.result["error"]


def acking(version: int, then: Script | None = None) -> Script:
    """Read the handshake, ack with ``version``, then run ``then``."""
    def script(relay: FakeRelay, conn: socket.socket) -> Any:
        hs = recv_exact(conn, 16)
        conn.sendall(encode_ack(version))
        return hs, (then(relay, conn) if then is not None else None)
    return script


def _reply(reply: RoundFrame | bytes, prefix: int | None = None
           ) -> Script:
    def then(relay: FakeRelay, conn: socket.socket) -> None:
        relay.read_request(conn)
        body = reply if isinstance(reply, bytes) else encode_round_frame_bytes(reply, SALT)
        n = len(body) if prefix is None else prefix
        conn.sendall(n.to_bytes(4, "little") + body)
    return then


# -- local checks ------------------------------------------------------------------------------
def test_rank_out_of_range_and_zero_world_are_rejected_locally() -> None:
    with pytest.raises(InvalidValue, match=r"cpu_reduce: rank_id 2 must be < world_size 2") as e:
        RankClient.connect("127.0.0.1:1", 2, 2, SALT)
    assert not e.value.remote
    with pytest.raises(InvalidValue) as e:
        RankClient.connect("127.0.0.1:1", -1, 2, SALT)
    assert str(e.value) == "cpu_reduce: rank_id -1 must be >= 0"
    assert e.value.error_id == "client.rank_negative" and not e.value.remote
    with pytest.raises(InvalidValue, match=r"cpu_reduce: world_size must be > 0"):
        RankClient.connect("127.0.0.1:1", 0, 0, SALT)
    with pytest.raises(VersionMismatch):
        RankClient.connect("127.0.0.1:1", 0, 1, SALT, version=4)


@pytest.mark.parametrize("ceiling", [0, 24])
def test_a_ceiling_below_the_smallest_round_frame_is_rejected_before_dialing(
        ceiling: int) -> None:
    """Every frame is at least a RoundFrame with no tensor (25 bytes): a smaller ceiling is
    refused before any connection is tried (port 1: nothing listens; a dial would retry)."""
    with pytest.raises(InvalidValue) as e:
        RankClient.connect("127.0.0.1:1", 0, 1, SALT, ceiling=ceiling)
    assert str(e.value) == (f"rank: frame ceiling {ceiling} is below 25 bytes (the smallest "
                            "RoundFrame: no tensor); a record every run exchanges would be "
                            "refused")
    assert e.value.error_id == "ceiling.below_minimum" and not e.value.remote


def test_broadcast_root_outside_the_world_is_rejected_before_sending() -> None:
    fake = FakeRelay(acking(2))
    try:
        with RankClient.connect(fake.addr, 0, 2, SALT) as c:
            for root, message, error_id in (
                    (-1, "cpu_reduce: rank_id -1 must be >= 0", "client.rank_negative"),
                    (2, "cpu_reduce: rank_id 2 must be < world_size 2",
                     "client.rank_out_of_range")):
                with pytest.raises(InvalidValue) as e:
                    c.broadcast_from_root([np.ones(2, np.float32)], root)
                assert (str(e.value), e.value.error_id) == (message, error_id)
                assert not c.closed
    finally:
        fake.close()


def test_connect_failure_is_reported_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLODL_NET_TIMEOUT_SCALE", "0.1")  # the minimum: 6 attempts
    port = closed_port()
    with pytest.raises(ConnectionError, match=rf"cpu_reduce: connect to 127.0.0.1:{port} failed"):
        RankClient.connect(f"127.0.0.1:{port}", 0, 1, SALT)


# -- handshake ---------------------------------------------------------------------------------
@pytest.mark.parametrize("version", [2, 3])
def test_handshake_bytes_and_ack(version: int) -> None:
    fake = FakeRelay(acking(version))
    client = RankClient.connect(fake.addr, 3, 4, SALT, version)
    client.close()
    fake.close()
    hs, _ = fake.result["value"]
    assert hs == bytes.fromhex(f"c0170df10{version}000000030000000400000000"[:32])


def test_ack_with_the_other_version_or_magic_or_missing() -> None:
    fake = FakeRelay(acking(3))
    with pytest.raises(VersionMismatch,
                       match=r"cpu_reduce: controller protocol_version 3 != our version 2"):
        RankClient.connect(fake.addr, 0, 1, SALT, 2)
    fake.close()

    def bad_magic(relay: FakeRelay, conn: socket.socket) -> None:
        recv_exact(conn, 16)
        conn.sendall(bytes.fromhex("c0170df102000000"))

    fake = FakeRelay(bad_magic)
    with pytest.raises(BadMagic, match="cpu_reduce: handshake ack magic 0xf10d17c0"):
        RankClient.connect(fake.addr, 0, 1, SALT)
    fake.close()

    def refuse(relay: FakeRelay, conn: socket.socket) -> None:
        recv_exact(conn, 16)

    fake = FakeRelay(refuse)
    with pytest.raises(TruncatedInput, match="cpu_reduce: handshake ack read failed"):
        RankClient.connect(fake.addr, 0, 1, SALT)
    fake.close()


def _handshake_only(relay: FakeRelay, conn: socket.socket) -> None:
    recv_exact(conn, 16)


_TAMPERED = _reply(encode_round_frame_bytes(frame([1.0, 2.0]), bytes(16)))  # another salt
_GOOD = encode_round_frame_bytes(frame([1.0, 2.0]), SALT)


def _changed(at: int, new: bytes) -> bytes:
    """:data:`_GOOD` with ``new`` written at offset ``at`` (the reply a relay sends back)."""
    return _GOOD[:at] + new + _GOOD[at + len(new):]

_HMAC = (r"cluster_controller: RoundFrame HMAC verification failed \(computed 0x[0-9a-f]{16}, "
         r"wire carried 0x[0-9a-f]{16}\); session salt disagreement, tampered frame, or payload "
         r"corruption")


@pytest.mark.parametrize(("script", "round_trip", "error_id", "text"), [
    (acking(2, lambda r, conn: r.read_request(conn)), True, "client.reply_closed",
     r"cpu_reduce: controller closed connection before sending averaged frame back \(round 1\)"),
    (acking(2, _TAMPERED), True, "frame.auth_failed", _HMAC),
    (acking(3), False, "ack.bad_version", r"cpu_reduce: controller protocol_version 3 != our "
                                          r"version 2"),
    (_handshake_only, False, "ack.read_failed",
     r"cpu_reduce: handshake ack read failed: failed to fill whole buffer \(0 of 8 bytes\) "
     r"\(controller may have rejected our handshake\)"),
    (acking(2, _reply(_changed(0, b"\xf0"))), True, "frame.bad_magic",
     r"cluster_controller: frame magic 0xf10d17f0 != 0xf10d17f1"),
    (acking(2, _reply(_changed(4, (70000).to_bytes(4, "little")))), True,
     "frame.too_many_tensors", r"cluster_controller: frame claims 70000 tensors \(> 65536\); "
                               r"corrupt or hostile peer"),
    (acking(2, _reply(_changed(8, b"\x09"))), True, "frame.unknown_kind",
     r"cluster_controller: unknown RoundKind wire byte 9"),
    (acking(2, _reply(_changed(9, struct.pack("<d", -1.0)))), True, "frame.bad_weight",
     r"cluster_controller: frame weight -1 is not a finite non-negative realized-work mass"),
    (acking(2, _reply(_GOOD[:-9])), True, "frame.data_read_failed",
     r"cluster_controller: tensor\[0\] data read failed: failed to fill whole buffer \(7 of 8 "
     r"bytes at offset 31\)"),
    (acking(2, _reply(_GOOD[:-4])), True, "frame.footer_read_failed",
     r"cluster_controller: frame HMAC footer read failed: failed to fill whole buffer \(sender "
     r"at PROTOCOL_VERSION < 2, or stream truncated mid-frame\) \(offset 39\)"),
    (acking(2, _reply(b"\xf0" + encode_round_frame_bytes(frame(np.zeros(1 << 18, np.float32)),
                                                         SALT)[1:])),
     True, "frame.bad_magic", r"cluster_controller: frame magic 0xf10d17f0 != 0xf10d17f1"),
], ids=["reply-closed", "reply-tampered", "ack-version", "ack-missing", "reply-magic",
        "reply-tensor-count", "reply-kind", "reply-weight", "reply-cut-in-data",
        "reply-cut-in-tag", "large-reply-magic"])
def test_a_message_in_words_naming_the_controller_names_the_relay(
        script: Script, round_trip: bool, error_id: str, text: str) -> None:
    """A rank's one peer is its relay: a catalogued message in upstream's words naming the
    controller (kept whole, so a match of its prefix holds) ends with the peer's address, named
    as the relay the rank expects there, on the handshake and on the reply of a round alike (a
    reply the RoundFrame reader refused, ``cluster_controller: frame magic ...``, ended
    without it but for its HMAC check)."""
    fake = FakeRelay(script)
    try:
        with pytest.raises(ProtocolError) as e:
            with RankClient.connect(fake.addr, 0, 1, SALT) as c:
                assert c.relay == fake.addr
                if round_trip:
                    c.all_reduce(frame([1.0, 2.0]))
    finally:
        fake.close()
    assert e.value.error_id == error_id and e.value.remote
    assert re.fullmatch(rf"{text}; this rank's peer at {fake.addr} \(expected its relay\)",
                        str(e.value)), str(e.value)


@pytest.mark.parametrize("port_mux", [True, False], ids=["port-mux", "direct"])
def test_a_rank_given_the_controller_s_port_does_not_name_it_its_relay(port_mux: bool) -> None:
    """A rank dialing a real controller's port (not its relay's loopback port) gets no ack: the
    port mux drops its connection with a warning, the direct listener fails its run, and
    neither sends the rank a byte, as a relay that refused the handshake sends none. The rank
    cannot tell it reached a controller, so its line names the peer it expected there, where
    it said ``this rank's peer is its relay at ...`` of the controller's address."""
    with ReferenceController(1, SALT, port_mux=port_mux) as ctrl:
        addr = f"127.0.0.1:{ctrl.address[1]}"
        with pytest.raises(TruncatedInput) as e:
            RankClient.connect(addr, 0, 1, SALT)
    assert e.value.error_id == "ack.read_failed" and e.value.remote
    assert str(e.value) == (
        "cpu_reduce: handshake ack read failed: failed to fill whole buffer (0 of 8 bytes) "
        f"(controller may have rejected our handshake); this rank's peer at {addr} (expected "
        "its relay)")


# -- the framed reply --------------------------------------------------------------------------
def test_reply_must_fill_its_prefix_exactly() -> None:
    reply = frame([1.0, 2.0])
    body = encode_round_frame_bytes(reply, SALT)
    # the prefix claims more than the frame: the frame ends early
    fake = FakeRelay(acking(2, _reply(body + b"\0\0", prefix=len(body) + 2)))
    with RankClient.connect(fake.addr, 0, 1, SALT) as c, \
            pytest.raises(TruncatedInput, match="consumed 2 bytes fewer than its length prefix"):
        c.all_reduce(frame([1.0, 2.0]))
    fake.close()
    # the peer dies inside the body
    fake = FakeRelay(acking(2, _reply(body[:20], prefix=len(body))))
    with RankClient.connect(fake.addr, 0, 1, SALT) as c, \
            pytest.raises(TruncatedInput, match="stream ended inside a len-framed RoundFrame"):
        c.all_reduce(frame([1.0, 2.0]))
    fake.close()
    # closed before the reply
    fake = FakeRelay(acking(2, lambda r, conn: r.read_request(conn)))
    with RankClient.connect(fake.addr, 0, 1, SALT) as c, \
            pytest.raises(TruncatedInput, match="closed connection before sending averaged"):
        c.all_reduce(frame([1.0, 2.0]))
    fake.close()


def _closed_for_good(c: RankClient, why: str) -> None:
    """``c`` closed itself: later calls raise at once, naming the failed round."""
    assert c.closed and c.closed_reason is not None and c.closed_reason.startswith(why)
    for call in (lambda: c.all_reduce(frame([1.0])),
                 lambda: c.all_reduce_scaled([np.ones(2, np.float32)], 1.0),
                 lambda: c.broadcast_from_root([np.ones(2, np.float32)]),
                 lambda: c.gather_counts(1.0)):
        with pytest.raises(SequenceError) as ei:
            call()
        assert isinstance(ei.value, LocalProtocolError)
        assert str(ei.value) == (f"cpu_reduce: the client is closed ({c.closed_reason}); "
                                 "nothing was sent; connect a new client")


def test_a_write_stalled_part_way_closes_the_client() -> None:
    # the relay acks, then stops reading: the 16 MiB frame stalls part-way; the client closes
    # itself, so a second round cannot write a new frame into the middle of the first
    def stall(relay: FakeRelay, conn: socket.socket) -> int:
        relay.result["stalled"] = threading.Event()
        relay.result["stalled"].wait(30)  # until the client gave up
        got = 0
        while chunk := conn.recv(1 << 20):
            got += len(chunk)
        return got

    fake = FakeRelay(acking(2, stall))
    c = RankClient.connect(fake.addr, 0, 1, SALT)
    big = frame(np.zeros(4 << 20, np.float32))
    with pytest.raises(TimeoutError, match=r"^cpu_reduce: the relay stopped reading while "
                                           r"round 1 was being sent \(write stalled"):
        c.all_reduce(big)
    _closed_for_good(c, "round 1 failed: cpu_reduce: the relay stopped reading")
    fake.result["stalled"].set()
    fake.close()
    _, received = fake.result["value"]
    # what arrived after the handshake is a part of the first frame and nothing after it
    assert 0 < received < 4 + big.wire_len


def test_a_send_that_timed_out_is_said_in_words(monkeypatch: pytest.MonkeyPatch) -> None:
    """A timeout with an errno (ETIMEDOUT) gave Python's text ('[Errno 110] Connection timed
    out') in the line; now the reason only."""
    from flodl_proto.runner import rank as rank_mod

    def timed_out(sock: socket.socket, batches: Any) -> int:
        raise TimeoutError(errno.ETIMEDOUT, os.strerror(errno.ETIMEDOUT))

    fake = FakeRelay(acking(2))
    c = RankClient.connect(fake.addr, 0, 1, SALT)
    monkeypatch.setattr(rank_mod, "_send_batches", timed_out)
    with pytest.raises(TimeoutError) as ei:
        c.all_reduce(frame([1.0]))
    assert str(ei.value) == ("cpu_reduce: the relay stopped reading while round 1 was being "
                             f"sent ({os.strerror(errno.ETIMEDOUT)})")
    _closed_for_good(c, "round 1 failed: cpu_reduce: the relay stopped reading")
    fake.close()


@pytest.mark.parametrize(("n", "want"), [
    (1 << 20, 4),  # a 4 MiB frame: four batches, each hashed while the one before is sent
    (4 << 20, 5),  # a 16 MiB frame: steps of 4 MiB, and the tag's batch
    (1000, 1),  # a small frame: one batch
])
def test_a_frame_is_written_in_steps_of_hash_step(monkeypatch: pytest.MonkeyPatch, n: int,
                                                  want: int) -> None:
    from flodl_proto.runner import rank as rank_mod

    seen: list[list[int]] = []

    def recording(sock: socket.socket, batches: Any) -> int:
        seen.extend([memoryview(p).nbytes for p in batch] for batch in batches)
        raise TimeoutError("stop here")

    fake = FakeRelay(acking(2))
    c = RankClient.connect(fake.addr, 0, 1, SALT)
    monkeypatch.setattr(rank_mod, "_send_batches", recording)
    big = frame(np.zeros(n, np.float32))
    with pytest.raises(TimeoutError):
        c.all_reduce(big)
    fake.close()
    assert len(seen) == want
    assert sum(map(sum, seen)) == 4 + big.wire_len
    if want > 1:  # each batch but the last holds a step's bytes (the last: the rest and tag)
        step = min(4 << 20, max(1 << 20, big.wire_len >> 2))
        assert [sum(s) >= step for s in seen] == [True] * (want - 1) + [False]


def test_a_lost_relay_is_named_and_closes_the_client() -> None:
    fake = FakeRelay(acking(2))  # acks, then closes the connection
    c = RankClient.connect(fake.addr, 0, 1, SALT)
    fake.close()
    with pytest.raises((ConnectionError, TruncatedInput)) as ei:
        c.all_reduce(frame(np.zeros(4 << 20, np.float32)))
    msg = str(ei.value)
    assert "Errno" not in msg
    assert re.fullmatch(r"cpu_reduce: lost the relay while sending round 1: it closed the "
                        r"connection \((broken pipe|connection reset by peer)\)|cpu_reduce: "
                        r"controller closed connection before sending averaged frame back "
                        rf"\(round 1\); this rank's peer at {fake.addr} \(expected its "
                        r"relay\)", msg), msg
    _closed_for_good(c, "round 1 failed: cpu_reduce: ")


def test_a_failed_read_closes_the_client_and_a_local_error_does_not() -> None:
    reply = frame([1.0, 2.0])
    body = encode_round_frame_bytes(reply, SALT)
    fake = FakeRelay(acking(2, _reply(body[:20], prefix=len(body))))
    with RankClient.connect(fake.addr, 0, 1, SALT) as c:
        with pytest.raises(InvalidValue):  # a bad dtype: found before anything is written
            c.all_reduce_scaled([np.ones(2, np.float64)], 1.0)
        assert not c.closed
        with pytest.raises(TruncatedInput, match="stream ended inside a len-framed RoundFrame"):
            c.all_reduce(frame([1.0, 2.0]))
        _closed_for_good(c, "round 1 failed: ")
    fake.close()
    assert c.closed_reason is not None and c.closed_reason.startswith("round 1 failed")
    fake = FakeRelay(acking(2))
    c2 = RankClient.connect(fake.addr, 0, 1, SALT)
    c2.close()
    _closed_for_good(c2, "closed by the caller")
    fake.close()


def test_reply_prefix_above_the_ceiling_is_rejected_before_reading() -> None:
    fake = FakeRelay(acking(2, _reply(b"", prefix=1 << 30)))
    with RankClient.connect(fake.addr, 0, 1, SALT, ceiling=1 << 20) as c, \
            pytest.raises(LimitExceeded, match="exceeds the frame ceiling"):
        c.all_reduce(frame([1.0]))
    fake.close()


def test_a_numpy_integer_ceiling_is_taken_as_an_int() -> None:
    fake = FakeRelay(acking(2, _reply(b"", prefix=1 << 30)))
    with RankClient.connect(fake.addr, 0, 1, SALT, ceiling=np.int64(1 << 20)) as c:
        assert c.ceiling == 1 << 20 and type(c.ceiling) is int
        with pytest.raises(LimitExceeded, match="exceeds the frame ceiling 1048576"):
            c.all_reduce(frame([1.0]))
    fake.close()


# -- what goes on the wire --------------------------------------------------------------------
def _capture(version: int, call: Callable[[RankClient], Any], reply: RoundFrame,
             bf16: bool = False, rank: int = 0, world: int = 1) -> tuple[RoundFrame, Any]:
    """Run ``call`` against a fake relay answering ``reply``; return (request, result)."""
    fake = FakeRelay(acking(version, _reply(reply)))
    try:
        with RankClient.connect(fake.addr, rank, world, SALT, version, bf16=bf16) as c:
            out = call(c)
    except BaseException:
        fake.thread.join()
        fake.listener.close()
        raise
    fake.close()
    return fake.requests[0], out


def test_fused_scale_f32_and_bf16_wire() -> None:
    x = np.array([1.0, -3.0, 0.1, 1e-3], np.float32)
    sent, _ = _capture(2, lambda c: c.all_reduce_scaled([x.copy()], 0.3), frame([0, 0, 0, 0]))
    assert sent.kind is RoundKind.MODEL and sent.weight == 0.3
    assert bytes(sent.tensors[0].data) == (x * np.float32(0.3)).astype("<f4").tobytes()
    sent, _ = _capture(2, lambda c: c.all_reduce_scaled([x.copy()], 0.3), frame([0, 0, 0, 0],
                       dtype=Dtype.BF16), bf16=True)
    assert sent.tensors[0].dtype == Dtype.BF16
    assert bytes(sent.tensors[0].data) == bf16_from_f32(x * np.float32(0.3)).tobytes()
    # a bf16 staging tensor: widened, scaled in f32, rounded once
    xb = x.astype(ml_dtypes.bfloat16)
    sent, _ = _capture(2, lambda c: c.all_reduce_scaled([xb.copy()], 1 / 7), frame(
        [0, 0, 0, 0], dtype=Dtype.BF16), bf16=True)
    expect = bf16_from_f32(xb.astype(np.float32) * np.float32(1 / 7)).tobytes()
    assert bytes(sent.tensors[0].data) == expect


def test_idle_rank_v3_sends_elided_v2_sends_real_zeros() -> None:
    x = np.array([[1.0, -2.0], [np.nan, np.inf]], np.float32)
    sent, _ = _capture(3, lambda c: c.all_reduce_scaled([x.copy()], 0.0), frame(
        TensorPayload.elide(Dtype.F32, [2, 2]), weight=0.0))
    assert sent.weight == 0.0 and sent.tensors[0].elided and sent.tensors[0].shape == (2, 2)
    sent, _ = _capture(2, lambda c: c.all_reduce_scaled([x.copy()], 0.0), frame(
        np.zeros(4), weight=0.0))
    got = np.frombuffer(sent.tensors[0].data, "<f4")
    assert np.signbit(got[1]) and got[0] == 0.0 and np.isnan(got[2]) and np.isnan(got[3])


def test_zero_mass_reply_leaves_arrays_untouched() -> None:
    x = np.array([1.0, 2.0], np.float32)
    _, rep = _capture(2, lambda c: c.all_reduce_scaled([x], 0.0), frame([5.0, 6.0], weight=0.0))
    assert not rep.adopted and x.tolist() == [1.0, 2.0] and rep.weight == 0.0
    assert rep.arrays()[0].tolist() == [5.0, 6.0]


def test_decode_into_widens_bf16_and_zeroes_elided() -> None:
    x = np.array([1.0, 2.0, 3.0], np.float32)
    y = np.ones((2, 2), np.float32)
    reply = RoundFrame(RoundKind.MODEL, 2.0, [
        TensorPayload(Dtype.BF16, [3], bf16_from_f32(np.array([1.5, -2.25, 1e30],
                                                              np.float32)).tobytes()),
        TensorPayload.elide(Dtype.BF16, [2, 2])])
    _, rep = _capture(3, lambda c: c.all_reduce_scaled([x, y], 1.0), reply, bf16=True)
    assert rep.adopted
    assert x.tolist() == [1.5, -2.25, float(np.float32(ml_dtypes.bfloat16(1e30)))]
    assert y.tolist() == [[0.0, 0.0], [0.0, 0.0]]
    # bf16 destinations get the bf16 bytes verbatim
    xb = np.zeros(3, ml_dtypes.bfloat16)
    _, rep = _capture(3, lambda c: c.all_reduce_scaled([xb], 1.0), RoundFrame(
        RoundKind.MODEL, 1.0, [reply.tensors[0]]), bf16=True)
    assert xb.view(np.uint16).tobytes() == bytes(reply.tensors[0].data)


def test_decode_into_refuses_drifted_destinations() -> None:
    x = np.zeros(3, np.float32)
    with pytest.raises(SchemaMismatch, match="decode into destination refused"):
        _capture(2, lambda c: c.all_reduce_scaled([x], 1.0), frame([1.0, 2.0]))
    with pytest.raises(InvalidValue, match="dtype float64 not supported"):
        _capture(2, lambda c: c.all_reduce_scaled([np.zeros(2)], 1.0), frame([1.0, 2.0]))


@pytest.mark.parametrize("bad", [
    TensorPayload(Dtype.F32, [4], bytes(16)),  # another shape
    TensorPayload(7, [2], bytes(8)),  # an unknown dtype
    TensorPayload(Dtype.F32, [2], bytes(6)),  # bytes that do not match the shape
])
def test_a_reply_that_fails_at_a_later_tensor_adopts_nothing(bad: TensorPayload) -> None:
    """The consensus is checked for every destination before any is written: a reply whose
    second tensor does not fit leaves the first destination as it was too."""
    x = np.array([1.0, 2.0], np.float32)
    y = np.array([3.0, 4.0], np.float32)
    reply = RoundFrame(RoundKind.MODEL, 1.0, [tensor([9.0, 9.0]), bad], check_nbytes=False)
    with pytest.raises((SchemaMismatch, InvalidValue)):
        _capture(2, lambda c: c.all_reduce_scaled([x, y], 1.0), reply)
    assert x.tolist() == [1.0, 2.0] and y.tolist() == [3.0, 4.0]


@pytest.mark.parametrize("version", [2, 3])
def test_broadcast_and_gather_frames(version: int) -> None:
    x = np.array([1.0, -2.0, 3.0], np.float32)
    reply = frame([1.0, -2.0, 3.0], weight=0.0, kind=RoundKind.CONTROL)
    sent, rep = _capture(version, lambda c: c.broadcast_from_root([x.copy()], 0), reply,
                         bf16=True, rank=0, world=2)
    assert sent.kind is RoundKind.CONTROL and sent.weight == 0.0
    assert sent.tensors[0].dtype == Dtype.F32  # Control always rides f32
    assert bytes(sent.tensors[0].data) == x.tobytes()
    mine = np.array([9.0, 9.0, 9.0], np.float32)
    sent, rep = _capture(version, lambda c: c.broadcast_from_root([mine], 0), reply,
                         rank=1, world=2)
    assert sent.tensors[0].elided == (version == 3)
    assert mine.tolist() == [1.0, -2.0, 3.0] and rep.adopted
    sent, counts = _capture(version, lambda c: c.gather_counts(5), frame(
        [3.0, 5.0, 0.0], kind=RoundKind.CONTROL, weight=0.0), rank=1, world=3)
    assert values(sent) == [[0.0, 5.0, 0.0]] and sent.kind is RoundKind.CONTROL
    assert counts.dtype == np.float64 and counts.tolist() == [3.0, 5.0, 0.0]


def test_gather_counts_of_a_world_beyond_the_ceiling_is_refused_before_allocating() -> None:
    # the largest world the handshake carries: the [world_size] f32 tensor (16 GiB) is refused
    # from its size alone; nothing is sent and the client stays usable (a later round works)
    world = 2**32 - 1
    reply = frame([4.0], weight=1.0)
    fake = FakeRelay(acking(2, _reply(reply)))
    with RankClient.connect(fake.addr, world - 1, world, SALT, 2) as c:
        tracemalloc.start()
        try:
            with pytest.raises(LimitExceeded) as ei:
                c.gather_counts(1.0)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert isinstance(ei.value, LocalProtocolError)
        assert str(ei.value) == (f"relay_mux: len-framed blob length {4 * world} exceeds the "
                                 f"frame ceiling {c.ceiling}; model has outgrown the frame "
                                 "ceiling (see wire::frame_ceiling)")
        assert peak < 1 << 20
        assert not c.closed
        assert values(c.all_reduce(frame([4.0]))) == [[4.0]]
    fake.close()
    assert len(fake.requests) == 1


# -- through a real relay and controller (cpu_reduce_tests.rs) ---------------------------------
class _Cluster:
    def __init__(self, hosts: list[list[int]], version: int = 2) -> None:
        self.world = sum(len(h) for h in hosts)
        self.version = version
        self.ctrl = ReferenceController(self.world, SALT, version=version).start()
        self.relays = [Relay(self.ctrl.address, h, self.world, SALT, version=version,
                             listen_port=0, host=f"h{i}").start() for i, h in enumerate(hosts)]
        self.hosts = hosts

    def run(self, fn: Callable[[RankClient], Any], bf16: bool = False) -> dict[int, Any]:
        jobs = {}
        for relay, ranks in zip(self.relays, self.hosts, strict=True):
            for r in ranks:
                def body(r: int = r, relay: Relay = relay) -> Any:
                    with RankClient.connect(relay.address, r, self.world, SALT, self.version,
                                            bf16=bf16) as c:
                        return fn(c)
                jobs[r] = in_thread(body)
        out = {}
        for r, (t, res) in jobs.items():
            t.join()
            if "error" in res:
                raise res["error"]
            out[r] = res["result"]
        return out

    def close(self) -> None:
        for r in self.relays:
            r.shutdown()
        self.ctrl.shutdown()


@pytest.fixture
def cluster() -> Iterator[Callable[..., _Cluster]]:
    made: list[_Cluster] = []

    def make(hosts: list[list[int]], version: int = 2) -> _Cluster:
        made.append(_Cluster(hosts, version))
        return made[-1]

    yield make
    for c in made:
        c.close()


def test_two_rank_client_average_and_multi_round_persistence(
        cluster: Callable[..., _Cluster]) -> None:
    cl = cluster([[0, 1]])

    def rounds(c: RankClient) -> list[list[float]]:
        out = []
        for k in range(3):
            x = np.array([2.0, 4.0, 6.0], np.float32) * (c.rank + 1) + 4 * k
            c.all_reduce_mean([x])
            out.append(x.tolist())
        return out

    res = cl.run(rounds)
    assert res[0] == res[1]
    assert res[0][0] == [3.0, 6.0, 9.0]
    assert [r[0] for r in res[0]] == [3.0, 7.0, 11.0]


def test_three_rank_broadcast_from_root(cluster: Callable[..., _Cluster]) -> None:
    cl = cluster([[0, 1], [2]], version=3)

    def bcast(c: RankClient) -> list[list[float]]:
        a = np.full(3, 10.0 * c.rank + 1, np.float32)
        b = np.arange(4, dtype=np.float32).reshape(2, 2) * (c.rank + 1)
        c.broadcast_from_root([a, b])
        return [a.tolist(), b.reshape(-1).tolist()]

    res = cl.run(bcast)
    assert res[0] == res[1] == res[2] == [[1.0, 1.0, 1.0], [0.0, 1.0, 2.0, 3.0]]


@pytest.mark.parametrize("version", [2, 3])
def test_idle_nan_rank_cannot_poison_v3_but_does_v2(cluster: Callable[..., _Cluster],
                                                    version: int) -> None:
    cl = cluster([[0, 1], [2]], version=version)

    def step(c: RankClient) -> list[float]:
        x = {0: [2.0, 8.0], 1: [2.0, 8.0], 2: [np.nan, 1.0]}[c.rank]
        arr = np.array(x, np.float32)
        mass = {0: 1.0, 1: 2.0, 2: 0.0}[c.rank]
        rep = c.all_reduce_scaled([arr], mass)
        assert rep.weight == 3.0
        return arr.tolist()

    res = cl.run(step)
    if version == 3:
        assert res[0] == res[1] == res[2] == [2.0, 8.0]
    else:
        assert all(np.isnan(r[0]) and r[1] == 8.0 for r in res.values())


def test_two_rank_scaled_weighted_average_bf16_wire_and_counts(
        cluster: Callable[..., _Cluster]) -> None:
    cl = cluster([[0], [1]])

    def step(c: RankClient) -> tuple[list[float], list[float], float]:
        counts = c.gather_counts({0: 3, 1: 1}[c.rank])
        x = np.array({0: [2.0, 8.0], 1: [4.0, 16.0]}[c.rank], np.float32)
        rep = c.all_reduce_scaled([x], float(counts[c.rank]))
        return x.tolist(), counts.tolist(), rep.weight

    res = cl.run(step, bf16=True)
    assert res[0] == res[1] == ([2.5, 10.0], [3.0, 1.0], 4.0)


def test_rank_cli_prints_digests(tmp_path: Any) -> None:
    import subprocess
    import sys

    with ReferenceController(2, SALT) as ctrl:
        relay = Relay(ctrl.address, [0, 1], 2, SALT, listen_port=0).start()
        try:
            procs = [subprocess.Popen(
                [sys.executable, "-m", "flodl_proto.cli", "rank", "--relay",
                 f"127.0.0.1:{relay.port}", "--rank", str(r), "--world-size", "2", "--salt",
                 SALT.hex(), "--rounds", "3", "--payload-mib", "0.25"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
            outs = [p.communicate(timeout=60) for p in procs]
            assert [p.returncode for p in procs] == [0, 0], outs
            lines = [o[0].splitlines() for o in outs]
            assert lines[0] == lines[1] and len(lines[0]) == 3
            for k, line in enumerate(lines[0], 1):
                head, digest = line.rsplit(" ", 1)
                assert head == f"round {k} digest" and len(digest) == 64
                int(digest, 16)
            assert relay.wait(20) is None
        finally:
            relay.shutdown()
    assert ctrl.outcome is not None and ctrl.outcome.clean



#: rounds the unread-stdout test runs: far more digest lines than a 4 KiB pipe and the backlog
#: hold together
_UNREAD_ROUNDS = 600


@pytest.mark.timeout(120)
def test_rank_cli_rounds_go_on_while_nobody_reads_stdout() -> None:
    """A stdout pipe nobody reads fills (here shrunk to one page, 4 KiB); the digest lines then
    wait in the rank's bounded backlog or are dropped and counted, and every round still completes
    (the fake relay answers all of them before stdout is read). Once stdout is read, the rank
    exits 0: the lines written plus the ones the warning counts are one per round."""
    import fcntl
    import os
    import subprocess
    import sys

    from flodl_proto.commands._output import STDOUT_BACKLOG

    def serve(relay: FakeRelay, conn: socket.socket) -> None:
        for _ in range(_UNREAD_ROUNDS):  # echo each contribution as the consensus
            conn.sendall(_echo(relay.read_request(conn)))
        assert conn.recv(1) == b""  # the rank closes after its last round

    fake = FakeRelay(acking(2, serve))
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    e = {k: v for k, v in os.environ.items() if k != "FLODL_SESSION_SALT"}
    p = subprocess.Popen([sys.executable, "-m", "flodl_proto.cli", "rank", "--relay", fake.addr,
                          "--rank", "0", "--world-size", "1", "--salt", SALT.hex(), "--rounds",
                          str(_UNREAD_ROUNDS)],
                         stdout=write_end, stderr=subprocess.PIPE, text=True, env=e)
    os.close(write_end)
    with os.fdopen(read_end, "rb", buffering=0) as out:
        try:
            fake.thread.join(100)  # every round answered while nobody reads stdout
            assert not fake.thread.is_alive() and len(fake.requests) == _UNREAD_ROUNDS
            rest = out.read()  # now stdout is read: the rank can finish
            assert p.wait(timeout=60) == 0
            assert p.stderr is not None
            err = p.stderr.read()
        finally:
            p.kill() if p.poll() is None else None
    fake.close()
    lines = rest.decode().splitlines()
    rounds = [int(m.group(1)) for ln in lines
              if (m := re.fullmatch(r"round (\d+) digest [0-9a-f]{64}", ln))]
    assert len(rounds) == len(lines) and rounds == sorted(set(rounds)) and rounds[0] == 1
    warning = err.strip().splitlines()
    assert len(warning) == 1, err
    prefix = "flodl-proto rank 0: warning: "
    assert warning[0].startswith(prefix), err
    assert warning[0].endswith(" progress lines dropped: stdout was not read fast enough")
    dropped = int(warning[0][len(prefix):].split()[0])
    assert len(lines) + dropped == _UNREAD_ROUNDS
    # at most: the backlog, the line being written and what the pipe held
    assert len(lines) <= STDOUT_BACKLOG + 1 + 4096 // min(len(ln) + 1 for ln in lines)


def test_rank_cli_digest_lines_of_rounds_gathered_leave_in_one_write(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The rank's stdout writer gathers its digest lines for ``LINE_COALESCE`` seconds after a
    line, as the controller's does: the lines of the rounds that end meanwhile are written in one
    ``write``, in order, byte for byte as before (``round K digest <sha256 of the consensus
    frame's bytes>``), and the rank waits at exit for them. Here the gathering ends only once
    the relay has seen the rank leave (every line put), so all of them are one write; a writer
    that wrote each line as it came made one write per round."""
    import hashlib

    from flodl_proto.cli import main
    from flodl_proto.commands import _output
    from flodl_proto.commands.controller import LINE_COALESCE as CONTROLLER_COALESCE

    rounds = 3
    echoed: list[bytes] = []
    rank_left = threading.Event()

    def serve(relay: FakeRelay, conn: socket.socket) -> None:
        try:
            for _ in range(rounds):  # each contribution is its own consensus
                n = int.from_bytes(recv_exact(conn, 4), "little")
                body = recv_exact(conn, n)
                echoed.append(body)
                conn.sendall(n.to_bytes(4, "little") + body)
            assert conn.recv(1) == b""  # the rank leaves after its last round
        finally:
            rank_left.set()

    gathered: list[float] = []

    def gather(writer: object, seconds: float) -> None:  # the writer's wait for more lines
        gathered.append(seconds)
        assert rank_left.wait(30)

    fake = FakeRelay(acking(2, serve))
    try:
        with stdout_pipe_writes(monkeypatch) as pipe, monkeypatch.context() as m:
            m.setattr(_output.LineWriter, "_gather", gather)
            code = main(["rank", "--relay", fake.addr, "--rank", "0", "--world-size", "1",
                         "--salt", SALT.hex(), "--rounds", str(rounds)])
    finally:
        fake.close()
    want = "".join(f"round {k} digest {hashlib.sha256(body).hexdigest()}\n"
                   for k, body in enumerate(echoed, 1)).encode()
    assert (code, len(echoed)) == (0, rounds)
    assert pipe.writes == [want] and pipe.got == want
    assert gathered and set(gathered) == {CONTROLLER_COALESCE} == {_output.LINE_COALESCE}


def _echo(request: RoundFrame) -> bytes:
    body = encode_round_frame_bytes(request, SALT)
    return len(body).to_bytes(4, "little") + body


def test_realized_work_scattered_frame_is_the_consensus(cluster: Callable[..., _Cluster]) -> None:
    """Counts [3, 5, 2] gathered through Control, values [1, 2, 3] weighted by gamma_mass(n, 1):
    every rank adopts (3 + 10 + 6) / 10 = 1.9."""
    from flodl_proto.reduce import gamma_mass

    cl = cluster([[0, 1], [2]], version=3)

    def step(c: RankClient) -> tuple[list[float], list[float]]:
        n = {0: 3, 1: 5, 2: 2}[c.rank]
        counts = c.gather_counts(n)
        x = np.full(4, float(c.rank + 1), np.float32)
        mass = gamma_mass(counts[c.rank], 1.0)
        rep = c.all_reduce_scaled([x], mass)
        assert rep.weight == 10.0 and rep.adopted
        return counts.tolist(), x.tolist()

    res = cl.run(step)
    want = float(np.float32(19.0) * np.float32(1 / 10))
    assert all(r == ([3.0, 5.0, 2.0], [want] * 4) for r in res.values())
    assert abs(want - 1.9) < 1e-6


def test_bf16_staging_scaled_into_the_reused_scratch() -> None:
    """A bf16 array on a bf16 wire is scaled into the client's f32 scratch (its first half):
    round after round the payload is that round's own product, with no fresh buffer."""
    from flodl_proto.runner._rank_payloads import scaled_payload

    rng = np.random.default_rng(4)
    scratch = np.full(1001, 123.0, np.float32)
    for scale in (0.3, 1 / 7, 2.0):
        xb = rng.standard_normal(1001).astype(np.float32).astype(ml_dtypes.bfloat16)
        p = scaled_payload(xb, Dtype.BF16, scale, scratch)
        expect = bf16_from_f32(xb.astype(np.float32) * np.float32(scale)).tobytes()
        assert bytes(p.data) == expect
        assert np.frombuffer(p.data, np.uint8).ctypes.data == scratch.ctypes.data


def test_reply_buffers_are_reused_only_when_released() -> None:
    """Replies land in a reused buffer once nothing holds the earlier reply: a held reply (or
    a view of its payload) is never overwritten by a later round; without one the client
    alternates between two buffers (the last reply's and the next one)."""
    replies = [frame(np.full(4096, float(k), np.float32)) for k in range(10)]

    def rounds(relay: FakeRelay, conn: socket.socket) -> None:
        for r in replies:
            _reply(r)(relay, conn)

    fake = FakeRelay(acking(2, rounds))
    with RankClient.connect(fake.addr, 0, 1, SALT) as c:
        held = c.all_reduce(frame(np.zeros(4096, np.float32)))
        view = np.frombuffer(held.tensors[0].data, np.float32)
        for k in range(1, 5):
            got = c.all_reduce(frame(np.zeros(4096, np.float32)))
            assert (np.frombuffer(got.tensors[0].data, np.float32) == float(k)).all()
            del got
            assert (view == 0.0).all()
            assert len(c._reply_bufs) <= 2
        del held, view
        addrs = []
        for k in range(5, 10):
            got = c.all_reduce(frame(np.zeros(4096, np.float32)))
            assert (np.frombuffer(got.tensors[0].data, np.float32) == float(k)).all()
            addrs.append(np.frombuffer(got.tensors[0].data, np.uint8).ctypes.data)
            del got
        assert len(set(addrs[1:])) == 2 and addrs[1] == addrs[3] and addrs[2] == addrs[4]
    fake.close()


def _sent_bytes(call: Callable[[RankClient], Any], rounds: int, bf16: bool,
                version: int = 2) -> list[bytes]:
    """Run ``call`` ``rounds`` times against a fake relay that echoes each request as the
    reply; return every request's raw bytes (length prefix included)."""
    def echo(relay: FakeRelay, conn: socket.socket) -> list[bytes]:
        raw = []
        for _ in range(rounds):
            prefix = recv_exact(conn, 4)
            body = recv_exact(conn, int.from_bytes(prefix, "little"))
            raw.append(prefix + body)
            conn.sendall(prefix + body)
        return raw

    fake = FakeRelay(acking(version, echo))
    with RankClient.connect(fake.addr, 0, 1, SALT, version, bf16=bf16) as c:
        for _ in range(rounds):
            call(c)
    fake.close()
    return list(fake.result["value"][1])


def _staged(seed: int) -> list[np.ndarray]:
    """Arrays of every shape class (0-d, empty, 2-D, a strided view) with special values."""
    rng = np.random.default_rng(seed)
    big = rng.standard_normal((6, 10)).astype(np.float32)
    big[0, :4] = [np.nan, np.inf, -np.inf, -0.0]
    return [big[:, ::2], np.float32(rng.standard_normal()).reshape(()),
            np.zeros((0, 3), np.float32), rng.standard_normal(257).astype(np.float32)]


@pytest.mark.parametrize("bf16_wire", [False, True])
@pytest.mark.parametrize("staging", ["f32", "bf16", "mixed"])
def test_small_frames_from_the_template_are_the_encoded_frames(
        monkeypatch: pytest.MonkeyPatch, bf16_wire: bool, staging: str) -> None:
    """Frames up to TEMPLATE_MAX_PAYLOAD bytes are written into a kept template; their bytes
    are those of the frame built tensor by tensor (the path of larger frames), round after
    round, through layout changes, for f32, bf16 and mixed staging on either wire dtype."""
    import flodl_proto.runner.rank as rank_mod

    def arrays(k: int) -> list[np.ndarray]:
        arrs = _staged(k)
        if staging == "bf16":
            arrs = [a.astype(ml_dtypes.bfloat16) for a in arrs]
        elif staging == "mixed":
            arrs[1] = arrs[1].astype(ml_dtypes.bfloat16)
        return arrs if k % 3 else arrs[:2]  # every third round another layout

    scales = [0.3, 1 / 7, 0.0, 2.0, 1e-30, 5.0]
    kinds = [RoundKind.MODEL, RoundKind.MODEL, RoundKind.CONTROL]

    def call(c: RankClient) -> None:
        k = c.rounds
        c.all_reduce_scaled(arrays(k), scales[k % len(scales)], kinds[k % 3],
                            weight=float(k), adopt=False)

    templated = _sent_bytes(call, 7, bf16_wire)
    monkeypatch.setattr(rank_mod, "TEMPLATE_MAX_PAYLOAD", -1)  # every frame tensor by tensor
    pieces = _sent_bytes(call, 7, bf16_wire)
    assert templated == pieces
    assert len({len(b) for b in templated}) >= 2  # the layouts did change


def test_the_template_is_kept_per_layout_and_only_for_small_frames(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import flodl_proto.runner.rank as rank_mod

    seen: list[Any] = []

    def call(c: RankClient) -> None:
        n = [8, 8, 16, 16, 2048][c.rounds]
        c.all_reduce_scaled([np.ones(n, np.float32)], 0.5, adopt=False)
        seen.append(c._template)

    monkeypatch.setattr(rank_mod, "TEMPLATE_MAX_PAYLOAD", 64)
    _sent_bytes(call, 5, False)
    assert seen[0] is seen[1] and seen[2] is seen[3] and seen[0] is not seen[2]
    assert seen[0] is not None and seen[0][1].layout == ((0, (8,)),)
    assert seen[2][1].layout == ((0, (16,)),)
    assert seen[4] is seen[3]  # 8 KiB of payload: sent tensor by tensor, the template kept


def test_template_local_errors_write_nothing_and_keep_the_client() -> None:
    """A bad weight or a frame over the ceiling is refused before anything is written, on
    the template path as on the other."""
    def then(relay: FakeRelay, conn: socket.socket) -> bytes:
        prefix = recv_exact(conn, 4)
        body = recv_exact(conn, int.from_bytes(prefix, "little"))
        conn.sendall(prefix + body)
        return prefix + body

    fake = FakeRelay(acking(2, then))
    x = np.array([1.0, 2.0], np.float32)
    with RankClient.connect(fake.addr, 0, 1, SALT, 2) as c:
        with pytest.raises(InvalidValue, match="weight"):
            c.all_reduce_scaled([x], 0.5, weight=float("nan"))
        c.ceiling = 10
        with pytest.raises(LimitExceeded, match="ceiling"):
            c.all_reduce_scaled([x], 0.5)
        c.ceiling = 1 << 20
        rep = c.all_reduce_scaled([x], 0.5, weight=1.0)
        assert not c.closed and rep.adopted and x.tolist() == [0.5, 1.0]
    fake.close()
    sent = fake.result["value"][1]
    assert decode_round_frame(sent[4:], SALT)[0] == frame([0.5, 1.0])


def test_arguments_that_cannot_make_a_round_are_refused_before_anything_is_written() -> None:
    """A destination the consensus cannot be written into (read-only, or a NumPy scalar that
    would be copied), a kind, wire dtype, scale, weight, root or count value that is not one:
    each is a typed local error naming the argument and its value, found before the round is
    written, and the client goes on (the relay sees only the last, good round)."""
    def then(relay: FakeRelay, conn: socket.socket) -> list[bytes]:
        prefix = recv_exact(conn, 4)
        body = recv_exact(conn, int.from_bytes(prefix, "little"))
        conn.sendall(prefix + body)
        return [prefix + body, recv_exact(conn, 1)]

    fake = FakeRelay(acking(2, then))
    ro = np.array([1.0, 2.0], np.float32)
    ro.flags.writeable = False
    x = np.array([1.0, 2.0], np.float32)
    with RankClient.connect(fake.addr, 0, 1, SALT, 2) as c:
        for call, error_id, fields in (
                (lambda: c.all_reduce_scaled([x, ro], 0.5), "client.not_writable",
                 {"index": 1, "reason": "the array is read-only; pass a writable array"}),
                (lambda: c.all_reduce_mean([ro]), "client.not_writable",
                 {"index": 0, "reason": "the array is read-only; pass a writable array"}),
                (lambda: c.broadcast_from_root([ro]), "client.not_writable",
                 {"index": 0, "reason": "the array is read-only; pass a writable array"}),
                (lambda: c.all_reduce_scaled([np.float32(1.0)], 0.5), "client.not_writable",
                 {"index": 0, "reason": "got float32, not a NumPy array, so the consensus "
                                        "would go into a copy; pass an array"}),
                (lambda: c.all_reduce_scaled([x], 0.5, kind=5), "client.bad_argument",
                 {"field": "kind", "value": 5, "reason": "not 0 (Model) or 1 (Control)"}),
                (lambda: c.all_reduce_scaled([x], 0.5, wire_dtype=7), "client.bad_argument",
                 {"field": "wire_dtype", "value": 7, "reason": "not 0 (f32) or 1 (bf16)"}),
                (lambda: c.all_reduce_scaled([x], "0.5"),  # type: ignore[arg-type]
                 "client.bad_argument",
                 {"field": "scale", "value": "0.5", "reason": "not a real number"}),
                (lambda: c.all_reduce_scaled([x], 0.5, weight="1"),  # type: ignore[arg-type]
                 "client.bad_argument",
                 {"field": "weight", "value": "1", "reason": "not a real number"}),
                (lambda: c.all_reduce_scaled([x], 0.5, weight=10 ** 400), "client.bad_argument",
                 {"field": "weight", "value": 10 ** 400, "reason": "beyond the f64 range"}),
                (lambda: c.all_reduce_scaled([x], 0.5, weight=True), "client.bad_argument",
                 {"field": "weight", "value": True, "reason": "not a real number"}),
                (lambda: c.all_reduce_scaled([x], True), "client.bad_argument",
                 {"field": "scale", "value": True, "reason": "not a real number"}),
                (lambda: c.broadcast_from_root([x], root=0.5), "client.bad_argument",  # type: ignore[arg-type]
                 {"field": "root", "value": 0.5, "reason": "not an integer rank"}),
                (lambda: c.gather_counts(None), "client.bad_argument",  # type: ignore[arg-type]
                 {"field": "value", "value": None, "reason": "not a real number"}),
        ):
            with pytest.raises(InvalidValue) as ei:
                call()
            assert isinstance(ei.value, LocalProtocolError)
            assert ei.value.error_id == error_id and dict(ei.value.fields) == fields
            assert not c.closed and c.bytes_sent == 16 and c.rounds == 0
        assert str(ei.value) == "cpu_reduce: value = None is invalid: not a real number"
        rep = c.all_reduce_scaled([ro], 0.5, weight=1.0, adopt=False)
        assert not rep.adopted and ro.tolist() == [1.0, 2.0]
    fake.close()
    sent, rest = fake.result["value"][1]
    assert decode_round_frame(sent[4:], SALT)[0] == frame([0.5, 1.0]) and rest == b""
