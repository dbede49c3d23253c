"""``runner._controller_conn._write_direct``: a small record leaves whole in one non-blocking
``sendmsg``; what a full socket does not take is returned as views (the writer thread sends it),
exactly the bytes ``send_now`` would leave; records of many buffers go through ``send_now``."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from flodl_proto.runner import _controller_conn as conn_mod
from flodl_proto.runner import _netio_send


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def _drain(sock: socket.socket) -> bytes:
    sock.setblocking(False)
    got = b""
    while True:
        try:
            chunk = sock.recv(1 << 20)
        except BlockingIOError:
            return got
        if not chunk:
            return got
        got += chunk


def test_a_small_record_leaves_whole(pair: tuple[socket.socket, socket.socket],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = pair
    calls: list[int] = []
    monkeypatch.setattr(conn_mod, "send_now", lambda *args: calls.append(1) or [])
    bufs = (b"head", memoryview(b"payload"), b"", b"tag")
    assert conn_mod._write_direct(a, bufs, 14) == []
    assert (_drain(b), calls) == (b"headpayloadtag", [])


@pytest.mark.parametrize("many", [False, True])
def test_what_a_full_socket_leaves_is_returned(pair: tuple[socket.socket, socket.socket],
                                               many: bool) -> None:
    a, b = pair
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    piece = bytes(range(256)) * 64  # 16 KiB
    count = conn_mod._DIRECT_BUFFERS + 1 if many else 8
    bufs = tuple([b"hdr", *[memoryview(piece)] * count, b"tag"])
    want = b"".join(bytes(x) for x in bufs)
    rest = conn_mod._write_direct(a, bufs, len(want))
    assert rest and all(isinstance(r, memoryview) for r in rest)
    got = _drain(b)
    assert 0 < len(got) < len(want)
    assert got + b"".join(bytes(r) for r in rest) == want


def test_a_failed_socket_leaves_everything(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    b.close()
    a.shutdown(socket.SHUT_WR)
    bufs = (b"head", memoryview(b"payload"))
    rest = conn_mod._write_direct(a, bufs, 11)
    assert b"".join(bytes(r) for r in rest) == b"headpayload"
    assert rest == _netio_send.send_now(a, bufs)
