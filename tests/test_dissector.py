"""The Wireshark dissector generated from the spec, checked against ``flodl-proto decode``.

Without tshark: the generator writes a dissector whose tables come from ``spec/wire.yaml`` (a
changed spec changes them), whose runtime holds no per-field code, and whose filter-field table
in ``docs/wireshark.md`` is current.

With tshark (``tshark`` marker; deselected with a printed reason when absent): captures built
from every golden vector of both versions, hand-built streams cut at awkward places, a malformed
capture, and (``capture`` marker: root) a real ``demo`` run recorded with tcpdump are dissected
with ``tshark -X lua_script:...``; record for record, tshark and ``flodl-proto decode --pcap``
must list the same kind, ranks, weight, tensor dtypes, shapes and nbytes.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import shutil
import struct
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import yaml

from flodl_proto.cli import main
from flodl_proto.codec import (
    DeclareDead,
    Dtype,
    Hello,
    HelloAck,
    MuxRecord,
    RankExit,
    RecordKind,
    RoundFrame,
    RoundKind,
    TensorPayload,
    decode_control,
    encode_ack,
    encode_channel_magic,
    encode_control,
    encode_frame_record,
    encode_framed_round,
    encode_handshake,
    encode_mux_record_bytes,
    encode_mux_record_parts,
)
from flodl_proto.dissector import (
    PROTO_NAME,
    default_ports,
    filter_fields,
    filter_fields_markdown,
    render_dissector,
)
from flodl_proto.errors import ProtocolError, shown
from flodl_proto.spec import SPEC, Spec

from .conftest import ROOT, vectors_root
from .pcap_writer import Capture, Connection, pcap_file

SALT = bytes.fromhex("5a17c0de429901fe3c88b70d6e21f493")
RUNTIME = ROOT / "flodl_proto" / "_dissector_runtime.lua"
DOC = ROOT / "docs" / "wireshark.md"
MUX_PORT, LOOP_PORT = 20000, 20004  # registered with the ports preference in the vector runs
KIND_NAMES = {code: "".join(p.capitalize() for p in name.split("_"))
              for name, code in SPEC.enum("RecordKind").items()}
VARIANTS = {code: name for name, code in SPEC.enum("ControlVariant").items()}


# -------------------------------------------------------------------------------------------------
# Without tshark
# -------------------------------------------------------------------------------------------------
def test_cli_writes_the_dissector(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "f.lua"
    assert main(["dissector", "--out", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert text == render_dissector()
    assert f'ports = "{",".join(map(str, default_ports()))}"' in text
    assert default_ports() == [1337, 1341]
    assert main(["dissector", "--out", str(out), "--port", "9000", "--port", "9004"]) == 0
    assert 'ports = "9000,9004"' in out.read_text(encoding="utf-8")
    assert main(["dissector", "--out", "-"]) == 0
    assert capsys.readouterr().out.endswith(RUNTIME.read_text(encoding="utf-8"))
    with pytest.raises(SystemExit) as e:
        main(["dissector", "--port", "70000"])
    assert e.value.code == 2
    capsys.readouterr()
    nested = tmp_path / "plugins" / "lua" / "f.lua"  # missing parents are created
    assert main(["dissector", "--out", str(nested)]) == 0
    assert nested.read_text(encoding="utf-8") == render_dissector()
    size = len(render_dissector().encode("utf-8"))
    assert capsys.readouterr() == (f"{shown(str(nested))}: written ({size} bytes)\n", "")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    # a file where a folder of the path should be, at any level: the command line's (exit 2,
    # one line), found before the dissector is generated, where it was found as it was written
    # (exit 1)
    from flodl_proto.errors import shown_name

    from .cli_util import run_main

    for under in (blocker / "f.lua", blocker / "sub" / "f.lua"):
        assert run_main(capsys, "dissector", "--out", str(under)) == (
            2, "", f"flodl-proto dissector: error: argument --out: {shown(str(under))}: Not a "
            f"directory ({shown_name(str(blocker))} is a file, not a folder)\n")
    assert blocker.read_text() == "not a folder"


def test_out_naming_a_folder_is_a_usage_error_with_or_without_its_slash(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--out DIR/`` was refused with the command line (exit 2) but ``--out DIR``, a folder
    that exists, only as the file was written (exit 1, other words): both are the command
    line's, in the same words, and nothing is written."""
    from flodl_proto.errors import shown

    from .cli_util import run_main

    for out, why in ((str(tmp_path), "an existing one"), (f"{tmp_path}/", "it ends with /")):
        assert run_main(capsys, "dissector", "--out", out) == (
            2, "", f"flodl-proto dissector: error: argument --out: {shown(out)} names a folder "
            f"({why}); give a file path in it\n")
    assert list(tmp_path.iterdir()) == []


def test_out_whose_folder_cannot_be_created_names_that_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--out /sys/kernel/x/y.lua`` said ``Operation not permitted`` as if of the file; the
    folder the system refused is named, as the temporary-file and rename steps are."""
    import errno
    import os

    from flodl_proto.errors import shown, shown_name

    real_mkdir = os.mkdir

    def not_permitted(path: Any, mode: int = 0o777) -> None:
        if Path(path) == tmp_path / "kernel" / "x":
            raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), path)
        real_mkdir(path, mode)

    monkeypatch.setattr(os, "mkdir", not_permitted)
    out = tmp_path / "kernel" / "x" / "y.lua"
    assert main(["dissector", "--out", str(out)]) == 1
    assert capsys.readouterr() == (
        "", f"flodl-proto dissector: error: cannot write {shown(str(out))}: creating the "
        f"folder {shown_name(str(tmp_path / 'kernel' / 'x'))}: Operation not permitted\n")


def test_tables_come_from_the_spec(tmp_path: Path) -> None:
    text = render_dissector()
    for name, value in SPEC.constants.items():
        assert re.search(rf"\b{name} = {value:#X}\b".replace("0X", "0x"), text) or \
            f"{name} = {value}," in text, name
    # a changed spec gives a changed dissector: move the mux magic and rename a Hello field
    raw = yaml.safe_load((SPEC.path / "wire.yaml").read_text(encoding="utf-8"))
    raw["constants"]["MUX_RECORD_MAGIC"]["value"] = 0xF10D17D9
    raw["messages"]["relay_control_msg"]["variants"][0]["fields"][0]["name"] = "hostname"
    (tmp_path / "wire.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    shutil.copy(SPEC.path / "lifecycle.yaml", tmp_path / "lifecycle.yaml")
    changed = render_dissector(spec=Spec(tmp_path))
    assert "MUX_RECORD_MAGIC = 0xF10D17D9" in changed
    assert "MUX_RECORD_MAGIC = 0xF10D17D0" in text
    assert f'"{PROTO_NAME}.relay_control_msg.hostname"' in changed
    assert f'"{PROTO_NAME}.relay_control_msg.hostname"' not in text


def test_every_wire_field_is_a_filter_field_and_the_runtime_names_none() -> None:
    abbrevs = {f.abbrev for f in filter_fields()}
    msgs = SPEC.raw["messages"]
    wire: list[str] = []
    for m in ("channel_magic", "handshake", "handshake_ack", "len_framed", "mux_record"):
        wire += [f"{PROTO_NAME}.{m}.{f['name']}" for f in msgs[m]["fields"]]
    for part in msgs["round_frame"]["parts"]:
        wire += [f"{PROTO_NAME}.round_frame.{f['name']}" for f in part["fields"]]
    for var in msgs["relay_control_msg"]["variants"]:
        wire += [f"{PROTO_NAME}.relay_control_msg.{f['name']}" for f in var["fields"]]
    assert set(wire) <= abbrevs
    runtime = RUNTIME.read_text(encoding="utf-8")
    for abbrev in wire:  # no per-field code: the runtime reaches wire fields only via the tables
        assert abbrev not in runtime and abbrev.split(".", 1)[1] not in runtime, abbrev


#: functions of Lua 5.2 (Wireshark 4.0's Lua) that Lua 5.4 (newer Wireshark releases') no longer
#: has: a dissector calling one fails there with "attempt to call a nil value"
LUA_54_REMOVED = ("math.frexp", "math.ldexp", "math.pow", "math.cosh", "math.sinh", "math.tanh",
                  "math.log10", "table.getn", "table.maxn", "loadstring", "setfenv", "getfenv",
                  "string.gfind", "math.mod", "unpack(")


def test_the_runtime_calls_nothing_lua_5_4_lacks() -> None:
    """The runtime found a number's exponent with math.frexp, which Lua 5.4 does not have."""
    code = "\n".join(line.split("--", 1)[0] for line in
                     RUNTIME.read_text(encoding="utf-8").splitlines())
    used = [name for name in LUA_54_REMOVED
            if re.search(r"(?<![\w.:])" + re.escape(name), code)]
    assert used == []


def test_docs_field_table_is_current() -> None:
    text = DOC.read_text(encoding="utf-8")
    begin, end = "<!-- fields: begin -->\n", "<!-- fields: end -->"
    assert text[text.index(begin) + len(begin):text.index(end)] == filter_fields_markdown(), \
        "docs/wireshark.md: regenerate the table with flodl_proto.dissector.filter_fields_markdown"


# -------------------------------------------------------------------------------------------------
# tshark plumbing
# -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lua(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The generated dissector, checked to load into tshark (Lua enabled, also as root)."""
    path = tmp_path_factory.mktemp("lua") / "flodl_proto.lua"
    path.write_text(render_dissector(), encoding="utf-8")
    res = subprocess.run(["tshark", "-G", "protocols", "-X", f"lua_script:{path}"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert f"\t{PROTO_NAME}\n" in res.stdout or res.stdout.rstrip().endswith(f"\t{PROTO_NAME}"), (
        "tshark did not load the Lua dissector; check that Lua is enabled (enable_lua and, as "
        "root, run_user_scripts_when_superuser in /usr/share/wireshark/init.lua)\n" + res.stderr)
    return path


def _tshark(pcap: Path, lua: Path, prefs: dict[str, str], *args: str) -> str:
    # a host can capture one connection's segments out of sequence order (docs/wireshark.md);
    # decode orders them itself, so tshark is asked to as well
    cmd = ["tshark", "-n", "-r", str(pcap), "-X", f"lua_script:{lua}",
           "-o", "tcp.reassemble_out_of_order:TRUE"]
    for k, v in prefs.items():
        cmd += ["-o", f"{k}:{v}"]
    res = subprocess.run([*cmd, *args], capture_output=True, text=True, errors="replace",
                         timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    assert "Lua: Error" not in res.stderr and "Error during loading" not in res.stderr, res.stderr
    return res.stdout


Pairs = list[tuple[str, Any]]


def _get(pairs: Pairs, key: str, default: Any = None) -> Any:
    return next((v for k, v in pairs if k == key), default)


def _all(pairs: Pairs, key: str) -> list[Any]:
    return [v for k, v in pairs if k == key]


def _find_tree(pairs: Pairs, key: str) -> Pairs | None:
    """The first (depth-first) sub-tree holding ``key``."""
    if any(k == key for k, _ in pairs):
        return pairs
    for _, v in pairs:
        if isinstance(v, list):
            hit = _find_tree(v, key)
            if hit is not None:
                return hit
    return None


def _experts(pairs: Pairs) -> list[str]:
    out: list[str] = []
    for k, v in pairs:
        if k == "_ws.expert" and isinstance(v, list):
            out += [x for x, _ in v if x.startswith(f"{PROTO_NAME}.expert.")]
        elif isinstance(v, list):
            out += _experts(v)
    return out


def _num(v: Any, conv: Any = int) -> Any:
    return None if v is None else conv(v)


def _t_frame(ft: Pairs) -> dict[str, Any]:
    """A RoundFrame from tshark's tree (None for fields a malformed frame does not reach)."""
    p = f"{PROTO_NAME}.round_frame."
    tensors = []
    for t in _all(ft, p + "tensor_tree"):
        # the shape (every dim; the tree shows the first 16 as fields), else a cut tensor's dims
        shape = _get(t, p + "shape")
        dims = json.loads(shape) if shape else [int(d) for d in _all(t, p + "dim")]
        tensors.append((_num(_get(t, p + "dtype")), dims, _num(_get(t, p + "nbytes"))))
    return {"kind": _num(_get(ft, p + "kind")), "weight": _get(ft, p + "weight"),
            "tensors": tensors}


def _t_record(rec: Pairs) -> dict[str, Any]:
    p = f"{PROTO_NAME}."
    cont, skipped = _get(rec, p + "continuation"), _get(rec, p + "skipped")
    uncaptured = _get(rec, p + "uncaptured")
    if cont is not None:  # not a record: the bytes of one begun in an earlier segment
        return {"continuation": cont}
    if skipped is not None:  # not a record: bytes that start none
        return {"skipped": int(skipped)}
    if uncaptured is not None:  # not a record: a segment's bytes the capture did not keep
        return {"uncaptured": int(uncaptured)}
    kind = _get(rec, p + "kind")
    out: dict[str, Any] = {"kind": kind, "ranks": [int(r) for r in _all(rec, p + "rank")]}
    if kind == "Handshake":
        out.update(rank=_num(_get(rec, p + "handshake.rank")),
                   world_size=_num(_get(rec, p + "handshake.world_size")),
                   version=_num(_get(rec, p + "handshake.version")))
    elif kind == "HandshakeAck":
        out["version"] = _num(_get(rec, p + "handshake_ack.version"))
    elif kind == "Data":
        out["rank"] = _num(_get(rec, p + "mux_record.rank"))
    elif kind == "Control":
        ct = _find_tree(rec, p + "relay_control_msg.variant") or []
        out["variant"] = VARIANTS.get(int(_get(ct, p + "relay_control_msg.variant", -1)))
        for name in ("host", "rank"):
            v = _get(ct, f"{p}relay_control_msg.{name}")
            if v is not None:
                out[name] = int(v) if name == "rank" else v
        if out["variant"] == "Hello":
            out["hello_ranks"] = [int(r) for r in _all(ct, p + "relay_control_msg.ranks")]
    ft = _find_tree(rec, p + "round_frame.magic")
    if ft is not None and kind in ("HostFrame", "Broadcast", "LenFramed"):
        out["frame"] = _t_frame(ft)
    return out


def tshark_records(pcap: Path, lua: Path, prefs: dict[str, str]
                   ) -> dict[str, list[tuple[dict[str, Any], list[str]]]]:
    """tshark's records per TCP direction (``"ip:port -> ip:port"``), with their expert ids."""
    return tshark_records_args(pcap, lua, prefs)


def _info_column(pcap: Path, lua: Path, prefs: dict[str, str], *args: str) -> list[str]:
    """The Info column of each packet tshark (run with ``args``) gives to the dissector."""
    lines = _tshark(pcap, lua, prefs, *args, "-T", "fields", "-e", "_ws.col.Protocol",
                    "-e", "_ws.col.Info").splitlines()
    return [line.split("\t", 1)[1] for line in lines if line.startswith(PROTO_NAME + "\t")]


def tshark_records_args(pcap: Path, lua: Path, prefs: dict[str, str], *args: str
                        ) -> dict[str, list[tuple[dict[str, Any], list[str]]]]:
    """:func:`tshark_records` of a tshark run given ``args`` too (e.g. ``-2``, two passes); one
    run gives each packet's records and, from its IP and TCP layers, its direction."""
    text = _tshark(pcap, lua, prefs, *args, "-Y", PROTO_NAME, "-T", "json", "-J",
                   f"{PROTO_NAME} ip tcp")
    assert "Lua Error" not in text, text[max(0, text.index("Lua Error") - 2000):][:4000]
    packets = json.loads(text, object_pairs_hook=list) if text.strip() else []
    out: dict[str, list[tuple[dict[str, Any], list[str]]]] = defaultdict(list)
    for pkt in packets:
        layers = _get(_get(pkt, "_source"), "layers")
        ip, tcp = _get(layers, "ip"), _get(layers, "tcp")
        assert ip is not None and tcp is not None, layers
        label = (f"{_get(ip, 'ip.src')}:{_get(tcp, 'tcp.srcport')} -> "
                 f"{_get(ip, 'ip.dst')}:{_get(tcp, 'tcp.dstport')}")
        for k, rec in layers:
            if k == PROTO_NAME:
                out[label].append((_t_record(rec), _experts(rec)))
    return dict(out)


def _d_frame(f: dict[str, Any]) -> dict[str, Any]:
    w = float(f["weight"])  # a float, or the strings NaN / inf / -inf
    # tshark writes a double with 15 significant digits
    return {"kind": f["kind_byte"], "weight": f"{w:.15g}",
            "tensors": [(t["dtype_byte"], t["shape"], t["nbytes"]) for t in f["tensors"]]}


def decode_records(pcap: Path, port: int, leg: str, version: int | None
                   ) -> dict[str, tuple[list[dict[str, Any]], dict[str, Any]]]:
    """``flodl-proto decode --pcap`` per TCP direction: (records, final line)."""
    args = ["decode", "--pcap", str(pcap), "--port", str(port), "--leg", leg]
    if version is not None:
        args += ["--protocol-version", str(version)]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        main(args)
    streams: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = {}
    for line in buf.getvalue().splitlines():
        obj = json.loads(line)
        recs, _ = streams.get(obj["stream"], ([], {}))
        if obj["type"] in ("end", "error", "capture_ended"):
            streams[obj["stream"]] = (recs, obj)
        else:
            recs.append(obj)
            streams[obj["stream"]] = (recs, {})
    return streams


def _reverse(label: str) -> str:
    a, b = label.split(" -> ")
    return f"{b} -> {a}"


def _d_canonical(streams: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]]
                 ) -> dict[str, list[dict[str, Any]]]:
    """decode's records in the comparison form, with the ranks the dissector attaches: a
    connection's Hello ranks on its HostFrames and Broadcasts, its handshake rank on loopback
    frames."""
    conn_ranks: dict[str, list[int]] = {}
    for label, (recs, _) in streams.items():
        for r in recs:
            c = r.get("control", {})
            if c.get("variant") == "Hello":
                conn_ranks[label] = conn_ranks[_reverse(label)] = list(c["ranks"])
            if r["type"] == "handshake":
                conn_ranks[label] = conn_ranks[_reverse(label)] = [r["rank"]]
    out: dict[str, list[dict[str, Any]]] = {}
    for label, (recs, _) in streams.items():
        canon = []
        for r in recs:
            t = r["type"]
            if t == "channel_magic":
                c: dict[str, Any] = {"kind": "ChannelMagic", "ranks": []}
            elif t == "handshake":
                c = {"kind": "Handshake", "ranks": [r["rank"]], "rank": r["rank"],
                     "world_size": r["world_size"], "version": r["version"]}
            elif t == "handshake_ack":
                c = {"kind": "HandshakeAck", "ranks": [], "version": r["version"]}
            elif t == "len_framed":
                c = {"kind": "LenFramed", "ranks": conn_ranks.get(label, []),
                     "frame": _d_frame(r["frame"])}
            else:
                kind = KIND_NAMES[r["kind_byte"]]
                c = {"kind": kind, "ranks": []}
                if kind == "Data":
                    c["rank"] = c["ranks"] = r["rank"]
                    c["ranks"] = [r["rank"]]
                elif kind == "Control":
                    ctl = r["control"]
                    c["variant"] = ctl["variant"]
                    if "host" in ctl:
                        c["host"] = ctl["host"]
                    if "rank" in ctl:
                        c["rank"] = ctl["rank"]
                        c["ranks"] = [ctl["rank"]]
                    if ctl["variant"] == "Hello":
                        c["hello_ranks"] = c["ranks"] = list(ctl["ranks"])
                else:
                    c["ranks"] = conn_ranks.get(label, [])
                    c["frame"] = _d_frame(r["frame"])
            canon.append(c)
        out[label] = canon
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b or math.isclose(a, b, rel_tol=1e-12)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def compare(tshark: dict[str, list[tuple[dict[str, Any], list[str]]]],
            decoded: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]],
            *, expect_experts: bool) -> int:
    """Assert tshark lists decode's records, stream by stream; where decode stopped at an error,
    the records before it must agree and (``expect_experts``) tshark must raise expert info on
    that stream. Returns the number of records compared."""
    canon = _d_canonical(decoded)
    n = 0
    for label, want in canon.items():
        got = tshark.get(label, [])
        final = decoded[label][1]
        failed = final.get("type") in ("error", "capture_ended")
        if not failed:
            assert len(got) == len(want), (label, [g[0]["kind"] for g in got],
                                           [w["kind"] for w in want])
        else:
            assert len(got) >= len(want), (label, got, want)
        for i, w in enumerate(want):
            assert _same(got[i][0], w), (label, i, got[i][0], w)
        n += len(want)
        if failed and expect_experts:
            assert any(ex for _, ex in got[len(want):]), \
                (label, final, got)
    return n


# -------------------------------------------------------------------------------------------------
# Captures built from the golden vectors
# -------------------------------------------------------------------------------------------------
# file -> (leg, server-side ops: their bytes flow server -> client)
_VECTOR_FILES = {
    "channel_magic": ("mux", ()),
    "handshake": ("loopback", ("handshake.ack_write", "handshake.ack_read")),
    "len_framed": ("loopback", ()),
    "round_frame": ("loopback", ()),  # a bare frame travels length-framed on the loopback
    "mux_record": ("mux", ()),
    "controller_session": ("mux", ()),
}


def _vector_streams(folder: Path) -> Iterable[tuple[str, str, list[tuple[bool, bytes]]]]:
    """(case id, leg, [(from client, bytes), ...]) for every vector holding stream bytes."""
    for name, (leg, server_ops) in _VECTOR_FILES.items():
        doc = json.loads((folder / f"{name}.json").read_text(encoding="utf-8"))
        for case in doc["cases"]:
            steps: list[tuple[bool, bytes]] = []
            if name == "controller_session":
                for conn in sorted({s.get("conn", 0) for s in case["steps"]}):
                    steps = [(s["action"] == "send", bytes.fromhex(s["bytes"]))
                             for s in case["steps"] + case.get("after", [])
                             if s.get("conn", 0) == conn and s.get("bytes")]
                    if steps:
                        yield f"{case['id']}#{conn}", leg, steps
                continue
            if "bytes" not in case:
                continue
            data = bytes.fromhex(case["bytes"])
            if name == "round_frame":
                data = struct.pack("<I", len(data)) + data
            yield case["id"], leg, [(case["op"] not in server_ops, data)]


def _vector_capture(folder: Path, whole: bool) -> tuple[Capture, int]:
    cap = Capture()
    n = 0
    for i, (_cid, leg, steps) in enumerate(_vector_streams(folder)):
        server = MUX_PORT if leg == "mux" else LOOP_PORT
        c = cap.connect(("10.0.0.2", 30000 + i), ("10.0.0.1", server))
        for from_client, data in steps:
            cap.send(c, from_client, data, (len(data),) if whole else (9, 1, 3, 7, 30, 2, 500))
        cap.close(c)
        n += 1
    return cap, n


@pytest.mark.tshark
@pytest.mark.parametrize("version", [3, 2])
def test_vector_captures_match_decode(version: int, lua: Path, tmp_path: Path) -> None:
    folder = vectors_root() / ("v2" if version == 2 else "")
    prefs = {f"{PROTO_NAME}.version": str(version),
             f"{PROTO_NAME}.ports": f"{MUX_PORT},{LOOP_PORT}"}
    # segments cut at awkward places, TCP reassembly on: records agree
    cap, nconn = _vector_capture(folder, whole=False)
    assert nconn > 100
    pcap = tmp_path / "cut.pcap"
    pcap.write_bytes(cap.pcap())
    got = tshark_records(pcap, lua, prefs)
    decoded = {**decode_records(pcap, MUX_PORT, "mux", version),
               **decode_records(pcap, LOOP_PORT, "loopback", version)}
    failing = sum(1 for _, f in decoded.values() if f.get("type") in ("error", "capture_ended"))
    assert failing > 40  # the negative vectors
    assert compare(got, decoded, expect_experts=False) > 100
    # each stream in one segment, reassembly off: every stream decode rejects raises expert info
    # (a record cut by the end of a capture is visible only without reassembly)
    cap, _ = _vector_capture(folder, whole=True)
    pcap = tmp_path / "whole.pcap"
    pcap.write_bytes(cap.pcap())
    got = tshark_records(pcap, lua, {**prefs, "tcp.desegment_tcp_streams": "FALSE"})
    compare(got, decoded, expect_experts=True)


# -------------------------------------------------------------------------------------------------
# Hand-built streams: heuristic, awkward segments, version detection, the info line
# -------------------------------------------------------------------------------------------------
def _frames(version: int) -> list[RoundFrame]:
    out = [
        RoundFrame(RoundKind.MODEL, 3.0, [TensorPayload.from_array(
            np.array([3.0, 6.0, -1.5], np.float32))]),
        RoundFrame(RoundKind.CONTROL, 0.0, [TensorPayload.from_array(
            np.array([0.0, 2.0, 0.0, 0.0], np.float32))]),
        RoundFrame(RoundKind.MODEL, 0.5, [
            TensorPayload.from_array(np.arange(6, dtype=np.float32).reshape(2, 3)),
            TensorPayload.from_array(np.array([1.0, -0.5], dtype=ml_dtypes.bfloat16)),
            TensorPayload.from_array(np.zeros((), np.float32)),
        ]),
        RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload.from_array(
            np.linspace(-1, 1, 70000, dtype=np.float32))]),  # several segments
    ]
    if version == 3:
        out.append(RoundFrame(RoundKind.MODEL, 0.0, [TensorPayload(Dtype.F32, [8, 8], b"")]))
    return out


def _record(msg: Any, version: int) -> bytes:
    return encode_mux_record_bytes(MuxRecord.control_msg(msg, version), SALT)


def _cluster_capture(version: int, mux_port: int = 23456, rank_port: int = 40002) -> Capture:
    """One relay (ranks 0, 1, 2) and one of its ranks, on ports no preference names (the
    controller's: ``mux_port``; the rank's end of its loopback connection: ``rank_port``)."""
    cap = Capture()
    mux = cap.connect(("10.0.0.2", 40001), ("10.0.0.1", mux_port))
    loop = cap.connect(("127.0.0.1", rank_port), ("127.0.0.1", 23460))
    cut = (9, 1, 3, 7, 25, 2, 1460, 17)
    cap.send(loop, True, encode_handshake(1, 4, version), cut)
    cap.send(loop, False, encode_ack(version), (8,))
    cap.send(mux, True, encode_channel_magic("data") + _record(Hello("host-a", [0, 1, 2]),
                                                               version), cut)
    cap.send(mux, False, _record(HelloAck(), version), cut)
    for f in _frames(version):
        cap.send(loop, True, b"".join(encode_framed_round(f, SALT)), cut)
        cap.send(mux, True, b"".join(encode_frame_record(RecordKind.HOST_FRAME, f, SALT)), cut)
        cap.send(mux, False, b"".join(encode_frame_record(RecordKind.BROADCAST, f, SALT)),
                 (1460, 3))
        cap.send(loop, False, b"".join(encode_framed_round(f, SALT)), (65000,))
    # several records in one segment
    cap.send(mux, True, _record(RankExit(2), version) + _record(RankExit(1), version), (4096,))
    cap.send(mux, False, _record(DeclareDead(300), version), (4096,))
    cap.close(mux)
    cap.close(loop)
    return cap


@pytest.mark.tshark
def test_segments_captured_out_of_order_are_reassembled(lua: Path, tmp_path: Path) -> None:
    """A large record's last segment captured before the one ahead of it (as a 2-core host
    captured the demo's 1 MiB Broadcast): tshark, asked to reorder, lists every record decode
    reads, the reordered one included."""
    cap = Capture()
    mux = cap.connect(("10.0.0.2", 40001), ("10.0.0.1", 23456))
    cap.send(mux, True, encode_channel_magic("data") + _record(Hello("host-a", [0, 1]), 2))
    cap.send(mux, False, _record(HelloAck(), 2))
    frame = _frames(2)[-1]
    before = len(cap.packets)
    cap.send(mux, False, b"".join(encode_frame_record(RecordKind.BROADCAST, frame, SALT)),
             (1460,))
    assert len(cap.packets) - before >= 3
    cap.packets[-1], cap.packets[-2] = cap.packets[-2], cap.packets[-1]
    cap.send(mux, False, _record(DeclareDead(7), 2))
    cap.close(mux)
    pcap = tmp_path / "reordered.pcap"
    pcap.write_bytes(cap.pcap())
    got = tshark_records(pcap, lua, {})
    decoded = decode_records(pcap, 23456, "mux", 2)
    # magic, Hello | HelloAck, Broadcast, DeclareDead
    assert compare(got, decoded, expect_experts=False) == 5
    kinds = [r["kind"] for label, recs in got.items() if label.endswith(":40001")
             for r, _ in recs]
    assert kinds == ["Control", "Broadcast", "Control"], kinds


@pytest.mark.tshark
@pytest.mark.parametrize("version", [2, 3])
def test_cluster_streams_heuristic_and_version_detection(version: int, lua: Path,
                                                         tmp_path: Path) -> None:
    pcap = tmp_path / "cluster.pcap"
    pcap.write_bytes(_cluster_capture(version).pcap())
    got = tshark_records(pcap, lua, {})  # heuristic only, version auto
    decoded = {**decode_records(pcap, 23456, "mux", version),
               **decode_records(pcap, 23460, "loopback", version)}
    # magic, Hello, HostFrames, 2 RankExit | HelloAck, Broadcasts, DeclareDead | handshake,
    # frames | ack, frames
    assert compare(got, decoded, expect_experts=False) == 4 * len(_frames(version)) + 8
    assert all(not ex for recs in got.values() for _, ex in recs)
    versions = _tshark(pcap, lua, {}, "-Y", PROTO_NAME, "-T", "fields", "-e",
                       f"{PROTO_NAME}.version").split()
    # the loopback's handshake and ack carry the version; the mux leg learns it from the Hello
    # at version 3 (model_sigs) and keeps the default (2) otherwise
    assert {v for line in versions for v in line.split(",")} == {str(version)}
    info = _tshark(pcap, lua, {}, "-Y", f'{PROTO_NAME}.kind == "HostFrame"', "-T", "fields",
                   "-e", "_ws.col.Info").splitlines()
    assert info[0] == "HostFrame relay→ctl ranks [0,1,2] Model w=3.0 1 tensor 12 B"
    assert info[3] == "HostFrame relay→ctl ranks [0,1,2] Model w=1.0 1 tensor 273.4 KiB"
    ranks = _tshark(pcap, lua, {}, "-Y", f'{PROTO_NAME}.kind == "Broadcast" && '
                    f'{PROTO_NAME}.rank == 2', "-T", "fields", "-e", "frame.number")
    assert len(ranks.split()) == len(_frames(version))
    tree = _tshark(pcap, lua, {}, "-Y", f'{PROTO_NAME}.kind == "HostFrame"', "-V")
    assert "[First values: [3.0, 6.0, -1.5]]" in tree
    assert "[First values: [1.0, -0.5]]" in tree  # bf16
    assert "[Elements: 70000]" in tree and "[First values: [-1.0, -0.999971" in tree
    assert "not verified: check with flodl-proto decode --salt-file" in tree


@pytest.mark.tshark
def test_a_port_another_dissector_owns_needs_the_ports_preference(lua: Path,
                                                                   tmp_path: Path) -> None:
    """Wireshark asks a port's own dissector before any heuristic: on 7000 (the README cluster's
    controller port, registered by Wireshark's Gryphon dissector) the controller leg is not
    flodl's unless the port is given (``dissector --port 7000``, the ports preference) or the
    heuristics go first (``tcp.try_heuristic_first``), as docs/wireshark.md says."""
    pcap = tmp_path / "cluster7000.pcap"
    pcap.write_bytes(_cluster_capture(2, mux_port=7000).pcap())
    decoded = {**decode_records(pcap, 7000, "mux", 2),
               **decode_records(pcap, 23460, "loopback", 2)}
    n = 4 * len(_frames(2)) + 8
    protocols = subprocess.run(["tshark", "-G", "protocols"], capture_output=True, text=True,
                               timeout=120, check=True).stdout
    gryphon = any(line.split("\t")[2:3] == ["gryphon"] for line in protocols.splitlines())
    mux_label = "10.0.0.2:40001 -> 10.0.0.1:7000"
    default = tshark_records(pcap, lua, {})
    assert (mux_label in default) == (not gryphon)
    for prefs in ({f"{PROTO_NAME}.ports": "7000"}, {"tcp.try_heuristic_first": "TRUE"}):
        got = tshark_records(pcap, lua, prefs)
        assert compare(got, decoded, expect_experts=False) == n, prefs
    lua7000 = tmp_path / "flodl_7000.lua"
    assert main(["dissector", "--port", "7000", "--out", str(lua7000)]) == 0
    assert compare(tshark_records(pcap, lua7000, {}), decoded, expect_experts=False) == n


@pytest.mark.tshark
def test_a_client_port_another_dissector_owns_needs_the_server_port(lua: Path,
                                                                     tmp_path: Path) -> None:
    """The connecting end's port counts too: a rank's ephemeral port 34980 is registered by
    Wireshark's EtherCAT frame dissector (``ecatf``), which then takes the whole connection.
    Wireshark asks the port that accepted the connection first, so naming the relay's loopback
    port (the ports preference) finds it, as heuristics first do (docs/wireshark.md)."""
    pcap = tmp_path / "cluster34980.pcap"
    pcap.write_bytes(_cluster_capture(2, rank_port=34980).pcap())
    decoded = {**decode_records(pcap, 23456, "mux", 2),
               **decode_records(pcap, 23460, "loopback", 2)}
    n = 4 * len(_frames(2)) + 8
    tables = subprocess.run(["tshark", "-G", "decodes"], capture_output=True, text=True,
                            timeout=120, check=True).stdout
    ecatf = "tcp.port\t34980\tecatf" in tables
    loop_label = "127.0.0.1:34980 -> 127.0.0.1:23460"
    default = tshark_records(pcap, lua, {})
    assert (loop_label in default) == (not ecatf)
    for prefs in ({f"{PROTO_NAME}.ports": "23460"}, {"tcp.try_heuristic_first": "TRUE"}):
        got = tshark_records(pcap, lua, prefs)
        assert compare(got, decoded, expect_experts=False) == n, prefs


def _mux_capture_cut(version: int, size: int) -> Capture:
    """The relay -> controller stream of :func:`_cluster_capture` (and the replies), every
    segment ``size`` bytes: many end inside a 25-byte mux record header."""
    cap = Capture()
    mux = cap.connect(("10.0.0.2", 40001), ("10.0.0.1", 23456))
    up = [encode_channel_magic("data") + _record(Hello("host-a", [0, 1, 2]), version)]
    up += [b"".join(encode_frame_record(RecordKind.HOST_FRAME, f, SALT))
           for f in _frames(version)[:3]]
    up += [_record(RankExit(2), version), _record(RankExit(1), version)]
    cap.send(mux, True, b"".join(up), (size,))
    down = [_record(HelloAck(), version)]
    down += [b"".join(encode_frame_record(RecordKind.BROADCAST, f, SALT))
             for f in _frames(version)[:3]]
    cap.send(mux, False, b"".join(down), (size,))
    cap.close(mux)
    return cap


@pytest.mark.tshark
@pytest.mark.parametrize("size", [10, 13, 24, 29])
def test_two_pass_runs_keep_records_whose_header_is_cut(size: int, lua: Path,
                                                        tmp_path: Path) -> None:
    # a segment ending 4 to 24 bytes into a mux record header asked for exactly the header's
    # missing bytes; on tshark's second pass (-2) the records after it were lost
    pcap = tmp_path / "cut.pcap"
    pcap.write_bytes(_mux_capture_cut(3, size).pcap())
    decoded = decode_records(pcap, 23456, "mux", 3)
    want = sum(len(recs) for recs, _ in decoded.values())
    assert want == 1 + 1 + 3 + 2 + 1 + 3  # magic, Hello, 3 HostFrames, 2 RankExit | ack, 3 Bc
    for passes in ((), ("-2",)):
        got = tshark_records_args(pcap, lua, {}, *passes)
        assert compare(got, decoded, expect_experts=False) == want, passes
        assert all(not ex for recs in got.values() for _, ex in recs), passes


@pytest.mark.tshark
@pytest.mark.parametrize("version", [2, 3])
def test_the_info_column_is_the_same_in_one_pass_and_two(version: int, lua: Path,
                                                          tmp_path: Path) -> None:
    # the connection's state was keyed by tcp.stream, which has no value on tshark -2's first
    # pass (no tree): the second pass lost what the first learned (the version, the ranks)
    pcap = tmp_path / "cluster.pcap"
    pcap.write_bytes(_cluster_capture(version).pcap())
    fields = ("-T", "fields", "-e", "frame.number", "-e", "_ws.col.Info")
    one = _tshark(pcap, lua, {}, *fields)
    two = _tshark(pcap, lua, {}, "-2", *fields)
    assert one == two
    assert "HostFrame relay→ctl ranks [0,1,2] Model w=3.0 1 tensor 12 B" in two
    assert ("ranks [0,1,2] model_sigs 0" in two) == (version == 3)


@pytest.mark.tshark
def test_a_connection_reusing_the_ports_of_an_http_one_is_dissected_afresh(
        lua: Path, tmp_path: Path) -> None:
    # a status poll, then the relay's data connection from the same client port (the server
    # closed first, so the port was free at once): keyed by the endpoints alone, the data
    # connection took the HTTP one's state and none of its records was dissected
    cap = Capture()
    http = cap.connect(("127.0.0.1", 40100), ("127.0.0.1", 23458))
    cap.send(http, True, b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
    cap.send(http, False, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
    cap.close(http)
    data = cap.connect(("127.0.0.1", 40100), ("127.0.0.1", 23458), isn=(900000, 700000))
    cap.send(data, True, encode_channel_magic("data") + _record(Hello("h", [0, 1]), 3))
    cap.send(data, False, _record(HelloAck(), 3))
    cap.close(data)
    pcap = tmp_path / "reuse.pcap"
    pcap.write_bytes(cap.pcap())
    prefs = {f"{PROTO_NAME}.ports": "23458"}
    for passes in ((), ("-2",)):
        got = tshark_records_args(pcap, lua, prefs, *passes)
        assert [r["kind"] for r, _ in got["127.0.0.1:40100 -> 127.0.0.1:23458"]] == [
            "ChannelMagic", "Control"], passes
        assert [r["kind"] for r, _ in got["127.0.0.1:23458 -> 127.0.0.1:40100"]] == [
            "Control"], passes
        # and without a tree on the first pass (no tcp.stream there: the endpoints key)
        info = _tshark(pcap, lua, prefs, *passes, "-T", "fields", "-e", "_ws.col.Protocol",
                       "-e", "_ws.col.Info").splitlines()
        assert [line.split("\t")[0] for line in info] == (
            ["TCP"] * 3 + ["HTTP"] * 2 + ["TCP"] * 5 + [PROTO_NAME] * 2 + ["TCP"] * 2), passes


@pytest.mark.tshark
def test_the_dissector_loaded_twice_dissects_once_without_an_error(lua: Path,
                                                                  tmp_path: Path) -> None:
    # as a plugin and with -X lua_script: the second copy failed with a Lua traceback
    pcap = tmp_path / "cluster.pcap"
    pcap.write_bytes(_cluster_capture(3).pcap())
    cmd = ["tshark", "-n", "-r", str(pcap), "-X", f"lua_script:{lua}", "-X",
           f"lua_script:{lua}", "-Y", PROTO_NAME, "-T", "fields", "-e", "_ws.col.Info"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0 and "Lua" not in res.stderr, res.stderr
    assert res.stdout == _tshark(pcap, lua, {}, "-Y", PROTO_NAME, "-T", "fields", "-e",
                                 "_ws.col.Info")
    assert res.stdout.startswith("Handshake rank→relay rank 1 world 4 v3\n")


@pytest.mark.tshark
def test_a_frame_of_many_tensors_of_many_dims_stays_within_the_tree_limit(
        lua: Path, tmp_path: Path) -> None:
    # 4000 tensors of 255 dims passed tshark's million tree items: the packet was cut off with
    # an error; an element count over u64 showed as 0
    many = RoundFrame(RoundKind.MODEL, 1.0,
                      [TensorPayload(Dtype.F32, [1] * 255, b"\0\0\0\0")] * 4000)
    huge = RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload(Dtype.F32, [2**32 - 1] * 3, b"")])
    cap = Capture()
    loop = cap.connect(("127.0.0.1", 40002), ("127.0.0.1", 23460))
    cap.send(loop, True, encode_handshake(1, 4, 3), (16,))
    cap.send(loop, True, b"".join(encode_framed_round(many, SALT)), (65000,))
    cap.send(loop, True, b"".join(encode_framed_round(huge, SALT)), (65000,))
    pcap = tmp_path / "many.pcap"
    pcap.write_bytes(cap.pcap())
    # one tshark run (each reads the million dims): -P adds each packet's summary line, whose
    # last column is the Info column, before its tree
    tree = _tshark(pcap, lua, {}, "-P", "-V", "-Y", PROTO_NAME)
    assert "Lua" not in tree and "Maximum tree items" not in tree, tree[-2000:]
    assert tree.count("Tensor 999: f32[1, 1, ") == 1 and "Tensor 1000:" not in tree
    assert "3000 more tensors not shown in the tree (read and checked; flodl-proto decode " \
           "lists them)" in tree
    assert tree.count("239 more dims not shown (see Shape)") == 1000
    assert "[Elements: 7.923e+28 (the product of the dims) overflows u64]" in tree
    assert "Expert Info (Error/Malformed): element count 7.923e+28 (the product of the dims) " \
           "overflows u64" in tree
    info = re.findall(rf"(?m)^ *\d+ +[\d.]+ +127\.0\.0\.1 \S+ 127\.0\.0\.1 +{PROTO_NAME} \d+ (.*)$",
                      tree)
    assert info[1:] == [
        "LenFramed rank→relay rank [1] Model w=1.0 4000 tensors 15.6 KiB",
        "LenFramed rank→relay rank [1] Model w=1.0 1 tensor 0 B"]


# -------------------------------------------------------------------------------------------------
# A malformed capture
# -------------------------------------------------------------------------------------------------
@pytest.mark.tshark
def test_malformed_capture_raises_expert_info_and_later_records_dissect(lua: Path,
                                                                       tmp_path: Path) -> None:
    good = RoundFrame(RoundKind.MODEL, 2.0, [TensorPayload.from_array(
        np.array([1.0, 2.0], np.float32))])
    bad_nbytes = RoundFrame(RoundKind.MODEL, 2.0, [TensorPayload(Dtype.F32, [3], b"\0" * 8)],
                            check_nbytes=False)  # as a peer may send it
    hostframe = b"".join(encode_frame_record(RecordKind.HOST_FRAME, good, SALT))
    inner = b"".join(encode_frame_record(RecordKind.HOST_FRAME, bad_nbytes, SALT))
    # a HostFrame whose payload_len stops 10 bytes into the frame's data
    cut_frame = bytearray(hostframe[:25 + 35])
    struct.pack_into("<I", cut_frame, 13, 35)
    too_long = bytearray(hostframe[:25])
    struct.pack_into("<I", too_long, 13, 1 << 30)
    cap = Capture()
    c: Connection = cap.connect(("10.0.0.2", 40001), ("10.0.0.1", 23456))
    cap.send(c, True, encode_channel_magic("data") + _record(Hello("h", [4, 5]), 2))
    cap.send(c, True, hostframe)
    cap.send(c, True, b"\xde\xad\xbe\xef" * 10)          # bad magic
    cap.send(c, True, hostframe)                         # dissects again
    cap.send(c, True, inner)                             # nbytes 8 for shape [3] f32
    cap.send(c, True, bytes(cut_frame))                  # truncated RoundFrame
    cap.send(c, True, _record(RankExit(5), 2))           # still dissects
    # payload_len above the ceiling (last: the record's length stands, so its 1 GiB would take
    # in what followed as its continuation)
    cap.send(c, True, bytes(too_long) + b"\0" * 100)
    pcap = tmp_path / "bad.pcap"
    pcap.write_bytes(cap.pcap())
    got = tshark_records(pcap, lua, {f"{PROTO_NAME}.ceiling": str(1 << 20)})
    recs = got["10.0.0.2:40001 -> 10.0.0.1:23456"]
    kinds = [r["kind"] for r, _ in recs]
    assert kinds == ["ChannelMagic", "Control", "HostFrame", "Malformed", "HostFrame",
                     "HostFrame", "HostFrame", "Control", "Malformed"]
    experts = [ex for _, ex in recs]
    assert experts[3] == [f"{PROTO_NAME}.expert.bad_magic"]
    assert experts[5] == [f"{PROTO_NAME}.expert.nbytes_shape"]
    assert experts[6] == [f"{PROTO_NAME}.expert.truncated"]
    assert experts[8] == [f"{PROTO_NAME}.expert.too_large"]
    assert [e for i, e in enumerate(experts) if i not in (3, 5, 6, 8)] == [[]] * 5
    assert recs[4][0]["frame"] == _t_like(good)
    assert recs[7][0] == {"kind": "Control", "ranks": [5], "variant": "RankExit", "rank": 5}
    msgs = _tshark(pcap, lua, {f"{PROTO_NAME}.ceiling": str(1 << 20)}, "-T", "fields",
                   "-e", "_ws.expert.message", "-Y", "_ws.expert").splitlines()
    assert "relay_mux: record magic 0xefbeadde != 0xf10d17d0" in msgs
    assert "tensor shape [3] numel*element_size 12 != nbytes 8" in msgs
    assert any(m.startswith("relay_mux: record payload_len 1073741824 exceeds the frame ceiling "
                            "1048576") for m in msgs)
    assert "cluster_controller: tensor[0] data read failed: failed to fill whole buffer (4 of 8 " \
        "bytes at offset 31)" in msgs


# -------------------------------------------------------------------------------------------------
# Records that go on past their segment where TCP does not reassemble them
# -------------------------------------------------------------------------------------------------
# a 4,039-byte RoundFrame: a HostFrame or Broadcast of it takes three 1460-byte segments
_FRAME_4K = RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload.from_array(
    np.arange(1000, dtype=np.float32))])
MUX_UP, MUX_DOWN = "10.0.0.2:40001 -> 10.0.0.1:23456", "10.0.0.1:23456 -> 10.0.0.2:40001"
LOOP_UP = "127.0.0.1:40002 -> 127.0.0.1:23460"
REASSEMBLY_OFF = {"tcp.desegment_tcp_streams": "FALSE"}
CONTINUED, TOO_LARGE = f"{PROTO_NAME}.expert.continued", f"{PROTO_NAME}.expert.too_large"


def _multi_segment_capture() -> Capture:
    """1460-byte segments: a HostFrame with a RankExit in its last segment, a Broadcast, and two
    loopback blobs, the second starting inside the first's last segment."""
    cap = Capture()
    mux = cap.connect(("10.0.0.2", 40001), ("10.0.0.1", 23456))
    cap.send(mux, True, encode_channel_magic("data") + _record(Hello("h", [0, 1]), 2))
    cap.send(mux, True, b"".join(encode_frame_record(RecordKind.HOST_FRAME, _FRAME_4K, SALT))
             + _record(RankExit(1), 2))
    cap.send(mux, False, _record(HelloAck(), 2))
    cap.send(mux, False, b"".join(encode_frame_record(RecordKind.BROADCAST, _FRAME_4K, SALT)))
    cap.send(mux, False, _record(DeclareDead(7), 2))
    cap.close(mux)
    loop = cap.connect(("127.0.0.1", 40002), ("127.0.0.1", 23460))
    cap.send(loop, True, encode_handshake(1, 4, 2))
    cap.send(loop, True, b"".join(encode_framed_round(_FRAME_4K, SALT)) * 2)
    cap.close(loop)
    return cap


def _listing(recs: list[tuple[dict[str, Any], list[str]]]) -> list[tuple[str, list[str]]]:
    """(what each item is, its expert ids): a record's kind, or a continuation, or skipped
    bytes."""
    out = []
    for r, ex in recs:
        if "continuation" in r:
            what = f"continuation of {r['continuation']}"
        elif "skipped" in r:
            what = f"{r['skipped']} bytes skipped"
        elif "uncaptured" in r:
            what = f"{r['uncaptured']} bytes not captured"
        else:
            what = r["kind"]
        out.append((what, ex))
    return out


@pytest.mark.tshark
@pytest.mark.parametrize("passes", [(), ("-2",)])
def test_without_reassembly_a_record_s_next_segments_are_its_continuation(
        passes: tuple[str, ...], lua: Path, tmp_path: Path) -> None:
    # with reassembly off, every segment after a record's first was read as a record start:
    # invented magics and lengths, one error each
    pcap = tmp_path / "segments.pcap"
    pcap.write_bytes(_multi_segment_capture().pcap())
    got = tshark_records_args(pcap, lua, REASSEMBLY_OFF, *passes)
    hf, bc, lf = (f"continuation of {k}" for k in ("HostFrame", "Broadcast", "LenFramed"))
    assert _listing(got[MUX_UP]) == [("ChannelMagic", []), ("Control", []),
                                     ("HostFrame", [CONTINUED]), (hf, []), (hf, []),
                                     ("Control", [])]
    assert got[MUX_UP][-1][0] == {"kind": "Control", "ranks": [1], "variant": "RankExit",
                                  "rank": 1}
    assert _listing(got[MUX_DOWN]) == [("Control", []), ("Broadcast", [CONTINUED]), (bc, []),
                                       (bc, []), ("Control", [])]
    assert got[MUX_DOWN][-1][0] == {"kind": "Control", "ranks": [7], "variant": "DeclareDead",
                                    "rank": 7}
    assert _listing(got[LOOP_UP]) == [("Handshake", []), ("LenFramed", [CONTINUED]), (lf, []),
                                      (lf, []), ("LenFramed", [CONTINUED]), (lf, []), (lf, []),
                                      (lf, [])]
    info = _tshark(pcap, lua, REASSEMBLY_OFF, *passes, "-Y", PROTO_NAME, "-T", "fields",
                   "-e", "_ws.col.Info").splitlines()
    assert info == [
        "ChannelMagic data relay→ctl | Control Hello relay→ctl host h ranks [0,1]",
        "HostFrame relay→ctl ranks [0,1] (continues)",
        "[continuation of HostFrame]",
        "[continuation of HostFrame] | Control RankExit relay→ctl rank 1",
        "Control HelloAck ctl→relay",
        "Broadcast ctl→relay ranks [0,1] (continues)",
        "[continuation of Broadcast]",
        "[continuation of Broadcast]",
        "Control DeclareDead ctl→relay rank 7",
        "Handshake rank→relay rank 1 world 4 v2",
        "LenFramed rank→relay rank [1] (continues)",
        "[continuation of LenFramed]",
        "[continuation of LenFramed] | LenFramed rank→relay rank [1] (continues)",
        "[continuation of LenFramed]",
        "[continuation of LenFramed]",
        "[continuation of LenFramed]"]
    tree = _tshark(pcap, lua, REASSEMBLY_OFF, *passes, "-V", "-Y", PROTO_NAME)
    assert "Expert Info (Error" not in tree
    note = "Expert Info (Note/Reassemble): record continues in the next segments: "
    assert tree.count(note + "1460 of its 4064 bytes here (not reassembled)") == 2
    assert tree.count(note + "1460 of its 4043 bytes here (not reassembled)") == 1
    assert tree.count(note + "337 of its 4043 bytes here (not reassembled)") == 1
    assert tree.count("Expert Info (") == 4
    for text in ("continuation of HostFrame (bytes 1461 to 2920 of 4064)",
                 "continuation of HostFrame (bytes 2921 to 4064 of 4064)",
                 "continuation of LenFramed (bytes 2921 to 4043 of 4043)",
                 "continuation of LenFramed (bytes 3258 to 4043 of 4043)"):
        assert text in tree, text
    # reassembled (the default), the same capture has whole records and no continuation
    decoded = {**decode_records(pcap, 23456, "mux", 2),
               **decode_records(pcap, 23460, "loopback", 2)}
    assert compare(tshark_records_args(pcap, lua, {}, *passes), decoded,
                   expect_experts=False) == 4 + 3 + 3


@pytest.mark.tshark
@pytest.mark.parametrize("passes", [(), ("-2",)])
def test_without_reassembly_a_record_that_continues_names_its_ranks(
        passes: tuple[str, ...], lua: Path, tmp_path: Path) -> None:
    # a record going on past its segment was named by its kind and direction alone: a whole
    # HostFrame or Broadcast names the connection's ranks, a Data record its rank, a loopback
    # blob the handshake's rank; their first segments did not
    cap = Capture()
    mux = cap.connect(("10.0.0.2", 40001), ("10.0.0.1", 23456))
    cap.send(mux, True, encode_channel_magic("data") + _record(Hello("h", [0, 1]), 2))
    cap.send(mux, True, encode_mux_record_bytes(MuxRecord.data(3, bytes(3000)), SALT))
    cap.send(mux, True, b"".join(encode_frame_record(RecordKind.HOST_FRAME, _FRAME_4K, SALT)))
    cap.send(mux, False, _record(HelloAck(), 2))
    cap.send(mux, False, encode_mux_record_bytes(MuxRecord.data(5, bytes(3000)), SALT))
    cap.send(mux, False, b"".join(encode_frame_record(RecordKind.BROADCAST, _FRAME_4K, SALT)))
    cap.close(mux)
    loop = cap.connect(("127.0.0.1", 40002), ("127.0.0.1", 23460))
    cap.send(loop, True, encode_handshake(2, 4, 2))
    cap.send(loop, True, b"".join(encode_framed_round(_FRAME_4K, SALT)))
    cap.close(loop)
    pcap = tmp_path / "continues.pcap"
    pcap.write_bytes(cap.pcap())
    info = _tshark(pcap, lua, REASSEMBLY_OFF, *passes, "-Y", f"{PROTO_NAME}.kind", "-T",
                   "fields", "-e", "_ws.col.Info").splitlines()
    assert info == [
        "ChannelMagic data relay→ctl | Control Hello relay→ctl host h ranks [0,1]",
        "Data relay↔ctl rank 3 (continues)",
        "HostFrame relay→ctl ranks [0,1] (continues)",
        "Control HelloAck ctl→relay",
        "Data relay↔ctl rank 5 (continues)",
        "Broadcast ctl→relay ranks [0,1] (continues)",
        "Handshake rank→relay rank 2 world 4 v2",
        "LenFramed rank→relay rank [2] (continues)"], info
    # and the tree's rank fields (flodl.rank), as on a whole record
    got = tshark_records_args(pcap, lua, REASSEMBLY_OFF, *passes)
    firsts = [r for recs in got.values() for r, ex in recs if ex == [CONTINUED]]
    assert [(r["kind"], r["ranks"]) for r in firsts] == [
        ("Data", [3]), ("HostFrame", [0, 1]), ("Data", [5]), ("Broadcast", [0, 1]),
        ("LenFramed", [2])], firsts
    ranks = _tshark(pcap, lua, REASSEMBLY_OFF, *passes, "-Y",
                    f'{PROTO_NAME}.kind == "HostFrame" && {PROTO_NAME}.rank == 1', "-T",
                    "fields", "-e", "frame.number").split()
    assert len(ranks) == 1


@pytest.mark.tshark
@pytest.mark.parametrize("passes", [(), ("-2",)])
def test_an_unknown_kind_is_named_as_such_in_every_segment_of_its_record(
        passes: tuple[str, ...], lua: Path, tmp_path: Path) -> None:
    # a record of unknown kind 0xff going on past its segment: its first segment read
    # '0xff  (continues)' and the next ones '[continuation of 0xff]', where the whole record
    # reads '0xff (unknown kind)'
    cap = Capture()
    mux = cap.connect(("10.0.0.2", 40001), ("10.0.0.1", 23456))
    cap.send(mux, True, encode_channel_magic("data") + _record(Hello("h", [0, 1]), 2))
    cap.send(mux, True, b"".join(encode_mux_record_parts(0xFF, 5, [bytes(4000)], SALT))
             + _record(RankExit(1), 2))
    cap.send(mux, True, b"".join(encode_mux_record_parts(0xFF, 5, [bytes(10)], SALT)))
    cap.close(mux)
    pcap = tmp_path / "unknown.pcap"
    pcap.write_bytes(cap.pcap())
    first = "ChannelMagic data relay→ctl | Control Hello relay→ctl host h ranks [0,1]"
    info = _tshark(pcap, lua, REASSEMBLY_OFF, *passes, "-Y", PROTO_NAME, "-T", "fields",
                   "-e", "_ws.col.Info").splitlines()
    assert info == [first, "0xff (unknown kind) (continues)",
                    "[continuation of 0xff (unknown kind)]",
                    "[continuation of 0xff (unknown kind)] | Control RankExit relay→ctl rank 1",
                    "0xff (unknown kind)"], info
    tree = _tshark(pcap, lua, REASSEMBLY_OFF, *passes, "-V", "-Y", PROTO_NAME)
    for text in ("continuation of 0xff (unknown kind) (bytes 1461 to 2920 of 4025)",
                 "continuation of 0xff (unknown kind) (bytes 2921 to 4025 of 4025)"):
        assert text in tree, text
    # the filter fields hold the kind's byte, as the record's flodl.kind does; the kind is
    # refused on the record (its expert info), once
    got = tshark_records_args(pcap, lua, REASSEMBLY_OFF, *passes)
    bad = f"{PROTO_NAME}.expert.bad_value"
    assert _listing(got[MUX_UP]) == [
        ("ChannelMagic", []), ("Control", []), ("0xff", [bad, CONTINUED]),
        ("continuation of 0xff", []), ("continuation of 0xff", []), ("Control", []),
        ("0xff", [bad])]
    # reassembled, the record is whole and named as before
    info = _tshark(pcap, lua, {}, *passes, "-Y", PROTO_NAME, "-T", "fields",
                   "-e", "_ws.col.Info").splitlines()
    assert info == [first, "0xff (unknown kind) | Control RankExit relay→ctl rank 1",
                    "0xff (unknown kind)"], info


@pytest.mark.tshark
@pytest.mark.parametrize("passes", [(), ("-2",)])
@pytest.mark.parametrize("reassemble", ["TRUE", "FALSE"])
def test_a_record_above_the_ceiling_is_one_error_and_its_bytes_a_continuation(
        reassemble: str, passes: tuple[str, ...], lua: Path, tmp_path: Path) -> None:
    # the header was reported, then the payload's next segments were read as record starts
    # (about 400 errors for 12 records above a lowered ceiling)
    pcap = tmp_path / "ceiling.pcap"
    pcap.write_bytes(_multi_segment_capture().pcap())
    prefs = {f"{PROTO_NAME}.ceiling": "4000", "tcp.desegment_tcp_streams": reassemble}
    got = tshark_records_args(pcap, lua, prefs, *passes)
    hf, bc, lf = (f"continuation of {k}" for k in ("HostFrame", "Broadcast", "LenFramed"))
    assert _listing(got[MUX_UP]) == [("ChannelMagic", []), ("Control", []),
                                     ("Malformed", [TOO_LARGE]), (hf, []), (hf, []),
                                     ("Control", [])]
    assert got[MUX_UP][-1][0]["variant"] == "RankExit"
    assert _listing(got[MUX_DOWN]) == [("Control", []), ("Malformed", [TOO_LARGE]), (bc, []),
                                       (bc, []), ("Control", [])]
    assert _listing(got[LOOP_UP]) == [("Handshake", []), ("Malformed", [TOO_LARGE]), (lf, []),
                                      (lf, []), ("Malformed", [TOO_LARGE]), (lf, []), (lf, []),
                                      (lf, [])]
    msgs = _tshark(pcap, lua, prefs, *passes, "-Y", f"_ws.expert && {PROTO_NAME}", "-T",
                   "fields", "-e", "_ws.expert.message").splitlines()
    assert len(msgs) == 4
    assert msgs[0].startswith("relay_mux: record payload_len 4039 exceeds the frame ceiling "
                              "4000"), msgs
    # each text names the leg its record is on: the rank's loopback blobs are not the relay's mux
    assert msgs[2] == msgs[3] == ("loopback leg: len-framed blob length 4039 exceeds the frame "
                                  "ceiling 4000; corrupt or hostile peer"), msgs


@pytest.mark.tshark
def test_a_truncated_hello_reads_as_the_package_words_it_in_the_singular(lua: Path,
                                                                         tmp_path: Path) -> None:
    # the catalogue's plural rule (a noun written word(s)) is applied by the dissector too: it
    # said '1 more byte(s) needed' where decode says '1 more byte needed'
    payload = MuxRecord.control_msg(Hello("h", [0, 1]), 2).payload
    want = []
    cap = Capture()
    for cut in (1, 3):
        mux = cap.connect(("10.0.0.2", 40001 + cut), ("10.0.0.1", 23456))
        cap.send(mux, True, encode_channel_magic("data") + b"".join(
            encode_mux_record_parts(RecordKind.CONTROL, 0, [payload[:-cut]], SALT)))
        cap.close(mux)
        with pytest.raises(ProtocolError) as err:
            decode_control(payload[:-cut], 2)
        want.append(str(err.value))
    pcap = tmp_path / "cut-hello.pcap"
    pcap.write_bytes(pcap_file(cap.packets))
    msgs = _tshark(pcap, lua, {f"{PROTO_NAME}.ports": "23456"}, "-Y",
                   f"_ws.expert && {PROTO_NAME}", "-T", "fields", "-e",
                   "_ws.expert.message").splitlines()
    assert msgs == want == [
        "relay_mux: bincode decode failed: io error: unexpected end of file (reading "
        "Hello.ranks at offset 5, 1 more byte needed)",
        "relay_mux: bincode decode failed: io error: unexpected end of file (reading "
        "Hello.ranks length at offset 3, 1 more byte needed)"], msgs


@pytest.mark.tshark
@pytest.mark.parametrize("passes", [(), ("-2",)])
@pytest.mark.parametrize("reassemble", ["TRUE", "FALSE"])
def test_a_capture_that_begins_inside_a_record_warns_once_then_reads_the_next_record(
        reassemble: str, passes: tuple[str, ...], lua: Path, tmp_path: Path) -> None:
    # the capture starts at a HostFrame's second segment: each segment up to the next record
    # start was read as one (bad magic, an error each)
    cap = Capture()
    mux = cap.connect(("10.0.0.2", 40001), ("10.0.0.1", 23456))
    cap.send(mux, True, encode_channel_magic("data") + _record(Hello("h", [0, 1]), 2))
    cap.send(mux, True, b"".join(encode_frame_record(RecordKind.HOST_FRAME, _FRAME_4K, SALT)))
    cap.send(mux, True, _record(RankExit(1), 2))
    cap.send(mux, False, _record(HelloAck(), 2))
    cap.send(mux, False, b"".join(encode_frame_record(RecordKind.BROADCAST, _FRAME_4K, SALT)))
    cap.close(mux)
    pcap = tmp_path / "midway.pcap"
    pcap.write_bytes(pcap_file(cap.packets[5:]))  # handshake, Hello, first segment: not captured
    prefs = {"tcp.desegment_tcp_streams": reassemble}
    broadcast = [("Broadcast", [])] if reassemble == "TRUE" else [
        ("Broadcast", [CONTINUED]), ("continuation of Broadcast", []),
        ("continuation of Broadcast", [])]
    rank_exit = {"kind": "Control", "ranks": [1], "variant": "RankExit", "rank": 1}
    # on the flodl ports: the first bytes are skipped with one warning, the rest quietly
    got = tshark_records_args(pcap, lua, {**prefs, f"{PROTO_NAME}.ports": "23456"}, *passes)
    warned = [f"{PROTO_NAME}.expert.no_record_start"]
    assert _listing(got[MUX_UP]) == [("1460 bytes skipped", warned), ("1144 bytes skipped", []),
                                     ("Control", [])]
    assert got[MUX_UP][-1][0] == rank_exit
    assert _listing(got[MUX_DOWN]) == [("Control", []), *broadcast]
    msgs = _tshark(pcap, lua, {**prefs, f"{PROTO_NAME}.ports": "23456"}, *passes, "-Y",
                   f"_ws.expert && {PROTO_NAME}", "-T", "fields", "-e", "_ws.expert.severity",
                   "-e", "_ws.expert.message").splitlines()
    note = [] if reassemble == "TRUE" else [
        "4194304\trecord continues in the next segments: 1460 of its 4064 bytes here (not "
        "reassembled)"]
    assert msgs == ["6291456\tno record starts here: the capture began inside a record, or "
                    "these bytes are not flodl's (skipped until a segment starts a record)",
                    *note]
    # found by the heuristic: the connection is claimed at its first record start, and the
    # segments before it are not flodl's, on the second pass too
    got = tshark_records_args(pcap, lua, prefs, *passes)
    assert got[MUX_UP] == [(rank_exit, [])]
    assert _listing(got[MUX_DOWN]) == [("Control", []), *broadcast]


SNAPLEN = 94  # Ethernet, IPv4 and TCP headers (54 bytes) and 40 bytes of a segment
SNAPLEN_WARNING = (
    "6291456\tpacket cut by the capture: 40 of the segment's 60 bytes captured; the records in "
    "this direction's cut packets are incomplete or not shown (take the capture with a full "
    "snaplen: tcpdump -s 0)")


def _snaplen_capture() -> Capture:
    """Small records in 60-byte segments (8 RankExits up, 8 DeclareDeads down), then a HostFrame
    in 1460-byte segments with a RankExit in its last, and a RankExit in a segment of its own:
    taken with a snaplen of :data:`SNAPLEN`, every segment above 40 bytes is cut."""
    cap = Capture()
    mux = cap.connect(("10.0.0.2", 40001), ("10.0.0.1", 23456))
    cap.send(mux, True, encode_channel_magic("data") + _record(Hello("h", [0, 1]), 2))
    cap.send(mux, False, _record(HelloAck(), 2))
    cap.send(mux, True, b"".join(_record(RankExit(r), 2) for r in range(8)), (60,))
    cap.send(mux, False, b"".join(_record(DeclareDead(r), 2) for r in range(8)), (60,))
    cap.send(mux, True, b"".join(encode_frame_record(RecordKind.HOST_FRAME, _FRAME_4K, SALT))
             + _record(RankExit(1), 2))
    cap.send(mux, True, _record(RankExit(0), 2))
    cap.close(mux)
    return cap


@pytest.mark.tshark
@pytest.mark.parametrize("passes", [(), ("-2",)])
@pytest.mark.parametrize("reassemble", ["TRUE", "FALSE"])
def test_a_capture_with_a_short_snaplen_warns_and_shows_records_as_cut(
        reassemble: str, passes: tuple[str, ...], lua: Path, tmp_path: Path) -> None:
    # packets cut by the capture (tcpdump -s 200) were read as whole segments: a record past the
    # cut was shown as going on in the next segment (or a header completed from it), the
    # direction's next segments were counted from the cut, and nothing said the capture had
    # cut the packets
    pcap = tmp_path / "snaplen.pcap"
    pcap.write_bytes(_snaplen_capture().pcap(SNAPLEN))
    # (reassembling out of order, TCP waits for the bytes the capture cut and hands none of
    # the direction's later segments over)
    prefs = {"tcp.reassemble_out_of_order": "FALSE", "tcp.desegment_tcp_streams": reassemble,
             f"{PROTO_NAME}.ports": "23456"}
    msgs = _tshark(pcap, lua, prefs, *passes, "-Y", f"_ws.expert && {PROTO_NAME}", "-T",
                   "fields", "-e", "frame.number", "-e", "_ws.expert.severity", "-e",
                   "_ws.expert.message").splitlines()
    # one warning per direction, on its first cut packet (the records' 60-byte segments)
    assert msgs == [f"6\t{SNAPLEN_WARNING}", f"10\t{SNAPLEN_WARNING}"], msgs
    info = _info_column(pcap, lua, prefs, *passes)
    assert info == [
        "ChannelMagic data relay→ctl | Control Hello relay→ctl host h ranks [0,1]",
        "Control HelloAck ctl→relay",
        "Control RankExit relay→ctl rank 0 | [record header, cut by the capture] | "
        "[20 bytes not captured]",
        *["[no record start] | [20 bytes not captured]"] * 2,
        "[no record start]",  # the last 36 bytes, whole, begin inside a record
        "Control DeclareDead ctl→relay rank 0 | [record header, cut by the capture] | "
        "[20 bytes not captured]",
        *["[no record start] | [20 bytes not captured]"] * 2,
        "[no record start]",
        "HostFrame relay→ctl ranks [0,1] (cut by the capture) | [1420 bytes not captured]",
        "[continuation of HostFrame] | [1420 bytes not captured]",
        # the HostFrame's end and a RankExit not captured: the next segment is placed by its
        # sequence number, not by the bytes captured
        "[continuation of HostFrame] | [1131 bytes not captured]",
        "Control RankExit relay→ctl rank 0"], info
    got = tshark_records_args(pcap, lua, prefs, *passes)
    snap = [f"{PROTO_NAME}.expert.snaplen"]
    assert _listing(got[MUX_UP])[:5] == [
        ("ChannelMagic", []), ("Control", []), ("Control", []), ("Header", []),
        ("20 bytes not captured", snap)]
    hf = "continuation of HostFrame"
    assert _listing(got[MUX_UP])[-7:] == [
        ("HostFrame", []), ("1420 bytes not captured", []), (hf, []),
        ("1420 bytes not captured", []), (hf, []), ("1131 bytes not captured", []),
        ("Control", [])]
    assert got[MUX_UP][-1][0] == {"kind": "Control", "ranks": [0], "variant": "RankExit",
                                  "rank": 0}
    tree = _tshark(pcap, lua, prefs, *passes, "-V", "-Y", PROTO_NAME)
    assert "Record cut by the capture: 40 of its 4064 bytes captured (the capture's snaplen)" \
        in tree
    assert "continuation of HostFrame (bytes 1461 to 2920 of 4064), 40 of them captured" in tree
    assert "record header cut by the capture (13 bytes captured)" in tree
    # nothing is presented as going on in segments not reassembled, nor as truncated
    assert "Expert Info (Note" not in tree and "Expert Info (Error" not in tree
    assert "(continues)" not in tree


#: a LenFramed Model round of one 2-element f32 tensor (51 bytes)
_SMALL_BLOB = b"".join(encode_framed_round(RoundFrame(RoundKind.MODEL, 1.0, [
    TensorPayload.from_array(np.arange(2, dtype=np.float32))]), SALT))


def _rank_connection(sizes: tuple[int, ...] = (1460,)) -> tuple[Capture, Connection]:
    """A capture of rank 1's loopback connection to its relay (port 23460), its handshake sent
    (in segments of ``sizes``)."""
    cap = Capture()
    loop = cap.connect(("127.0.0.1", 40002), ("127.0.0.1", 23460))
    cap.send(loop, True, encode_handshake(1, 4, 2), sizes)
    return cap, loop


def _asked_then_cut_capture() -> Capture:
    """Loopback blobs whose first bytes come in a whole segment and the rest in segments the
    capture cuts: a LenFramed starting in a 30-byte segment, then one whose 4-byte length starts
    in a 3-byte segment, each ending in a whole 30-byte segment; then one starting in a cut
    segment, with a whole 30-byte segment between cut ones; then a small LenFramed in two whole
    segments (20 and 31 bytes)."""
    cap, loop = _rank_connection()
    blob = b"".join(encode_framed_round(_FRAME_4K, SALT))
    rest = len(blob) - 30 - 2 * 1460 - 30
    cap.send(loop, True, blob, (30, 1460, 1460, rest, 30))
    cap.send(loop, True, blob, (3, 1460, 1460, rest + 27, 30))
    cap.send(loop, True, blob, (1460, 30, 1460, rest, 30))
    cap.send(loop, True, _SMALL_BLOB, (20, 31))
    cap.close(loop)
    return cap


@pytest.mark.tshark
@pytest.mark.parametrize("passes", [(), ("-2",)])
@pytest.mark.parametrize("reassemble", ["TRUE", "FALSE"])
def test_a_record_tcp_cannot_reassemble_for_a_cut_segment_goes_on_in_it(
        reassemble: str, passes: tuple[str, ...], lua: Path, tmp_path: Path) -> None:
    # with reassembly on, a record whose start (or header's start) was in a whole segment was
    # handed to TCP to reassemble; TCP reassembles no segment the capture cut, and handed the
    # next one over by itself, which was read as a record start: "[no record start]", or in two
    # passes a bogus length ("Malformed: ... blob length 2147483648 exceeds the frame ceiling");
    # and a cut segment after a whole one inside a record was placed from the last cut one
    pcap = tmp_path / "asked.pcap"
    pcap.write_bytes(_asked_then_cut_capture().pcap(SNAPLEN))
    prefs = {"tcp.reassemble_out_of_order": "FALSE", "tcp.desegment_tcp_streams": reassemble,
             f"{PROTO_NAME}.ports": "23460"}
    info = _info_column(pcap, lua, prefs, *passes)
    lf = "[continuation of LenFramed]"
    small = "LenFramed rank→relay rank [1] Model w=1.0 1 tensor 8 B"
    cut = [f"{lf} | [1420 bytes not captured]"] * 2
    third = ["LenFramed rank→relay rank [1] (cut by the capture) | [1420 bytes not captured]",
             lf, cut[0], f"{lf} | [1023 bytes not captured]", lf]
    if reassemble == "TRUE":
        # the whole segments TCP is asked to reassemble from are TCP's (each "TCP segment of a
        # reassembled PDU"), as is the first blob's last, inside the record TCP keeps
        assert info == [
            "Handshake rank→relay rank 1 world 4 v2",
            *cut, f"{lf} | [1023 bytes not captured]",
            "LenFramed rank→relay rank [1] (cut by the capture) | [1420 bytes not captured]",
            f"{cut[0]}", f"{lf} | [1050 bytes not captured]", lf,
            *third, small], info
    else:
        assert info == [
            "Handshake rank→relay rank 1 world 4 v2",
            "LenFramed rank→relay rank [1] (continues)",
            *cut, f"{lf} | [1023 bytes not captured]", lf,
            "[record header, continues]",
            "LenFramed rank→relay rank [1] (cut by the capture) | [1420 bytes not captured]",
            f"{cut[0]}", f"{lf} | [1050 bytes not captured]", lf,
            *third, "LenFramed rank→relay rank [1] (continues)", lf], info


def _kept_whole_segment_capture() -> Capture:
    """A loopback blob in segments of 30 and 30 bytes (whole), 1460, 1460 and the rest (cut by
    the capture) and 30 (whole), then a small LenFramed in two whole segments (20 and 31)."""
    cap, loop = _rank_connection()
    blob = b"".join(encode_framed_round(_FRAME_4K, SALT))
    cap.send(loop, True, blob, (30, 30, 1460, 1460, len(blob) - 60 - 2 * 1460 - 30, 30))
    cap.send(loop, True, _SMALL_BLOB, (20, 31))
    cap.close(loop)
    return cap


@pytest.mark.tshark
@pytest.mark.parametrize("passes", [(), ("-2",)])
@pytest.mark.parametrize("out_of_order", ["TRUE", "FALSE"])
def test_the_whole_segments_tcp_keeps_of_a_record_are_counted_by_sequence_number(
        out_of_order: str, passes: tuple[str, ...], lua: Path, tmp_path: Path) -> None:
    # TCP, asked to reassemble the blob from its first segment, kept its second (whole) one too,
    # which the dissector never saw: the cut segments were placed 30 bytes early, and the record's
    # end fell inside the next records ("Malformed: ... blob length ... exceeds the frame
    # ceiling", or hundreds of LenFramed records read from tensor bytes, in real captures)
    pcap = tmp_path / "kept.pcap"
    pcap.write_bytes(_kept_whole_segment_capture().pcap(SNAPLEN))
    prefs = {"tcp.reassemble_out_of_order": out_of_order, f"{PROTO_NAME}.ports": "23460"}
    info = _info_column(pcap, lua, prefs, *passes)
    lf = "[continuation of LenFramed]"
    # reassembling out of order, TCP keeps every later whole segment, waiting for the cut bytes
    small = ["LenFramed rank→relay rank [1] Model w=1.0 1 tensor 8 B"] \
        if out_of_order == "FALSE" else []
    assert info == ["Handshake rank→relay rank 1 world 4 v2",
                    *[f"{lf} | [1420 bytes not captured]"] * 2,
                    f"{lf} | [993 bytes not captured]", *small], info
    tree = _tshark(pcap, lua, prefs, *passes, "-V", "-Y", PROTO_NAME)
    assert re.findall(r"continuation of LenFramed \(bytes (\d+) to (\d+) of 4043\)", tree) == [
        ("61", "1520"), ("1521", "2980"), ("2981", "4013")]


@pytest.mark.tshark
@pytest.mark.parametrize("passes", [(), ("-2",)])
def test_bytes_tcp_was_asked_for_out_of_sync_start_no_record_in_a_cut_segment(
        passes: tuple[str, ...], lua: Path, tmp_path: Path) -> None:
    # out of sync (the blob's start is past the capture's cut), a whole 2-byte segment was handed
    # to TCP to reassemble as a record header's start; the cut segment after it was read as that
    # header's end: a LenFramed record invented from tensor bytes
    data = _SMALL_BLOB + b"".join(encode_framed_round(_FRAME_4K, SALT))
    cap, loop = _rank_connection()
    cap.send(loop, True, data, (1460, 2, 1460, len(data) - 2922))
    cap.send(loop, True, _SMALL_BLOB, (20, 31))
    cap.close(loop)
    pcap = tmp_path / "oos.pcap"
    pcap.write_bytes(cap.pcap(SNAPLEN))
    prefs = {"tcp.reassemble_out_of_order": "FALSE", f"{PROTO_NAME}.ports": "23460"}
    info = _info_column(pcap, lua, prefs, *passes)
    assert info == [
        "Handshake rank→relay rank 1 world 4 v2",
        "LenFramed rank→relay rank [1] (cut by the capture) | [1420 bytes not captured]",
        "[no record start] | [1420 bytes not captured]",
        "[no record start] | [1132 bytes not captured]",
        "LenFramed rank→relay rank [1] Model w=1.0 1 tensor 8 B"], info


@pytest.mark.tshark
@pytest.mark.parametrize("passes", [(), ("-2",)])
@pytest.mark.parametrize("out_of_order", ["TRUE", "FALSE"])
def test_two_passes_place_the_segments_after_ones_tcp_keeps_as_one_pass_does(
        out_of_order: str, passes: tuple[str, ...], lua: Path, tmp_path: Path) -> None:
    # a blob above the ceiling in cut segments, a small one in whole segments (which TCP,
    # reassembling out of order, keeps: it waits for the bytes the capture cut), then a blob
    # starting inside a cut segment. The second pass placed the cut segments by sequence number
    # only while the direction's segments it had placed followed each other, and the handshake,
    # handed over for reassembly, was never placed: the first pass's counted states stood, and
    # the bytes after those TCP kept were read as records ("LenFramed ... (not a RoundFrame)",
    # "Malformed: ... blob length 2147483648 exceeds the frame ceiling")
    blob = b"".join(encode_framed_round(_FRAME_4K, SALT))
    cap, loop = _rank_connection()
    cap.send(loop, True, blob, (1460,))
    cap.send(loop, True, _SMALL_BLOB, (20, 31))
    cap.send(loop, True, _SMALL_BLOB[:30])
    cap.send(loop, True, _SMALL_BLOB[30:] + blob, (1460,))
    cap.close(loop)
    pcap = tmp_path / "kept-then-cut.pcap"
    pcap.write_bytes(cap.pcap(SNAPLEN))
    prefs = {"tcp.reassemble_out_of_order": out_of_order, f"{PROTO_NAME}.ports": "23460",
             f"{PROTO_NAME}.ceiling": "1000"}
    info = _info_column(pcap, lua, prefs, *passes)
    lf = "[continuation of LenFramed]"
    big = ("Malformed: loopback leg: len-framed blob length 4039 exceeds the frame ceiling 1000; "
           "corrupt or hostile peer")
    head = ["Handshake rank→relay rank 1 world 4 v2", f"{big} | [1420 bytes not captured]",
            f"{lf} | [1420 bytes not captured]", f"{lf} | [1083 bytes not captured]"]
    if out_of_order == "TRUE":
        # the small blobs' segments are TCP's; the cut segment after them begins out of sync
        assert info == [*head, *["[no record start] | [1420 bytes not captured]"] * 2,
                        "[no record start] | [1104 bytes not captured]"], info
    else:
        assert info == [*head, "LenFramed rank→relay rank [1] Model w=1.0 1 tensor 8 B",
                        f"{lf} | {big} | [1420 bytes not captured]",
                        f"{lf} | [1420 bytes not captured]",
                        f"{lf} | [1104 bytes not captured]"], info


@pytest.mark.parametrize("cut", [None, (5,), (20, 9)])
def test_the_status_responder_s_http_on_a_flodl_port_is_http_not_malformed(
        cut: tuple[int, ...] | None, lua: Path, tmp_path: Path) -> None:
    # the controller serves GET /status on its port: with the port registered, the HTTP
    # connection's packets showed as "Malformed: frame magic 0x20544547"
    good = RoundFrame(RoundKind.MODEL, 2.0, [TensorPayload.from_array(
        np.array([1.0, 2.0], np.float32))])
    cap = Capture()
    data: Connection = cap.connect(("10.0.0.2", 40001), ("10.0.0.1", 23458))
    cap.send(data, True, encode_channel_magic("data") + _record(Hello("h", [4, 5]), 2))
    cap.send(data, True, b"".join(encode_frame_record(RecordKind.HOST_FRAME, good, SALT)))
    http: Connection = cap.connect(("10.0.0.3", 40002), ("10.0.0.1", 23458))
    request = b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n"
    cap.send(http, True, request, cut or (len(request),))  # cut: segments a reader reassembles
    body = b'{"state": "running"}'
    reply = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
             b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    cap.send(http, False, reply, cut or (len(reply),))
    pcap = tmp_path / "status.pcap"
    pcap.write_bytes(cap.pcap())
    prefs = {f"{PROTO_NAME}.ports": "23458"}
    got = tshark_records(pcap, lua, prefs)
    assert sorted(got) == ["10.0.0.2:40001 -> 10.0.0.1:23458"]  # no flodl record for HTTP
    assert [r["kind"] for r, _ in got["10.0.0.2:40001 -> 10.0.0.1:23458"]] == [
        "ChannelMagic", "Control", "HostFrame"]
    http_lines = _tshark(pcap, lua, prefs, "-Y", "http", "-T", "fields", "-e", "http.request.uri",
                         "-e", "http.response.code").splitlines()
    assert [line.strip() for line in http_lines] == ["/status", "200"]
    assert "Malformed" not in _tshark(pcap, lua, prefs)


def _t_like(f: RoundFrame) -> dict[str, Any]:
    return {"kind": int(f.kind), "weight": f"{f.weight:.15g}",
            "tensors": [(t.dtype, list(t.shape), t.nbytes) for t in f.tensors]}


# -------------------------------------------------------------------------------------------------
# A real cluster, captured on a private loopback
# -------------------------------------------------------------------------------------------------
_CAPTURE_SCRIPT = r"""
set -e
ip link set lo up
pcap=$1
tcpdump -i lo -B 262144 -s 0 -U -w "$pcap" tcp or udp port 9 2> "$pcap.log" &
td=$!
for _ in $(seq 50); do grep -q listening "$pcap.log" 2>/dev/null && break; sleep 0.1; done
shift
"$@" > /dev/null 2>&1 || true
# tcpdump drops what it has not yet taken from its ring buffer when it is stopped (and does not
# count it as dropped), so stop it only once it has written a marker sent after the demo.
echo end > /dev/udp/127.0.0.1/9
for _ in $(seq 600); do
  [ -n "$(tcpdump -r "$pcap" -c 1 udp port 9 2>/dev/null)" ] && break
  sleep 0.1
done
kill -INT $td
wait $td || true
"""


@pytest.mark.tshark
@pytest.mark.capture
@pytest.mark.timeout(600)
def test_demo_capture_matches_decode(lua: Path, tmp_path: Path) -> None:
    pcap = tmp_path / "demo.pcap"
    script = tmp_path / "capture.sh"
    script.write_text(_CAPTURE_SCRIPT, encoding="utf-8")
    subprocess.run(["unshare", "-n", "bash", str(script), str(pcap), sys.executable, "-m",
                    "flodl_proto.cli", "demo", "--world-size", "4", "--hosts", "2",
                    "--rounds", "5", "--no-progress"], check=True, timeout=500)
    log = (tmp_path / "demo.pcap.log").read_text(encoding="utf-8")
    assert re.search(r"^0 packets dropped by kernel$", log, re.M), log
    servers = sorted({int(p) for p in _tshark(
        pcap, lua, {}, "-Y", "tcp.flags.syn == 1 && tcp.flags.ack == 0", "-T", "fields",
        "-e", "tcp.dstport").split()})
    assert len(servers) == 3  # the controller and the two relays' loopback listeners
    # the listeners are named: an ephemeral port can be one another dissector registers (34980
    # is EtherCAT's), which Wireshark asks before any heuristic, but after the listener's port
    prefs = {f"{PROTO_NAME}.bytes_limit": "256",
             f"{PROTO_NAME}.ports": ",".join(map(str, servers))}
    got = tshark_records(pcap, lua, prefs)
    decoded: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = {}
    for port in servers:
        kinds = {r["kind"] for label, recs in got.items() if label.endswith(f":{port}")
                 for r, _ in recs}
        leg = "loopback" if "Handshake" in kinds else "mux"
        decoded.update(decode_records(pcap, port, leg, None))
    assert len(decoded) == 12  # 2 relays x 2 directions + 4 ranks x 2 directions
    assert all(final.get("type") == "end" for _, final in decoded.values()), {
        label: final for label, (_, final) in decoded.items() if final.get("type") != "end"}
    n = compare(got, decoded, expect_experts=False)
    assert all(not ex for recs in got.values() for _, ex in recs)
    hellos = sorted(r["hello_ranks"] for recs in got.values() for r, _ in recs
                    if r.get("variant") == "Hello")
    assert hellos == [[0, 1], [2, 3]]
    hostframes = [r for recs in got.values() for r, _ in recs if r["kind"] == "HostFrame"]
    broadcasts = [r for recs in got.values() for r, _ in recs if r["kind"] == "Broadcast"]
    assert len(hostframes) == len(broadcasts) >= 10 and n > 60
    big = [r for r in hostframes if any(t[2] >= 1 << 20 for t in r["frame"]["tensors"])]
    assert len(big) >= 10  # the demo's 1 MiB tensor, reassembled from many segments


def test_decode_salt_file_verifies_what_the_dissector_cannot(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    """The tree's tags say 'check with flodl-proto decode --salt-file PATH': that command."""
    pcap = tmp_path / "cluster.pcap"
    pcap.write_bytes(_cluster_capture(3).pcap())
    salt_file = tmp_path / "salt"
    salt_file.write_text(SALT.hex() + "\n", encoding="ascii")
    args = ["decode", "--pcap", str(pcap), "--port", "23456", "--protocol-version", "3"]
    assert main([*args, "--salt-file", str(salt_file)]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    tags = [r["tag_status"] for r in lines if r["type"] == "mux_record"]
    tags += [r["frame"]["tag_status"] for r in lines if "frame" in r]
    # 5 control records, and per frame a HostFrame and a Broadcast with two tags each
    assert len(tags) == 5 + 4 * len(_frames(3)) and set(tags) == {"ok"}
    salt_file.write_bytes(bytes(16))  # 16 raw bytes: another salt
    assert main([*args, "--salt-file", str(salt_file)]) == 3
    assert main([*args, "--salt-file", str(tmp_path / "none")]) == 2  # bad command line
    assert "flodl-proto decode: error: argument --salt-file: " in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*args, "--salt", SALT.hex(), "--salt-file", str(salt_file)])


@pytest.mark.tshark
def test_decode_as_and_ports_preference_where_the_heuristic_cannot_tell(lua: Path,
                                                                        tmp_path: Path) -> None:
    """A loopback stream whose first segment is too short for the heuristic (it needs the
    RoundFrame magic after the length prefix) is found through Decode As or the ports
    preference."""
    cap = Capture()
    c = cap.connect(("127.0.0.1", 40002), ("127.0.0.1", 23460))
    frames = _frames(2)
    cap.send(c, True, b"".join(b"".join(encode_framed_round(f, SALT)) for f in frames),
             (5, 20, 3, 1400))
    pcap = tmp_path / "loop.pcap"
    pcap.write_bytes(cap.pcap())
    assert tshark_records(pcap, lua, {}) == {}
    label = "127.0.0.1:40002 -> 127.0.0.1:23460"
    want = [_t_like(f) for f in frames]
    for prefs, args in (({}, ("-d", "tcp.port==23460,flodl")),
                        ({f"{PROTO_NAME}.ports": "23460"}, ())):
        text = _tshark(pcap, lua, prefs, *args, "-Y", f"{PROTO_NAME}.kind", "-T", "fields",
                       "-e", f"{PROTO_NAME}.kind")
        assert ",".join(text.split()).split(",") == ["LenFramed"] * len(frames)
        if not args:
            got = tshark_records(pcap, lua, prefs)
            assert [r["frame"] for r, _ in got[label]] == want


def _one_host_frame(frame: RoundFrame, version: int, pcap: Path) -> Path:
    """Write ``pcap``: one relay connection to port 23456 carrying a Hello and ``frame`` as a
    HostFrame."""
    cap = Capture()
    mux = cap.connect(("10.0.0.2", 40001), ("10.0.0.1", 23456))
    cap.send(mux, True, encode_channel_magic("data") + _record(Hello("host-a", [0]), version)
             + b"".join(encode_frame_record(RecordKind.HOST_FRAME, frame, SALT)))
    cap.close(mux)
    pcap.write_bytes(cap.pcap())
    return pcap


@pytest.mark.tshark
def test_an_unknown_dtype_is_lenient_not_malformed(lua: Path, tmp_path: Path) -> None:
    """Any dtype byte is accepted by the reader (leniency ``dtype_any``): the dissector marked
    dtype 7 malformed (an error) beside its "accepted by the reader" warning, and the warning
    told the reader to extend Rust code."""
    frame = RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload(7, [2], b"\x01\x02")])
    pcap = _one_host_frame(frame, 2, tmp_path / "dtype7.pcap")
    got = tshark_records(pcap, lua, {})
    (recs,) = [r for label, r in got.items() if label.endswith(":23456")]
    assert [r["kind"] for r, _ in recs][-1] == "HostFrame"
    assert recs[-1][1] == [f"{PROTO_NAME}.expert.lenient"]
    res = subprocess.run(["tshark", "-n", "-r", str(pcap), "-X", f"lua_script:{lua}", "-T",
                          "fields", "-e", "_ws.expert.message"],
                         capture_output=True, text=True, timeout=120, check=True)
    assert "unknown dtype tag 7 (0 = f32, 1 = bf16): accepted by the reader, rejected by the " \
           "fold" in res.stdout
    assert "extend round_frame.rs" not in res.stdout


@pytest.mark.tshark
def test_an_empty_payload_reads_as_none_not_missing(lua: Path, tmp_path: Path) -> None:
    """An elided tensor (and one of shape [0]) showed ``Data: <MISSING>``, Wireshark's words for
    bytes a capture lacks; nothing was cut."""
    frame = RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload(Dtype.F32, [0], b""),
                                              TensorPayload(Dtype.F32, [4], b"")])
    pcap = _one_host_frame(frame, 3, tmp_path / "empty.pcap")
    res = subprocess.run(["tshark", "-n", "-r", str(pcap), "-X", f"lua_script:{lua}", "-o",
                          "flodl.version:3", "-V"],
                         capture_output=True, text=True, timeout=120, check=True)
    assert "<MISSING>" not in res.stdout
    assert res.stdout.count("Data: none (0 bytes)") == 2, res.stdout


@pytest.mark.tshark
@pytest.mark.parametrize("version", [2, 3])
def test_an_empty_model_sigs_is_shown_over_its_count_byte(version: int, lua: Path,
                                                         tmp_path: Path) -> None:
    """A version 3 Hello's model_sigs (empty on the data channel: one count byte, 0) had no item
    in the tree: the payload's last byte belonged to no field, though the Info column said
    ``model_sigs 0``. At version 2 the field is absent from the wire and from the tree."""
    frame = RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload(Dtype.F32, [1], b"\0\0\x80?")])
    pcap = _one_host_frame(frame, version, tmp_path / "hello.pcap")
    res = subprocess.run(["tshark", "-n", "-r", str(pcap), "-X", f"lua_script:{lua}", "-V"],
                         capture_output=True, text=True, timeout=120, check=True)
    shown = [line.strip() for line in res.stdout.splitlines() if "Model sigs" in line]
    assert shown == (["Model sigs: none (0 entries)"] if version == 3 else []), res.stdout
    assert "Lua Error" not in res.stdout


@pytest.mark.tshark
@pytest.mark.parametrize("passes", [(), ("-2",)])
def test_a_mux_record_above_the_ceiling_is_named_as_its_kind_names_it(
        passes: tuple[str, ...], lua: Path, tmp_path: Path) -> None:
    # the reader's "(kind=0x03, rank=0)": a HostFrame's or Broadcast's header rank is always 0
    # (only a Data record fills it), so the text named a rank 0 the record has nothing to do with
    small = RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload.from_array(
        np.arange(50, dtype=np.float32))])
    cap = Capture()
    mux = cap.connect(("10.0.0.2", 40001), ("10.0.0.1", 23456))
    cap.send(mux, True, encode_channel_magic("data"))
    host_frame = b"".join(encode_frame_record(RecordKind.HOST_FRAME, small, SALT))
    cap.send(mux, True, host_frame)  # before the Hello: no ranks known
    cap.send(mux, True, encode_mux_record_bytes(MuxRecord.data(3, b"\0" * 200), SALT))
    cap.send(mux, True, _record(Hello("h", [0, 1]), 2))
    cap.send(mux, True, host_frame)
    cap.send(mux, True, _record(Hello("h" * 200, [0, 1]), 2))
    cap.send(mux, False, b"".join(encode_frame_record(RecordKind.BROADCAST, small, SALT)))
    cap.close(mux)
    pcap = tmp_path / "ceiling-kinds.pcap"
    pcap.write_bytes(cap.pcap())
    prefs = {f"{PROTO_NAME}.ceiling": "100"}
    msgs = _tshark(pcap, lua, prefs, *passes, "-Y", f"_ws.expert && {PROTO_NAME}", "-T",
                   "fields", "-e", "_ws.expert.message").splitlines()
    head = ("relay_mux: record payload_len {} exceeds the frame ceiling 100 ({}); corrupt or "
            "hostile peer, or a model that has outgrown the frame ceiling")
    frame_len = len(host_frame) - 25
    # as the record's tree item and Info column, the ranks of the connection's Hello: none yet on
    # the first pass, the ones the first pass learned on a second
    first = "kind=0x03 HostFrame relay→ctl" + (" ranks [0,1]" if passes else "")
    assert msgs == [
        head.format(frame_len, first),
        head.format(200, "kind=0x01 Data relay↔ctl rank 3"),
        head.format(frame_len, "kind=0x03 HostFrame relay→ctl ranks [0,1]"),
        head.format(len(encode_control(Hello("h" * 200, [0, 1]), 2)),
                    "kind=0x02 Control relay↔ctl"),
        head.format(frame_len, "kind=0x04 Broadcast ctl→relay ranks [0,1]")], msgs
    assert not any("rank=" in m for m in msgs), msgs


def _retransmitted_and_reordered_capture() -> Capture:
    """Reassembly off: upstream, a HostFrame's middle segment captured twice (retransmitted)
    and, at the end, its first segment again; downstream, a Broadcast's last two segments
    captured in reverse order (the last one ends with a DeclareDead)."""
    cap = Capture()
    mux = cap.connect(("10.0.0.2", 40001), ("10.0.0.1", 23456))
    cap.send(mux, True, encode_channel_magic("data") + _record(Hello("h", [0, 1]), 2))
    first = len(cap.packets)
    cap.send(mux, True, b"".join(encode_frame_record(RecordKind.HOST_FRAME, _FRAME_4K, SALT))
             + _record(RankExit(1), 2))
    assert len(cap.packets) == first + 3
    cap.packets.insert(first + 2, cap.packets[first + 1])  # the middle segment, again
    cap.send(mux, True, _record(RankExit(0), 2))
    cap.send(mux, False, _record(HelloAck(), 2))
    before = len(cap.packets)
    cap.send(mux, False, b"".join(encode_frame_record(RecordKind.BROADCAST, _FRAME_4K, SALT))
             + _record(DeclareDead(7), 2))
    assert len(cap.packets) == before + 3
    cap.packets[-1], cap.packets[-2] = cap.packets[-2], cap.packets[-1]
    cap.send(mux, False, _record(DeclareDead(8), 2))
    cap.resend(first)  # the HostFrame's first segment, late
    cap.close(mux)
    return cap


@pytest.mark.tshark
@pytest.mark.parametrize("passes", [(), ("-2",)])
@pytest.mark.parametrize("handed", ["TRUE", "FALSE"])
def test_without_reassembly_retransmitted_and_reordered_segments_keep_the_records(
        handed: str, passes: tuple[str, ...], lua: Path, tmp_path: Path) -> None:
    # the bytes of every segment handed over were counted, in capture order: a segment after
    # one captured late took its place in the record (the DeclareDead at its end was shown as
    # the Broadcast's bytes, and the next record too), a retransmission moved the record's end
    # by its length, and a spurious one (TCP hands it over whatever the preference) started
    # the record again; on tshark -2's second pass as on the first
    pcap = tmp_path / "retransmitted.pcap"
    pcap.write_bytes(_retransmitted_and_reordered_capture().pcap())
    # TCP's "do not call subdissectors for error packets" (on by default) keeps the
    # retransmission and the out-of-order segment from the dissector; off, it hands them over
    prefs = {**REASSEMBLY_OFF, "tcp.no_subdissector_on_error": handed}
    got = tshark_records_args(pcap, lua, prefs, *passes)
    hf, bc = "continuation of HostFrame", "continuation of Broadcast"
    shown = handed == "FALSE"
    assert _listing(got[MUX_UP]) == [
        ("ChannelMagic", []), ("Control", []), ("HostFrame", [CONTINUED]), (hf, []),
        *[(hf, [])] * shown, (hf, []), ("Control", []), ("Control", []),
        ("HostFrame", [CONTINUED])]
    assert [r.get("rank") for r, _ in got[MUX_UP]][-3:-1] == [1, 0]
    assert _listing(got[MUX_DOWN]) == [("Control", []), ("Broadcast", [CONTINUED]), (bc, []),
                                       ("Control", []), *[(bc, [])] * shown, ("Control", [])]
    assert [r.get("rank") for r, _ in got[MUX_DOWN]] == [
        None, None, None, 7, *[None] * shown, 8]
    # without a display filter, tshark -2's first pass builds no tree: TCP's fields (tcp.seq)
    # have no value there, and the second pass places the segments
    info = _info_column(pcap, lua, prefs, *passes)
    assert [re.sub(r"^(\[TCP [^]]*\] )*", "", line) for line in info] == [
        "ChannelMagic data relay→ctl | Control Hello relay→ctl host h ranks [0,1]",
        "HostFrame relay→ctl ranks [0,1] (continues)",
        "[continuation of HostFrame]",
        # the retransmission: the same bytes read from the same place
        *["[continuation of HostFrame]"] * shown,
        "[continuation of HostFrame] | Control RankExit relay→ctl rank 1",
        "Control RankExit relay→ctl rank 0",
        "Control HelloAck ctl→relay",
        "Broadcast ctl→relay ranks [0,1] (continues)",
        "[continuation of Broadcast] | Control DeclareDead ctl→relay rank 7",
        *["[continuation of Broadcast]"] * shown,  # the segment captured late
        "Control DeclareDead ctl→relay rank 8",
        "HostFrame relay→ctl ranks [0,1] (continues)"]  # the first segment again
    tree = _tshark(pcap, lua, prefs, *passes, "-V")
    # (each record's expert infos are the listings' above: the notes of the three records
    # that continue, nothing else)
    assert "Malformed" not in tree and "bytes that start no record" not in tree
    assert tree.count("continuation of HostFrame (bytes 1461 to 2920 of 4064)") == 1 + shown
    assert tree.count("continuation of Broadcast (bytes 2921 to 4064 of 4064)") == 1
    assert tree.count("continuation of Broadcast (bytes 1461 to 2920 of 4064)") == shown


@pytest.mark.tshark
@pytest.mark.parametrize("passes", [(), ("-2",)])
@pytest.mark.parametrize("size", [10, 13, 24, 29])
def test_without_reassembly_a_header_cut_by_its_segment_is_completed_from_the_next(
        size: int, passes: tuple[str, ...], lua: Path, tmp_path: Path) -> None:
    # a record header cut by its segment's end was a truncated record (an error), and the
    # direction skipped every segment up to the next that began a record: in segments of
    # 10 to 29 bytes, all but a few records were lost
    cap = _mux_capture_cut(3, size)
    loop = cap.connect(("127.0.0.1", 40002), ("127.0.0.1", 23460))
    # the first segment ends 2 bytes into the first blob's length prefix
    blobs = b"".join(encode_framed_round(_FRAME_4K, SALT)) * 2
    cap.send(loop, True, encode_handshake(1, 4, 3) + blobs, (18, 1460))
    cap.close(loop)
    pcap = tmp_path / "cut.pcap"
    pcap.write_bytes(cap.pcap())
    got = tshark_records_args(pcap, lua, REASSEMBLY_OFF, *passes)
    # the records (not continuations, cut headers or skipped bytes)
    records = {label: [r for r, _ in recs if r.get("kind") not in (None, "Header")]
               for label, recs in got.items()}
    assert [r["kind"] for r in records[MUX_UP]] == [
        "ChannelMagic", "Control", "HostFrame", "HostFrame", "HostFrame", "Control", "Control"]
    assert records[MUX_UP][-1] == {"kind": "Control", "ranks": [1], "variant": "RankExit",
                                   "rank": 1}
    assert [r["kind"] for r in records[MUX_DOWN]] == [
        "Control", "Broadcast", "Broadcast", "Broadcast"]
    assert [r["kind"] for r in records[LOOP_UP]] == ["Handshake", "LenFramed", "LenFramed"]
    # nothing but the notes of records (and headers) that go on in the next segments
    assert {e for recs in got.values() for _, ex in recs for e in ex} == {CONTINUED}
    headers = [r for recs in got.values() for r, _ in recs if r.get("kind") == "Header"]
    assert len(headers) >= 3
    info = _tshark(pcap, lua, REASSEMBLY_OFF, *passes, "-T", "fields", "-e",
                   "_ws.col.Info").splitlines()
    assert "Handshake rank→relay rank 1 world 4 v3 | [record header, continues]" in info
    assert "LenFramed rank→relay rank [1] (continues)" in info
    # the blob's first segment held 2 bytes of it, the next 1460: its bytes are numbered on
    tree = _tshark(pcap, lua, REASSEMBLY_OFF, *passes, "-V", "-Y", "tcp.port == 23460")
    assert "continuation of LenFramed (bytes 1463 to 1480 of 4043)" in tree


_SMALL = "LenFramed rank→relay rank [1] Model w=1.0 1 tensor 8 B"


@pytest.mark.tshark
@pytest.mark.parametrize("passes", [(), ("-2",)])
@pytest.mark.parametrize("sizes", [(1, 15), (2, 14), (3, 13), (1, 1, 1, 13), (2, 5, 9)])
def test_without_reassembly_a_direction_s_first_bytes_too_few_to_tell_are_read_with_the_next(
        sizes: tuple[int, ...], passes: tuple[str, ...], lua: Path, tmp_path: Path) -> None:
    # a first segment of 1 to 3 bytes (the rank's handshake sent as 2 bytes, then the rest) was
    # skipped as starting no record (a warning), and so was the next, which begins inside the
    # handshake: the handshake and the records after it were lost
    cap, loop = _rank_connection(sizes)
    cap.send(loop, True, _SMALL_BLOB * 2)
    cap.close(loop)
    pcap = tmp_path / "short-first.pcap"
    pcap.write_bytes(cap.pcap())
    prefs = {**REASSEMBLY_OFF, f"{PROTO_NAME}.ports": "23460"}
    # too few bytes to tell whether a record starts: kept, and read with the next segment's; a
    # record's magic among them is a record header cut by its segment's end
    heads = ["[possible record header]" if sum(sizes[:k + 1]) < 4 else
             "[record header, continues]" for k in range(len(sizes) - 1)]
    info = _info_column(pcap, lua, prefs, *passes)
    assert info == [*heads, "Handshake rank→relay rank 1 world 4 v2", f"{_SMALL} | {_SMALL}"], info
    got = tshark_records_args(pcap, lua, prefs, *passes)
    assert [(r["kind"], r["ranks"], ex) for r, ex in got[LOOP_UP]] == [
        *[("Header", [], [CONTINUED])] * len(heads),
        ("Handshake", [1], []), ("LenFramed", [1], []), ("LenFramed", [1], [])]
    # (a note: the bytes are kept for the next segment)
    tree = _tshark(pcap, lua, prefs, *passes, "-V", "-Y", PROTO_NAME)
    assert (f"Expert Info (Note/Reassemble): possible record header: {sizes[0]} bytes out of "
            "sync, too few to tell whether a record starts here (read with the next "
            "segment's)") in tree


@pytest.mark.tshark
@pytest.mark.parametrize("passes", [(), ("-2",)])
def test_without_reassembly_first_bytes_too_few_to_tell_that_start_no_record_are_not_one(
        passes: tuple[str, ...], lua: Path, tmp_path: Path) -> None:
    # the bytes kept from a short first segment and the next segment's do not start a record:
    # the next segment is read on its own, a record if it begins with one (upstream), skipped
    # with the warning otherwise (downstream: 3 bytes, then 30 from inside a blob, then a blob)
    cap = Capture()
    loop = cap.connect(("127.0.0.1", 40002), ("127.0.0.1", 23460))
    cap.send(loop, True, _SMALL_BLOB[-2:])
    cap.send(loop, True, _SMALL_BLOB)
    cap.send(loop, False, _SMALL_BLOB[-3:])
    cap.send(loop, False, _SMALL_BLOB[8:38])
    cap.send(loop, False, _SMALL_BLOB)
    cap.close(loop)
    pcap = tmp_path / "short-first-no-record.pcap"
    pcap.write_bytes(cap.pcap())
    prefs = {**REASSEMBLY_OFF, f"{PROTO_NAME}.ports": "23460"}
    small = "LenFramed rank↔relay Model w=1.0 1 tensor 8 B"
    info = _info_column(pcap, lua, prefs, *passes)
    assert info == ["[possible record header]", small, "[possible record header]",
                    "[no record start]", small], info
    got = tshark_records_args(pcap, lua, prefs, *passes)
    warned = [f"{PROTO_NAME}.expert.no_record_start"]
    assert _listing(got[LOOP_UP]) == [("Header", [CONTINUED]), ("LenFramed", [])]
    assert _listing(got[_reverse(LOOP_UP)]) == [
        ("Header", [CONTINUED]), ("30 bytes skipped", warned), ("LenFramed", [])]


@pytest.mark.tshark
@pytest.mark.parametrize("passes", [(), ("-2",)])
@pytest.mark.parametrize("sizes", [(4, 12), (5, 11), (8, 8), (15, 1), (4, 4, 8)])
def test_without_reassembly_a_handshake_cut_by_its_segment_is_read_whole_for_its_rank(
        sizes: tuple[int, ...], passes: tuple[str, ...], lua: Path, tmp_path: Path) -> None:
    # a handshake cut by its segment's end was a record that continues: its rank (and which end
    # is the rank's) was never read, and the connection's records were "rank↔relay", without
    # flodl.rank; the ack too
    cap, loop = _rank_connection(sizes)
    cap.send(loop, False, encode_ack(2), (5, 3))
    cap.send(loop, True, _SMALL_BLOB * 2)
    cap.send(loop, False, _SMALL_BLOB)
    cap.close(loop)
    pcap = tmp_path / "short-handshake.pcap"
    pcap.write_bytes(cap.pcap())
    prefs = {**REASSEMBLY_OFF, f"{PROTO_NAME}.ports": "23460"}
    info = _info_column(pcap, lua, prefs, *passes)
    heads = ["[record header, continues]"] * (len(sizes) - 1)
    assert info == [*heads, "Handshake rank→relay rank 1 world 4 v2",
                    "[record header, continues]", "HandshakeAck relay→rank v2",
                    f"{_SMALL} | {_SMALL}", _SMALL.replace("rank→relay", "relay→rank")], info
    got = tshark_records_args(pcap, lua, prefs, *passes)
    assert [(r["kind"], r["ranks"]) for r, _ in got[LOOP_UP]] == [
        *[("Header", [])] * len(heads), ("Handshake", [1]), ("LenFramed", [1]),
        ("LenFramed", [1])]
    assert [(r["kind"], r["ranks"]) for r, _ in got[_reverse(LOOP_UP)]] == [
        ("Header", []), ("HandshakeAck", []), ("LenFramed", [1])]


@pytest.mark.parametrize(("port", "shown"), [
    (70000, "70000"), (0, "0"),
    # printed whole, it raised Python's own ValueError (an int of over 4300 digits)
    (10**5000, "<an integer of 16610 bits>"),
], ids=["70000", "0", "huge"])
def test_render_dissector_names_a_bad_port(port: int, shown: str) -> None:
    from flodl_proto.dissector import render_dissector

    with pytest.raises(ValueError) as ei:
        render_dissector([port])
    assert str(ei.value) == f"port {shown} is not a TCP port (1..65535)"


@pytest.mark.skipif(not Path("/proc/version").is_file(), reason="needs Linux's /proc")
def test_out_in_a_folder_that_takes_no_new_file_names_the_step(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--out /proc/version`` said ``No such file or directory`` of a file that exists: the
    file is replaced by a temporary file renamed onto it, and /proc takes no new file."""
    import os

    assert main(["dissector", "--out", "/proc/version"]) == 1
    why = ("creating a temporary file in /proc to replace it: No such file or directory (the "
           "folder takes no new file)" if os.geteuid() == 0 else "Permission denied")
    assert capsys.readouterr() == (
        "", f"flodl-proto dissector: error: cannot write '/proc/version': {why}\n")


@pytest.mark.tshark
@pytest.mark.parametrize("extra", [1, 3])
def test_bytes_after_a_message_or_a_frame_are_counted_in_words(extra: int, lua: Path,
                                                               tmp_path: Path) -> None:
    """The expert info of bytes a reader ignores (after a HostFrame's RoundFrame; after a
    Hello read at version 2, such as a version 3 Hello's model_sigs) said "1 bytes": one byte
    is "1 byte"."""
    frame = RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload.from_array(
        np.array([1.0], np.float32))])
    wire = b"".join(encode_frame_record(RecordKind.HOST_FRAME, frame, SALT))
    padded = MuxRecord(RecordKind.HOST_FRAME, 0, memoryview(wire[25:] + bytes(extra)))
    hello = encode_mux_record_bytes(MuxRecord.control_msg(Hello("h", [0]), version=3), SALT)
    cap = Capture()
    mux = cap.connect(("10.0.0.2", 40001), ("10.0.0.1", 23456))
    cap.send(mux, True, encode_channel_magic("data") + hello
             + encode_mux_record_bytes(padded, SALT))
    cap.close(mux)
    pcap = tmp_path / "trailing.pcap"
    pcap.write_bytes(cap.pcap())
    res = subprocess.run(["tshark", "-n", "-r", str(pcap), "-X", f"lua_script:{lua}",
                          "-o", f"{PROTO_NAME}.ports:{23456}", "-o", f"{PROTO_NAME}.version:2",
                          "-T", "fields", "-e", "_ws.expert.message"],
                         capture_output=True, text=True, timeout=120, check=True)
    shown = [m for line in res.stdout.splitlines() for m in line.split(",") if "after" in m]
    noun = "byte" if extra == 1 else "bytes"
    assert shown == ["1 byte after the message (ignored by the reader)",
                     f"{extra} {noun} after the RoundFrame (ignored by the reader)"], res.stdout
