"""Shared oracle pieces for the harnesses: input parameters, the "remote error or nothing" rule,
tag re-signing (so mutated inputs get past the HMAC checks), and re-encoding checks."""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from flodl_proto.codec import (
    END_OF_STREAM,
    NeedData,
    RoundFrame,
    compute_tag,
    encode_round_frame_bytes,
    round_frame_extent,
)
from flodl_proto.errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from flodl_proto.spec import (
    AUTH_TAG_LEN,
    DEFAULT_FRAME_CEILING,
    FRAME_CEILING_FLOOR,
    LEN_PREFIX_LEN,
    MUX_AUTH_COVERED_HEADER_LEN,
    MUX_HEADER_LEN,
    MUX_PROTOCOL_VERSION,
    MUX_RECORD_MAGIC,
    REC_BROADCAST,
    REC_HOST_FRAME,
)

T = TypeVar("T")

#: the two salts of the shared vectors (``zero`` and ``b``)
SALTS: tuple[bytes, bytes] = (bytes(16), bytes.fromhex("5a17c0de429901fe3c88b70d6e21f493"))
#: frame ceilings a harness can pick: the default, the model-derived floor, and two tiny ones so
#: the fuzzer reaches the ceiling checks with small inputs
CEILINGS: tuple[int, int, int, int] = (DEFAULT_FRAME_CEILING, FRAME_CEILING_FLOOR, 1024, 0)

#: Findings reported but not fixed yet (their fix belongs to another module). While a name is
#: listed, a harness may tolerate that one behaviour, at the one place it occurs, so campaigns
#: keep looking for other bugs; ``FLODL_FUZZ_STRICT=1`` turns every tolerance off. Each one is
#: pinned by a strict-xfail test in ``tests/test_fuzz_corpus.py``. Empty: every finding so far
#: is fixed (see fuzz/README.md).
KNOWN_FINDINGS: frozenset[str] = frozenset()


class Finding(AssertionError):
    """An oracle violation: the code under test did something the protocol does not allow."""


def known(name: str) -> bool:
    """True while the finding ``name`` is tolerated (listed and ``FLODL_FUZZ_STRICT`` unset)."""
    return name in KNOWN_FINDINGS and os.environ.get("FLODL_FUZZ_STRICT") != "1"


def check(condition: bool, message: str) -> None:
    """Raise :class:`Finding` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise Finding(message)


class Params:
    """Reads harness parameters from the front of a fuzz input; missing bytes read as zero."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def u8(self) -> int:
        """Next byte (0 past the end)."""
        b = self.data[self.pos:self.pos + 1]
        self.pos += 1
        return b[0] if b else 0

    def u32(self) -> int:
        """Next little-endian u32 (zero-padded past the end)."""
        b = self.data[self.pos:self.pos + 4].ljust(4, b"\0")
        self.pos += 4
        return int.from_bytes(b, "little")

    def take(self, n: int) -> bytes:
        """Next ``n`` bytes (fewer at the end)."""
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def rest(self) -> bytes:
        """Everything not read yet."""
        return self.data[self.pos:]


def remote(fn: Callable[..., T], *args: Any, **kwargs: Any
           ) -> tuple[T | None, ProtocolError | None]:
    """Call a reader on peer bytes: ``(result, None)`` or ``(None, RemoteProtocolError)``.

    A :class:`LocalProtocolError` (the reader blamed its caller for the peer's bytes) becomes a
    :class:`Finding`; any other exception propagates and is a finding by itself.
    """
    try:
        return fn(*args, **kwargs), None
    except RemoteProtocolError as e:
        return None, e
    except LocalProtocolError as e:
        raise Finding(f"{fn.__name__} raised a LocalProtocolError on peer bytes: {e!r}") from e


def chunks(payload: bytes, sizes: bytes) -> Iterator[bytes]:
    """Split ``payload`` into chunks whose sizes cycle through ``sizes`` (one byte each; 0 feeds
    an empty chunk). No sizes: one chunk."""
    if not sizes:
        yield payload
        return
    pos, i = 0, 0
    empties = 0
    while pos < len(payload):
        n = sizes[i % len(sizes)]
        i += 1
        if n == 0:
            empties += 1
            if empties > len(sizes):  # all sizes zero: do not spin
                n = len(payload) - pos
            else:
                yield b""
                continue
        empties = 0
        yield payload[pos:pos + n]
        pos += n


# -- re-signing ----------------------------------------------------------------------------------
def resign_round_frames(buf: bytearray, salt: bytes, ceiling: int, start: int = 0,
                        stop: int | None = None, once: bool = False) -> int:
    """Rewrite the tag of each complete, structurally valid frame in ``buf[start:stop]``,
    back to back, so the decoder's later checks are reachable. Returns where walking stopped."""
    stop = len(buf) if stop is None else stop
    pos = start
    while pos < stop:
        try:
            ext = round_frame_extent(bytes(buf[pos:stop]), ceiling=ceiling)
        except RemoteProtocolError:
            break
        if isinstance(ext, NeedData):
            break
        body_end = pos + ext - AUTH_TAG_LEN
        buf[body_end:pos + ext] = compute_tag(salt, [bytes(buf[pos:body_end])])
        pos += ext
        if once:
            break
    return pos


_MUX_HEAD = struct.Struct("<IIBII")


def resign_mux_records(buf: bytearray, salt: bytes, ceiling: int, start: int = 0) -> int:
    """Rewrite the outer tag of each complete mux record from ``start`` on (and first the inner
    frame tag of HostFrame / Broadcast payloads). Returns where walking stopped."""
    pos = start
    while len(buf) - pos >= MUX_HEADER_LEN:
        magic, version, kind, _rank, plen = _MUX_HEAD.unpack_from(buf, pos)
        end = pos + MUX_HEADER_LEN + plen
        if magic != MUX_RECORD_MAGIC or version != MUX_PROTOCOL_VERSION or plen > ceiling:
            break
        if end > len(buf):
            break
        if kind in (REC_HOST_FRAME, REC_BROADCAST):
            resign_round_frames(buf, salt, ceiling, pos + MUX_HEADER_LEN, end, once=True)
        tag = compute_tag(salt, [bytes(buf[pos:pos + MUX_AUTH_COVERED_HEADER_LEN]),
                                 bytes(buf[pos + MUX_HEADER_LEN:end])])
        buf[pos + MUX_AUTH_COVERED_HEADER_LEN:pos + MUX_HEADER_LEN] = tag
        pos = end
    return pos


def resign_len_framed(buf: bytearray, salt: bytes, ceiling: int) -> int:
    """Re-sign the RoundFrame at the start of each complete length-framed blob."""
    pos = 0
    while len(buf) - pos >= LEN_PREFIX_LEN:
        length = int.from_bytes(buf[pos:pos + LEN_PREFIX_LEN], "little")
        end = pos + LEN_PREFIX_LEN + length
        if length > ceiling or end > len(buf):
            break
        resign_round_frames(buf, salt, ceiling, pos + LEN_PREFIX_LEN, end, once=True)
        pos = end
    return pos


# -- re-encoding checks ----------------------------------------------------------------------------
def check_frame_reencodes(frame: RoundFrame, salt: bytes, wire: bytes | memoryview,
                          what: str) -> None:
    """A decoded RoundFrame's encoding is unique: re-encoding must give ``wire`` exactly."""
    again = encode_round_frame_bytes(frame, salt)
    check(again == bytes(wire),
          f"{what}: re-encoded frame differs from the accepted bytes\n"
          f"  in : {bytes(wire).hex()}\n  out: {again.hex()}")


#: NumPy's dimension limit (the wire allows 255)
_NUMPY_MAX_NDIM = 64
#: in an expected error set: the call may also succeed
MAY_SUCCEED = "(may succeed)"


def _expected_view_error(t: Any, version: int) -> tuple[type[ProtocolError], set[str]] | None:
    """The error ``TensorPayload.array`` must raise for ``t`` (class and the error ids it may
    carry), or None when it must return an array. Written from the method's documented rules,
    not from its code."""
    es = {0: 4, 1: 2}.get(t.dtype)
    if es is None:
        return RemoteProtocolError, {"tensor.unknown_dtype"}
    numel = 1
    for d in t.shape:
        numel *= d
    expected = numel * es
    if t.nbytes != expected:
        if t.nbytes == 0 and version >= 3:
            if len(t.shape) > _NUMPY_MAX_NDIM:
                return LocalProtocolError, {"tensor.ndim_unsupported"}
            if expected > FRAME_CEILING_FLOOR:
                return LocalProtocolError, {"tensor.elided_too_large"}
            return None
        if t.nbytes == 0:  # elided, read without materialize_elided (version 2 here)
            return LocalProtocolError, {"tensor.elided"}
        return RemoteProtocolError, {"tensor.nbytes_vs_shape"}
    if len(t.shape) > _NUMPY_MAX_NDIM:
        return LocalProtocolError, {"tensor.ndim_unsupported"}
    nonzero = 1
    for d in t.shape:
        nonzero *= d or 1
    if numel == 0 and nonzero * es >= 1 << 62:
        # a zero-element shape whose other dimensions may overflow NumPy's index type: the
        # array or this error
        return RemoteProtocolError, {"tensor.shape_unrepresentable", MAY_SUCCEED}
    return None


def exercise_views(frame: RoundFrame, version: int) -> None:
    """Use each tensor the way a fold would (``TensorPayload.array``) and hold it to the same
    oracle. The only errors tolerated are the documented ones, for the tensor that warrants
    them: an unknown dtype or a byte count that does not match the shape (remote), an elided
    payload read without ``materialize_elided`` (local: the caller's choice), more
    dimensions than NumPy carries or zeros above the ceiling passed here (local, one read
    chunk), and a zero-element shape NumPy cannot index (remote). A well-formed tensor must give
    an array."""
    for t in frame.tensors:
        want = _expected_view_error(t, version)
        try:
            arr = t.array(materialize_elided=version >= 3, ceiling=FRAME_CEILING_FLOOR)
        except ProtocolError as e:
            if want is None or not isinstance(e, want[0]) or e.error_id not in want[1]:
                raise Finding(f"TensorPayload.array of dtype {t.dtype}, shape {t.shape}, "
                              f"{t.nbytes} bytes raised {e!r}; expected {want}") from e
            continue
        if want is not None and MAY_SUCCEED not in want[1]:
            raise Finding(f"TensorPayload.array of dtype {t.dtype}, shape {t.shape}, "
                          f"{t.nbytes} bytes gave an array; expected {want}")
        check(arr.shape == t.shape, f"array shape {arr.shape} != {t.shape}")
        if t.nbytes:
            check(arr.nbytes == t.nbytes, f"array of {arr.nbytes} bytes from {t.nbytes}")


def outcome_of(error: BaseException | None) -> tuple[str, str] | None:
    """A comparable summary of an error: ``(class name, message)``."""
    return None if error is None else (type(error).__name__, str(error))


__all__ = [
    "CEILINGS",
    "END_OF_STREAM",
    "KNOWN_FINDINGS",
    "SALTS",
    "Finding",
    "Params",
    "check",
    "check_frame_reencodes",
    "chunks",
    "exercise_views",
    "known",
    "outcome_of",
    "remote",
    "resign_len_framed",
    "resign_mux_records",
    "resign_round_frames",
]
