"""8-byte HMAC-SHA256 auth tags over memoryview slices.

The key is the 16-byte session salt itself (nothing is derived); the tag is the first 8 raw bytes
of HMAC-SHA256. RoundFrames cover magic .. last payload byte; mux records cover header bytes 0..17
followed by the payload (``spec/wire.yaml`` ``auth``). Tags are compared in constant time with
:func:`hmac.compare_digest`. Upstream prints a tag as ``u64::from_le_bytes(tag)`` in hex, which
:func:`tag_as_u64` reproduces for error messages.

Upstream: ``flodl/src/distributed/wire.rs`` (hmac_sha256_64), ``controller/round_frame.rs``,
``relay/mux.rs`` (crate ``hmac-sha256``).
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import protocol_error, shown_type
from ..spec import AUTH_TAG_LEN, SESSION_SALT_BYTES
from ._common import BytesLike, is_buffer, not_bytes_like, numpy_text, numpy_text_named

__all__ = [
    "Premac",
    "check_salt",
    "compute_tag",
    "new_mac",
    "tag_as_u64",
    "tags_equal",
    "update_in_parallel",
]

#: below this many bytes per MAC, :func:`update_in_parallel` hashes on the calling thread only
PARALLEL_MAC_MIN = 1 << 20


@dataclass(frozen=True, slots=True)
class Premac:
    """A MAC a caller already computed over the bytes a tag covers (e.g. while they arrived).

    A decoder given a ``Premac`` compares the carried tag with ``digest`` instead of hashing the
    covered bytes again, but only when ``covered`` equals the number of bytes the tag covers
    (otherwise it hashes them itself). Compute it with :func:`new_mac` over exactly those bytes of
    the very buffer handed to the decoder, after they were written and before anything could
    change them. The decoder trusts it: a ``Premac`` computed over other bytes (another buffer,
    an earlier round's frame of the same size) makes it accept whatever those bytes
    authenticate, so never build one from anything but the bytes being decoded, and never take
    one from a peer.

    Attributes:
        covered: how many covered bytes ``digest`` was computed over (a RoundFrame: the frame's
            length minus its 8-byte tag; a mux record: header bytes 0..17 plus the payload).
        digest: the HMAC-SHA256 digest (at least its first 8 bytes).

    Upstream: the streaming ``HMAC::new`` / ``update`` / ``finalize`` (crate ``hmac-sha256``) of
    ``controller/round_frame.rs`` and ``relay/mux.rs``; handing in a MAC computed ahead of the
    check is this package's.
    """

    covered: int
    digest: bytes


def update_in_parallel(jobs: Sequence[tuple[Any, Sequence[BytesLike]]],
                       executor: Executor | None = None) -> None:
    """Feed each ``(mac, pieces)`` job's pieces to its MAC, concurrently when asked and worth it.

    With an ``executor`` and two or more jobs of at least :data:`PARALLEL_MAC_MIN` bytes each,
    every job but the first is submitted to the executor (OpenSSL hashing releases the GIL, so
    two MACs over the same bytes take about the time of one on two free cores) and the first
    runs on the caller's thread; every job has finished when this returns. Otherwise (no
    executor, one job, or a small one: a hand-off costs more than it saves) all run on the
    caller's thread. This function starts no thread: the caller owns the executor.

    Raises:
        whatever a job's ``update`` raises (re-raised on the caller's thread).

    No upstream counterpart: a scheduling helper of this package; each MAC is that of ``wire.rs``
    ``hmac_sha256_64``.
    """
    def run(mac: Any, pieces: Sequence[BytesLike]) -> None:
        for p in pieces:
            mac.update(p)

    big = executor is not None and len(jobs) >= 2 and all(
        sum(memoryview(p).nbytes for p in pieces) >= PARALLEL_MAC_MIN for _, pieces in jobs)
    if not big or executor is None:
        for mac, pieces in jobs:
            run(mac, pieces)
        return
    futures = [executor.submit(run, *job) for job in jobs[1:]]
    try:
        run(*jobs[0])
    finally:
        for f in futures:
            f.exception()  # waits; the caller's buffers stay unchanged until every job ran
    for f in futures:
        f.result()  # re-raises a job's error (hashing bytes-like input cannot fail)


def check_salt(salt: BytesLike) -> bytes:
    """Validate a session salt and return it as ``bytes``.

    Args:
        salt: the session salt, 16 bytes (any bytes-like object).

    Raises:
        InvalidValue (local): the salt is not exactly 16 bytes (``salt.bad_length``), or is
            text (``salt.not_bytes``: hex strings must be converted with ``bytes.fromhex``;
            NumPy text too, a ``str_`` or an array of dtype kind ``U``, named with its dtype:
            its buffer holds UCS-4 characters, ``np.array(["abcd"])`` 16 bytes of them; a
            ``memoryview`` of it is taken as the bytes it asks for), or is not bytes-like at
            all (``salt.not_bytes_like``: an int, None).

    Upstream: ``wire.rs`` (``SessionSalt = [u8; 16]``).
    """
    if type(salt) is bytes and len(salt) == SESSION_SALT_BYTES:
        return salt  # what the conversion below gives (every round's call: a client's own salt)
    if isinstance(salt, str) or numpy_text(salt):  # NumPy text exports UCS-4 characters
        got = numpy_text_named(salt) if numpy_text(salt) else shown_type(salt)
        raise protocol_error("salt.not_bytes", got=got)
    try:  # not bytes(salt): bytes(16) is 16 zero bytes, an int is no salt
        b = memoryview(salt).tobytes()
    except TypeError:
        raise protocol_error("salt.not_bytes_like", got=shown_type(salt)) from None
    if len(b) != SESSION_SALT_BYTES:
        raise protocol_error("salt.bad_length", expected=SESSION_SALT_BYTES, got=len(b))
    return b


try:  # OpenSSL's HMAC, which hmac.new wraps on CPython: its update and digest are direct calls
    from _hashlib import hmac_new as _openssl_hmac
except ImportError:  # pragma: no cover - a Python without OpenSSL's hashlib
    _openssl_hmac = None  # type: ignore[assignment]

#: ``(salt, keyed MAC)`` of the last salt :func:`new_mac` was asked for (a process keeps one
#: session salt): each new MAC is a copy of that keyed one, which skips the key set-up
_keyed: tuple[bytes, Any] = (b"", None)


def new_mac(salt: bytes) -> Any:
    """Return a streaming HMAC-SHA256 object keyed with ``salt`` (OpenSSL-backed ``hmac``).

    ``update`` it with memoryview slices (no copies; the GIL is released on large buffers) and
    take ``digest()[:8]`` as the tag. The object is a copy of one keyed MAC kept for the last
    salt asked for: OpenSSL's HMAC object (the one ``hmac.new`` wraps), or ``hmac.HMAC`` where
    Python has no OpenSSL hashlib.

    Upstream: ``HMAC::new(salt)`` (crate ``hmac-sha256``) as ``controller/round_frame.rs`` and
    ``relay/mux.rs`` stream it.
    """
    global _keyed
    key, base = _keyed
    if base is None or key != salt:
        if _openssl_hmac is None:
            base = hmac.new(salt, digestmod="sha256")
        else:
            base = _openssl_hmac(salt, digestmod="sha256")
        _keyed = (bytes(salt), base)
    return base.copy()


def compute_tag(salt: bytes, pieces: Iterable[BytesLike]) -> bytes:
    """Return the 8-byte tag over the concatenation of ``pieces`` (bytes-like, not copied).

    Args:
        salt: the 16-byte session salt.
        pieces: the covered byte ranges, in wire order.

    Returns:
        8 bytes: ``HMAC-SHA256(salt, b"".join(pieces))[:8]``.

    Raises:
        InvalidValue (local): the salt is not 16 bytes; ``pieces`` is a single buffer (pass
            ``[data]``; a NumPy array too, whose elements are no pieces, and any other object
            that exports the buffer protocol and whose items are no buffers, an
            ``array.array``: told from its first item, so the normal path pays no check) or
            no iterable (``codec.not_pieces``), or one of them is no buffer, is NumPy text,
            whose buffer holds UCS-4 characters, or holds Python objects (a NumPy object array
            or a ``memoryview`` of one: its buffer holds their addresses)
            (``codec.not_bytes_like`` naming ``pieces[i]``).

    Upstream: ``wire.rs`` ``hmac_sha256_64``.
    """
    mac = new_mac(check_salt(salt))
    # one buffer or text: its items would be ints, a NumPy array's its elements' scalars (each
    # hashed as its bytes)
    if isinstance(pieces, bytes | bytearray | memoryview | str | np.ndarray):
        raise protocol_error("codec.not_pieces", field="pieces", got=shown_type(pieces))
    try:
        items = iter(pieces)
    except TypeError:
        raise protocol_error("codec.not_pieces", field="pieces", got=shown_type(pieces)
                             ) from None
    update = mac.update
    for i, p in enumerate(items):
        try:
            # UCS-4 characters, Python object pointers (their addresses): no bytes
            if (isinstance(p, np.ndarray) and (p.dtype.kind == "U" or p.dtype.hasobject)) or (
                    isinstance(p, memoryview) and "O" in p.format):
                raise TypeError
            update(p)
        except (TypeError, BufferError, ValueError):  # an int, text, None, a strided view
            if is_buffer(pieces):  # one buffer (an array.array): its items were no pieces
                raise protocol_error("codec.not_pieces", field="pieces", got=shown_type(pieces)
                                     ) from None
            raise not_bytes_like(f"pieces[{i}]", p) from None
    return bytes(mac.digest()[:AUTH_TAG_LEN])


def tags_equal(computed: BytesLike, carried: BytesLike) -> bool:
    """Constant-time comparison of two auth tags.

    Returns:
        True only when both are exactly 8 bytes (``AUTH_TAG_LEN``) and equal; a tag of any other
        length (empty included) never matches.

    Upstream: the tag comparison of ``controller/round_frame.rs`` and ``relay/mux.rs``.
    """
    a, b = bytes(computed), bytes(carried)
    if len(a) != AUTH_TAG_LEN or len(b) != AUTH_TAG_LEN:
        return False
    return hmac.compare_digest(a, b)


def tag_as_u64(tag: BytesLike) -> int:
    """Return the tag read as a little-endian u64, the way upstream prints it (``0x%016x``).

    Upstream: the ``0x{:016x}`` of ``u64::from_le_bytes(tag)`` in the HMAC errors of
    ``controller/round_frame.rs`` and ``relay/mux.rs``.
    """
    return int.from_bytes(bytes(tag), "little")
