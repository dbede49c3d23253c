"""Pure codec: bytes <-> records. No sockets, no threads, no clocks.

Every decoder takes any bytes-like object and never copies payload bytes. The whole-buffer
decoders (``decode_round_frame``, ``decode_mux_record``, ``decode_len_framed``, ...) return the
decoded object with the number of bytes consumed, or raise (input ending inside a header is a
``TruncatedInput``). Their ``*_or_eos`` forms are for readers at a record boundary of a stream:
input ending inside the header (including empty input) returns :data:`END_OF_STREAM`, a clean end
of stream, as upstream's readers return ``Ok(None)``. The incremental decoders
(:mod:`~flodl_proto.codec.stream`, :mod:`~flodl_proto.codec.loopback_stream`) do the same for
bytes that arrive piece by piece. The encoders
of records that carry tensor payloads (``encode_round_frame``, ``encode_mux_record``,
``encode_framed_round``, ``encode_len_framed``, ...) return a list of buffers for
``socket.sendmsg`` (the payloads as views, not copies; ``*_bytes`` joins them where that form
exists); the encoders of the fixed-size and control records (``encode_handshake``,
``encode_ack``, ``encode_channel_magic``, ``encode_control``, ``encode_len_prefix``) return
``bytes``.
"""

from __future__ import annotations

from .._names import adopt
from ._common import END_OF_STREAM, BytesLike, EndOfStream, NeedData
from .auth import check_salt, compute_tag
from .handshake import (
    Handshake,
    decode_ack,
    decode_handshake,
    encode_ack,
    encode_channel_magic,
    encode_handshake,
    expect_channel_magic,
)
from .loopback import (
    decode_framed_round,
    decode_framed_round_or_eos,
    decode_len_framed,
    decode_len_framed_or_eos,
    decode_len_prefix,
    decode_len_prefix_or_eos,
    encode_framed_round,
    encode_len_framed,
    encode_len_prefix,
)
from .loopback_stream import (
    AckReceived,
    FrameReceived,
    HandshakeReceived,
    LoopbackEvent,
    LoopbackStream,
)
from .mux import (
    ControlMessage,
    DeclareDead,
    Hello,
    HelloAck,
    MuxHeader,
    MuxRecord,
    RankExit,
    RecordKind,
    decode_control,
    decode_mux_record,
    decode_mux_record_or_eos,
    encode_control,
    encode_frame_record,
    encode_mux_record,
    encode_mux_record_bytes,
    encode_mux_record_parts,
    parse_mux_header,
    parse_mux_header_or_eos,
)
from .round_frame import (
    Dtype,
    RoundFrame,
    RoundKind,
    TensorPayload,
    decode_round_frame,
    decode_round_frame_or_eos,
    encode_round_frame,
    encode_round_frame_bytes,
    round_frame_extent,
    round_frame_wire_len,
)
from .stream import (
    LenFramedDecoder,
    MagicReceived,
    MuxStream,
    RecordReceived,
    RoundFrameDecoder,
    StreamEnded,
    StreamEvent,
    StreamFailed,
)
from .template import FrameTemplate

__all__ = [
    "END_OF_STREAM",
    "AckReceived",
    "BytesLike",
    "ControlMessage",
    "DeclareDead",
    "Dtype",
    "EndOfStream",
    "FrameReceived",
    "FrameTemplate",
    "Handshake",
    "HandshakeReceived",
    "Hello",
    "HelloAck",
    "LenFramedDecoder",
    "LoopbackEvent",
    "LoopbackStream",
    "MagicReceived",
    "MuxHeader",
    "MuxRecord",
    "MuxStream",
    "NeedData",
    "RankExit",
    "RecordKind",
    "RecordReceived",
    "RoundFrame",
    "RoundFrameDecoder",
    "RoundKind",
    "StreamEnded",
    "StreamEvent",
    "StreamFailed",
    "TensorPayload",
    "check_salt",
    "compute_tag",
    "decode_ack",
    "decode_control",
    "decode_framed_round",
    "decode_framed_round_or_eos",
    "decode_handshake",
    "decode_len_framed",
    "decode_len_framed_or_eos",
    "decode_len_prefix",
    "decode_len_prefix_or_eos",
    "decode_mux_record",
    "decode_mux_record_or_eos",
    "decode_round_frame",
    "decode_round_frame_or_eos",
    "encode_ack",
    "encode_channel_magic",
    "encode_control",
    "encode_frame_record",
    "encode_framed_round",
    "encode_handshake",
    "encode_len_framed",
    "encode_len_prefix",
    "encode_mux_record",
    "encode_mux_record_bytes",
    "encode_mux_record_parts",
    "encode_round_frame",
    "encode_round_frame_bytes",
    "expect_channel_magic",
    "parse_mux_header",
    "parse_mux_header_or_eos",
    "round_frame_extent",
    "round_frame_wire_len",
]

# their code lives in codec/_common.py; they are this package's names, so help(), pydoc and
# pickle name it (set once, at import)
adopt(__name__, EndOfStream, NeedData)
