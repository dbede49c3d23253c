"""``flodl-proto decode``: print the records of a captured data-channel byte stream.

::

    flodl-proto decode [--leg mux|loopback] [--hex] [--salt HEX | --salt-file PATH]
                       [--protocol-version 2|3]
                       [--format json|table] [--values] [--pcap --port N] [FILE|-]

Reads FILE (``-`` or nothing: stdin); with ``--hex`` the input is hex text (whitespace ignored);
with ``--pcap`` it is a libpcap/pcapng capture and every TCP stream to or from ``--port`` is
decoded, each direction on its own. Prints one JSON object per line per record (or a table), and
last the end of the stream or the error that stopped decoding with its byte offset.

Exit codes: 0 every stream decoded to its end; 1 decoding stopped at an error (or the input could
not be read); 3 ``--salt`` was given and some auth tag did not verify; 2 usage errors.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from ..decode import EXIT_BAD_TAG, EXIT_ERROR, EXIT_OK, DecodeReport, decode_stream, format_table
from ..errors import ProtocolError
from ..spec import SESSION_SALT_BYTES, SUPPORTED_VERSIONS
from .relay import resolve_salt

__all__ = ["register", "run"]


def _salt(text: str) -> bytes:
    try:
        b = bytes.fromhex(text)
    except ValueError:
        raise argparse.ArgumentTypeError("not hex") from None
    if len(b) != SESSION_SALT_BYTES:
        raise argparse.ArgumentTypeError(f"a session salt is {SESSION_SALT_BYTES} bytes "
                                         f"({2 * SESSION_SALT_BYTES} hex digits), got {len(b)}")
    return b


def register(sub: Any) -> None:
    """Add the ``decode`` subcommand to the CLI's subparsers."""
    p = sub.add_parser(
        "decode", help="decode a captured data-channel byte stream",
        description="Decode a captured byte stream of the data channel and print its records. "
        "Exit codes: 0 clean end of stream, 1 stopped at an error, 3 a tag did not verify "
        "(with --salt).",
    )
    p.add_argument("file", nargs="?", default="-", metavar="FILE",
                   help="input file, or '-' for stdin (default)")
    p.add_argument("--leg", choices=("mux", "loopback"), default="mux",
                   help="mux: relay<->controller (channel magic first if present); loopback: "
                   "rank<->relay (handshake or ack first, then length-framed frames). "
                   "Default mux")
    p.add_argument("--hex", action="store_true", help="the input is hex text (whitespace ignored)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--salt", type=_salt, metavar="HEX",
                   help="16-byte session salt in hex: verify every auth tag")
    g.add_argument("--salt-file", metavar="PATH",
                   help="file holding the session salt (32 hex digits, or 16 raw bytes): verify "
                   "every auth tag")
    p.add_argument("--protocol-version", type=int, choices=SUPPORTED_VERSIONS, default=None,
                   help="data-channel protocol version (default: the loopback handshake's, "
                   "else 2)")
    p.add_argument("--format", choices=("json", "table"), default="json",
                   help="one JSON object per line (default) or a table")
    p.add_argument("--values", action="store_true",
                   help="print every tensor element instead of a summary")
    p.add_argument("--pcap", action="store_true",
                   help="FILE is a libpcap/pcapng capture; decode the TCP streams of --port")
    p.add_argument("--port", type=int, metavar="N", help="TCP port of the streams (with --pcap)")
    p.set_defaults(func=run)


def _read_input(name: str, hex_text: bool) -> bytes:
    if name == "-":
        raw = sys.stdin.buffer.read()
    else:
        with open(name, "rb") as f:
            raw = f.read()
    if hex_text:
        text = "".join(raw.decode("ascii").split())
        return bytes.fromhex(text)
    return raw


def _print_report(report: DecodeReport, fmt: str, out: TextIO,
                  stream: str | None = None) -> None:
    if fmt == "table":
        for line in format_table(report, stream):
            print(line, file=out)
        return
    extra = {"stream": stream} if stream is not None else {}
    for rec in [*report.records, report.final_record()]:
        print(json.dumps({**extra, **rec}, allow_nan=False), file=out)


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Execute ``decode`` with parsed ``args``; print to ``out`` (default stdout); return the exit
    code."""
    out = out or sys.stdout
    if args.pcap and args.port is None:
        print("decode: --pcap needs --port N", file=sys.stderr)
        return 2
    if args.port is not None and not args.pcap:
        print("decode: --port is only meaningful with --pcap", file=sys.stderr)
        return 2
    if getattr(args, "salt_file", None) is not None:
        try:
            args.salt = resolve_salt(None, args.salt_file)
        except (OSError, ProtocolError) as e:
            print(f"decode: --salt-file {args.salt_file}: {e}", file=sys.stderr)
            return EXIT_ERROR
    try:
        data = _read_input(args.file, args.hex)
    except (OSError, ValueError) as e:
        print(f"decode: cannot read input: {e}", file=sys.stderr)
        return EXIT_ERROR
    streams: list[tuple[str | None, bytes]]
    if args.pcap:
        from ..pcap import PcapError, read_tcp_streams

        try:
            tcp = read_tcp_streams(data, args.port)
        except PcapError as e:
            print(f"decode: {e}", file=sys.stderr)
            return EXIT_ERROR
        if not tcp:
            print(f"decode: no TCP stream to or from port {args.port} in the capture",
                  file=sys.stderr)
            return EXIT_ERROR
        streams = []
        for st in tcp:
            if st.gap:
                print(f"decode: {st.label}: bytes missing from the capture after stream offset "
                      f"{len(st.data)}; decoding stops there", file=sys.stderr)
            if not st.syn_seen and st.data:
                print(f"decode: {st.label}: the connection's start was not captured; offsets "
                      "count from the first captured byte", file=sys.stderr)
            streams.append((st.label, st.data))
    else:
        streams = [(None, data)]
    code = EXIT_OK
    for label, payload in streams:
        try:
            report = decode_stream(payload, args.leg, salt=args.salt,
                                   version=args.protocol_version, values=args.values)
        except ProtocolError as e:  # local misuse (cannot happen with validated arguments)
            print(f"decode: {e}", file=sys.stderr)
            return EXIT_ERROR
        _print_report(report, args.format, out, label)
        rc = report.exit_code
        if rc == EXIT_ERROR or (rc == EXIT_BAD_TAG and code == EXIT_OK):
            code = rc
    return code
