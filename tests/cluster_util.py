"""Helpers for the relay / rank / end-to-end socket tests: a scripted controller, raw ranks,
frame builders and a leak guard (threads and sockets)."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from flodl_proto.codec import (
    DeclareDead,
    Dtype,
    HelloAck,
    MuxRecord,
    RecordKind,
    RoundFrame,
    RoundKind,
    TensorPayload,
    decode_mux_record,
    encode_channel_magic,
    encode_frame_record,
    encode_handshake,
    encode_mux_record_bytes,
    encode_round_frame_bytes,
    parse_mux_header,
)
from flodl_proto.reduce import bf16_from_f32

SALT = bytes.fromhex("5a17c0de429901fe3c88b70d6e21f493")
OTHER_SALT = bytes(16)
IO_TIMEOUT = 20.0


def tensor(values: Sequence[float] | np.ndarray, dtype: int = Dtype.F32,
           shape: Sequence[int] | None = None) -> TensorPayload:
    """A payload of ``values`` in wire ``dtype`` (bf16 with upstream's rounding)."""
    arr = np.asarray(values, dtype=np.float32)
    if shape is not None:
        arr = arr.reshape(shape)
    if dtype == Dtype.BF16:
        return TensorPayload(Dtype.BF16, arr.shape, bf16_from_f32(arr).tobytes())
    return TensorPayload(Dtype.F32, arr.shape, arr.astype("<f4").tobytes())


def frame(*tensors: Sequence[float] | np.ndarray | TensorPayload, weight: float = 1.0,
          kind: RoundKind = RoundKind.MODEL, dtype: int = Dtype.F32) -> RoundFrame:
    """A RoundFrame of the given tensors (value lists become payloads of ``dtype``)."""
    ts = [t if isinstance(t, TensorPayload) else tensor(t, dtype) for t in tensors]
    return RoundFrame(kind, weight, ts)


def values(f: RoundFrame) -> list[list[float]]:
    """Every tensor of ``f`` as a flat list of floats (elided -> zeros)."""
    return [np.asarray(t.array(materialize_elided=True), dtype=np.float32).reshape(-1).tolist()
            for t in f.tensors]


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Read exactly ``n`` bytes (fewer only at end of stream)."""
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf))
        except ConnectionResetError:
            break
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


def read_to_eof(sock: socket.socket) -> bytes:
    """Everything until the peer closes."""
    out = bytearray()
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except ConnectionResetError:
            break
        if not chunk:
            break
        out += chunk
    return bytes(out)


class ControllerConn:
    """The controller side of one relay connection (scripted by a test)."""

    def __init__(self, sock: socket.socket, salt: bytes, version: int) -> None:
        self.sock = sock
        self.salt = salt
        self.version = version
        sock.settimeout(IO_TIMEOUT)

    def read_magic(self) -> bytes:
        return recv_exact(self.sock, 4)

    def read_record(self) -> MuxRecord | None:
        """The next record (authenticated with the salt), or None at end of stream."""
        head = recv_exact(self.sock, 25)
        if len(head) < 25:
            return None
        hdr = parse_mux_header(head)
        body = recv_exact(self.sock, hdr.payload_len)
        res = decode_mux_record(head + body, self.salt, version=self.version)
        return res[0]

    def read_raw_record(self) -> bytes:
        head = recv_exact(self.sock, 25)
        hdr = parse_mux_header(head)
        return head + recv_exact(self.sock, hdr.payload_len)

    def handshake(self) -> MuxRecord:
        """Read magic + Hello, answer HelloAck; return the Hello record."""
        assert self.read_magic() == encode_channel_magic("data")
        hello = self.read_record()
        assert hello is not None and hello.kind is RecordKind.CONTROL
        self.send(MuxRecord.control_msg(HelloAck(), self.version))
        return hello

    def send(self, rec: MuxRecord, salt: bytes | None = None) -> None:
        self.sock.sendall(encode_mux_record_bytes(rec, salt or self.salt))

    def broadcast(self, f: RoundFrame, salt: bytes | None = None) -> bytes:
        """Send ``f`` as a Broadcast; return the payload bytes (the frame)."""
        parts = encode_frame_record(RecordKind.BROADCAST, f, salt or self.salt)
        self.sock.sendall(b"".join(parts))
        return encode_round_frame_bytes(f, salt or self.salt)

    def declare_dead(self, rank: int) -> None:
        self.send(MuxRecord.control_msg(DeclareDead(rank), self.version))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class FakeController:
    """A listener on an ephemeral loopback port whose connections a test scripts."""

    def __init__(self, salt: bytes = SALT, version: int = 2) -> None:
        self.salt = salt
        self.version = version
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.listener.settimeout(IO_TIMEOUT)
        self.port = self.listener.getsockname()[1]
        self.conns: list[ControllerConn] = []

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def accept(self) -> ControllerConn:
        sock, _ = self.listener.accept()
        c = ControllerConn(sock, self.salt, self.version)
        self.conns.append(c)
        return c

    def close(self) -> None:
        for c in self.conns:
            c.close()
        self.listener.close()

    def __enter__(self) -> FakeController:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class RawRank:
    """A rank speaking raw bytes to a relay (for the cases a RankClient refuses to produce)."""

    def __init__(self, addr: tuple[str, int]) -> None:
        self.sock = socket.create_connection(addr, timeout=IO_TIMEOUT)

    def handshake(self, rank: int, world_size: int, version: int = 2) -> bytes:
        """Send the handshake, return what came back (the ack, or less if refused)."""
        self.sock.sendall(encode_handshake(rank, world_size, version))
        return recv_exact(self.sock, 8)

    def send_frame(self, f: RoundFrame, salt: bytes = SALT) -> None:
        body = encode_round_frame_bytes(f, salt)
        self.sock.sendall(len(body).to_bytes(4, "little") + body)

    def read_reply(self) -> bytes | None:
        """One len-framed reply body, or None at end of stream."""
        prefix = recv_exact(self.sock, 4)
        if len(prefix) < 4:
            return None
        return recv_exact(self.sock, int.from_bytes(prefix, "little"))

    def close(self) -> None:
        self.sock.close()


def in_thread(fn: Any, *args: Any) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``fn(*args)`` in a thread; the dict gets ``result`` or ``error``."""
    out: dict[str, Any] = {}

    def body() -> None:
        try:
            out["result"] = fn(*args)
        except BaseException as e:
            out["error"] = e

    t = threading.Thread(target=body, name="test-helper")
    t.start()
    return t, out


def _socket_fds() -> set[str]:
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                out.add(fd)
    return out


@contextlib.contextmanager
def leak_guard(grace: float = 10.0) -> Iterator[None]:
    """Fail if the block leaves a thread running or a socket open."""
    threads = set(threading.enumerate())
    fds = _socket_fds() if os.path.isdir("/proc/self/fd") else set()
    yield
    deadline = time.monotonic() + grace
    while True:
        extra = [t for t in threading.enumerate() if t not in threads and t.is_alive()]
        if not extra or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert not extra, f"threads left running: {[t.name for t in extra]}"
    if os.path.isdir("/proc/self/fd"):
        left = _socket_fds() - fds
        assert not left, f"{len(left)} socket(s) left open"


def wait_until(cond: Any, timeout: float = IO_TIMEOUT) -> None:
    """Poll ``cond()`` until true (fails the test after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


def skip_deep_unless_selected(request: Any) -> None:
    """Skip a ``@pytest.mark.deep`` test unless the run selected deep cases (``-m deep``)."""
    import pytest

    markexpr = str(request.config.getoption("markexpr") or "")
    if request.node.get_closest_marker("deep") and (
            "deep" not in markexpr or "not deep" in markexpr):
        pytest.skip("deep case: select with -m deep")


def small_relay_send_buffers(monkeypatch: Any) -> None:
    """Give every socket the relay configures a 4 KiB send buffer (``SO_SNDBUF``), so that a
    rank or controller that reads slowly, or not at all, stalls the relay's writes after a few
    KiB instead of after the kernel's default of several MiB."""
    from flodl_proto.runner import _netio
    from flodl_proto.runner import relay as relay_mod

    def small_buffers(sock: socket.socket, **kw: float | None) -> None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        _netio.configure_socket(sock, **kw)

    monkeypatch.setattr(relay_mod, "configure_socket", small_buffers)
