"""The Wireshark dissector without TCP reassembly on a capture of a lossy network: segments
lost before the capture point and sent again, captured after the ones that follow them
(``tshark`` marker)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from flodl_proto import ControlMessage
from flodl_proto.codec import (
    Hello,
    MuxRecord,
    RankExit,
    RecordKind,
    RoundFrame,
    RoundKind,
    TensorPayload,
    encode_channel_magic,
    encode_frame_record,
    encode_mux_record_bytes,
)
from flodl_proto.dissector import PROTO_NAME, render_dissector

from .pcap_writer import Capture

SALT = bytes(16)
PORT = 23456
SEG = 1000


def _control(msg: ControlMessage) -> bytes:
    return encode_mux_record_bytes(MuxRecord.control_msg(msg, version=2), SALT)


def _lossy_capture(order: list[int]) -> tuple[Capture, int]:
    """A relay's connection whose HostFrame (20 KiB, in segments of 1000 bytes) is captured in
    ``order`` (indices of its segments; one missing from it is a segment the capture never
    saw), then a RankExit. Returns the capture and the number of HostFrame segments."""
    frame = RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload.from_array(
        np.arange(5000, dtype=np.float32))])
    cap = Capture()
    mux = cap.connect(("10.0.0.2", 40001), ("10.0.0.1", PORT))
    cap.send(mux, True, encode_channel_magic("data") + _control(Hello("h", [0, 1])))
    first = len(cap.packets)
    cap.send(mux, True, b"".join(encode_frame_record(RecordKind.HOST_FRAME, frame, SALT)),
             (SEG,))
    segments = cap.packets[first:]
    del cap.packets[first:]
    cap.packets += [segments[i] for i in order]
    cap.send(mux, True, _control(RankExit(1)))
    cap.close(mux)
    return cap, len(segments)


@pytest.fixture(scope="module")
def lua(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("lua") / "flodl_proto.lua"
    path.write_text(render_dissector(), encoding="utf-8")
    return path


def _info(pcap: Path, lua: Path, *args: str) -> list[str]:
    res = subprocess.run(["tshark", "-n", "-r", str(pcap), "-X", f"lua_script:{lua}",
                          "-o", f"{PROTO_NAME}.ports:{PORT}",
                          "-o", "tcp.desegment_tcp_streams:FALSE",
                          "-o", "tcp.no_subdissector_on_error:FALSE", *args,
                          "-Y", PROTO_NAME, "-T", "fields", "-e", "_ws.col.Info"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0 and "Lua" not in res.stderr, res.stderr
    return [re.sub(r"^(\[TCP [^]]*\] )*", "", line) for line in res.stdout.splitlines()]


@pytest.mark.tshark
@pytest.mark.parametrize("passes", [(), ("-2",)])
def test_a_segment_captured_late_inside_a_gap_continues_its_record(
        passes: tuple[str, ...], lua: Path, tmp_path: Path) -> None:
    """Two segments of a record lost on the way (5 and 6), the one after them captured (7),
    then 6 sent again, still before 5: 6 was taken for bytes that start no record (``[no
    record start]``), the state at its sequence number being unknown; it is placed from the
    state known where it ends (7's start), inside the record, as 5 and the second 6 are. A
    network-lab capture at 2 % loss showed 2 such segments among its 2,634 retransmitted or out
    of order."""
    cap, n = _lossy_capture([0, 1, 2, 3, 4, 7, 6, 5, 6, *range(8, 21)])
    assert n == 21
    pcap = tmp_path / "lossy.pcap"
    pcap.write_bytes(cap.pcap())
    cont = "[continuation of HostFrame]"
    assert _info(pcap, lua, *passes) == [
        "ChannelMagic data relay→ctl | Control Hello relay→ctl host h ranks [0,1]",
        "HostFrame relay→ctl ranks [0,1] (continues)",
        *[cont] * 4,  # 1 to 4
        cont, cont, cont, cont,  # 7, then 6 captured late, 5 and 6 sent again
        *[cont] * 13,  # 8 to 20, the record's end
        "Control RankExit relay→ctl rank 1"]


