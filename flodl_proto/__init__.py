"""flodl-proto: byte-exact implementation of flodl's cluster data-channel protocol.

The public surface: the codec (:mod:`flodl_proto.codec`, re-exported here), the error classes
(:mod:`flodl_proto.errors`), the spec (:mod:`flodl_proto.spec`). The reduce engine
(:mod:`flodl_proto.reduce`), the controller lifecycle (:mod:`flodl_proto.fsm`) and the socket
runners (:mod:`flodl_proto.runner`) are imported from their modules.
"""

from __future__ import annotations

from .codec import *  # noqa: F403
from .codec import __all__ as _codec_all
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
from .spec import DEFAULT_VERSION, SPEC, SUPPORTED_VERSIONS

__version__ = "0.1.0"

__all__ = [
    *_codec_all,
    "DEFAULT_VERSION",
    "SPEC",
    "SUPPORTED_VERSIONS",
    "AuthenticationError",
    "BadMagic",
    "InvalidValue",
    "LimitExceeded",
    "LocalProtocolError",
    "ProtocolError",
    "RemoteProtocolError",
    "SchemaMismatch",
    "SequenceError",
    "TruncatedInput",
    "VersionMismatch",
    "__version__",
]
