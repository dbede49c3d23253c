"""A scripted relay for controller tests, built on the codec only (no runner code).

It opens a data-channel connection, sends the channel magic and a Hello, ships HostFrames and
reads the controller's records (HelloAck, Broadcast, DeclareDead) with a deadline, so a test
fails instead of hanging.
"""

from __future__ import annotations

import socket
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from flodl_proto.codec.handshake import encode_channel_magic
from flodl_proto.codec.mux import (
    DeclareDead,
    Hello,
    HelloAck,
    MuxRecord,
    RankExit,
    RecordKind,
    encode_frame_record,
    encode_mux_record_bytes,
)
from flodl_proto.codec.round_frame import RoundFrame, RoundKind, TensorPayload
from flodl_proto.codec.stream import MuxStream, RecordReceived, StreamFailed

SALT = bytes.fromhex("5a17c0de429901fe3c88b70d6e21f493")
DEADLINE = 5.0


def frame(*tensors: Sequence[float] | np.ndarray[Any, Any], weight: float = 1.0,
          kind: RoundKind = RoundKind.MODEL, dtype: int = 0) -> RoundFrame:
    """A RoundFrame of f32 (dtype 0) or bf16 (dtype 1) tensors."""
    return RoundFrame(kind, weight, [TensorPayload.from_array(np.asarray(t, dtype=np.float32),
                                                              dtype) for t in tensors])


def values(f: RoundFrame, i: int = 0) -> list[float]:
    """Tensor ``i`` of ``f`` as Python floats."""
    return [float(x) for x in np.asarray(f.tensors[i].array(), dtype=np.float32).ravel()]


class FakeRelay:
    """One relay connection to a controller.

    Args:
        port: the controller's port (on 127.0.0.1).
        ranks: the ranks announced in Hello (None: send no Hello).
        salt: session salt.
        version: protocol version (Hello shape).
        host: host name announced.
        magic: send the data-channel magic first (a raw u32 sends that value instead).
        rcvbuf: SO_RCVBUF to set before connecting (to make the controller's writes stall).
    """

    def __init__(self, port: int, ranks: Sequence[int] | None, *, salt: bytes = SALT,
                 version: int = 2, host: str = "fake", magic: bool | int = True,
                 rcvbuf: int | None = None) -> None:
        self.salt = salt
        self.version = version
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(DEADLINE)
        self.sock.connect(("127.0.0.1", port))
        # the controller -> relay direction: no channel magic
        self._stream = MuxStream(salt, version=version, expect_magic=None)
        self._records: deque[MuxRecord] = deque()
        if magic is True:
            self.sock.sendall(encode_channel_magic("data"))
        elif magic is not False:
            self.sock.sendall(encode_channel_magic(int(magic)))
        if ranks is not None:
            self.send_control(Hello(host, list(ranks)))

    # -- sending ---------------------------------------------------------------------------------
    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_record(self, record: MuxRecord, salt: bytes | None = None) -> None:
        self.sock.sendall(encode_mux_record_bytes(record, salt or self.salt))

    def send_control(self, msg: Any) -> None:
        self.send_record(MuxRecord.control_msg(msg, self.version))

    def send_host_frame(self, f: RoundFrame, *, frame_salt: bytes | None = None) -> None:
        """Ship ``f`` as a HostFrame (inner frame signed with ``frame_salt``, default the salt)."""
        if frame_salt is None:
            parts = encode_frame_record(RecordKind.HOST_FRAME, f, self.salt)
            self.sock.sendall(b"".join(bytes(memoryview(b)) for b in parts))
        else:
            inner = b"".join(bytes(memoryview(b)) for b in
                             encode_frame_record(RecordKind.HOST_FRAME, f, frame_salt)[1:])
            self.send_record(MuxRecord.host_frame(inner))

    def rank_exit(self, rank: int) -> None:
        self.send_control(RankExit(rank))

    # -- receiving -------------------------------------------------------------------------------
    def read_record(self, timeout: float = DEADLINE) -> MuxRecord | None:
        """The next record, or None at end of stream (raises TimeoutError on the deadline)."""
        deadline = time.monotonic() + timeout
        while not self._records:
            if self._stream.done:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no record from the controller in time")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(1 << 20)
            except (ConnectionResetError, ConnectionAbortedError):
                chunk = b""
            for ev in self._stream.feed(chunk) if chunk else self._stream.feed_eof():
                if isinstance(ev, StreamFailed):
                    raise ev.error
                if isinstance(ev, RecordReceived):
                    self._records.append(ev.record)
        return self._records.popleft()

    def expect_hello_ack(self) -> None:
        rec = self.read_record()
        assert rec is not None and isinstance(rec.control, HelloAck), rec

    def read_broadcast(self, timeout: float = DEADLINE) -> RoundFrame:
        rec = self.read_record(timeout)
        assert rec is not None and rec.kind is RecordKind.BROADCAST, rec
        return rec.frame(self.salt)

    def read_declare_dead(self) -> int:
        rec = self.read_record()
        assert rec is not None and isinstance(rec.control, DeclareDead), rec
        return rec.control.rank

    def at_eof(self, timeout: float = DEADLINE) -> bool:
        """True when the controller closed the connection (nothing else arrives first)."""
        try:
            return self.read_record(timeout) is None
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> FakeRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
