"""``flodl_proto.pcap`` piece by piece: every link layer it understands, IPv6 endpoints, TCP
reassembly without a SYN and across sequence-number halves, packets it skips, the exact
boundaries between a capture cut short and a corrupt one, and several ports read at once.

Captures are written here byte by byte (libpcap) or with dpkt's writer (pcapng).
"""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest

from flodl_proto.errors import InvalidValue, LocalProtocolError
from flodl_proto.pcap import (
    CaptureTruncated,
    PcapError,
    _Watched,
    read_tcp_streams,
    read_tcp_streams_of_ports,
)

SYN, ACK, PSH = 0x02, 0x10, 0x08
PORT = 1337


def _tcp(sport: int, dport: int, seq: int, flags: int, payload: bytes = b"") -> bytes:
    return struct.pack(">HHIIBBHHH", sport, dport, seq & 0xFFFFFFFF, 0, 5 << 4, flags, 65535,
                       0, 0) + payload


def _ip4(src: str, dst: str, tcp: bytes, proto: int = 6) -> bytes:
    def a(x: str) -> bytes:
        return bytes(int(p) for p in x.split("."))

    return struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0, 64, proto, 0, a(src),
                       a(dst)) + tcp


def _ip6(src: int, dst: int, tcp: bytes) -> bytes:
    return struct.pack(">IHBB16s16s", 6 << 28, len(tcp), 6, 64, src.to_bytes(16, "big"),
                       dst.to_bytes(16, "big")) + tcp


def _eth(ip: bytes, ethertype: int = 0x0800) -> bytes:
    return b"\x02\x00\x00\x00\x00\x02\x02\x00\x00\x00\x00\x01" + struct.pack(">H", ethertype) + ip


def _pcap(linktype: int, packets: list[bytes], *, snaplen: int = 65535) -> bytes:
    out = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, snaplen, linktype)
    for i, p in enumerate(packets):
        out += struct.pack("<IIII", 1_700_000_000 + i, 0, len(p), len(p)) + p
    return out


def _up(seq: int, flags: int = PSH | ACK, payload: bytes = b"") -> bytes:
    return _ip4("10.0.0.2", "10.0.0.1", _tcp(40001, PORT, seq, flags, payload))


# -------------------------------------------------------------------------------------------------
# link layers and endpoints
# -------------------------------------------------------------------------------------------------
def _sll(ip: bytes) -> bytes:
    return struct.pack(">HHH8sH", 0, 1, 6, b"\x02\x00\x00\x00\x00\x02\x00\x00", 0x0800) + ip


def _sll2(ip: bytes) -> bytes:
    return struct.pack(">HHIHBB8s", 0x0800, 0, 1, 1, 0, 6, b"\x02\x00\x00\x00\x00\x02\x00\x00"
                       ) + ip


@pytest.mark.parametrize(("linktype", "wrap"), [
    (1, _eth),
    (0, lambda ip: struct.pack("<I", 2) + ip),    # BSD loopback, host order
    (108, lambda ip: struct.pack(">I", 2) + ip),  # OpenBSD loopback
    (113, _sll),
    (276, _sll2),
    (101, lambda ip: ip), (12, lambda ip: ip), (14, lambda ip: ip), (228, lambda ip: ip),
])
def test_every_link_layer_carries_the_stream(linktype: int, wrap: object) -> None:
    assert callable(wrap)
    packets = [wrap(_up(99, SYN)), wrap(_up(100, payload=b"abc")), wrap(_up(103, payload=b"de"))]
    (st,) = read_tcp_streams(_pcap(linktype, packets), PORT)
    assert (st.src, st.dst, st.data, st.gap, st.syn_seen, st.packets) == (
        "10.0.0.2:40001", "10.0.0.1:1337", b"abcde", False, True, 3)


def test_ipv6_endpoints_are_bracketed() -> None:
    tcp = _tcp(40001, PORT, 7, PSH | ACK, b"v6")
    for linktype, pkt in ((229, _ip6(1, 2, tcp)), (101, _ip6(1, 2, tcp)),
                          (1, _eth(_ip6(1, 2, tcp), 0x86DD))):
        (st,) = read_tcp_streams(_pcap(linktype, [pkt]), PORT)
        assert (st.src, st.dst, st.label, st.data) == ("[::1]:40001", "[::2]:1337",
                                                       "[::1]:40001 -> [::2]:1337", b"v6")


def test_an_unsupported_link_layer_is_named() -> None:
    with pytest.raises(PcapError) as ei:
        read_tcp_streams(_pcap(147, [_up(1, payload=b"x")]), PORT)
    assert str(ei.value) == "unsupported link-layer type 147"


def test_packets_that_carry_no_tcp_of_the_port_are_skipped_not_the_end() -> None:
    skipped = [
        _eth(b"\x00" * 28, 0x0806),                    # ARP: no IP layer
        _eth(b"\x00" * 20, 0x88B5),                    # an ethertype dpkt does not know
        _eth(_ip4("10.0.0.2", "10.0.0.1", b"\x00" * 8, proto=17)),  # UDP
        _eth(_ip4("10.0.0.2", "10.0.0.3", _tcp(40001, 80, 1, PSH | ACK, b"web"))),
    ]
    packets = [*skipped, _eth(_up(100, payload=b"abc")), *skipped, _eth(_up(103, payload=b"d"))]
    (st,) = read_tcp_streams(_pcap(1, packets), PORT)
    assert (st.data, st.packets, st.syn_seen) == (b"abcd", 2, False)
    raw = [b"", b"\x45", b"\x10" * 30, _up(100, payload=b"abc")]  # empty, cut IP header, no IP
    (st,) = read_tcp_streams(_pcap(101, raw), PORT)
    assert (st.data, st.packets) == (b"abc", 1)
    loop = [b"\x02\x00", _up(100, payload=b"abc")]  # a loopback header cut short
    (st,) = read_tcp_streams(_pcap(0, [loop[0], struct.pack("<I", 2) + loop[1]]), PORT)
    assert st.data == b"abc"


# -------------------------------------------------------------------------------------------------
# reassembly
# -------------------------------------------------------------------------------------------------
def _stream(packets: list[bytes]) -> tuple[bytes, bool, bool, int]:
    (st,) = read_tcp_streams(_pcap(101, packets), PORT)
    return st.data, st.gap, st.syn_seen, st.packets


def test_a_stream_without_its_syn_starts_at_its_lowest_sequence_number() -> None:
    assert _stream([_up(500, payload=b"xyz")]) == (b"xyz", False, False, 1)
    # captured out of order: the first segment seen is not the first of the stream
    assert _stream([_up(503, payload=b"def"), _up(500, payload=b"abc"),
                    _up(506, payload=b"g")]) == (b"abcdefg", False, False, 3)
    # across the wrap of the 32-bit sequence numbers
    assert _stream([_up(0, payload=b"cd"), _up(0xFFFFFFFE, payload=b"ab")]) == (
        b"abcd", False, False, 2)


def test_a_segment_half_the_sequence_space_away_counts_as_before_the_first() -> None:
    # 2**31 bytes apart: the later-captured segment is taken as the earlier one, and the stream
    # stops at the hole after it
    assert _stream([_up(1000, payload=b"A"), _up(1000 + (1 << 31), payload=b"B")]) == (
        b"B", True, False, 2)
    assert _stream([_up(1000, payload=b"A"), _up(1000 + (1 << 31) - 1, payload=b"B")]) == (
        b"A", True, False, 2)


def test_with_its_syn_seen_a_stream_starts_after_it() -> None:
    # the first data segment was not captured: a hole at the start, nothing to show
    assert _stream([_up(99, SYN), _up(103, payload=b"def")]) == (b"", True, True, 2)
    # captured out of order after the SYN
    assert _stream([_up(99, SYN), _up(103, payload=b"def"), _up(100, payload=b"abc")]) == (
        b"abcdef", False, True, 3)
    # retransmissions, one of them overlapping the next segment
    assert _stream([_up(99, SYN), _up(100, payload=b"abc"), _up(100, payload=b"abc"),
                    _up(101, payload=b"bcde"), _up(103, payload=b"de")]) == (
        b"abcde", False, True, 5)


# -------------------------------------------------------------------------------------------------
# not a capture, cut short or corrupt
# -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("data", [b"", b"\x00\x00", bytes(30), b"not a capture at all, is it?"])
def test_data_that_is_no_capture_is_no_truncated_capture(data: bytes) -> None:
    with pytest.raises(PcapError) as ei:
        read_tcp_streams(data, PORT)
    assert type(ei.value) is PcapError
    assert str(ei.value).startswith("not a libpcap or pcapng capture: ")


@pytest.mark.parametrize(("data", "why"), [
    (b"", "it is empty"),
    (b"\x00\x00", "it starts with 0000, no capture file's magic"),
    (b"not a capture at all, is it?", "it starts with 6e6f7420, no capture file's magic"),
])
def test_data_that_is_no_capture_is_named_by_its_first_bytes(data: bytes, why: str) -> None:
    # the capture reader's own words ("got 0, 24 needed at least") named no fault a reader knows
    with pytest.raises(PcapError) as ei:
        read_tcp_streams(data, PORT)
    assert str(ei.value) == f"not a libpcap or pcapng capture: {why}"


def test_a_truncated_capture_starts_with_no_streams() -> None:
    e = CaptureTruncated(10, 0)
    assert (e.size, e.complete, e.streams) == (10, 0, [])


def _record_header_only(incl_len: int, snaplen: int = 65535) -> bytes:
    return _pcap(101, [], snaplen=snaplen) + struct.pack("<IIII", 1, 0, incl_len, incl_len)


def test_a_libpcap_record_header_at_the_very_end_is_judged_by_its_length() -> None:
    with pytest.raises(PcapError) as ei:
        read_tcp_streams(_record_header_only(300000), PORT)
    assert type(ei.value) is PcapError
    assert str(ei.value) == ("capture is corrupt: the packet record at byte 24 claims 300000 "
                             "bytes, more than the capture's snaplen 65535")
    with pytest.raises(PcapError) as ei:
        read_tcp_streams(_record_header_only(0x80000000), PORT)
    assert str(ei.value) == ("capture is corrupt: the packet record at byte 24 claims "
                             "2147483648 bytes, more than the capture's snaplen 65535")
    for incl_len, snaplen in ((262144, 65535), (300000, 0x80000000)):
        # libpcap's largest packet, and a length under a (large) snaplen: a cut
        with pytest.raises(CaptureTruncated) as ti:
            read_tcp_streams(_record_header_only(incl_len, snaplen), PORT)
        assert (ti.value.size, ti.value.complete) == (40, 24)


def _pcapng(tail: bytes = b"") -> tuple[bytes, int]:
    import dpkt

    buf = io.BytesIO()
    writer = dpkt.pcapng.Writer(buf, linktype=101)
    writer.writepkt(_up(100, payload=b"abc"), ts=1)
    return buf.getvalue() + tail, len(buf.getvalue())


def test_a_pcapng_block_header_at_the_very_end_is_judged_by_its_length() -> None:
    for length, corrupt in ((8, True), (0x80000000, True), (12, False), (16, False)):
        ng, end = _pcapng(struct.pack("<II", 6, length))
        if corrupt:
            with pytest.raises(PcapError) as ei:
                read_tcp_streams(ng, PORT)
            assert type(ei.value) is PcapError
            assert str(ei.value) == (
                f"capture is corrupt: the block at byte {end} claims a total length of {length} "
                "bytes (a block is 12 to 393248 bytes, a multiple of 4)")
        else:
            with pytest.raises(CaptureTruncated) as ti:
                read_tcp_streams(ng, PORT)
            assert (ti.value.size, ti.value.complete) == (end + 8, end)
            assert [st.data for st in ti.value.streams] == [b"abc"]


def test_a_pcapng_ending_in_a_block_of_12_bytes_is_whole() -> None:
    ng, _end = _pcapng(struct.pack("<III", 0x0BAD, 12, 12))
    assert [st.data for st in read_tcp_streams(ng, PORT)] == [b"abc"]


def test_the_watched_reader_notes_short_reads_and_seeks_as_asked() -> None:
    w = _Watched(b"abcdef")
    assert w.read(6) == b"abcdef" and not w.short
    assert w.read(1) == b"" and w.short
    assert w.seek(3) == 3 and not w.short
    assert w.read(2) == b"de"
    assert w.seek(-2, 2) == 4 and w.read() == b"ef" and not w.short
    assert w.read(0) == b"" and not w.short


# -------------------------------------------------------------------------------------------------
# arguments
# -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("port", [0, -1, 70000, "35863", 1.0, True, None])
def test_a_port_that_is_no_tcp_port_is_a_local_error_naming_it(port: object) -> None:
    # 0, -1, 70000 and '35863' returned [] (no stream has such a port)
    cap = _pcap(101, [_up(1, SYN), _up(2, payload=b"abc")])
    with pytest.raises(InvalidValue) as ei:
        read_tcp_streams(cap, port)  # type: ignore[arg-type]
    assert isinstance(ei.value, LocalProtocolError)
    assert str(ei.value) == (f"port = {port!r} is invalid: not a TCP port (a whole number in "
                             "1..65535)")
    assert (ei.value.error_id, ei.value.fields) == ("capture.bad_port",
                                                    {"field": "port", "value": port})
    assert read_tcp_streams(cap, np.uint16(PORT))[0].data == b"abc"


def test_data_that_is_not_the_capture_s_bytes_is_a_local_error_naming_it(
        tmp_path: Path) -> None:
    # a path gave a bare TypeError naming no argument
    path = tmp_path / "cap.pcap"
    path.write_bytes(_pcap(101, [_up(1, SYN), _up(2, payload=b"abc")]))
    for given in (str(path), path):
        with pytest.raises(InvalidValue) as ei:
            read_tcp_streams(given, PORT)  # type: ignore[arg-type]
        assert isinstance(ei.value, LocalProtocolError)
        assert str(ei.value) == (
            f"data must be the capture file's bytes (bytes or bytearray), got "
            f"{type(given).__name__} {str(given)!r}: read the file first, e.g. "
            f"Path({str(given)!r}).read_bytes()")
        assert (ei.value.error_id, ei.value.fields["field"]) == ("capture.bad_type", "data")
    with pytest.raises(InvalidValue) as ei:
        read_tcp_streams(None, PORT)  # type: ignore[arg-type]
    assert str(ei.value) == ("data must be the capture file's bytes (bytes or bytearray), got "
                             "None")
    assert read_tcp_streams(bytearray(path.read_bytes()), PORT)[0].data == b"abc"


# -------------------------------------------------------------------------------------------------
# packets cut short (their IP header claims more bytes than were captured)
# -------------------------------------------------------------------------------------------------
def _claims(ip: bytes, more: int) -> bytes:
    """``ip`` (IPv4) whose total length claims ``more`` bytes beyond those present: a packet
    cut short by the capture (caplen == len, as a capture of a cut copy records it)."""
    (total,) = struct.unpack_from(">H", ip, 2)
    return ip[:2] + struct.pack(">H", total + more) + ip[4:]


def _tcp_opts(sport: int, dport: int, seq: int, flags: int, payload: bytes = b"") -> bytes:
    """A TCP segment whose header carries 12 bytes of options (timestamps, as Linux sends)."""
    return struct.pack(">HHIIBBHHH", sport, dport, seq, 0, 8 << 4, flags, 65535, 0, 0) + bytes(
        [1, 1, 8, 10]) + bytes(8) + payload


def test_a_segment_cut_short_is_a_gap_after_the_bytes_captured() -> None:
    # its payload's first bytes were placed and the stream said nothing was missing
    assert _stream([_up(99, SYN), _claims(_up(100, payload=b"abcdef"), 10)]) == (
        b"abcdef", True, True, 2)
    # a later copy of the whole segment (a retransmission) fills it
    assert _stream([_up(99, SYN), _claims(_up(100, payload=b"abcdef"), 4),
                    _up(100, payload=b"abcdefghij"), _up(110, payload=b"k")]) == (
        b"abcdefghijk", False, True, 4)
    # the next segment after the cut one: the hole is the cut's
    assert _stream([_up(99, SYN), _claims(_up(100, payload=b"abc"), 3),
                    _up(106, payload=b"xyz")]) == (b"abc", True, True, 3)


def test_a_segment_cut_inside_its_tcp_header_is_a_gap() -> None:
    # caplen == len == 60 (Ethernet): the options were cut, so no payload byte was captured,
    # and the stream had no bytes and no gap
    syn = _eth(_up(99, SYN))
    for more in (100, 1):
        seg = _eth(_ip4("10.0.0.2", "10.0.0.1", _tcp_opts(40001, PORT, 100, PSH | ACK,
                                                         bytes(more))))
        cut = seg[:60]
        cut = cut[:16] + struct.pack(">H", len(seg) - 14) + cut[18:]  # the IP length: whole
        (st,) = read_tcp_streams(_pcap(1, [syn, cut]), PORT)
        assert (st.data, st.gap, st.packets) == (b"", True, 2), more
    # a segment that carries no payload (an ACK) cut inside its options loses nothing
    ack = _eth(_ip4("10.0.0.2", "10.0.0.1", _tcp_opts(40001, PORT, 100, ACK)))
    ack = ack[:60]
    (st,) = read_tcp_streams(_pcap(1, [syn, _eth(_up(100, payload=b"ab")), ack]), PORT)
    assert (st.data, st.gap) == (b"ab", False)
    # fewer than the 20 bytes of a TCP header: the port is read from its first 4 bytes
    short = _claims(_up(100, payload=b"abcdef")[:20 + 10], 16)
    (st,) = read_tcp_streams(_pcap(101, [_up(99, SYN), short]), PORT)
    assert (st.data, st.gap, st.packets) == (b"", True, 2)
    other = _claims(_ip4("10.0.0.2", "10.0.0.3", _tcp(40001, 80, 1, PSH | ACK, b"web"))[:30], 13)
    (st,) = read_tcp_streams(_pcap(101, [_up(99, SYN), other, _up(100, payload=b"a")]), PORT)
    assert (st.data, st.gap, st.packets) == (b"a", False, 2)  # another port's: skipped


def test_an_ipv6_segment_cut_short_is_a_gap() -> None:
    tcp = _tcp(40001, PORT, 7, PSH | ACK, b"v6v6")
    pkt = _ip6(1, 2, tcp)
    pkt = pkt[:4] + struct.pack(">H", len(tcp) + 8) + pkt[6:]
    (st,) = read_tcp_streams(_pcap(101, [pkt]), PORT)
    assert (st.data, st.gap) == (b"v6v6", True)


def test_a_zero_ip_length_is_not_a_cut() -> None:
    # segmentation offload: the IP total length is 0, the payload is what was captured
    seg = _up(100, payload=b"abcdef")
    seg = seg[:2] + b"\x00\x00" + seg[4:]
    assert _stream([_up(99, SYN), seg]) == (b"abcdef", False, True, 2)


# -------------------------------------------------------------------------------------------------
# several ports
# -------------------------------------------------------------------------------------------------
def _seg(src: tuple[str, int], dst: tuple[str, int], seq: int, flags: int,
         payload: bytes = b"") -> bytes:
    return _ip4(src[0], dst[0], _tcp(src[1], dst[1], seq, flags, payload))


#: a capture of four connections, their packets interleaved: a relay (its outgoing port 40001)
#: to the controller (PORT), a rank to the relay's port 7001, the relay from 7001 to the
#: controller, and a web connection on neither port
_RELAY, _CTRL, _RANK = ("10.0.0.2", 40001), ("10.0.0.1", PORT), ("10.0.0.3", 50000)
_RELAY_PORT, _WEB = ("10.0.0.2", 7001), (("10.0.0.9", 5555), ("10.0.0.1", 80))
_SEVERAL = [
    _seg(_RELAY, _CTRL, 10, SYN), _seg(_RANK, _RELAY_PORT, 20, SYN),
    _seg(_CTRL, _RELAY, 90, SYN | ACK), _seg(_RELAY_PORT, _CTRL, 30, SYN),
    _seg(*_WEB, 1, PSH | ACK, b"web"), _seg(_RELAY_PORT, _RANK, 80, SYN | ACK),
    _seg(_CTRL, _RELAY_PORT, 70, SYN | ACK),
    _seg(_RANK, _RELAY_PORT, 21, PSH | ACK, b"rank up"),
    _seg(_RELAY, _CTRL, 11, PSH | ACK, b"relay up"),
    _seg(_RELAY_PORT, _CTRL, 31, PSH | ACK, b"7001 up"),
    _seg(_CTRL, _RELAY, 91, PSH | ACK, b"relay down"),
    _seg(_CTRL, _RELAY_PORT, 71, PSH | ACK, b"7001 down"),
    _seg(_RELAY_PORT, _RANK, 81, PSH | ACK, b"rank down"),
]


def _port_by_port(data: bytes, ports: list[int]) -> list[tuple[str, bytes]]:
    """What several ports give, from one :func:`read_tcp_streams` per port: each port's streams
    less the connections an earlier port listed."""
    out: list[tuple[str, bytes]] = []
    for i, port in enumerate(ports):
        out += [(st.label, st.data) for st in read_tcp_streams(data, port)
                if not {int(end.rsplit(":", 1)[1]) for end in (st.src, st.dst)} & set(ports[:i])]
    return out


def test_several_ports_are_read_in_one_pass_each_port_s_streams_in_the_order_given(
        capture_reads: list[int]) -> None:
    cap = _pcap(101, _SEVERAL)
    got = read_tcp_streams_of_ports(cap, [7001, PORT, 7001])
    assert capture_reads == [len(cap)]
    assert [(st.label, st.data) for st in got] == [  # in each port, the capture's order
        ("10.0.0.3:50000 -> 10.0.0.2:7001", b"rank up"),
        ("10.0.0.2:7001 -> 10.0.0.1:1337", b"7001 up"),  # the connection of both ports: once
        ("10.0.0.2:7001 -> 10.0.0.3:50000", b"rank down"),
        ("10.0.0.1:1337 -> 10.0.0.2:7001", b"7001 down"),
        ("10.0.0.2:40001 -> 10.0.0.1:1337", b"relay up"),
        ("10.0.0.1:1337 -> 10.0.0.2:40001", b"relay down")]
    assert all(st.syn_seen and not st.gap and st.packets == 2 for st in got)
    for ports in ([7001, PORT], [PORT, 7001], [PORT], [80, 9, PORT], [9]):
        assert [(st.label, st.data) for st in read_tcp_streams_of_ports(cap, ports)] == (
            _port_by_port(cap, ports)), ports
    assert read_tcp_streams_of_ports(cap, []) == []
    assert [st.data for st in read_tcp_streams_of_ports(cap, (np.uint16(80),))] == [b"web"]


def test_several_ports_of_a_capture_cut_short_carry_their_streams_in_port_order() -> None:
    cap = _pcap(101, _SEVERAL)
    cut = len(cap) - 5  # inside the last record (the rank's "rank down")
    with pytest.raises(CaptureTruncated) as ei:
        read_tcp_streams_of_ports(cap[:cut], [7001, PORT])
    assert [(st.label, st.data) for st in ei.value.streams] == [
        ("10.0.0.3:50000 -> 10.0.0.2:7001", b"rank up"),
        ("10.0.0.2:7001 -> 10.0.0.1:1337", b"7001 up"),
        ("10.0.0.2:7001 -> 10.0.0.3:50000", b""),
        ("10.0.0.1:1337 -> 10.0.0.2:7001", b"7001 down"),
        ("10.0.0.2:40001 -> 10.0.0.1:1337", b"relay up"),
        ("10.0.0.1:1337 -> 10.0.0.2:40001", b"relay down")]


@pytest.mark.parametrize(("ports", "bad"), [([PORT, 0], 0), ([PORT, "7001"], "7001"),
                                           ([True], True), ((7001, 1.0), 1.0)])
def test_ports_that_are_no_tcp_ports_are_a_local_error_naming_the_value(
        ports: object, bad: object) -> None:
    with pytest.raises(InvalidValue) as ei:
        read_tcp_streams_of_ports(_pcap(101, _SEVERAL), ports)  # type: ignore[arg-type]
    assert isinstance(ei.value, LocalProtocolError)
    assert (ei.value.error_id, ei.value.fields) == ("capture.bad_port",
                                                    {"field": "port", "value": bad})
    assert str(ei.value) == (f"port = {bad!r} is invalid: not a TCP port (a whole number in "
                             "1..65535)")


@pytest.mark.parametrize(("ports", "got"), [("1337", "str"), (b"\x05", "bytes"),
                                           (1337, "int"), (None, "None")])
def test_ports_that_are_no_collection_of_ports_are_a_local_error_naming_the_type(
        ports: object, got: str) -> None:
    # text would be read a character a port, and a bare port is no iterable: both name the type
    with pytest.raises(InvalidValue) as ei:
        read_tcp_streams_of_ports(_pcap(101, _SEVERAL), ports)  # type: ignore[arg-type]
    assert isinstance(ei.value, LocalProtocolError)
    assert ei.value.error_id == "capture.bad_type"
    assert str(ei.value) == ("ports must be an iterable of TCP ports (e.g. a list of ints), got "
                             f"{got}")
    with pytest.raises(InvalidValue) as ei:
        read_tcp_streams_of_ports("cap.pcap", [PORT])  # type: ignore[arg-type]
    assert ei.value.error_id == "capture.bad_type"
