"""flodl-proto: byte-exact implementation of flodl's cluster data-channel protocol.

The top level is deliberately narrow: the message types, one encoder and one decoder per message
(the whole-buffer forms), the error classes and the protocol-version constants. Everything else is
imported from its module: the rest of the codec (buffer-list encoders for ``socket.sendmsg``, the
``*_or_eos`` stream forms, the incremental decoders, ``END_OF_STREAM``) from
:mod:`flodl_proto.codec`, the spec's constants from :mod:`flodl_proto.spec`, ``HOST:PORT``
addresses from :mod:`flodl_proto.addr`, the reduce engine from :mod:`flodl_proto.reduce`, the
sans-IO cores from :mod:`flodl_proto.fsm` and the socket runners from :mod:`flodl_proto.runner`.

=====================  =========================================================================
message                encode / decode
=====================  =========================================================================
handshake              :func:`encode_handshake` / :func:`decode_handshake` (:class:`Handshake`)
handshake ack          :func:`encode_ack` / :func:`decode_ack`
channel magic          :func:`encode_channel_magic` / :func:`expect_channel_magic`
RoundFrame             :func:`encode_round_frame_bytes` / :func:`decode_round_frame`
                       (:class:`RoundFrame`, :class:`TensorPayload`, :class:`RoundKind`,
                       :class:`Dtype`)
length-framed blob     :func:`encode_len_framed` / :func:`decode_len_framed`
mux record             :func:`encode_mux_record_bytes` / :func:`decode_mux_record`
                       (:class:`MuxRecord`, :class:`RecordKind`)
control message        :func:`encode_control` / :func:`decode_control` (:class:`Hello`,
                       :class:`HelloAck`, :class:`RankExit`, :class:`DeclareDead`;
                       :data:`ControlMessage`)
=====================  =========================================================================

Importing the package is cheap: each name above is imported from its module (and NumPy with it)
the first time it is used, as are the submodules (``flodl_proto.codec``, ...) when reached as
attributes, so ``flodl-proto --help`` does not pay for NumPy and ml_dtypes.
"""

from __future__ import annotations

# typing.TYPE_CHECKING without importing typing (some milliseconds): the console script imports
# this package before its Ctrl-C handling (flodl_proto._console) can run, so the package's own
# import is kept short
TYPE_CHECKING = False
if TYPE_CHECKING:
    from .codec import (
        ControlMessage,
        DeclareDead,
        Dtype,
        Handshake,
        Hello,
        HelloAck,
        MuxRecord,
        RankExit,
        RecordKind,
        RoundFrame,
        RoundKind,
        TensorPayload,
        decode_ack,
        decode_control,
        decode_handshake,
        decode_len_framed,
        decode_mux_record,
        decode_round_frame,
        encode_ack,
        encode_channel_magic,
        encode_control,
        encode_handshake,
        encode_len_framed,
        encode_mux_record_bytes,
        encode_round_frame_bytes,
        expect_channel_magic,
    )
    from .errors import (
        AuthenticationError,
        BadMagic,
        InvalidValue,
        LimitExceeded,
        LocalProtocolError,
        ProtocolError,
        RemoteProtocolError,
        SchemaMismatch,
        SequenceError,
        TruncatedInput,
        VersionMismatch,
    )
    from .spec import DEFAULT_VERSION, SUPPORTED_VERSIONS

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_VERSION",
    "SUPPORTED_VERSIONS",
    "AuthenticationError",
    "BadMagic",
    "ControlMessage",
    "DeclareDead",
    "Dtype",
    "Handshake",
    "Hello",
    "HelloAck",
    "InvalidValue",
    "LimitExceeded",
    "LocalProtocolError",
    "MuxRecord",
    "ProtocolError",
    "RankExit",
    "RecordKind",
    "RemoteProtocolError",
    "RoundFrame",
    "RoundKind",
    "SchemaMismatch",
    "SequenceError",
    "TensorPayload",
    "TruncatedInput",
    "VersionMismatch",
    "__version__",
    "decode_ack",
    "decode_control",
    "decode_handshake",
    "decode_len_framed",
    "decode_mux_record",
    "decode_round_frame",
    "encode_ack",
    "encode_channel_magic",
    "encode_control",
    "encode_handshake",
    "encode_len_framed",
    "encode_mux_record_bytes",
    "encode_round_frame_bytes",
    "expect_channel_magic",
]

#: the module each name of :data:`__all__` is imported from on first use (the rest: ``codec``)
_HOMES = {
    **dict.fromkeys(("DEFAULT_VERSION", "SUPPORTED_VERSIONS"), "spec"),
    **dict.fromkeys(("AuthenticationError", "BadMagic", "InvalidValue", "LimitExceeded",
                     "LocalProtocolError", "ProtocolError", "RemoteProtocolError",
                     "SchemaMismatch", "SequenceError", "TruncatedInput", "VersionMismatch"),
                    "errors"),
}


def __getattr__(name: str) -> object:
    """Import a name of :data:`__all__`, or a submodule, on first access (PEP 562).

    Raises:
        AttributeError: ``name`` is neither (as for any module attribute).
    """
    from ._lazy import load_attribute

    return load_attribute(__name__, globals(), name,
                          _HOMES.get(name, "codec") if name in __all__ else None)


def __dir__() -> list[str]:
    """The module's names, including those not imported yet."""
    return sorted(set(globals()) | set(__all__))
