"""Reassemble the TCP byte streams to and from one or more ports out of a packet capture.

Reads libpcap and pcapng files with ``dpkt`` (the optional ``pcap`` extra:
``pip install 'flodl-proto[pcap]'``); link layers Ethernet (with VLAN tags), Linux cooked
capture v1 and v2, BSD loopback and raw IPv4/IPv6 are understood. Each direction of each TCP
connection whose source or destination port is one of the given ones becomes one
:class:`TcpStream` (the capture is read once, whatever the number of ports),
its payload bytes put back in sequence order: retransmitted and overlapping segments are
de-duplicated (the first copy wins), segments captured out of order are re-ordered, and a stream
stops at the first hole in the capture (``gap`` says so), since nothing after a missing byte can
be framed reliably. A packet cut short by the capture (its IP header claims more bytes than were
captured: a snaplen cut) is such a hole after the bytes it holds, unless another copy of the
segment holds the rest. A capture cut short inside its file header or a packet record (dpkt's
readers would hand out the partial packet as a whole one) raises :class:`CaptureTruncated`, which
carries the streams of the whole packets before the cut.

This is a debugging aid for ``flodl-proto decode --pcap``; it is not a general TCP reassembler
(no window or checksum validation, no IP fragment reassembly).
"""

from __future__ import annotations

import importlib
import io
import ipaddress
import operator
import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .errors import protocol_error, shown_type

__all__ = ["CaptureTruncated", "PcapError", "TcpStream", "capture_format", "read_tcp_streams",
           "read_tcp_streams_of_ports"]

_SEQ_MOD = 1 << 32
_HALF = 1 << 31
# link-layer header types (LINKTYPE_* of the pcap / pcapng formats; 12 and 14 are legacy raw)
_LINK_NULL, _LINK_ETHERNET, _LINK_LOOP = 0, 1, 108
_LINK_RAW = frozenset({101, 12, 14})
_LINK_IPV4, _LINK_IPV6 = 228, 229
_LINK_SLL, _LINK_SLL2 = 113, 276
_TH_SYN = 0x02


class PcapError(ValueError):
    """The capture cannot be read (unknown format, unsupported link type, dpkt missing).

    No upstream counterpart: upstream reads no packet captures.
    """


class CaptureTruncated(PcapError):
    """The capture ends inside its file header or inside a packet record (a copy cut short, a
    capture still being written).

    Attributes:
        size: the capture's length in bytes (where it ends).
        complete: bytes of whole records before the cut (the file header included); 0 when the
            file header itself is cut.
        streams: what :func:`read_tcp_streams` (or :func:`read_tcp_streams_of_ports`)
            reassembled from the whole packets before the cut (empty from the reader itself).

    No upstream counterpart: upstream reads no packet captures.
    """

    def __init__(self, size: int, complete: int) -> None:
        self.size = size
        self.complete = complete
        self.streams: list[TcpStream] = []
        where = ("inside its file header" if complete == 0
                 else f"inside the packet record that starts at byte {complete}")
        super().__init__(f"the capture is truncated: it ends at byte {size}, {where}")


#: the first 4 bytes of a libpcap file (micro- and nanosecond) -> the byte order of its fields
_LIBPCAP_ORDER = {b"\xd4\xc3\xb2\xa1": "<", b"\x4d\x3c\xb2\xa1": "<",
                  b"\xa1\xb2\xc3\xd4": ">", b"\xa1\xb2\x3c\x4d": ">"}
#: pcapng: the section header block's type, and its byte-order magic as each order writes it
_PCAPNG_SHB = b"\x0a\x0d\x0d\x0a"
_PCAPNG_ORDER = {b"\x4d\x3c\x2b\x1a": "<", b"\x1a\x2b\x3c\x4d": ">"}
#: the first 4 bytes of a libpcap or pcapng file
_MAGICS = (*_LIBPCAP_ORDER, _PCAPNG_SHB)


def capture_format(data: bytes | bytearray) -> str | None:
    """``"pcap"`` or ``"pcapng"`` when ``data`` starts with a libpcap file's magic (either byte
    order, micro- or nanosecond) or a pcapng section header block's type, else None. Needs no
    dpkt; reads the first 4 bytes only.

    No upstream counterpart: upstream reads no captures.
    """
    head = bytes(data[:4])
    if head in _LIBPCAP_ORDER:
        return "pcap"
    return "pcapng" if head == _PCAPNG_SHB else None


class _Watched(io.BytesIO):
    """A BytesIO that notes a read cut short by the end of the data (dpkt's readers take a
    short read of a packet's body as the whole packet)."""

    short = False

    def read(self, size: int | None = -1, /) -> bytes:
        got = super().read(size)
        if size is not None and size > 0 and len(got) < size:
            self.short = True
        return got

    def seek(self, pos: int, whence: int = 0, /) -> int:
        self.short = False
        return super().seek(pos, whence)


@dataclass(slots=True)
class TcpStream:
    """One direction of one TCP connection.

    Attributes:
        src: ``"ip:port"`` of the sender (IPv6 addresses in brackets).
        dst: ``"ip:port"`` of the receiver.
        data: the reassembled payload bytes, from the first byte seen (the byte after the SYN
            when the SYN was captured) up to the first hole.
        gap: True when bytes were missing and the stream was cut there: a hole between the
            segments captured, or a segment cut short by the capture (its IP header claims more
            bytes than were captured, a snaplen cut), whose missing bytes no other copy holds.
        syn_seen: True when the connection's SYN for this direction was captured (so ``data``
            starts at the connection's first byte).
        packets: TCP segments captured for this direction (payload-less ones included).

    No upstream counterpart: upstream reads no packet captures.
    """

    src: str
    dst: str
    data: bytes = b""
    gap: bool = False
    syn_seen: bool = False
    packets: int = 0
    #: (sequence number, payload captured, payload length on the wire)
    _segments: list[tuple[int, bytes, int]] = field(default_factory=list, repr=False)
    _base: int | None = field(default=None, repr=False)
    #: a segment was cut inside its TCP header: bytes are missing at a place unknown
    _lost: bool = field(default=False, repr=False)

    @property
    def label(self) -> str:
        """``"src -> dst"``."""
        return f"{self.src} -> {self.dst}"


def _endpoint(addr: bytes, port: int) -> str:
    ip = ipaddress.ip_address(addr)
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def _ip_layer(dpkt: Any, linktype: int, buf: bytes) -> Any:
    """Return the dpkt IP / IP6 packet inside a link-layer frame, or None."""
    if linktype == _LINK_ETHERNET:
        pkt = dpkt.ethernet.Ethernet(buf).data
    elif linktype in (_LINK_NULL, _LINK_LOOP):
        pkt = _raw_ip(dpkt, buf[4:])
    elif linktype == _LINK_SLL:
        pkt = dpkt.sll.SLL(buf).data
    elif linktype == _LINK_SLL2:
        pkt = dpkt.sll2.SLL2(buf).data
    elif linktype in _LINK_RAW or linktype in (_LINK_IPV4, _LINK_IPV6):
        pkt = _raw_ip(dpkt, buf)
    else:
        raise PcapError(f"unsupported link-layer type {linktype}")
    return pkt if isinstance(pkt, dpkt.ip.IP | dpkt.ip6.IP6) else None


def _raw_ip(dpkt: Any, buf: bytes) -> Any:
    if not buf:
        return None
    version = buf[0] >> 4
    if version == 4:
        return dpkt.ip.IP(buf)
    if version == 6:
        return dpkt.ip6.IP6(buf)
    return None


def _dpkt() -> Any:
    """Import dpkt (untyped, optional) with the submodules used here."""
    try:
        mod = importlib.import_module("dpkt")
        for sub in ("pcap", "pcapng", "ethernet", "sll", "sll2", "ip", "ip6", "tcp"):
            importlib.import_module(f"dpkt.{sub}")
    except ImportError as e:  # the optional extra is not installed
        raise PcapError("reading captures needs dpkt, the pcap extra: "
                        "pip install 'flodl-proto[pcap]'") from e
    return mod


#: the largest packet a libpcap capture can hold (libpcap's MAXIMUM_SNAPLEN)
_MAX_SNAPLEN = 262144
#: the largest pcapng block libpcap reads: an enhanced packet block (8-byte header, 20 bytes of
#: fields, 4-byte trailer) holding the largest packet and 128 KiB of options
_MAX_PCAPNG_BLOCK = 8 + 20 + _MAX_SNAPLEN + 131072 + 4


def _pcapng_order(data: bytes | bytearray) -> str | None:
    """The byte order (``"<"`` or ``">"``) of the pcapng capture ``data``'s first section, from
    its section header's byte-order magic; None when ``data`` is no pcapng."""
    if bytes(data[:4]) != _PCAPNG_SHB:
        return None
    return _PCAPNG_ORDER.get(bytes(data[8:12]))


def _impossible_record(data: bytes | bytearray, at: int) -> str | None:
    """Why the packet record (libpcap) or block (pcapng) at byte ``at`` cannot be one, or None:
    a record that runs past the end of the data is then a cut, not a corrupt file.

    A libpcap record's length is over the capture's snaplen and libpcap's largest; a pcapng
    block's total length is under 12 bytes, not a multiple of 4, or over the largest block
    libpcap reads (its byte order is the first section's). A short header: None."""
    order = _LIBPCAP_ORDER.get(bytes(data[:4]))
    if order is not None:
        if len(data) < 24 or at + 16 > len(data):
            return None
        (snaplen,) = struct.unpack_from(order + "I", data, 16)
        (incl_len,) = struct.unpack_from(order + "I", data, at + 8)
        if incl_len <= max(snaplen, _MAX_SNAPLEN):
            return None
        return (f"the packet record at byte {at} claims {incl_len} bytes, more than the "
                f"capture's snaplen {snaplen}")
    order = _pcapng_order(data)
    if order is None or at + 8 > len(data):
        return None
    (length,) = struct.unpack_from(order + "I", data, at + 4)
    if 12 <= length <= _MAX_PCAPNG_BLOCK and length % 4 == 0:
        return None
    return (f"the block at byte {at} claims a total length of {length} bytes (a block is 12 to "
            f"{_MAX_PCAPNG_BLOCK} bytes, a multiple of 4)")


def _packets(data: bytes | bytearray) -> Iterator[tuple[int, bytes]]:
    """Yield (link type, frame bytes) of every whole packet record.

    Raises:
        CaptureTruncated: the data ends inside the file header or a packet record (after the
            whole packets before it were yielded).
        PcapError: not a capture, or a corrupt one.
    """
    dpkt = _dpkt()
    f = _Watched(data)
    try:
        reader = dpkt.pcap.UniversalReader(f)
    except (ValueError, dpkt.UnpackError) as e:
        magic = any(m.startswith(data[:4]) for m in _MAGICS) and data
        if f.short and magic:
            raise CaptureTruncated(len(data), 0) from None
        if not magic:  # named by its first bytes, as the decode command's probe names them
            raise PcapError("not a libpcap or pcapng capture: " + (
                f"it starts with {bytes(data[:4]).hex()}, no capture file's magic" if data
                else "it is empty")) from None
        raise PcapError(f"not a libpcap or pcapng capture: {e}") from None
    linktype = int(reader.datalink())
    records = iter(reader)
    while True:
        complete = f.tell()
        try:
            _ts, buf = next(records)
        except StopIteration:  # pcapng's reader stops at a block header cut short
            if f.short and f.tell() > complete and not _blocks_end_whole(data, complete):
                raise _cut_or_corrupt(data, complete) from None
            return
        except (ValueError, dpkt.UnpackError) as e:
            if f.short:
                raise _cut_or_corrupt(data, complete) from None
            raise PcapError(f"capture is corrupt: {_impossible_record(data, complete) or e}"
                            ) from None
        if f.short:  # dpkt handed out the part of the packet that was there
            raise _cut_or_corrupt(data, complete)
        yield linktype, bytes(buf)


def _blocks_end_whole(data: bytes | bytearray, at: int) -> bool:
    """Whether the pcapng blocks from byte ``at`` (the packets' reader skips the other kinds:
    interface statistics, name resolution) run exactly to the end of ``data``: the capture
    ended after its last block, not inside one. The block lengths are read in the first
    section's byte order."""
    order = _pcapng_order(data)
    if order is None:
        return False
    while at + 8 <= len(data):
        (length,) = struct.unpack_from(order + "I", data, at + 4)
        if length < 12 or at + length > len(data):
            return False
        at += length
    return at == len(data)


def _cut_or_corrupt(data: bytes | bytearray, at: int) -> PcapError:
    """The error of a read that ran out of data in the record at byte ``at``: a corrupt record
    (:func:`_impossible_record`) or else a capture cut short (:class:`CaptureTruncated`)."""
    why = _impossible_record(data, at)
    return PcapError(f"capture is corrupt: {why}") if why else CaptureTruncated(len(data), at)


def _checked_data(data: object) -> None:
    """Check that ``data`` is a capture's bytes (:func:`read_tcp_streams`'s first argument).

    Raises:
        InvalidValue (local): as :func:`read_tcp_streams`.
    """
    if not isinstance(data, bytes | bytearray):
        hint = ""
        if isinstance(data, str | os.PathLike):
            path = os.fspath(data)
            hint = f" {path!r}: read the file first, e.g. Path({path!r}).read_bytes()"
        raise protocol_error("capture.bad_type", field="data",
                             expected="the capture file's bytes (bytes or bytearray)",
                             got=shown_type(data), hint=hint)


def _checked_port(port: object) -> int:
    """``port`` as an int, once it is known to be a TCP port.

    Raises:
        InvalidValue (local): ``port`` is not a whole number in 1..65535 (text, a bool, a float,
            0, 70000); the error names the value.
    """
    try:  # the codec's integer rule (an int, a NumPy integer; no bool, float or text)
        n = None if isinstance(port, bool) else operator.index(port)  # type: ignore[arg-type]
    except TypeError:
        n = None
    if n is None or not 1 <= n <= 65535:
        raise protocol_error("capture.bad_port", field="port", value=port)
    return n


def read_tcp_streams(data: bytes | bytearray, port: int) -> list[TcpStream]:
    """Reassemble every TCP stream to or from ``port`` in the capture ``data``.

    Args:
        data: the whole capture file (libpcap or pcapng).
        port: the TCP port of interest (either end).

    Returns:
        The streams, one per direction of each connection, in the order their first segment
        appears in the capture. A new SYN on a 4-tuple that already carried data starts a new
        stream.

    Raises:
        CaptureTruncated: the capture ends inside its file header or inside a packet record;
            its ``streams`` hold what the whole packets before the cut carry (as returned
            otherwise).
        PcapError: the capture cannot be read (a packet record claims more bytes than the
            capture's snaplen: corrupt, not cut), or its link-layer type is not supported.
        InvalidValue (local): ``data`` is not bytes or a bytearray (a path: read the file
            first, ``Path(...).read_bytes()``), or ``port`` is not a whole number in 1..65535
            (text, a bool, a float, 0, 70000); the error names the argument and the value.

    Upstream: none (a capture tool); the streams it yields are the TCP connections of
    ``flodl/src/distributed/relay/`` and ``controller/``.
    """
    _checked_data(data)
    return _read(data, [_checked_port(port)])


def read_tcp_streams_of_ports(data: bytes | bytearray,
                              ports: Iterable[int]) -> list[TcpStream]:
    """Reassemble every TCP stream to or from any of ``ports`` in the capture ``data``, reading
    the capture once.

    Args:
        data: the whole capture file (libpcap or pcapng).
        ports: the TCP ports of interest (either end), in the order wanted; a port given twice
            counts once. No port: no stream.

    Returns:
        The streams of the first port, then those of the second port not already listed, and
        so on: a connection between two of the ports is listed once, under the first of them.
        Each port's streams are in the order :func:`read_tcp_streams` gives them (that of their
        first segment in the capture), so the list is that of :func:`read_tcp_streams` called
        port by port, less the connections already listed.

    Raises:
        CaptureTruncated, PcapError: as :func:`read_tcp_streams` (the truncated capture's
            ``streams`` ordered as returned otherwise).
        InvalidValue (local): ``data`` as :func:`read_tcp_streams`; ``ports`` is text, bytes
            or no iterable (a bare port: give ``[port]``), the error naming its type; or one of
            them is not a whole number in 1..65535, the error naming the value.

    Upstream: none (a capture tool), as :func:`read_tcp_streams`.
    """
    _checked_data(data)
    if isinstance(ports, str | bytes | bytearray) or not isinstance(ports, Iterable):
        raise protocol_error("capture.bad_type", field="ports",
                             expected="an iterable of TCP ports (e.g. a list of ints)",
                             got=shown_type(ports), hint="")
    return _read(data, list(dict.fromkeys(_checked_port(p) for p in ports)))


def _read(data: bytes | bytearray, ports: list[int]) -> list[TcpStream]:
    """:func:`read_tcp_streams_of_ports` once its arguments are checked (``ports`` distinct)."""
    if not ports:
        return []
    dpkt = _dpkt()
    streams: list[TcpStream] = []
    current: dict[tuple[str, str], TcpStream] = {}
    try:
        _collect(dpkt, _packets(data), frozenset(ports), streams, current)
    except CaptureTruncated as e:
        e.streams = _by_port(streams, ports)
        raise
    return _by_port(streams, ports)


def _by_port(streams: list[TcpStream], ports: list[int]) -> list[TcpStream]:
    """Assemble ``streams`` (in capture order) and order them by the first of ``ports`` either
    end has, keeping the capture order within a port."""
    rank = {port: i for i, port in enumerate(ports)}
    for st in streams:
        _assemble(st)
    return sorted(streams, key=lambda st: min(rank.get(_port_of(end), len(rank))
                                              for end in (st.src, st.dst)))


def _port_of(endpoint: str) -> int:
    """The port of a :class:`TcpStream` end (``"10.0.0.1:1337"``, ``"[::1]:1337"``)."""
    return int(endpoint.rsplit(":", 1)[1])


def _tcp_wire_len(dpkt: Any, ip: Any) -> int | None:
    """The TCP segment's length on the wire, as the IP header gives it (IPv4 total length less
    its header; IPv6 payload length less the extension headers), or None when the header says
    nothing (a length of 0: segmentation offload, jumbograms)."""
    if isinstance(ip, dpkt.ip.IP):
        return ip.len - 4 * ip.hl if ip.len else None
    if not ip.plen:
        return None
    return int(ip.plen) - sum(int(h.length) for h in ip.all_extension_headers)


def _stream_of(key: tuple[str, str], syn: bool, streams: list[TcpStream],
               current: dict[tuple[str, str], TcpStream]) -> TcpStream:
    """The stream of ``key``: the current one, or a new one (none yet, or a new SYN on a
    4-tuple that already carried data)."""
    st = current.get(key)
    if st is None or (syn and st._segments):
        st = TcpStream(key[0], key[1])
        current[key] = st
        streams.append(st)
    st.packets += 1
    return st


def _cut_header(dpkt: Any, ip: Any, ports: frozenset[int], streams: list[TcpStream],
                current: dict[tuple[str, str], TcpStream]) -> None:
    """A TCP segment cut inside its 20-byte header (dpkt leaves its bytes unparsed): when one of
    its ports (its first 4 bytes) is in ``ports`` and it may carry payload (its header length, byte
    12, unknown or short of the wire length), its stream lost bytes at a place unknown."""
    raw = bytes(ip.data)
    wire = _tcp_wire_len(dpkt, ip)
    later_fragment = (ip.offset if isinstance(ip, dpkt.ip.IP) else
                      any(getattr(h, "frag_off", 0) for h in ip.all_extension_headers))
    if (ip.p != dpkt.ip.IP_PROTO_TCP or len(raw) < 4 or wire is None or len(raw) >= wire
            or later_fragment):
        return  # not a cut TCP header (another protocol, a later fragment, a corrupt one)
    sport, dport = struct.unpack_from(">HH", raw)
    if sport not in ports and dport not in ports:
        return
    st = _stream_of((_endpoint(ip.src, sport), _endpoint(ip.dst, dport)), False, streams,
                    current)
    if len(raw) < 13 or wire > 4 * (raw[12] >> 4):
        st._lost = True


def _collect(dpkt: Any, packets: Iterator[tuple[int, bytes]], ports: frozenset[int],
             streams: list[TcpStream], current: dict[tuple[str, str], TcpStream]) -> None:
    for linktype, buf in packets:
        try:
            ip = _ip_layer(dpkt, linktype, buf)
        except (dpkt.UnpackError, IndexError):
            continue  # a packet too short for its own headers
        if ip is None:
            continue
        if not isinstance(ip.data, dpkt.tcp.TCP):
            if isinstance(ip.data, bytes):  # dpkt could not parse it: a cut TCP header?
                _cut_header(dpkt, ip, ports, streams, current)
            continue
        tcp = ip.data
        if tcp.sport not in ports and tcp.dport not in ports:
            continue
        syn = bool(tcp.flags & _TH_SYN)
        st = _stream_of((_endpoint(ip.src, tcp.sport), _endpoint(ip.dst, tcp.dport)), syn,
                        streams, current)
        if syn:
            st.syn_seen = True
            st._base = (tcp.seq + 1) % _SEQ_MOD
            continue
        payload = bytes(tcp.data)
        # the payload's length on the wire: more than captured when the packet was cut short
        wire = _tcp_wire_len(dpkt, ip)
        sent = len(payload) if wire is None else max(len(payload), wire - 4 * tcp.off)
        if sent:
            st._segments.append((tcp.seq, payload, sent))


def _assemble(st: TcpStream) -> None:
    st.gap = st._lost
    if not st._segments:
        return
    base = st._base if st._base is not None else st._segments[0][0]
    placed: list[tuple[int, int, bytes, int]] = []
    for order, (seq, payload, sent) in enumerate(st._segments):
        rel = (seq - base) % _SEQ_MOD
        if rel >= _HALF:  # before the base (captured out of order, no SYN seen)
            rel -= _SEQ_MOD
        placed.append((rel, order, payload, sent))
    if st._base is None:
        low = min(p[0] for p in placed)
        placed = [(r - low, o, p, n) for r, o, p, n in placed]
    placed.sort()
    out = bytearray()
    sent_end = 0  # the end of the bytes the segments placed were sent with
    for rel, _order, payload, sent in placed:
        if rel > len(out):
            st.gap = True
            break
        sent_end = max(sent_end, rel + sent)
        if rel + len(payload) <= len(out):
            continue  # retransmission of bytes already placed
        out += payload[len(out) - rel:]
    if sent_end > len(out):  # a segment cut short, its rest in no other copy
        st.gap = True
    st.data = bytes(out)
    st._segments = []
