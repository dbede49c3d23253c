"""Write libpcap captures of TCP connections from known byte streams (for the tshark tests).

A :class:`Capture` holds TCP connections; each gets a SYN / SYN-ACK and its two directions'
bytes cut into segments at the sizes given (so records straddle segments and several records
share one). Packets of different connections and directions interleave in the order the caller
adds the data.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

SYN, ACK, PSH, FIN = 0x02, 0x10, 0x08, 0x01


def _ip4(a: str) -> bytes:
    return bytes(int(x) for x in a.split("."))


def tcp_packet(src: tuple[str, int], dst: tuple[str, int], seq: int, ack: int, flags: int,
               payload: bytes = b"") -> bytes:
    """One Ethernet/IPv4/TCP frame (checksums left 0: Wireshark does not check them)."""
    tcp = struct.pack(">HHIIBBHHH", src[1], dst[1], seq & 0xFFFFFFFF, ack & 0xFFFFFFFF, 5 << 4,
                      flags, 65535, 0, 0) + payload
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0x4000, 64, 6, 0,
                     _ip4(src[0]), _ip4(dst[0])) + tcp
    return b"\x02\x00\x00\x00\x00\x02" + b"\x02\x00\x00\x00\x00\x01" + b"\x08\x00" + ip


def pcap_file(packets: Iterable[bytes], snaplen: int = 262144) -> bytes:
    """A libpcap file (Ethernet link type) of ``packets``, one second apart; a packet longer than
    ``snaplen`` is cut to it (its captured length), as ``tcpdump -s N`` cuts it, and keeps its
    length on the wire."""
    out = bytearray(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, snaplen, 1))
    for i, p in enumerate(packets):
        kept = p[:snaplen]
        out += struct.pack("<IIII", 1_700_000_000 + i, 0, len(kept), len(p)) + kept
    return bytes(out)


def cut(data: bytes, sizes: Sequence[int]) -> list[bytes]:
    """Split ``data`` into pieces of the given sizes, cycling through them."""
    out, pos, k = [], 0, 0
    while pos < len(data):
        n = sizes[k % len(sizes)]
        out.append(data[pos:pos + n])
        pos += n
        k += 1
    return out


@dataclass
class Connection:
    """One TCP connection: client -> server and server -> client sequence numbers."""

    client: tuple[str, int]
    server: tuple[str, int]
    seq_c: int = 1000
    seq_s: int = 5000
    packets: list[bytes] = field(default_factory=list)

    def label(self, from_client: bool) -> str:
        """``"ip:port -> ip:port"`` of one direction (the form ``decode --pcap`` prints)."""
        a, b = (self.client, self.server) if from_client else (self.server, self.client)
        return f"{a[0]}:{a[1]} -> {b[0]}:{b[1]}"


class Capture:
    """Builds a capture of several TCP connections."""

    def __init__(self) -> None:
        self.packets: list[bytes] = []

    def connect(self, client: tuple[str, int], server: tuple[str, int],
                isn: tuple[int, int] = (1000, 5000)) -> Connection:
        """Open a connection (SYN, SYN-ACK, ACK); ``isn``: the client's and the server's initial
        sequence numbers."""
        c = Connection(client, server, *isn)
        self.packets.append(tcp_packet(client, server, c.seq_c, 0, SYN))
        self.packets.append(tcp_packet(server, client, c.seq_s, c.seq_c + 1, SYN | ACK))
        c.seq_c += 1
        c.seq_s += 1
        self.packets.append(tcp_packet(client, server, c.seq_c, c.seq_s, ACK))
        return c

    def send(self, c: Connection, from_client: bool, data: bytes,
             sizes: Sequence[int] = (1460,)) -> None:
        """Send ``data`` in one direction, cut into segments of ``sizes`` (cycled)."""
        for piece in cut(data, sizes):
            if from_client:
                self.packets.append(tcp_packet(c.client, c.server, c.seq_c, c.seq_s,
                                               PSH | ACK, piece))
                c.seq_c += len(piece)
            else:
                self.packets.append(tcp_packet(c.server, c.client, c.seq_s, c.seq_c,
                                               PSH | ACK, piece))
                c.seq_s += len(piece)

    def resend(self, index: int) -> None:
        """Capture the packet at ``index`` again (a TCP retransmission: the same sequence number
        and bytes)."""
        self.packets.append(self.packets[index])

    def close(self, c: Connection) -> None:
        """FIN from both ends."""
        self.packets.append(tcp_packet(c.client, c.server, c.seq_c, c.seq_s, FIN | ACK))
        self.packets.append(tcp_packet(c.server, c.client, c.seq_s, c.seq_c + 1, FIN | ACK))

    def pcap(self, snaplen: int = 262144) -> bytes:
        """The capture as a libpcap file (packets cut to ``snaplen``: :func:`pcap_file`)."""
        return pcap_file(self.packets, snaplen)
