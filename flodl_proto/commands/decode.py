"""``flodl-proto decode``: print the records of a captured data-channel byte stream.

::

    flodl-proto decode [--leg auto|mux|loopback|frame] [--salt HEX | --salt-file PATH]
                       [--protocol-version 2|3] [--format json|table] [--values]
                       [--hex | --pcap --port N [--port N ...]] [--frame-ceiling BYTES]
                       [--max-input BYTES] [--world-size N] [FILE|-]

Reads FILE (``-`` or nothing: stdin); with ``--hex`` the input is hex text: plain hex, ``xxd``,
``hexdump -C`` or ``od -Ax -tx1`` output (from any offset; ``*`` lines expanded), or the
offset-prefixed dumps of ``docs/protocol.md``; with ``--pcap`` it is a libpcap/pcapng capture and
every TCP stream to or from ``--port`` is decoded, each direction on its own, the controller ->
relay direction (no Hello) at the version its connection's relay -> controller Hello told
(``--port`` may be repeated: the streams of each port in the order given, a connection between two
of them once, under the first; a port with no stream is warned about on stderr, none at all is exit
1); a capture that ends inside its file header or a packet record is reported on stderr with the
byte it ends at, the streams of the whole packets before the cut are decoded, and the exit code is
4 (when the whole packets before the cut hold no stream of the ports, none at all when the file
header or the first packet is cut, that is no TCP stream, exit 1, on one line naming the cut). A
stream with bytes missing from the capture (a hole between its segments, or a packet cut short by
the snaplen: its IP header claims more bytes than were captured) is warned about on stderr with the
stream offset, decoded up to there and ends ``capture_ended`` there (``CAPTURE ENDED`` in the
table, not a clean end), exit 4. The leg is told from the first bytes (data channel magic or mux
record: ``mux``; rank handshake, ack or length-prefixed frame: ``loopback``; a bare RoundFrame:
``frame``) unless ``--leg`` names it; stderr says which was detected. Prints one JSON object per
line per record (or a table), and last the end of the stream, the point where the input ended
inside a record, or the error that stopped decoding, with its byte offset.

The input is read whole before decoding, into one buffer (a file's allocated at its size, so it
is held once); each record is printed as it is decoded and not kept, so memory is the input's
size and a constant, and ``| head`` sees the first records at once. At most ``--max-input``
bytes are read (default :data:`DEFAULT_MAX_INPUT`, 4 GiB); a longer input (an endless pipe)
stops the command with one line naming the option and the limit, exit 1, as an input larger
than this machine's memory does. The input is judged on its first
1 MiB first, and the rest is not read when no later byte can change the outcome: raw input that
starts no leg, or whose decoding stops at a protocol error there (``/dev/zero``: a bad magic at
byte 0); ``--hex`` input with a byte no text holds; ``--pcap`` input without a capture file's
magic.

Exit codes: 0 every stream ended at a record boundary, each record decoded; 1 decoding stopped
at a protocol error, or the input is not what was asked for (``--hex`` text that is not hex, a
``--pcap`` file that is not a capture, longer than ``--max-input``, or a capture with no TCP
stream to or from the ports, cut short or not); 3 ``--salt`` was given and
some auth tag did not verify; 4 the input ended inside a record, its header included (a capture
stopped mid-record, or a ``--pcap`` capture file cut short or with bytes missing from a stream:
normal for a capture, so it is not 1); 2 usage errors (FILE, or a ``--salt-file``, that cannot
be opened or read; a ``--salt`` or ``--salt-file`` that holds no salt; ``--hex`` with ``--pcap``,
``--pcap`` without ``--port``, ``--port`` without ``--pcap``).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import stat
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, BinaryIO, Final, TextIO, cast

from .._oserr import os_reason
from ..cli import interrupts_held
from ..errors import ProtocolError, shown_name
from ..spec import SUPPORTED_VERSIONS
from ._option_error import option_message
from ._paths import input_path_problem, path_text
from .relay import (
    add_frame_ceiling_option,
    byte_count,
    check_world_size,
    frame_ceiling,
    tcp_port,
    whole_number,
)

if TYPE_CHECKING:  # the decoder (and NumPy) is imported when the command runs
    from ..decode import DecodeReport, Leg, UnknownLeg

__all__ = ["DEFAULT_MAX_INPUT", "register", "run"]

#: default of ``--max-input``: the most input bytes ``decode`` reads (4 GiB)
DEFAULT_MAX_INPUT = 4 << 30
_PROG = "flodl-proto decode"
_CHUNK = 1 << 20
#: the bytes of a raw input's first chunk decoded to find an error that decides the report
_PROBE_BYTES = 64 << 10


class _InputTooLarge(Exception):
    """The input has more than ``--max-input`` bytes."""


class _NoLeg(Exception):
    """The input's first bytes are no leg's (the message says so, as ``detect_leg``'s)."""


class _Decided(Exception):
    """The input's first bytes already decide the report: decoding them stops at a protocol
    error, which no later byte can change (the rest of the input is not read); ``first``: those
    bytes, which the report is decoded from."""

    def __init__(self, first: bytes) -> None:
        super().__init__("decided by the first chunk")
        self.first = first


def _no_leg_line(e: UnknownLeg, hex_hint: bool) -> str:
    """:func:`~flodl_proto.decode.detect_leg`'s refusal in this command's words: the leg is
    named with ``--leg``, hex text read with ``--hex``, a vector file (JSON) with
    ``flodl-proto vectors check FILE`` (``hex_hint`` False: no hint about hex text or JSON,
    for input that ``--hex`` or ``--pcap`` already says is not a file's raw bytes)."""
    return e.describe("--leg", "--hex" if hex_hint else None,
                      "'flodl-proto vectors check FILE'" if hex_hint else None)


def _detect_or_refuse(first: bytes) -> Leg:
    """The leg ``first`` (the input's first chunk) starts; :class:`_NoLeg` when it starts
    none."""
    from ..decode import UnknownLeg, detect_leg
    from ..pcap import capture_format

    try:
        return detect_leg(first)[0]
    except UnknownLeg as e:
        if (fmt := capture_format(first)) is not None:
            raise _NoLeg(f"the input is a {fmt} capture file, not the bytes of a leg: read it "
                         "with --pcap --port N (N: the flodl connections' TCP port)") from None
        raise _NoLeg(_no_leg_line(e, hex_hint=True)) from None


def _first_chunk_probe(args: argparse.Namespace, salt: bytes | None,
                       ceiling: int) -> Callable[[bytes], None]:
    """The probe of a raw input's first chunk (:func:`_read_limited`): :class:`_NoLeg` when
    ``--leg auto`` and it starts no leg; :class:`_Decided` when decoding it stops at a protocol
    error (``decode --leg frame < /dev/zero`` read 4 GiB before reporting the bad magic at
    byte 0). Decoding stops at the first error, so the report of the whole input is the
    report of any prefix that holds it; only the first :data:`_PROBE_BYTES` are decoded here
    (an error further on is found by the decode of the whole input), and their records are
    not kept, so the work done twice stays small."""
    def probe(first: bytes) -> None:
        from ..decode import decode_stream

        leg = _detect_or_refuse(first) if args.leg == "auto" else args.leg
        head = first[:_PROBE_BYTES]
        try:
            report = decode_stream(head, leg, salt=salt, version=args.protocol_version,
                                   values=args.values, ceiling=ceiling,
                                   on_record=lambda rec: None, world_size=args.world_size)
        except ProtocolError:  # local misuse: the whole input's decode says so
            return
        if report.failure is not None and not report.failure.capture_ended:
            raise _Decided(head)

    return probe


def _byte_count(text: str) -> int:
    """argparse ``type=`` of ``--max-input``: :func:`.relay.byte_count`."""
    try:
        return byte_count(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _salt(text: str) -> bytes:
    """argparse ``type=`` of ``decode --salt``: :func:`.relay.parse_salt`, so the line is the
    one ``controller --salt`` and ``relay --salt`` give (``argument --salt: session salt must be
    16 bytes written as 32 hex digits, got 3 characters``), counting the characters given and
    never showing them (a near-miss salt is a secret).

    Raises:
        argparse.ArgumentTypeError: not 16 bytes of hex.
    """
    from .relay import parse_salt

    try:
        return parse_salt(text)
    except ProtocolError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def register(sub: Any) -> None:
    """Add the ``decode`` subcommand to the CLI's subparsers.

    No upstream counterpart (the command line is this package's own).
    """
    p = sub.add_parser(
        "decode", help="decode a captured data-channel byte stream",
        description="Decode a captured byte stream of the data channel and print its records. "
        "Exit codes: 0 every stream ended at a record boundary, 1 stopped at a protocol error "
        "or the input is not hex (--hex) / not a capture (--pcap), 2 bad command line (FILE or "
        "--salt-file cannot be read), 3 a tag did not verify (with --salt), 4 the input ended "
        "inside a record (header included): the capture stopped there, or (--pcap) bytes are "
        "missing from the capture. At most --max-input "
        "bytes are read.",
    )
    p.add_argument("file", nargs="?", default="-", metavar="FILE", type=path_text,
                   help="input file, or '-' for stdin (default)")
    p.add_argument("--leg", choices=("auto", "mux", "loopback", "frame"), default="auto",
                   help="mux: relay<->controller (channel magic first if present); loopback: "
                   "rank<->relay (handshake or ack first, then length-framed frames); frame: "
                   "bare RoundFrames. Default auto: told from the first bytes")
    form = p.add_mutually_exclusive_group()  # a capture is binary: never hex text
    form.add_argument("--hex", action="store_true",
                      help="the input is hex text: plain hex, xxd, hexdump -C or od -Ax -tx1 "
                      "output, or the dumps of docs/protocol.md (not with --pcap)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--salt", type=_salt, metavar="HEX",
                   help="16-byte session salt in hex: verify every auth tag")
    g.add_argument("--salt-file", metavar="PATH", type=path_text,
                   help="file holding the session salt (32 hex digits, or 16 raw bytes), e.g. "
                   "the one `demo --salt-file` wrote")
    p.add_argument("--protocol-version", type=whole_number, choices=SUPPORTED_VERSIONS,
                   default=None,
                   help="data-channel protocol version (default: detected from the loopback "
                   "handshake or ack, or from a mux Hello's model_sigs, else 2; with --pcap the "
                   "controller -> relay direction takes its connection's Hello's)")
    p.add_argument("--format", choices=("json", "table"), default="json",
                   help="one JSON object per line (default) or a table")
    p.add_argument("--values", action="store_true",
                   help="print every tensor element too, after its summary (min, max, "
                   "mean)")
    form.add_argument("--pcap", action="store_true",
                      help="FILE is a libpcap/pcapng capture; decode the TCP streams of each "
                      "--port (needs the pcap extra: pip install 'flodl-proto[pcap]'; not with "
                      "--hex)")
    p.add_argument("--port", type=tcp_port, action="append", metavar="N",
                   help="TCP port of the streams (with --pcap), 1..65535; repeatable (a demo "
                   "prints its controller's and relays' ports)")
    add_frame_ceiling_option(p, "length prefix, mux payload_len or bare RoundFrame (its whole "
                             "length, tag included) of any one record")
    p.add_argument("--world-size", type=whole_number, default=None, metavar="N",
                   help="the run's world size (no mux record carries it): a mux Control record "
                   "longer than the longest legal one for N ranks stops the decode, as the "
                   "controller (after the relay's Hello) or the relay refuses it; a relay's "
                   "first record longer than the longest legal Hello, as the controller does; "
                   "a rank's handshake carrying another world size, as the relay does")
    p.add_argument("--max-input", type=_byte_count, default=DEFAULT_MAX_INPUT, metavar="BYTES",
                   help="read at most this many input bytes; a longer input stops the command "
                   f"with exit 1 (default {DEFAULT_MAX_INPUT}, 4 GiB)")
    p.set_defaults(func=run)


def _read_limited(f: BinaryIO, limit: int,
                  probe: Callable[[bytes], None] | None = None) -> bytearray:
    """Read ``f`` to its end into one buffer (the input is never held twice); raise
    :class:`_InputTooLarge` past ``limit`` bytes. A regular file's buffer is allocated at its
    size before it is read, so a file over ``limit``, or larger than this machine can hold
    (``MemoryError``), is refused at once; a pipe's grows chunk by chunk. ``probe`` is called
    once with the first chunk (bytes) when it is within ``limit``: what it raises stops the read
    there (an input that cannot be decoded is not read to its end). A first chunk over
    ``limit`` is :class:`_InputTooLarge`, whatever its bytes are."""
    first = f.read(min(_CHUNK, limit + 1))
    if not first:
        return bytearray()
    if len(first) > limit:
        raise _InputTooLarge
    if probe is not None:
        probe(first)
    try:
        st = os.fstat(f.fileno())
        size: int | None = st.st_size if stat.S_ISREG(st.st_mode) else None
    except (OSError, AttributeError, ValueError, io.UnsupportedOperation):
        size = None  # no file descriptor behind it: read on
    if size is not None and size > len(first):
        if size > limit:
            raise _InputTooLarge
        buf = bytearray(size)
        buf[:len(first)] = first
        n = len(first)
        with memoryview(buf) as view:
            while n < size:
                got = cast("io.BufferedIOBase", f).readinto(view[n:])
                if not got:
                    break
                n += got
        del buf[n:]  # the file shrank while it was read
    else:
        buf = bytearray(first)
    while True:  # a pipe, or a file that grew while it was read
        if len(buf) > limit:
            raise _InputTooLarge
        chunk = f.read(min(_CHUNK, limit + 1 - len(buf)))
        if not chunk:
            return buf
        buf += chunk


class _Unreadable(Exception):
    """The input named on the command line cannot be opened or read (a usage error, exit 2):
    ``path`` True for a FILE (its line is ``argument FILE: 'PATH': REASON``, as an option's
    path), False for stdin (``cannot read input stdin: REASON``)."""

    def __init__(self, text: str, *, path: bool) -> None:
        super().__init__(text)
        self.path = path


class _NotHex(Exception):
    """``--hex`` input that is not hex text, or a dump whose offsets skip or repeat (bad input,
    exit 1); the message is the error line's text."""


#: a byte no hex text holds: neither printable ASCII nor white space
_NOT_TEXT: Final = re.compile(rb"[^\x20-\x7e\t\n\r\f\v]")


def _check_text(raw: bytes | bytearray) -> None:
    """Raise :class:`_NotHex` naming the first byte of ``raw`` that no hex text holds (a NUL, a
    control byte, a byte above 0x7f); the probe of ``--hex`` input's first chunk too, so
    ``decode --hex /dev/zero`` stops at byte 0 instead of reading ``--max-input`` bytes."""
    if (bad := _NOT_TEXT.search(raw)) is not None:
        at = bad.start()
        raise _NotHex(f"input is not hex: byte 0x{raw[at]:02x} at offset {at} (--hex takes hex "
                      "text)")


class _NotCapture(Exception):
    """``--pcap`` input whose first bytes are no capture file's magic (bad input, exit 1)."""


def _check_capture_magic(first: bytes) -> None:
    """The probe of ``--pcap`` input's first chunk: raise :class:`_NotCapture` when it starts
    with no libpcap or pcapng magic (``decode --pcap /dev/zero`` read ``--max-input`` bytes
    first). Fewer than 4 bytes are left to the capture reader."""
    from ..pcap import capture_format

    if len(first) >= 4 and capture_format(first) is None:
        raise _NotCapture(f"not a libpcap or pcapng capture: it starts with {first[:4].hex()}, "
                          "no capture file's magic")


def _read_input(name: str, hex_text: bool, limit: int,
                probe: Callable[[bytes], None] | None = None) -> bytes | bytearray:
    """The input's bytes (hex text decoded with ``hex_text``); ``probe``: as
    :func:`_read_limited`.

    Raises:
        whatever ``probe`` raises.
        _Unreadable: FILE cannot be opened or read, or stdin is closed.
        _InputTooLarge: more than ``limit`` bytes.
        _NotHex: ``hex_text`` and the text is not hex (offset or line named).
    """
    try:
        if name == "-":
            if sys.stdin is None:  # started with stdin closed (``<&-``)
                raise _Unreadable("stdin: it is closed", path=False)
            raw = _read_limited(sys.stdin.buffer, limit, probe)
        else:
            with open(name, "rb") as f:
                raw = _read_limited(f, limit, probe)
    except OSError as e:
        if name == "-":
            raise _Unreadable(f"{shown_name(str(e.filename or name))}: {os_reason(e)}",
                              path=False) from None
        raise _Unreadable(input_path_problem(str(e.filename or name), e), path=True) from None
    if not hex_text:
        return raw
    from .._hexdump import HexDumpTooLarge, read_hex_dump

    _check_text(raw)
    text = raw.decode("ascii")
    try:
        dump = read_hex_dump(text, limit)
    except HexDumpTooLarge as e:  # a '*' line up to a far offset: checked before it expands
        raise _NotHex(f"the hex dump stands for more bytes than --max-input: {e}; give a "
                      "larger --max-input to decode it") from None
    except ValueError as e:  # "line N: not hex: '...'", or "line N: offset ... where ..."
        why = str(e)
        if ": not hex:" in why:
            raise _NotHex("input is not hex: " + why.replace(": not hex:", ":", 1)
                          + " (--hex takes hex text)") from None
        raise _NotHex(f"the hex dump's offsets do not follow on: {why}"
                      if " where " in why or "'*'" in why else f"not a hex dump: {why}") from None
    if dump.start:  # `xxd -s N`: the decoder sees the dump's bytes only
        print(f"{_PROG}: the hex dump starts at byte {dump.start} of its stream "
              f"(0x{dump.start:x}); the offsets below count from the dump's first byte",
              file=sys.stderr)
    return dump.data


class _Ended:
    """A report's closing record replaced (what :func:`table_end` reads of a report)."""

    def __init__(self, final: dict[str, Any]) -> None:
        self.records: list[dict[str, Any]] = []
        self._final = final

    def final_record(self) -> dict[str, Any]:
        return self._final


def _decode_and_print(payload: bytes | bytearray, leg: Leg, args: argparse.Namespace,
                      salt: bytes | None, ceiling: int, out: TextIO,
                      stream: str | None = None, gap: str | None = None,
                      version: int | None = None) -> DecodeReport:
    """Decode ``payload`` as ``leg`` and print each record as it is decoded (a table line, or a
    JSON line with the stream's label), then the end: a long stream's records are neither held
    nor waited for. ``version``: the protocol version (None: told by the stream, else 2).
    ``gap``: why the capture may lack bytes after ``payload`` (a hole, a packet
    cut short, the capture file cut short), with ``{offset}`` where the decoding stopped; a
    stream that decodes cleanly to its end then ends as a capture that ended there
    (``capture_ended``, exit 4), not as a clean end of stream.

    Raises:
        ProtocolError (local): a bad salt or version (the arguments are checked before).
    """
    from ..decode import DecodeFailure, decode_stream, table_end, table_head, table_line

    on_record: Callable[[dict[str, Any]], None]
    extra = {"stream": stream} if stream is not None else {}
    if args.format == "table":
        for line in table_head(stream):
            print(line, file=out)

        def on_record(rec: dict[str, Any]) -> None:
            print(table_line(rec), file=out)
    else:
        def on_record(rec: dict[str, Any]) -> None:
            print(json.dumps({**extra, **rec}, allow_nan=False), file=out)

    report = decode_stream(payload, leg, salt=salt, version=version,
                           values=args.values, ceiling=ceiling, on_record=on_record,
                           world_size=args.world_size)
    final = report.final_record()
    if gap is not None and report.failure is None:  # a clean end only as far as the capture goes
        why = gap.format(offset=report.end)
        report.failure = DecodeFailure(report.end, why, "truncated", None, capture_ended=True)
        final = {"type": "capture_ended", "offset": report.end, "error_id": None, "error": why}
    if args.format == "table":
        print(table_end(_Ended(final)), file=out)
    else:
        print(json.dumps({**extra, **final}, allow_nan=False), file=out)
    return report


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Execute ``decode`` with parsed ``args``; print to ``out`` (default stdout); return the exit
    code. An input larger than this machine can hold (read, decoded or reassembled) stops the
    command with one line, exit 1.

    No upstream counterpart: upstream has no decoder tool.
    """
    try:
        return _run(args, out)
    except MemoryError:
        print(f"{_PROG}: error: not enough memory to read and decode the input; decode a "
              "shorter capture, or cap what is read with --max-input", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace, out: TextIO | None) -> int:
    with interrupts_held():  # NumPy and the codec load: Ctrl-C after, as one line
        from ..codec.handshake import http_stream
        from ..decode import (
            EXIT_CAPTURE_ENDED,
            EXIT_ERROR,
            EXIT_OK,
            UnknownLeg,
            detect_leg,
        )

    out = out or sys.stdout
    try:
        ceiling = frame_ceiling(args.frame_ceiling)
        if args.world_size is not None:
            check_world_size(args.world_size)
    except ValueError as e:
        print(f"{_PROG}: error: {e}", file=sys.stderr)
        return 2
    if args.pcap and args.port is None:
        print(f"{_PROG}: error: {option_message('--pcap', 'needs --port N')}", file=sys.stderr)
        return 2
    if args.port is not None and not args.pcap:
        print(f"{_PROG}: error: {option_message('--port', 'only meaningful with --pcap')}",
              file=sys.stderr)
        return 2
    salt: bytes | None = args.salt
    if args.salt_file is not None:
        from .relay import cli_salt

        try:
            salt = cli_salt(None, args.salt_file)
        except ValueError as e:  # a missing or malformed salt: the command line, as --salt
            print(f"{_PROG}: error: {e}", file=sys.stderr)
            return 2
    try:
        # raw bytes of an unnamed leg: the first bytes tell it, or the input is refused unread
        data = _read_input(args.file, args.hex, args.max_input,
                           _check_text if args.hex else _check_capture_magic if args.pcap else
                           _first_chunk_probe(args, salt, ceiling))
    except _Decided as e:
        data = e.first
    except _NoLeg as e:
        print(f"{_PROG}: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except _InputTooLarge:
        print(f"{_PROG}: error: the input is longer than --max-input {args.max_input} bytes; give "
              "a larger --max-input to decode it", file=sys.stderr)
        return EXIT_ERROR
    except _Unreadable as e:  # a path of the command line, as --salt-file: a usage error
        why = option_message("FILE", str(e)) if e.path else f"cannot read input {e}"
        print(f"{_PROG}: error: {why}", file=sys.stderr)
        return 2
    except (_NotHex, _NotCapture) as e:
        print(f"{_PROG}: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    #: each stream: its label, bytes, why it may lack bytes after them, its (src, dst) ends
    streams: list[tuple[str | None, bytes | bytearray, str | None, tuple[str, str] | None]]
    code = EXIT_OK
    cut: str | None = None  # the capture file ends inside a packet record: no stream is whole
    if args.pcap:
        from ..pcap import CaptureTruncated, PcapError, TcpStream, read_tcp_streams_of_ports

        ports = list(dict.fromkeys(args.port))  # a port given twice is read once
        tcp: list[TcpStream]
        try:  # one read of the capture for every port: each port's streams in the order given,
            # a connection between two of the ports once, under the first port given
            tcp = read_tcp_streams_of_ports(data, ports)
        except CaptureTruncated as e:  # the file's end
            if not e.streams:  # no whole packet of the ports' streams before the cut (none at
                # all when the file header or the first packet is cut): no stream, as in a
                # capture that ends there whole (1 before 4), the cut named on the same line
                print(f"{_PROG}: error: no TCP stream to or from {_ports_text(ports)} in the "
                      f"capture; {e}", file=sys.stderr)
                return EXIT_ERROR
            # the streams before the cut are decoded
            print(f"{_PROG}: warning: {e}; the streams stop before it", file=sys.stderr)
            code, tcp = EXIT_CAPTURE_ENDED, e.streams
            cut = (f"the capture file is cut short (at byte {e.size}); the stream may go on "
                   "after offset {offset}")
        except PcapError as e:
            print(f"{_PROG}: error: {e}", file=sys.stderr)
            return EXIT_ERROR
        if not tcp:
            print(f"{_PROG}: error: no TCP stream to or from {_ports_text(ports)} in the "
                  "capture", file=sys.stderr)
            return EXIT_ERROR
        seen = {int(end.rsplit(":", 1)[1]) for st in tcp for end in (st.src, st.dst)}
        if missing := [p for p in ports if p not in seen]:  # the others' streams are decoded
            print(f"{_PROG}: warning: no TCP stream to or from {_ports_text(missing)} in the "
                  "capture", file=sys.stderr)
        streams = []
        for st in tcp:
            if st.gap:  # a capture that lost bytes: incomplete, as one cut short is
                print(f"{_PROG}: warning: {st.label}: bytes missing from the capture after stream "
                      f"offset {len(st.data)}; decoding stops there", file=sys.stderr)
                code = _worse(code, EXIT_CAPTURE_ENDED)
            if not st.syn_seen and st.data:
                print(f"{_PROG}: warning: {st.label}: the connection's start was not captured; "
                      "offsets count from the first captured byte", file=sys.stderr)
            streams.append((st.label, st.data, "bytes missing from the capture after offset "
                            "{offset}; decoding stops there" if st.gap else cut,
                            (st.src, st.dst)))
    else:
        streams = [(None, data, None, None)]
    #: the version a mux direction's own bytes told (its Hello), by its (src, dst): the other
    #: direction of the connection, which carries no Hello, is read at it
    told: dict[tuple[str, str], int] = {}
    for label, payload, gap, ends in streams:
        leg: Leg
        if label is not None and http_stream(payload):  # the port's status requests and replies
            print(f"{_PROG}: {label}: HTTP (the controller's status responder), not a flodl leg; "
                  "skipped", file=sys.stderr)
            continue
        if label is not None and not payload:  # e.g. both directions of a refused connection
            print(f"{_PROG}: {label}: no bytes in this direction; skipped", file=sys.stderr)
            continue
        if args.leg == "auto":
            try:
                leg, why = detect_leg(payload)
            except UnknownLeg as e:
                line = _no_leg_line(e, hex_hint=not (args.hex or args.pcap))
                print(f"{_PROG}: error: {label + ': ' if label else ''}{line}", file=sys.stderr)
                code = EXIT_ERROR
                continue
            print(f"{_PROG}: {label + ': ' if label else ''}{leg} leg ({why}; --leg to choose)",
                  file=sys.stderr)
        else:
            leg = args.leg
        version = args.protocol_version
        if version is None and ends is not None and leg == "mux":
            version = told.get((ends[1], ends[0]))
        try:
            report = _decode_and_print(payload, leg, args, salt, ceiling, out, label, gap,
                                       version)
        except ProtocolError as e:  # local misuse (cannot happen with validated arguments)
            print(f"{_PROG}: error: {e}", file=sys.stderr)
            return EXIT_ERROR
        if ends is not None and leg == "mux" and report.version_told:  # a loopback
            # direction tells its own version (the handshake's, the ack's)
            told[ends] = report.version
        code = _worse(code, report.exit_code)
    return code


#: ports a line names at most (the rest are counted)
_PORTS_SHOWN: Final = 8


def _ports_text(ports: list[int]) -> str:
    """``port 5000``, or ``ports 5000, 5004`` (at most :data:`_PORTS_SHOWN` named, then how many
    more: a line stays one line)."""
    if len(ports) == 1:
        return f"port {ports[0]}"
    more = len(ports) - _PORTS_SHOWN
    return "ports " + ", ".join(map(str, ports[:_PORTS_SHOWN])) + \
        (f", ... ({more} more)" if more > 0 else "")


def _worse(a: int, b: int) -> int:
    """The exit code of two streams together: error, then bad tag, then capture ended."""
    from ..decode import EXIT_BAD_TAG, EXIT_CAPTURE_ENDED, EXIT_ERROR, EXIT_OK

    order = (EXIT_OK, EXIT_CAPTURE_ENDED, EXIT_BAD_TAG, EXIT_ERROR)
    return max(a, b, key=order.index)
