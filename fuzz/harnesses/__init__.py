"""One module per fuzz target; each exposes ``test_one_input(data: bytes) -> None``.

The oracle (shared by atheris and the pytest corpus replay): an input yields a record,
``END_OF_STREAM`` or a :class:`~flodl_proto.errors.RemoteProtocolError`. Anything else — another
exception, a ``LocalProtocolError`` from a parser fed remote bytes, a failed re-encoding check, a
hang, an allocation out of proportion to the input — is a finding and is raised.
"""

from __future__ import annotations

#: every fuzz target, in the order ``fuzz/run.sh all`` runs them (module names in this package)
TARGETS: tuple[str, ...] = (
    "handshake",
    "channel_magic",
    "round_frame",
    "control",
    "mux_record",
    "len_framed",
    "stream_round_frame",
    "stream_len_framed",
    "mux_stream",
    "loopback_stream",
    "decode_stream",
    "host_fold",
    "controller_core",
    "relay_core",
)
