"""The auth helpers one by one: salt checks, MAC objects, tag comparison and printing, and when
the MACs of a frame are handed to the caller's executor.

Expected tags are computed here with :mod:`hmac` / :mod:`hashlib` (HMAC-SHA256 keyed with the
16-byte session salt, first 8 bytes); expected errors name the catalogue id, the side and the
exact message.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

import numpy as np
import pytest

from flodl_proto import errors
from flodl_proto.codec import auth

SALT = bytes(range(16))
MIB = 1 << 20


def sha(salt: bytes, msg: bytes) -> bytes:
    return hmac.new(salt, msg, hashlib.sha256).digest()


# -- check_salt ---------------------------------------------------------------------------------
@pytest.mark.parametrize("salt", [SALT, bytearray(SALT), memoryview(SALT), bytes(16)])
def test_check_salt_returns_the_bytes(salt: bytes | bytearray | memoryview) -> None:
    got = auth.check_salt(salt)
    assert type(got) is bytes and got == bytes(salt)
    # a 16-byte bytes salt (every round's call) is returned as given, not copied
    assert (got is salt) == (type(salt) is bytes)


@pytest.mark.parametrize("n", [0, 1, 15, 17, 32])
def test_check_salt_bad_length(n: int) -> None:
    with pytest.raises(errors.InvalidValue) as exc:
        auth.check_salt(bytes(n))
    e = exc.value
    assert isinstance(e, errors.LocalProtocolError) and not e.remote
    assert e.error_id == "salt.bad_length"
    assert str(e) == f"session salt must be 16 bytes, got {n}"
    assert dict(e.fields) == {"expected": 16, "got": n}


def test_check_salt_rejects_text() -> None:
    with pytest.raises(errors.InvalidValue) as exc:
        auth.check_salt("00" * 16)  # type: ignore[arg-type]
    e = exc.value
    assert isinstance(e, errors.LocalProtocolError) and not e.remote
    assert e.error_id == "salt.not_bytes"
    assert str(e) == ("session salt must be 16 bytes, got str (convert hex text with "
                      "bytes.fromhex)")
    assert dict(e.fields) == {"got": "str"}


@pytest.mark.parametrize(("salt", "got"), [
    # UCS-4 characters: np.array(["abcd"]) exports 16 bytes, which were taken as the salt
    (np.array(["abcd"]), "NumPy text (ndarray of dtype <U4)"),
    (np.array("abcd"), "NumPy text (ndarray of dtype <U4)"),
    (np.array(["ab", "cd"]), "NumPy text (ndarray of dtype <U2)"),
    (np.array(["00" * 16]), "NumPy text (ndarray of dtype <U32)"),  # 128 bytes: bad_length
    (np.str_("00" * 16), "NumPy text (str_ of dtype <U32)"),  # was named 'str_'
])
def test_check_salt_rejects_numpy_text(salt: Any, got: str) -> None:
    with pytest.raises(errors.InvalidValue) as exc:
        auth.check_salt(salt)
    e = exc.value
    assert isinstance(e, errors.LocalProtocolError) and not e.remote
    assert e.error_id == "salt.not_bytes" and e.__cause__ is None
    assert str(e) == (f"session salt must be 16 bytes, got {got} (convert hex text with "
                      "bytes.fromhex)")
    assert dict(e.fields) == {"got": got}
    # a memoryview of it is taken as the bytes it asks for, as the codec takes one
    assert auth.check_salt(memoryview(np.array(["abcd"]))) == "abcd".encode("utf-32-le")


# -- new_mac / compute_tag / tag_as_u64 / tags_equal --------------------------------------------
def test_new_mac_is_hmac_sha256_keyed_with_the_salt() -> None:
    m = auth.new_mac(SALT)
    m.update(b"abc")
    m.update(memoryview(b"def"))
    assert m.digest() == sha(SALT, b"abcdef")
    assert m.digest_size == 32


def test_compute_tag() -> None:
    assert auth.compute_tag(SALT, [b"ab", bytearray(b"c"), memoryview(b"")]) == (
        sha(SALT, b"abc")[:8])
    assert auth.compute_tag(bytes(16), []) == sha(bytes(16), b"")[:8]
    with pytest.raises(errors.InvalidValue):
        auth.compute_tag(bytes(8), [b"x"])



@pytest.mark.parametrize(("tag", "value"), [
    ("0102030405060708", 0x0807060504030201),
    ("258a7fbb3b5825c6", 0xC625583BBB7F8A25),
    ("ff00000000000000", 0xFF),
    ("", 0),
])
def test_tag_as_u64_reads_little_endian(tag: str, value: int) -> None:
    assert auth.tag_as_u64(bytes.fromhex(tag)) == value
    assert auth.tag_as_u64(memoryview(bytearray.fromhex(tag))) == value


def test_tags_equal() -> None:
    t = sha(SALT, b"x")[:8]
    assert auth.tags_equal(t, memoryview(t)) is True
    assert auth.tags_equal(t, bytes(8)) is False
    assert auth.tags_equal(bytes(8), t) is False
    assert auth.tags_equal(t[:7], t[:7]) is False
    assert auth.tags_equal(t + b"\x00", t + b"\x00") is False
    assert auth.tags_equal(t, t[:7]) is False
    assert auth.tags_equal(t[:7], t) is False


# -- update_in_parallel -------------------------------------------------------------------------
class Recording(Executor):
    """Runs each submitted call at once on the calling thread, and records it."""

    def __init__(self) -> None:
        self.calls = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.calls += 1
        f: Future[Any] = Future()
        try:
            f.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # handed back like a real executor
            f.set_exception(exc)
        return f


def macs(n: int) -> list[Any]:
    return [auth.new_mac(SALT) for _ in range(n)]


def test_update_in_parallel_big_jobs_go_to_the_executor() -> None:
    # exactly PARALLEL_MAC_MIN bytes per job is enough, in one piece or several
    assert auth.PARALLEL_MAC_MIN == MIB
    data = bytes(range(256)) * (MIB // 256)
    half = memoryview(data)[:MIB // 2], memoryview(data)[MIB // 2:]
    pool = Recording()
    a, b = macs(2)
    auth.update_in_parallel([(a, [data]), (b, list(half))], pool)
    assert pool.calls == 1
    assert a.digest() == b.digest() == sha(SALT, data)


def test_update_in_parallel_three_jobs() -> None:
    data = b"\x5a" * MIB
    pool = Recording()
    a, b, c = macs(3)
    auth.update_in_parallel([(a, [data]), (b, [data, b"1"]), (c, [b"2", data])], pool)
    assert pool.calls == 2
    assert a.digest() == sha(SALT, data)
    assert b.digest() == sha(SALT, data + b"1")
    assert c.digest() == sha(SALT, b"2" + data)


@pytest.mark.parametrize("sizes", [(MIB - 1, MIB), (MIB, MIB - 1), (10, 10), (MIB,)])
def test_update_in_parallel_small_or_single_jobs_stay_on_the_caller(sizes: tuple[int, ...]
                                                                    ) -> None:
    pool = Recording()
    ms = macs(len(sizes))
    datas = [bytes([i + 1]) * n for i, n in enumerate(sizes)]
    auth.update_in_parallel([(m, [d[:3], d[3:]]) for m, d in zip(ms, datas, strict=True)], pool)
    assert pool.calls == 0
    for m, d in zip(ms, datas, strict=True):
        assert m.digest() == sha(SALT, d)


def test_update_in_parallel_without_executor() -> None:
    data = b"\x01" * MIB
    a, b = macs(2)
    auth.update_in_parallel([(a, [data]), (b, [b"x", b"y"])])
    assert a.digest() == sha(SALT, data) and b.digest() == sha(SALT, b"xy")
    auth.update_in_parallel([])


def test_update_in_parallel_reraises_a_jobs_error() -> None:
    class Broken:
        def update(self, _: object) -> None:
            raise RuntimeError("broken mac")

    data = b"\x02" * MIB
    a = auth.new_mac(SALT)
    with pytest.raises(RuntimeError, match="broken mac"):
        auth.update_in_parallel([(a, [data]), (Broken(), [data])], Recording())
    assert a.digest() == sha(SALT, data)  # the caller's own job ran to the end


@pytest.mark.parametrize(("salt", "got"), [(16, "int"), (None, "None"), (3.0, "float")])
def test_check_salt_rejects_what_is_not_bytes_like(salt: object, got: str) -> None:
    """``bytes(16)`` is sixteen zero bytes: an int must never become an all-zero salt."""
    with pytest.raises(errors.InvalidValue) as exc:
        auth.check_salt(salt)  # type: ignore[arg-type]
    e = exc.value
    assert not e.remote and e.error_id == "salt.not_bytes_like"
    assert str(e) == f"session salt must be 16 bytes, got {got}, which is not bytes-like"
