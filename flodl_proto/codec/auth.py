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
from collections.abc import Iterable
from typing import Any

from ..errors import protocol_error
from ..spec import AUTH_TAG_LEN, SESSION_SALT_BYTES
from ._common import BytesLike

__all__ = ["check_salt", "compute_tag", "new_mac", "tag_as_u64", "tags_equal"]


def check_salt(salt: BytesLike) -> bytes:
    """Validate a session salt and return it as ``bytes``.

    Args:
        salt: the session salt, 16 bytes (any bytes-like object).

    Raises:
        InvalidValue (local): the salt is not exactly 16 bytes, or is text (hex strings must be
            converted with ``bytes.fromhex``).
    """
    if isinstance(salt, str):
        raise protocol_error("salt.not_bytes", got=type(salt).__name__)
    b = bytes(salt)
    if len(b) != SESSION_SALT_BYTES:
        raise protocol_error("salt.bad_length", expected=SESSION_SALT_BYTES, got=len(b))
    return b


def new_mac(salt: bytes) -> Any:
    """Return a streaming HMAC-SHA256 object keyed with ``salt`` (OpenSSL-backed ``hmac``).

    ``update`` it with memoryview slices (no copies; the GIL is released on large buffers) and
    take ``digest()[:8]`` as the tag.
    """
    return hmac.new(salt, digestmod="sha256")


def compute_tag(salt: bytes, pieces: Iterable[BytesLike]) -> bytes:
    """Return the 8-byte tag over the concatenation of ``pieces`` (bytes-like, not copied).

    Args:
        salt: the 16-byte session salt.
        pieces: the covered byte ranges, in wire order.

    Returns:
        8 bytes: ``HMAC-SHA256(salt, b"".join(pieces))[:8]``.

    Raises:
        InvalidValue (local): the salt is not 16 bytes.
    """
    mac = new_mac(check_salt(salt))
    for p in pieces:
        mac.update(p)
    return bytes(mac.digest()[:AUTH_TAG_LEN])


def tags_equal(computed: BytesLike, carried: BytesLike) -> bool:
    """Constant-time comparison of two 8-byte tags."""
    return hmac.compare_digest(bytes(computed), bytes(carried))


def tag_as_u64(tag: BytesLike) -> int:
    """Return the tag read as a little-endian u64, the way upstream prints it (``0x%016x``)."""
    return int.from_bytes(bytes(tag), "little")
