"""The worked examples of ``spec/wire.yaml`` (``examples``) checked against the codec, for
``flodl-proto docs --check``: each example's bytes are decoded by the codec and encoded again from
what it decoded, and each of its tags is the HMAC it states over the bytes it says it covers.
The test suite checks the shipped examples against the golden vectors; this step finds an
edited example (a byte changed, a tag left stale) before the reference documents it.

It runs when the spec documented is the one the codec runs on (the package's own, or
``$FLODL_PROTO_SPEC_DIR``'s): a ``docs --spec DIR`` spec of other constants or layouts is not
the codec's, and its examples are not checked so. It adds about 0.25 s to ``docs --check``,
nearly all of it the codec's import (NumPy), which ``docs`` without ``--check`` does not load;
the check itself takes under a millisecond.

No upstream counterpart: upstream ships no worked examples (its protocol is its source).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

from .. import codec
from ..errors import ProtocolError
from ..spec import AUTH_TAG_LEN, CHANNEL_MAGIC_LEN, CHANNELS, SESSION_SALT_BYTES, SpecError

__all__ = ["check_examples"]


def check_examples(examples: Mapping[str, Mapping[str, Any]], default_version: int) -> None:
    """Check every worked example of ``examples`` (``wire.yaml``'s section, already of its
    shape) against the codec: its bytes (the fields' ``bytes``, hex) decode as its ``message``
    at its ``version`` (``any``: ``default_version``) with its ``salt``, as one whole message,
    and encode again to the same bytes (a form the readers take but the writers never give, a
    non-minimal varint, is refused so); each of its ``tags`` is the HMAC-SHA256 (key = the
    salt) over the bytes it ``covers``, stated whole as its ``hmac`` and first ``AUTH_TAG_LEN``
    (8) bytes as its field's bytes.

    Raises:
        SpecError: one line naming the example and what differs: ``wire.yaml: example
            handshake_v2: the codec reads one message of 16 bytes, not its 17 bytes`` (a byte
            past the handshake); ``wire.yaml: example hello_v2: encoded again, byte 9
            is 0x00, not the example's 0x05 (the codec writes what it decodes so)`` (a rank
            in a Control record, which the reader ignores); ``wire.yaml: example
            round_frame_f32: tag auth_tag: the HMAC over bytes [[0, 47]] is 7783...d62e, not
            the example's 39a5...b25f`` (a byte changed, the tag left as it was).

    Upstream: the layouts of ``flodl/src/distributed/controller/mod.rs`` (handshake, ack),
    ``controller/round_frame.rs`` (RoundFrame), ``relay/mux.rs`` (mux records, length prefix,
    RelayControlMsg) and ``wire.rs`` (channel magic), as the codec writes them.
    """
    for name, ex in examples.items():
        where = f"wire.yaml: example {name}"
        data, spans = _example_bytes(ex, where)
        salt = _salt(ex, where)
        if salt is None and ex["tags"]:  # wire.yaml: salt null where no tag exists
            raise SpecError(f"{where}: salt is null, which means a message without a tag, but "
                            f"it has tags ({', '.join(str(t['field']) for t in ex['tags'])})")
        version = default_version if ex["version"] == "any" else int(ex["version"])
        for tag in ex["tags"]:
            _check_tag(tag, data, spans, bytes(SESSION_SALT_BYTES) if salt is None else salt,
                       f"{where}: tag {tag['field']}")
        try:
            again, used = _encoded_again(str(ex["message"]), data, salt, version)
        except ProtocolError as e:
            raise SpecError(f"{where}: the codec refuses its bytes: {e}") from None
        except SpecError as e:  # a message the codec has no decoder for
            raise SpecError(f"{where}: {e}") from None
        if used != len(data):
            raise SpecError(f"{where}: the codec reads one message of {used} bytes, not its "
                            f"{len(data)} bytes")
        if again != data:
            at = next((i for i, (a, b) in enumerate(zip(again, data, strict=False)) if a != b),
                      min(len(again), len(data)))
            what = (f"byte {at} is 0x{again[at]:02x}, not the example's 0x{data[at]:02x}"
                    if at < min(len(again), len(data)) else
                    f"it is {len(again)} bytes, not the example's {len(data)}")
            raise SpecError(f"{where}: encoded again, {what} (the codec writes what it decodes "
                            "so)")


def _example_bytes(ex: Mapping[str, Any], where: str) -> tuple[bytes, dict[str, range]]:
    """The example's bytes in wire order, and where each of its fields is."""
    data = b""
    spans: dict[str, range] = {}
    for f in ex["fields"]:
        try:
            part = bytes.fromhex(str(f["bytes"]))
        except ValueError:
            raise SpecError(f"{where}: field {f['field']}: bytes {f['bytes']!r} are not hex "
                            "(two digits a byte)") from None
        spans[str(f["field"])] = range(len(data), len(data) + len(part))
        data += part
    return data, spans


def _salt(ex: Mapping[str, Any], where: str) -> bytes | None:
    """The example's session salt, or None when it has none (a message without a tag)."""
    text = ex.get("salt")
    if text is None:
        return None
    try:
        salt = bytes.fromhex(str(text))
    except ValueError:
        salt = b""
    if len(salt) != SESSION_SALT_BYTES:
        raise SpecError(f"{where}: salt {text!r} is not {SESSION_SALT_BYTES} bytes written as "
                        f"{2 * SESSION_SALT_BYTES} hex digits")
    return salt


def _check_tag(tag: Mapping[str, Any], data: bytes, spans: Mapping[str, range], salt: bytes,
               where: str) -> None:
    """A tag of an example: the HMAC over the bytes it covers is its ``hmac``, and its field's
    bytes are that HMAC's first ``AUTH_TAG_LEN`` (8)."""
    covered = b""
    for a, b in tag["covers"]:
        if not 0 <= a <= b <= len(data):
            raise SpecError(f"{where}: covers bytes [{a}, {b}], past the example's "
                            f"{len(data)} bytes")
        covered += data[a:b]
    mac = hmac.new(salt, covered, hashlib.sha256).digest()
    if mac.hex() != str(tag["hmac"]).lower():
        raise SpecError(f"{where}: the HMAC over bytes {tag['covers']} is {mac.hex()}, not the "
                        f"example's {tag['hmac']}")
    span = spans.get(str(tag["field"]))
    if span is None:
        raise SpecError(f"{where}: the example has no field {tag['field']!r}")
    if data[span.start:span.stop] != mac[:AUTH_TAG_LEN]:
        raise SpecError(f"{where}: the field's bytes are {data[span.start:span.stop].hex(' ')}, "
                        f"not the HMAC's first {AUTH_TAG_LEN} ({mac[:AUTH_TAG_LEN].hex(' ')})")


def _encoded_again(message: str, data: bytes, salt: bytes | None,
                   version: int) -> tuple[bytes, int]:
    """``data`` decoded as ``message`` by the codec and encoded again from what it decoded,
    and the bytes the decode read; ``salt`` None for an example without one (its tags, if it
    has any, with a salt of zero bytes: a RoundFrame's, a mux record's).

    Raises:
        ProtocolError: the codec refuses the bytes.
        SpecError: the codec has no decoder for ``message`` (``message 'x' has no decoder in
            the codec``, which :func:`check_examples` prefixes with the example's name).
    """
    key = bytes(SESSION_SALT_BYTES) if salt is None else salt
    if message == "handshake":
        hs, used = codec.decode_handshake(data, None, version)
        return codec.encode_handshake(hs.rank, hs.world_size, hs.version), used
    if message == "handshake_ack":
        used = codec.decode_ack(data, version)
        return codec.encode_ack(version), used
    if message == "channel_magic":  # the channel whose magic it is (else refused as data's)
        magic = data[:CHANNEL_MAGIC_LEN]
        name = next((n for n in CHANNELS if codec.encode_channel_magic(n) == magic), "data")
        used = codec.expect_channel_magic(data, name)
        return codec.encode_channel_magic(name), used
    if message == "round_frame":
        frame, used = codec.decode_round_frame(data, key)
        return codec.encode_round_frame_bytes(frame, key), used
    if message == "len_framed" and salt is None:  # an opaque blob, no RoundFrame: no tag
        blob, used = codec.decode_len_framed(data)
        return b"".join(bytes(b) for b in codec.encode_len_framed(bytes(blob))), used
    if message == "len_framed":
        frame, used = codec.decode_framed_round(data, key)
        return b"".join(bytes(b) for b in codec.encode_framed_round(frame, key)), used
    if message == "relay_control_msg":
        msg = codec.decode_control(data, version)
        return codec.encode_control(msg, version), len(data)
    if message == "mux_record":
        rec, used = codec.decode_mux_record(data, key, version=version)
        if rec.control is not None:
            rec = codec.MuxRecord.control_msg(rec.control, version)
        elif rec.kind in (codec.RecordKind.HOST_FRAME, codec.RecordKind.BROADCAST):
            inner = codec.encode_round_frame_bytes(rec.frame(key), key)
            rec = (codec.MuxRecord.host_frame(inner) if rec.kind == codec.RecordKind.HOST_FRAME
                   else codec.MuxRecord.broadcast(inner))
        return codec.encode_mux_record_bytes(rec, key), used
    raise SpecError(f"message {message!r} has no decoder in the codec")
