"""``docs/decode.md`` names every field of the records ``decode --format json`` prints and
``decode_stream`` returns, each under its record type, and no field they do not hold.

The records come from streams of every leg, both protocol versions, with and without a salt and
``values``, and from the inputs that add a record's optional fields (leniencies, notes, a long
Data payload, each way a stream ends); ``stream`` from ``decode --pcap``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flodl_proto.cli import main
from flodl_proto.codec import (
    Dtype,
    Hello,
    MuxRecord,
    RecordKind,
    RoundFrame,
    RoundKind,
    TensorPayload,
    encode_channel_magic,
    encode_handshake,
    encode_len_framed,
    encode_mux_record_bytes,
    encode_mux_record_parts,
    encode_round_frame,
    encode_round_frame_bytes,
)
from flodl_proto.decode import DecodeReport, Leg, decode_stream

from .test_decode import BUILDERS, SALT, _capture, _frames, _mux_down, _mux_up

DOC = Path(__file__).resolve().parent.parent / "docs" / "decode.md"

#: the doc's section of each level of a record, by its heading
EVERY, FRAME, TENSOR, CONTROL, LAST = ("Every record", "Frame", "Tensor", "Control message",
                                       "The last record of a stream")


def _documented() -> dict[str, set[str]]:
    """The fields each section's table names in its first column (``min``, ``max``, ``mean``
    share a row), by heading (a record type's heading is its type in backticks)."""
    out: dict[str, set[str]] = {}
    heading = ""
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if m := re.match(r"#{2,3} (.+)", line):
            heading = m[1].strip("`")
        elif m := re.match(r"\| (`[^|]+`) \|", line):
            out.setdefault(heading, set()).update(re.findall(r"`(\w+)`", m[1]))
    return out


def _streams() -> Iterator[tuple[bytes, Leg, dict[str, Any]]]:
    """(data, leg, decode_stream's keywords) of every input the records are taken from."""
    for leg, build in BUILDERS.values():
        for version in (2, 3):
            for salt in (SALT, None):
                for values in (False, True):
                    yield (build(version).data, leg,
                           {"salt": salt, "version": version, "values": values})
    frame = _frames(2)[0]
    # a HostFrame with a rank field and bytes after its frame (both ignored by the reader)
    payload = [*encode_round_frame(frame, SALT), b"\xaa\xbb"]
    yield (b"".join(encode_mux_record_parts(RecordKind.HOST_FRAME, 9, payload, SALT)), "mux",
           {"salt": SALT})
    # a version 3 Hello read as version 2: a trailing byte and a note
    yield (encode_channel_magic("data") + encode_mux_record_bytes(
        MuxRecord.control_msg(Hello("h", [0]), 3), SALT), "mux", {"version": 2})
    # a Data record longer than the preview, shown cut and whole
    data = encode_mux_record_bytes(MuxRecord.data(5, bytes(range(100))), SALT)
    yield data, "mux", {}
    yield data, "mux", {"values": True}
    # a rank not below the world size; tensors whose elements cannot be read; bytes after a
    # rank's frame inside its length prefix
    odd = RoundFrame(RoundKind.MODEL, 0.0, [
        TensorPayload(7, [2], bytes(8)), TensorPayload(Dtype.F32, [3], bytes(8)),
        TensorPayload(Dtype.F32, [4], b"")], check_nbytes=False)
    blob = [encode_round_frame_bytes(odd, SALT), b"\x01\x02"]
    for values in (False, True):
        yield (encode_handshake(5, 4, 2) + b"".join(encode_len_framed(blob)), "loopback",
               {"salt": SALT, "values": values})
    # bare frames; and each way a stream ends: a bad tag, a cut, a protocol error
    bare = encode_round_frame_bytes(frame, SALT)
    yield bare, "frame", {"salt": SALT}
    yield bare, "frame", {"salt": bytes(16)}
    yield bare[:-3], "frame", {}
    yield b"\x00" * 8 + bare, "frame", {}


def _records() -> Iterator[tuple[dict[str, Any], bool]]:
    """Every record of every stream, with True for a stream's last one."""
    for data, leg, kw in _streams():
        report: DecodeReport = decode_stream(data, leg, **kw)
        for rec in report.records:
            yield rec, False
        yield report.final_record(), True


def _emitted() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}

    def add(section: str, keys: Any) -> None:
        out.setdefault(section, set()).update(keys)

    for rec, last in _records():
        if last:
            add(LAST, rec)
            continue
        add(EVERY, ("offset", "length", "type"))
        add(rec["type"], set(rec) - {"offset", "length", "type"})
        if "frame" in rec:
            add(FRAME, rec["frame"])
            for t in rec["frame"]["tensors"]:
                add(TENSOR, t)
        if "control" in rec:
            add(CONTROL, rec["control"])
    return out


def test_the_doc_names_every_field_of_every_record_and_no_other() -> None:
    emitted, documented = _emitted(), _documented()
    emitted[EVERY].add("stream")  # decode --pcap's (test_pcap_records_name_their_stream)
    assert set(emitted) <= set(documented), sorted(set(emitted) - set(documented))
    for section, keys in emitted.items():
        assert keys == documented[section], (section, sorted(keys ^ documented[section]))
    assert set(documented) == set(emitted), sorted(set(documented) - set(emitted))


def test_the_doc_names_every_way_a_stream_ends() -> None:
    row = next(ln for ln in DOC.read_text(encoding="utf-8").split(f"## {LAST}")[1].splitlines()
               if ln.startswith("| `type` |"))
    ends = {rec["type"] for rec, last in _records() if last}
    assert ends == {"end", "capture_ended", "error"}
    assert all(f"`{t}`" in row for t in ends), row


def test_pcap_records_name_their_stream(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    cap = tmp_path / "cap.pcap"
    cap.write_bytes(_capture(_mux_up(2).data, _mux_down(2).data, 1337))
    assert main(["decode", "--pcap", str(cap), "--port", "1337"]) == 0
    lines = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert {ln["stream"] for ln in lines} == {"10.0.0.2:40001 -> 10.0.0.1:1337",
                                              "10.0.0.1:1337 -> 10.0.0.2:40001"}


def test_the_doc_s_script_runs() -> None:
    text = DOC.read_text(encoding="utf-8")
    m = re.search(r"^## From a script\n+```python\n(.*?)^```$", text, re.S | re.M)
    assert m is not None
    printed: list[tuple[Any, ...]] = []
    glob = {"data": _mux_up(2).data, "salt": SALT,
            "print": lambda *a: printed.append(a)}
    exec(compile(m[1], str(DOC), "exec"), glob)
    assert printed[0] == ("channel_magic", None)
    assert printed[2] == ("mux_record", "ok")
    assert printed[-1] == ({"type": "end", "offset": len(glob["data"]), "records": 6,
                            "bad_tags": 0}, 0)
    assert len(printed) == 7


def test_the_doc_s_tag_check_by_hand_runs() -> None:
    """The doc named ``ParsedFrame.covered`` as what ``tag_status`` takes (``tag_status(salt,
    covered, carried)``, "a list of buffers"), but it is the number of bytes the tag covers: a
    script that passed it got ``pieces must be an iterable of bytes-like pieces (one buffer:
    pass [data]), got int``; the doc's second block checks each HostFrame's tag by hand."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## From a script\n", 1)[1]
    blocks = re.findall(r"^```python\n(.*?)^```$", section, re.S | re.M)
    assert len(blocks) == 2, blocks
    assert "[frame[:pf.covered]]" in blocks[1]

    def run(salt: bytes) -> list[tuple[Any, ...]]:
        printed: list[tuple[Any, ...]] = []
        glob = {"data": _mux_up(2).data, "salt": salt, "print": lambda *a: printed.append(a)}
        exec(compile(blocks[1], str(DOC), "exec"), glob)
        return printed

    weights = [f.weight for f in _frames(2)]
    assert len(weights) >= 2
    assert run(SALT) == [(w, "ok") for w in weights]
    assert run(bytes(16)) == [(w, "bad") for w in weights]
