"""The conformance kit: catalogue, builders, case selection, reports, docs, and runs of the whole
catalogue against this package's own controller and relay (in process), plus one launched
end-to-end run of the command line per role and version."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flodl_proto.cli import main
from flodl_proto.codec.round_frame import (
    RoundFrame,
    TensorPayload,
    decode_round_frame,
    encode_round_frame_bytes,
)
from flodl_proto.conform import (
    Case,
    CatalogueError,
    KitSettings,
    load_catalogue,
    run_cases,
    select_cases,
)
from flodl_proto.conform.builders import BuildContext, build, frame_bytes, other_salt
from flodl_proto.conform.catalogue import ACTIONS
from flodl_proto.conform.doc import render_conformance_doc
from flodl_proto.conform.inprocess import controller_target, relay_target
from flodl_proto.conform.player import first_difference, free_port
from flodl_proto.conform.report import (
    case_line,
    exit_code,
    section_order,
    summary_by_section,
    write_json,
    write_junit,
)
from flodl_proto.conform.sections import resolve_section
from flodl_proto.conform.target import fill_placeholders
from flodl_proto.errors import shown, shown_name
from flodl_proto.reduce import reduce_realized_work, sum_frames
from flodl_proto.spec import SPEC

from .conftest import run_with_file_size_limit
from .spec_util import spec_with_constant

ROOT = Path(__file__).resolve().parent.parent
CATALOGUE = load_catalogue()
SALT = bytes(range(16))
#: cases whose waits follow an unscaled 10 s timeout: run once (version 3) in process
SLOW = ("controller.lifecycle.handshake-deadline",)
SETTINGS = KitSettings(timeout_scale=0.1)

# -- catalogue ------------------------------------------------------------------------------------


def test_catalogue_covers_the_issue_areas() -> None:
    ids = {c.id for c in CATALOGUE}
    roles = {c.role for c in CATALOGUE}
    assert roles == {"controller", "relay"}
    groups = {c.id.rsplit(".", 1)[0] for c in CATALOGUE}
    for g in ("controller.magic", "controller.portmux", "controller.hello", "controller.round",
              "controller.auth", "controller.schema", "controller.lifecycle", "controller.limits",
              "controller.session", "relay.handshake", "relay.fold", "relay.auth",
              "relay.schema", "relay.lifecycle", "relay.limits"):
        assert g in groups, g
    assert "controller.lifecycle.elastic-scatter" in ids
    assert len(ids) == len(CATALOGUE)


def test_every_case_links_a_section_and_a_known_error() -> None:
    for c in CATALOGUE:
        sec = resolve_section(c.section)  # raises for a key naming no heading
        assert sec.anchor and sec.heading.split(" ", 1)[0][0].isdigit()
        assert c.level in ("MUST", "SHOULD")
        assert c.error is None or c.error in SPEC.errors
        assert set(c.versions) <= {2, 3} and c.versions
        for v in c.versions:
            for s in c.steps[v]:
                assert sum(a in s for a in ACTIONS) == 1


def test_controller_session_vectors_are_cases_not_copies() -> None:
    vec = {c.id: c for c in CATALOGUE if c.source != "conformance.yaml"}
    raw = json.loads((ROOT / "flodl_proto" / "_vectors" / "controller_session.json")
                     .read_text())
    raw2 = json.loads((ROOT / "flodl_proto" / "_vectors" / "v2" / "controller_session.json")
                      .read_text())
    names = {c["id"].rsplit("/", 1)[-1] for c in raw["cases"] + raw2["cases"]}
    assert {f"controller.session.{n}" for n in names} == set(vec)
    one = vec["controller.session.one-relay-one-round"]
    assert one.versions == (2, 3)
    v3 = next(c for c in raw["cases"] if c["id"].endswith("/one-relay-one-round"))
    assert one.salt == bytes.fromhex(v3["salt"])
    assert one.steps[3][1] == {"send": {"conn": 0, "hex": v3["steps"][1]["bytes"]}}
    assert one.steps[3][-1] == {"expect_exit": "success"}
    assert vec["controller.session.hostframe-elided"].versions == (2,)
    # the catalogue holds no step of these cases (not a second copy)
    text = (ROOT / "spec" / "conformance.yaml").read_text()
    assert v3["steps"][2]["bytes"] not in text


def test_catalogue_refuses_two_vector_cases_of_one_name(tmp_path: Path) -> None:
    """A session case is filed under the last part of its vector id: a second of that name at
    the same version replaced the first without a word."""
    import json
    import shutil

    from flodl_proto.commands.vectors import BUNDLED_VECTORS

    vdir = tmp_path / "vec"
    shutil.copytree(BUNDLED_VECTORS, vdir)
    path = vdir / "controller_session.json"
    doc = json.loads(path.read_text(encoding="utf-8"))
    first, second = doc["cases"][0]["id"], doc["cases"][1]["id"]
    renamed = second.rsplit("/", 2)[0] + "/elsewhere/" + first.rsplit("/", 1)[1]
    doc["cases"][1]["id"] = renamed
    path.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(CatalogueError) as e:
        load_catalogue(vectors=vdir)
    assert str(e.value) == (f"vector_cases controller_session: two vector cases named "
                            f"{first.rsplit('/', 1)[1]!r} at version 3: {first}, {renamed}")


def test_catalogue_rejects_malformed_entries(tmp_path: Path) -> None:
    bad = tmp_path / "conformance.yaml"
    base = ("schema: flodl-proto-conformance/1\ncases:\n  - {id: controller.x.y, title: t, "
            "section: 'section:Lifecycle', level: MUST, steps: [{connect: 0}]%s}\n")
    bad.write_text(base % ", error: no.such_error")
    with pytest.raises(CatalogueError, match=r"no\.such_error"):
        load_catalogue(bad)
    bad.write_text(base.replace("level: MUST", "level: MAY") % "")
    with pytest.raises(CatalogueError, match="level"):
        load_catalogue(bad)
    bad.write_text(base.replace("{connect: 0}", "{connect: 0, close: 0}") % "")
    with pytest.raises(CatalogueError, match="exactly one action"):
        load_catalogue(bad)
    bad.write_text(base.replace("controller.x.y", "Controller x") % "")
    with pytest.raises(CatalogueError, match="role"):
        load_catalogue(bad)
    bad.write_text(base % "" + (base % "").split("cases:\n")[1])
    with pytest.raises(CatalogueError, match=r"duplicate case id controller\.x\.y"):
        load_catalogue(bad)
    bad.write_text("schema: [")
    with pytest.raises(CatalogueError, match=r"conformance\.yaml"):
        load_catalogue(bad)


_CASE = ("schema: flodl-proto-conformance/1\n%scases:\n  - {id: controller.x.y, title: t, "
         "section: 'section:Lifecycle', level: MUST, steps: [{connect: 0}]%s}\n")


@pytest.mark.parametrize(("top", "extra", "message"), [
    # a misspelt key was read as nothing (the case ran at world size 1, without its error)
    ("", ", wrold_size: 2", "cases[0]: unknown key 'wrold_size' (known: error, id, level, "
     "needs, ranks, section, steps, steps_v2, steps_v3, title, versions, world_size)"),
    # int('two') raised a bare ValueError
    ("", ", world_size: two", "cases[0].world_size is the string 'two', not an integer"),
    ("", ", ranks: 0", "cases[0].ranks is the number 0, not a list"),
    ("", ", versions: [two]", "cases[0].versions[0] is the string 'two', not an integer"),
    ("", ", steps_v4: []", "cases[0]: unknown key 'steps_v4' (known: error, id, level, needs, "
     "ranks, section, steps, steps_v2, steps_v3, title, versions, world_size)"),
    ("", ", error: [t]", "cases[0].error is a list, not a string or null"),
    # a key written twice: YAML kept the last one silently (this one), in three lines
    ("", ", title: u", "not YAML: duplicate key 'title' (first at line 3) at line 3, column 102"),
    ("case: []\n", "", "unknown top-level key 'case' (known: cases, schema, vector_cases)"),
    ("vector_cases:\n  - {file: controller_session, id_prefix: controller.session., cases: "
     "{one-relay-one-round: {section: 'semantics:clean_exit', titel: x}}}\n", "",
     "vector_cases[0].cases.one-relay-one-round: unknown key 'titel' (known: error, level, "
     "needs, section, title)"),
    ("vector_cases: {file: x}\n", "", "vector_cases is a mapping, not a list"),
], ids=lambda v: str(v)[:30])
def test_catalogue_refuses_a_key_or_type_outside_its_shape_naming_its_path(
        tmp_path: Path, top: str, extra: str, message: str) -> None:
    bad = tmp_path / "conformance.yaml"
    bad.write_text(_CASE % (top, extra))
    with pytest.raises(CatalogueError) as e:
        load_catalogue(bad)
    assert str(e.value) == f"conformance.yaml: {message}"


def test_a_steps_misspelt_action_is_named_with_its_path(tmp_path: Path) -> None:
    bad = tmp_path / "conformance.yaml"
    bad.write_text((_CASE % ("", "")).replace("{connect: 0}", "{connect: 0}, {conect: 0}"))
    with pytest.raises(CatalogueError) as e:
        load_catalogue(bad)
    assert str(e.value).startswith("conformance.yaml: cases[0].steps[1]: unknown key 'conect' "
                                   "(known: accept, close, connect, ")
    bad.write_text(_CASE % ("", ""))
    assert [c.id for c in load_catalogue(bad)] == ["controller.x.y"]


def _frame(params: Mapping[str, Any], version: int) -> RoundFrame:
    raw = frame_bytes(params, BuildContext(SALT, version, 1), "test")
    return decode_round_frame(raw, SALT)[0]


def _encoded(frame: RoundFrame) -> bytes:
    return encode_round_frame_bytes(frame, SALT)


def _relay_fold(frames: Sequence[RoundFrame], version: int) -> RoundFrame:
    """The HostFrame a relay folds ``frames`` (in deposit order) into, by protocol.md 15.6: the
    first's tensors under the summed weight while no later payload has bytes (version 3), else
    sum_frames with every tensor shipped, one that every deposit elided as zeros."""
    seed, later = frames[0], frames[1:]
    if version >= 3 and not any(t.nbytes for f in later for t in f.tensors):
        weight = seed.weight
        for f in later:
            weight += f.weight
        return RoundFrame(seed.kind, weight, list(seed.tensors))
    summed = sum_frames(frames, version=version)
    return RoundFrame(summed.kind, summed.weight, [
        t if t.nbytes else TensorPayload(t.dtype, t.shape, bytes(t.expected_nbytes or 0))
        for t in summed.tensors])


@pytest.mark.parametrize("case", [c for c in CATALOGUE if c.source == "conformance.yaml"],
                         ids=lambda c: c.id)
def test_expected_consensus_is_the_vector_pinned_reduce(case: Case) -> None:
    """Every Broadcast a controller case expects is reduce_realized_work of the HostFrames it
    sent (in Hello acceptance order); every HostFrame a relay case expects is the relay's fold
    of the deposits (a lone deposit verbatim, :func:`_relay_fold`). At version 2 a lone
    deposit's bytes are also its re-sum from +0.0: which of the two upstream's version 2 relay
    ships is not pinned (relay.fold.single-deposit-verbatim is a version 3 case)."""
    checked = 0
    for v in case.versions:
        accepted: list[str] = []
        deposits: dict[str, Mapping[str, Any]] = {}
        order: list[str] = []
        dead: set[str] = set()
        round_taken = False
        for s in case.steps[v]:
            send, expect = s.get("send", {}), s.get("expect", {})
            if "hello_ack" in expect:
                accepted.append(str(expect["conn"]))
            if "hello_ack" in send and case.role == "relay":
                accepted = []
            if "declare_dead" in send:
                dead.add(f"r{send['declare_dead']['rank']}")
            for key in ("host_frame", "framed"):
                if key in send and "salt" not in send[key] and not any(
                        t in send for t in ("flip", "cut", "record_salt")):
                    if round_taken:
                        deposits.clear()
                        round_taken = False
                    conn = str(send["conn"])
                    if conn not in deposits:
                        order.append(conn)
                    deposits[conn] = send[key]
            if "broadcast" in expect and deposits:
                frames = [_frame(deposits[c], v) for c in accepted if c in deposits]
                want = _encoded(reduce_realized_work(frames, version=v))
                assert frame_bytes(expect["broadcast"], BuildContext(SALT, v, 1), "t") == want
                checked += 1
                round_taken = True
            if "host_frame" in expect and deposits:
                frames = [_frame(deposits[c], v) for c in order if c not in dead]
                if len(frames) == 1:
                    want = frame_bytes(deposits[order[0]], BuildContext(SALT, v, 1), "t")
                    if v == 2:  # upstream's v2 relay may re-sum a lone deposit from +0.0
                        assert _encoded(sum_frames(frames, version=v)) == want, \
                            f"{case.id}: a lone deposit re-summed differs at version 2"
                else:
                    want = _encoded(_relay_fold(frames, v))
                assert frame_bytes(expect["host_frame"], BuildContext(SALT, v, 1), "t") == want
                deposits.clear()
                order.clear()
                checked += 1
    if any("expect" in s and ("broadcast" in s["expect"] or "host_frame" in s["expect"])
           for v in case.versions for s in case.steps[v]):
        assert checked


def test_semantics_worked_example_is_the_reduce() -> None:
    ex = SPEC.raw["semantics"]["divide_once"]["example"]
    frames = [RoundFrame(0, f["weight"], [_tensor(f["values"])]) for f in ex["frames"]]
    out = reduce_realized_work(frames)
    assert bytes(out.tensors[0].data).hex() == ex["consensus_hex"]
    assert out.weight == ex["weight"]
    assert np.float32(1.0 / ex["weight"]).tobytes().hex() == ex["inv_hex"]
    assert bytes(sum_frames(frames).tensors[0].data).hex() == ex["sum_hex"]
    assert [float(x) for x in np.frombuffer(bytes.fromhex(ex["sum_hex"]), np.float32)] == \
        ex["sum"]


def _tensor(values: list[float]) -> Any:
    from flodl_proto.codec.round_frame import TensorPayload

    return TensorPayload.from_array(np.array(values, np.float32))


# -- builders ---------------------------------------------------------------------------------


def test_builders_give_the_spec_worked_examples() -> None:
    ctx2 = BuildContext(bytes(16), 2, 4)
    ctx3 = BuildContext(bytes(16), 3, 4)
    assert build({"handshake": {"rank": 3}}, ctx2, "t").hex() == "c0170df1020000000300000004000000"
    assert build({"ack": {}}, ctx3, "t").hex() == "c1170df103000000"
    assert build({"magic": "data"}, ctx2, "t").hex() == "e1170df1"
    hello2 = build({"hello": {"host": "h0", "ranks": [0, 1]}}, ctx2, "t")
    assert hello2.hex() == ("d0170df1010000000200000000070000008a2d9a3ccf46a58e"
                            "00026830020001")
    hello3 = build({"hello": {"host": "h0", "ranks": [0, 1]}}, ctx3, "t")
    assert hello3.hex() == ("d0170df101000000020000000008000000bfb0f531cb8c2c6a"
                            "0002683002000100")
    assert build({"hello": {"host": "h0", "ranks": [0, 1], "version": 3}}, ctx2, "t") == hello3
    frame = build({"frame": {"weight": 1, "tensors": [{"shape": [4],
                                                       "values": [1, -2.5, 0, 3.25]}]}},
                  ctx2, "t")
    assert frame.hex().endswith("39a58785a03c12d1") and len(frame) == 55
    framed = build({"framed": {"weight": 1, "tensors": [{"shape": [4],
                                                         "values": [1, -2.5, 0, 3.25]}]}},
                   ctx2, "t")
    assert framed == struct.pack("<I", 55) + frame


def test_builders_tamper_and_refuse() -> None:
    ctx = BuildContext(SALT, 3, 2)
    good = build({"host_frame": {"tensors": [{"shape": [2], "values": [1, 2]}]}}, ctx, "t")
    flipped = build({"flip": -1, "host_frame": {"tensors": [{"shape": [2], "values": [1, 2]}]}},
                    ctx, "t")
    assert first_difference(good, flipped) == len(good) - 1
    assert flipped[-1] == good[-1] ^ 1
    cut = build({"cut": 3, "hex": "00010203"}, ctx, "t")
    assert cut == b"\x00"
    wrong = build({"record_salt": "wrong", "host_frame": {"tensors": [{"shape": [2],
                                                                       "values": [1, 2]}]}},
                  ctx, "t")
    assert wrong[25:] == good[25:] and wrong[17:25] != good[17:25]
    inner = build({"host_frame": {"salt": "wrong", "tensors": [{"shape": [2],
                                                               "values": [1, 2]}]}}, ctx, "t")
    assert inner[:17] == good[:17] and inner[-8:] != good[-8:]
    assert other_salt(SALT) == bytes(b ^ 0xFF for b in SALT)
    short = build({"frame": {"cut_tag": 4, "tensors": []}}, ctx, "t")
    assert len(short) == 25 - 4
    elided = build({"frame": {"weight": 0, "tensors": [{"shape": [64, 128], "elided": True},
                                                       {"dtype": "bf16", "shape": [512],
                                                        "elided": True}]}}, ctx, "t")
    assert len(elided) == 57
    header = build({"mux_header": {"kind": "host_frame", "payload_len": 4294967295}}, ctx, "t")
    assert header.hex() == "d0170df10100000003" + "00000000" + "ffffffff" + "00" * 8
    with pytest.raises(CatalogueError, match="not exact in f32"):
        build({"frame": {"tensors": [{"shape": [1], "values": [0.1]}]}}, ctx, "t")
    with pytest.raises(CatalogueError, match="not exact in bf16"):
        build({"frame": {"tensors": [{"dtype": "bf16", "shape": [1], "values": [1.001]}]}},
              ctx, "t")
    with pytest.raises(CatalogueError, match="exactly one of"):
        build({"hex": "00", "magic": "data"}, ctx, "t")
    with pytest.raises(CatalogueError, match="2 values for shape"):
        build({"frame": {"tensors": [{"shape": [3], "values": [1, 2]}]}}, ctx, "t")


def test_builders_write_a_records_rank_field_and_trailing_payload_bytes_signed() -> None:
    from flodl_proto.codec.mux import decode_mux_record

    ctx = BuildContext(SALT, 3, 2)
    params = {"tensors": [{"shape": [2], "values": [1, 2]}]}
    good = build({"host_frame": params}, ctx, "t")
    ranked = build({"record_rank": 7, "host_frame": params}, ctx, "t")
    assert ranked[9:13] == (7).to_bytes(4, "little") and ranked[25:] == good[25:]
    assert decode_mux_record(ranked, SALT)[0].payload == good[25:]  # its tag covers the rank
    hello = build({"record_rank": 7, "hello": {"ranks": [0]}}, ctx, "t")
    assert hello[9:13] == (7).to_bytes(4, "little")
    longer = build({"trailing": "00ff", "host_frame": params}, ctx, "t")
    assert longer[25:] == good[25:] + b"\x00\xff"
    assert longer[13:17] == (len(good) - 25 + 2).to_bytes(4, "little")
    assert bytes(decode_mux_record(longer, SALT)[0].payload) == good[25:] + b"\x00\xff"
    with pytest.raises(CatalogueError, match="trailing applies to host_frame and broadcast"):
        build({"trailing": "00", "hello": {"ranks": [0]}}, ctx, "t")
    with pytest.raises(CatalogueError, match="record_rank must be a u32, got -1"):
        build({"record_rank": -1, "host_frame": params}, ctx, "t")
    with pytest.raises(CatalogueError, match="bad record_rank or trailing"):
        build({"trailing": "0", "host_frame": params}, ctx, "t")


def test_first_difference() -> None:
    assert first_difference(b"abc", b"abc") is None
    assert first_difference(b"abc", b"abd") == 2
    assert first_difference(b"abc", b"ab") == 2
    assert first_difference(b"", b"x") == 0


# -- selection, placeholders, reports ---------------------------------------------------------


def test_select_cases_lists_port_mux_cases_as_not_selected() -> None:
    runs, skipped = select_cases(CATALOGUE, role="controller", versions=[2, 3])
    ids = {c.id for c, _ in runs}
    assert "controller.portmux.status" not in ids
    assert {c.id for c, _ in skipped} >= {"controller.portmux.status",
                                          "controller.portmux.unknown-magic-dropped"}
    assert all(why == "needs --port-mux" for _, why in skipped)
    runs_mux, skipped_mux = select_cases(CATALOGUE, role="controller", versions=[3],
                                         port_mux=True)
    assert "controller.portmux.status" in {c.id for c, _ in runs_mux}
    assert {c.id for c, _ in skipped_mux} == {"controller.magic.unknown",
                                              "controller.session.wrong-channel-magic"}
    only, _ = select_cases(CATALOGUE, role="relay", versions=[2], patterns=["relay.fold.*"],
                           level="MUST")
    assert only and all(c.id.startswith("relay.fold.") and v == 2 and c.level == "MUST"
                        for c, v in only)
    assert "relay.fold.elided" not in {c.id for c, _ in only}  # version 3 only
    should, _ = select_cases(CATALOGUE, role="controller", versions=[2, 3], level="should")
    assert should and all(c.level == "SHOULD" for c, _ in should)


def test_fill_placeholders() -> None:
    argv = fill_placeholders("ctl --listen {host}:{port} --salt-file '{salt_file}'",
                             {"host": "127.0.0.1", "port": "5", "salt_file": "/t/a b"})
    assert argv == ["ctl", "--listen", "127.0.0.1:5", "--salt-file", "/t/a b"]
    with pytest.raises(ValueError, match=r"unknown placeholder \{ranks\}"):
        fill_placeholders("relay --ranks {ranks}", {"host": "h"})


def test_fill_placeholders_joins_lines_ended_by_a_backslash() -> None:
    # a shell keeps the backslash and the newline inside single quotes: shlex made the newline a
    # word of its own, and the target refused it
    argv = fill_placeholders("ctl \\\n  --listen {host}:{port} \\\r\n  --flag", {"host": "h",
                                                                                "port": "5"})
    assert argv == ["ctl", "--listen", "h:5", "--flag"]
    assert fill_placeholders("a\\\nb 'c\\\nd'", {}) == ["ab", "cd"]  # as a script's continuation
    assert fill_placeholders("a \\ b", {}) == ["a", " b"]  # a backslash not ending a line stays


def _readme_launch_commands() -> dict[str, str]:
    """The ``--launch`` argument of each README conformance command, as a POSIX shell passes it
    (the README's lines joined as the shell reads them)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("## Conformance kit", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    out = {}
    for command in block.split("\nflodl-proto ")[0:]:
        words = shlex.split(command.removeprefix("flodl-proto "), comments=True)
        if "--launch" in words:
            out[words[1]] = words[words.index("--launch") + 1]
    return out


@pytest.mark.parametrize("role", ["controller", "relay"])
def test_readme_launch_commands_fill_to_the_launch_of_the_tests(role: str) -> None:
    """The README's multi-line ``--launch '...'`` commands give the same argv as the one-line
    commands the end-to-end tests run (every README case failed: a newline word)."""
    launch = _readme_launch_commands()[role]
    assert "\n" in launch  # it spans lines, as a user pastes it
    values = {k: f"<{k}>" for k in ("host", "port", "world_size", "salt_file", "version",
                                     "controller", "ranks", "listen_port", "salt")}
    expected = fill_placeholders(_LAUNCH[role].replace(_CLI, "flodl-proto"), values)
    assert fill_placeholders(launch, values) == expected


def _inprocess(role: str, versions: list[int], patterns: Sequence[str] = (),
               exclude: tuple[str, ...] = SLOW, port_mux: bool = False,
               factory: Any = None) -> list[Any]:
    runs, _ = select_cases(CATALOGUE, role=role, versions=versions, patterns=list(patterns),
                           port_mux=port_mux)
    runs = [(c, v) for c, v in runs if c.id not in exclude]
    if factory is None:
        factory = controller_target(port_mux=port_mux) if role == "controller" \
            else relay_target()
    return run_cases(runs, factory, SETTINGS, jobs=4)


def _failures(results: list[Any]) -> str:
    return "\n".join(line for r in results if not r.passed
                     for line in case_line(r, r.case.section))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("version", [2, 3])
def test_our_controller_passes_every_case_in_process(version: int) -> None:
    results = _inprocess("controller", [version], exclude=SLOW if version == 2 else ())
    assert results and all(r.passed for r in results), _failures(results)
    assert exit_code(results) == 0
    mux = _inprocess("controller", [version], ["controller.portmux.*", "controller.round.*"],
                     port_mux=True)
    assert len(mux) > 3 and all(r.passed for r in mux), _failures(mux)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("version", [2, 3])
def test_our_relay_passes_every_case_in_process(version: int) -> None:
    results = _inprocess("relay", [version])
    assert results and all(r.passed for r in results), _failures(results)


def test_reports_junit_json_and_failure_lines(tmp_path: Path) -> None:
    # a controller that is not there: the target never listens, every case fails
    from flodl_proto.conform.target import InProcessTarget

    def broken(ctx: Any) -> Any:
        raise OSError("nothing here")

    runs, _ = select_cases(CATALOGUE, role="controller", versions=[3],
                           patterns=["controller.round.zero-mass"])
    skipped = select_cases(CATALOGUE, role="controller", versions=[3])[1]
    assert skipped
    res = run_cases(runs, lambda: InProcessTarget(broken), SETTINGS)
    assert len(res) == 1 and not res[0].passed
    assert res[0].message == "target did not start: cannot start the in-process target: " \
                             "nothing here"
    assert res[0].exit is None  # it never started: nothing to reap, no "target:" line
    assert case_line(res[0], "S") == [
        "FAIL controller.round.zero-mass v3 [MUST] (S)",
        "     target did not start: cannot start the in-process target: nothing here"]
    assert exit_code(res) == 1
    ok = _inprocess("controller", [3], ["controller.round.zero-mass",
                                        "controller.lifecycle.foreign-rank-exit"])
    write_junit(tmp_path / "j.xml", "controller", res + ok, skipped, str)
    root = ET.parse(tmp_path / "j.xml").getroot()
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == ["controller v3", "controller not selected"]
    assert suites[0].get("tests") == "3" and suites[0].get("failures") == "1"
    cases = [(tc.get("name"), tc.find("failure") is not None)
             for tc in suites[0].findall("testcase")]
    assert cases == [("controller.round.zero-mass", True), ("controller.round.zero-mass", False),
                     ("controller.lifecycle.foreign-rank-exit", False)]
    assert len(suites[1].findall("testcase/skipped")) == len(skipped)
    write_json(tmp_path / "r.json", "controller", res + ok, skipped, str)
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["failed"] == 1 and doc["must_failed"] == 1 and doc["passed"] == 2
    assert doc["results"][0]["result"] == "fail"
    assert {x["id"] for x in doc["not_selected"]} == {c.id for c, _ in skipped}


def test_junit_report_stays_well_formed_with_control_characters_in_the_output(
        tmp_path: Path) -> None:
    """A target's output (ANSI colours, a NUL, a bell) is quoted in the JUnit report: XML 1.0
    holds no such character, so each is written as ``#xNN`` (tab, newline and the rest as
    they are), and the report still parses."""
    from flodl_proto.conform.player import CaseResult
    from flodl_proto.conform.target import TargetExit

    out = "\x1b[31mred\x1b[0m\tcol\nnul \x00 bell \x07 \ufffe end"
    r = CaseResult(case=CATALOGUE[0], version=2, message="target did not start: \x1b[1mno",
                   exit=TargetExit(3, True), output=out, started=False)
    write_junit(tmp_path / "j.xml", "controller", [r], [], str)
    tc = ET.parse(tmp_path / "j.xml").getroot().find("testsuite/testcase")
    assert tc is not None
    failure, system_out = tc.find("failure"), tc.find("system-out")
    assert failure is not None and system_out is not None
    assert failure.get("message") == "target did not start: #x1B[1mno"
    assert system_out.text == "#x1B[31mred#x1B[0m\tcol\nnul #x00 bell #x07 #xFFFE end"
    assert failure.text is not None and failure.text.splitlines()[-2:] == [
        "       #x1B[31mred#x1B[0m\tcol", "       nul #x00 bell #x07 #xFFFE end"]


def test_cli_shows_a_targets_control_characters_escaped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A target's output on the console: its colour codes, a window-title sequence, a bell and
    a C1 CSI reached the user's terminal as they were. They are shown as ``#xNN``, as in the
    JUnit report (a line's closing CR dropped, as before); the JSON report escapes them as JSON
    does."""
    from flodl_proto._unseen import terminal_text

    script = r"printf '\033]0;title\007\033[31mred\033[0m z \302\233x\r\n' >&2; exit 3"
    run = ["conform", "controller", "--version", "3", "--jobs", "1", "--timeout-scale", "0.1",
           "--cases", "controller.round.zero-mass", "--json", str(tmp_path / "r.json"),
           "--launch", f"sh -c {shlex.quote(script)}"]
    assert main(run) == 1
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x9b" not in out and "\x07" not in out
    tail = out.split("     target's last output:\n", 1)[1].splitlines()[0]
    assert tail == "       stderr: #x1B]0;title#x07#x1B[31mred#x1B[0m z #x9Bx"
    assert terminal_text("a\x00\x1b\tb\x7f\x9f\xa0\u00e9\r\n") == \
        "a#x00#x1B\tb#x7F#x9F\xa0\u00e9#x0D#x0A"
    # the JSON report holds no raw control character either
    doc = (tmp_path / "r.json").read_bytes()
    assert not any(b < 0x20 and b not in b"\n" for b in doc)


def test_the_console_escape_takes_the_direction_controls_too() -> None:
    """A target's output holding U+202E RIGHT-TO-LEFT OVERRIDE (or an isolate, a mark)
    reordered the rest of the console's line (``txt.exe`` shown for ``exe.txt``): every
    Bidi_Control character is shown as ``#xNNNN``; other text beyond ASCII is kept."""
    from flodl_proto._unseen import terminal_text

    bidi = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
    assert terminal_text(f"a{bidi}b \u00e9\u200d\u2065\u206a") == (
        "a#x61C#x200E#x200F#x202A#x202B#x202C#x202D#x202E#x2066#x2067#x2068#x2069b "
        "\u00e9\u200d\u2065\u206a")


@pytest.mark.parametrize("jobs", [1, 2])
def test_run_stops_when_the_first_cases_never_start(jobs: int) -> None:
    """A target that never starts would fail every case the same way, 20 s each when it never
    listens: once the first ``jobs`` cases to end all failed so, the others are not run."""
    from flodl_proto.conform.report import TargetNeverStarted
    from flodl_proto.conform.target import InProcessTarget

    def broken(ctx: Any) -> Any:
        raise OSError("nothing here")

    runs, _ = select_cases(CATALOGUE, role="controller", versions=[3],
                           patterns=["controller.round.*"])
    assert len(runs) > 3
    seen: list[str] = []
    with pytest.raises(TargetNeverStarted) as info:
        run_cases(runs, lambda: InProcessTarget(broken), SETTINGS, jobs=jobs,
                  on_result=lambda r: seen.append(r.case.id))
    n = len(info.value.results)
    assert n == len(seen) == jobs  # the cases after the first ``jobs`` wait, then never start
    assert info.value.not_run == len(runs) - n > 0
    assert not any(r.started or r.passed for r in info.value.results)
    assert str(info.value) == (f"the target did not start in the first {n} case(s); "
                               f"{len(runs) - n} other case(s) not run")
    # a target that started once is judged case by case: every case runs
    ok = run_cases(runs[:2], controller_target(), SETTINGS, jobs=jobs)
    assert [r.started for r in ok] == [True, True]


@pytest.mark.timeout(60)
def test_a_stop_set_before_the_run_leaves_no_case_held() -> None:
    """A stop set (by another thread) before any case played: the first cases return at once
    without telling whether the target starts, and the cases held behind them return too, so
    the run ends interrupted rather than waiting for ever."""
    import threading

    from flodl_proto.conform.report import RunInterrupted
    from flodl_proto.conform.target import InProcessTarget

    def never(ctx: Any) -> Any:
        raise AssertionError("no case may play after the stop")

    runs, _ = select_cases(CATALOGUE, role="controller", versions=[3],
                           patterns=["controller.round.*"])
    assert len(runs) > 2
    stop = threading.Event()
    stop.set()
    with pytest.raises(RunInterrupted) as info:
        run_cases(runs, lambda: InProcessTarget(never), SETTINGS, jobs=2, stop=stop)
    assert info.value.results == []


@pytest.mark.parametrize("jobs", ["1", "4"])
def test_cli_target_that_never_starts_runs_only_the_first_cases(
        jobs: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Five cases, a target that exits at once: the kit runs as many cases as ``--jobs`` runs at
    once, then stops with its closing line. With ``--jobs 4`` the pool took the fifth case as
    soon as the first one ended, before the others had shown the target never starts: all five
    ran, and the closing line was not printed."""
    run = ["conform", "controller", "--version", "3", "--jobs", jobs, "--timeout-scale", "0.1",
           "--cases", "controller.schema.*", "--cases", "controller.round.zero-mass",
           "--launch", "false {port}"]
    assert main(run) == 1
    out, err = capsys.readouterr()
    n = int(jobs)
    assert err == ("flodl-proto conform controller: error: the target did not start in the "
                   f"first {n} case(s); {5 - n} other case(s) not run\n")
    fails = [line for line in out.splitlines() if line.startswith("FAIL ")]
    assert len(fails) == n
    assert out.count("     target did not start: the target exited (1) before listening") == n
    assert f"controller: 0 passed, {n} MUST failed, 0 SHOULD failed, 0 not selected" in out


def test_stop_runs_no_further_case() -> None:
    import threading

    runs, _ = select_cases(CATALOGUE, role="controller", versions=[3],
                           patterns=["controller.round.*"])
    stop = threading.Event()
    ran: list[str] = []

    def on_result(r: Any) -> None:
        ran.append(r.case.id)
        stop.set()

    from flodl_proto.conform.report import RunInterrupted

    with pytest.raises(RunInterrupted) as info:
        run_cases(runs, controller_target(), SETTINGS, on_result=on_result, stop=stop)
    assert ran == [runs[0][0].id]
    assert [r.case.id for r in info.value.results] == ran  # the case that ended before the stop
    assert isinstance(info.value, KeyboardInterrupt)


def test_a_run_that_never_started_lists_the_rest_as_not_run(tmp_path: Path) -> None:
    """The reports of a run stopped because its target never started held the cases that ran
    and no word of the others; they now list them as not run, with the reason."""
    import subprocess

    res = subprocess.run(
        [sys.executable, "-m", "flodl_proto.cli", "conform", "controller", "--version", "3",
         "--jobs", "1", "--cases", "controller.round.*", "--launch", "false {port}",
         "--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "r.xml")],
        capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stderr
    runs, _ = select_cases(CATALOGUE, role="controller", versions=[3],
                           patterns=["controller.round.*"])
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["interrupted"] is False and doc["stop"] is None and len(doc["results"]) == 1
    assert [(r["id"], r["version"], r["reason"]) for r in doc["not_run"]] == [
        (c.id, 3, "not run: the target did not start in the first case(s)")
        for c, _ in runs if c.id != doc["results"][0]["id"]]
    root = ET.parse(tmp_path / "r.xml").getroot()
    assert root.find(".//property[@name='interrupted']") is None
    assert [t.get("name") for t in root.findall("testsuite[@name='controller not run']/"
                                                 "testcase")] == [r["id"] for r in doc["not_run"]]


def test_a_target_that_did_not_start_shows_its_last_output(tmp_path: Path) -> None:
    from flodl_proto.conform.player import play_case
    from flodl_proto.conform.target import LaunchedTarget

    (case, version), = select_cases(CATALOGUE, role="controller", versions=[3],
                                    patterns=["controller.round.zero-mass"])[0]
    script = "; ".join(f"echo line {i} >&2" for i in range(8)) + "; exit 2"
    res = play_case(case, version, lambda: LaunchedTarget(f"sh -c {shlex.quote(script)}"),
                    SETTINGS)
    assert (res.passed, res.started) == (False, False)
    assert case_line(res, "S") == [
        "FAIL controller.round.zero-mass v3 [MUST] (S)",
        "     target did not start: the target exited (2) before listening",
        "     target: exit 2",
        "     target's last output:",
        *(f"       stderr: line {i}" for i in range(3, 8))]


def test_failing_byte_expectation_reports_offset_and_both_sides() -> None:
    from flodl_proto.conform.player import play_case

    case = next(c for c in CATALOGUE if c.id == "controller.round.two-rounds")
    steps = list(case.steps[3])
    steps[5] = {"expect": {"conn": 0, "broadcast": {"weight": 2, "tensors": [
        {"shape": [2], "values": [1, 4]}]}}}
    bad = dataclasses.replace(case, steps={3: tuple(steps)})
    r = play_case(bad, 3, controller_target(), SETTINGS)
    assert not r.passed and r.step == 5
    # every byte arrived and they differ: the line says so, in bytes
    assert r.message == ("connection 0: expected a Broadcast record (72 bytes), observed 72 "
                         "bytes (they differ)")
    assert r.offset == 17  # the record's tag covers the payload: it differs first
    # header 25 + frame header 17 + tensor meta 14 + first element 4 = the second element;
    # 3.0 is 00 00 40 40 and 4.0 is 00 00 80 40: its third byte
    assert r.payload_offset == 25 + 17 + 2 + 4 + 8 + 4 + 2
    assert "00004040" in r.observed and "00008040" in r.expected
    lines = case_line(r, "15.3 Divide once")
    assert lines[0] == "FAIL controller.round.two-rounds v3 [MUST] (15.3 Divide once)"
    assert "     first differing byte offset: 17 (the record's auth tag; first differing byte " \
           "after the header: 62, payload.tensor[0].data, element 1: expected 4.0, observed " \
           "3.0)" in lines
    assert r.differing_field == "payload.tensor[0].data, element 1"
    assert r.differing_values == "expected 4.0, observed 3.0"


def test_the_json_report_holds_a_failing_case_s_two_values(tmp_path: Path) -> None:
    """The text line shows the differing field's values (``expected 4.0, observed 3.0``); the
    JSON report had the field and the bytes but not those values: now its own keys."""
    from flodl_proto.conform.player import play_case

    case = next(c for c in CATALOGUE if c.id == "controller.round.two-rounds")
    steps = list(case.steps[3])
    steps[5] = {"expect": {"conn": 0, "broadcast": {"weight": 2, "tensors": [
        {"shape": [2], "values": [1, 4]}]}}}
    bad = dataclasses.replace(case, steps={3: tuple(steps)})
    r = play_case(bad, 3, controller_target(), SETTINGS)
    write_json(tmp_path / "r.json", "controller", [r], [], lambda s: "15.3 Divide once")
    [got] = json.loads((tmp_path / "r.json").read_text())["results"]
    assert got.pop("seconds") >= 0
    assert got == {
        "id": "controller.round.two-rounds", "version": 3, "level": "MUST",
        "section": "semantics:divide_once", "section_title": "15.3 Divide once", "error": None,
        "title": "consecutive rounds each get their own consensus", "result": "fail", "step": 5,
        "message": "connection 0: expected a Broadcast record (72 bytes), observed 72 bytes "
                   "(they differ)",
        "expected": "...000008000000000000000000803f00008040" + r.expected[-23:],
        "observed": "...000008000000000000000000803f00004040" + r.observed[-23:],
        "first_difference": 17, "first_payload_difference": 62,
        "first_difference_field": "payload.tensor[0].data, element 1",
        "first_difference_expected": "4.0", "first_difference_observed": "3.0",
        "exit_status": 0, "exited_by_itself": False}
    assert got["expected"].endswith(" (72 B)") and got["observed"].endswith(" (72 B)")


def test_a_record_differing_in_its_tag_alone_is_named_so() -> None:
    """A target that signs a right record with another salt (or another MAC) differs from the
    expected record in its 8-byte tag only: the line says so, not just an offset inside it."""
    from flodl_proto.conform.player import play_case

    case = next(c for c in CATALOGUE if c.id == "controller.round.two-rounds")
    steps = list(case.steps[3])
    steps[5] = {"expect": {"conn": 0, "record_salt": "wrong", "broadcast": {
        "weight": 2, "tensors": [{"shape": [2], "values": [1, 3]}]}}}
    bad = dataclasses.replace(case, steps={3: tuple(steps)})
    r = play_case(bad, 3, controller_target(), SETTINGS)
    assert not r.passed and r.step == 5
    assert (r.offset, r.payload_offset, r.tag_only) == (17, None, True)
    assert r.differing_field == "auth_tag"
    assert "     first differing byte offset: 17 (the record's auth tag, and only it: the bytes " \
           "it covers are the same, so it was computed with another salt or another MAC)" \
           in case_line(r, "15.3 Divide once")


@pytest.mark.parametrize("role,case_id", [("controller", "controller.round.zero-mass"),
                                          ("relay", "relay.fold.two-ranks")])
def test_in_process_target_binds_its_own_port(role: str, case_id: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The port the kit picks may be taken by the time a target binds it (another case's
    connection, under ``jobs``): an in-process target binds a port of the kernel's choosing."""
    import socket

    from flodl_proto.conform import player
    from flodl_proto.conform.player import play_case

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setattr(player, "free_port", lambda host: int(taken.getsockname()[1]))
        (case, version), = select_cases(CATALOGUE, role=role, versions=[3],
                                        patterns=[case_id])[0]
        factory = controller_target() if role == "controller" else relay_target()
        res = play_case(case, version, factory, SETTINGS)
    assert (res.passed, res.started, res.message) == (True, True, "")


def test_free_port_is_below_the_ephemeral_range_and_not_handed_out_twice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    from flodl_proto.conform import player

    monkeypatch.setattr(player, "_ephemeral_range", lambda: (32768, 60999))
    ports = [free_port("127.0.0.1") for _ in range(200)]
    assert all(10000 <= p < 32768 for p in ports), ports
    assert len(set(ports)) == 200
    for p in ports[-3:]:  # free to bind
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
    # a port in use is not handed out
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = int(held.getsockname()[1])
        monkeypatch.setattr(player, "_ephemeral_range", lambda: (port + 1024, 65535))
        monkeypatch.setattr(player, "_LISTEN_PORT_FLOOR", port)
        tried: list[int] = []

        def first(seq: range) -> int:
            tried.append(seq[0])
            return seq[0]

        monkeypatch.setattr(player.secrets, "choice", first)
        assert free_port("127.0.0.1") != port  # the kernel's pick, after 64 tries
        assert tried == [port] * 64
    # no room below the range (or no range known): the kernel's pick, still not repeated
    monkeypatch.setattr(player, "_ephemeral_range", lambda: None)
    more = [free_port("127.0.0.1") for _ in range(50)]
    assert len(set(more)) == 50 and not set(more) & set(ports)


# -- command line -------------------------------------------------------------------------------


def test_cli_list_needs_no_target(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conform", "relay", "--list", "--version", "3"]) == 0
    out = capsys.readouterr().out
    assert "relay.fold.elided  MUST  v3" in out
    assert "relay.fold.elided-at-v2" not in out
    assert main(["conform", "controller", "--list"]) == 0
    out = capsys.readouterr().out
    assert "controller.portmux.status  SHOULD  not selected (needs --port-mux)" in out
    # listing no case is the usage error a run of no case is (it listed "0 cases", exit 0)
    assert main(["conform", "relay", "--list", "--cases", "nothing.*"]) == 2
    assert capsys.readouterr() == ("", "flodl-proto conform relay: error: argument --cases: no "
                                   "relay case id matches 'nothing.*'; 'flodl-proto "
                                   "conform relay --list' without --cases lists the ids\n")
    # cases that match but need what the target was not said to have: said so (it was only
    # "no case selected")
    portmux = sum(1 for c in load_catalogue() if c.id.startswith("controller.portmux."))
    assert portmux >= 2
    for extra in (["--list"], ["--launch", "true"]):
        assert main(["conform", "controller", "--cases", "controller.portmux.*", *extra]) == 2
        assert capsys.readouterr() == ("", (
            f"flodl-proto conform controller: error: no case selected: {portmux} cases match "
            f"but are left out (needs --port-mux: {portmux})\n"))
    assert main(["conform", "controller", "--cases", "controller.portmux.status", "--list"]) == 2
    assert capsys.readouterr().err.endswith(": no case selected: 1 case matches but is left out "
                                            "(needs --port-mux: 1)\n")


def test_cli_cases_left_out_by_the_version_are_counted(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A --version that leaves out every matching case said only "no case selected"."""
    only = {c.id: c.versions for c in load_catalogue()}
    assert only["controller.hello.model-sigs-ignored"] == (3,)
    assert only["controller.hello.v3-hello-at-v2"] == (2,)
    for extra in (["--list"], ["--launch", "true"]):
        assert main(["conform", "controller", "--version", "2", "--cases",
                     "controller.hello.model-sigs-ignored", *extra]) == 2
        assert capsys.readouterr() == ("", (
            "flodl-proto conform controller: error: no case selected: 1 case matches but is "
            "left out (needs --version 3: 1)\n"))
    assert main(["conform", "controller", "--version", "3", "--cases",
                 "controller.hello.v3-hello-at-v2", "--list"]) == 2
    assert capsys.readouterr().err.endswith(": no case selected: 1 case matches but is left out "
                                            "(needs --version 2: 1)\n")
    # with the cases a need leaves out: one line, each reason counted
    portmux = sum(1 for c in load_catalogue() if c.id.startswith("controller.portmux."))
    assert main(["conform", "controller", "--version", "2", "--cases", "controller.portmux.*",
                 "--cases", "controller.hello.model-sigs-ignored", "--list"]) == 2
    assert capsys.readouterr() == ("", (
        f"flodl-proto conform controller: error: no case selected: {portmux + 1} cases match "
        f"but are left out (needs --port-mux: {portmux}; needs --version 3: 1)\n"))
    # a SHOULD-only run of a MUST case said only "no case selected"; then "needs --level must"
    # alone, though --level must brought it back no more than --version 3 alone did: the
    # reason names both, under the level (the filter applied first)
    assert main(["conform", "controller", "--version", "2", "--level", "should", "--cases",
                 "controller.hello.model-sigs-ignored", "--list"]) == 2
    assert capsys.readouterr().err.endswith(": no case selected: 1 case matches but is left out "
                                            "(needs --level must and --version 3: 1)\n")
    assert main(["conform", "controller", "--version", "3", "--level", "must", "--cases",
                 "controller.hello.model-sigs-ignored", "--list"]) == 0  # as the reason said
    capsys.readouterr()


def test_cli_cases_left_out_by_the_level_are_counted(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A --level that leaves out every matching case said only "no case selected", or named
    only the other reasons; the level is counted as the version and the needs are."""
    catalogue = load_catalogue()
    level = {c.id: c.level for c in catalogue}
    assert level["controller.portmux.status"] == "SHOULD"
    assert level["controller.hello.model-sigs-ignored"] == "MUST"
    assert level["controller.hello.v3-hello-at-v2"] == "MUST"
    portmux = [c for c in catalogue if c.id.startswith("controller.portmux.")]
    must = sum(1 for c in portmux if c.level == "MUST")
    should = len(portmux) - must
    assert must and should
    for extra in (["--list"], ["--launch", "true"]):
        assert main(["conform", "controller", "--level", "Should", "--cases",
                     "controller.hello.model-sigs-ignored", *extra]) == 2
        assert capsys.readouterr() == ("", (
            "flodl-proto conform controller: error: no case selected: 1 case matches but is "
            "left out (needs --level must: 1)\n"))
    # with the other reasons: each case once, with every need that leaves it out (a SHOULD
    # port-mux case was counted as "needs --level should" only, which alone did not bring it
    # back), grouped under the first filter that leaves it out: level, needs, version
    assert main(["conform", "controller", "--level", "must", "--cases", "controller.portmux.*",
                 "--cases", "controller.hello.v3-hello-at-v2", "--version", "3", "--list"]) == 2
    assert capsys.readouterr() == ("", (
        f"flodl-proto conform controller: error: no case selected: {len(portmux) + 1} cases "
        f"match but are left out (needs --level should and --port-mux: {should}; needs "
        f"--port-mux: {must}; needs --version 2: 1)\n"))
    assert main(["conform", "controller", "--level", "should", "--port-mux", "--cases",
                 "controller.portmux.*", "--list"]) == 0  # as the reason said
    assert f"{should} case{'' if should == 1 else 's'}, " in capsys.readouterr().out


@pytest.mark.parametrize(("cases", "versions", "line"), [
    (["controller.round.zero-mass"], ["--version", "2"], "1 case, 1 run selected; "),
    (["controller.round.zero-mass"], [], "1 case, 2 runs selected; "),
    (["controller.round.zero-mass", "controller.round.all-elided"], [],
     "2 cases, 3 runs selected; "),
])
def test_cli_list_counts_one_case_in_the_singular(
        cases: list[str], versions: list[str], line: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--list`` of a single case said "1 cases, 1 runs selected"."""
    argv = ["conform", "controller", "--list", *versions]
    for c in cases:
        argv += ["--cases", c]
    assert main(argv) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith(line), last


def _case(case_id: str, level: str, versions: tuple[int, ...], needs: tuple[str, ...]) -> Case:
    return dataclasses.replace(CATALOGUE[0], id=case_id, role="controller", level=level,
                               versions=versions, needs=needs)


def test_cli_a_case_left_out_by_a_need_and_the_version_names_both(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A case that needs the port mux and a --version not asked for was counted as "needs
    --port-mux" only: --port-mux then left it out for the version."""
    from flodl_proto.conform import catalogue

    cases = (_case("controller.x.mux-v3", "MUST", (3,), ("port_mux",)),
             _case("controller.x.direct-v2", "SHOULD", (2,), ("direct",)),
             _case("controller.x.mux", "MUST", (2, 3), ("port_mux",)),
             _case("controller.x.v3", "MUST", (3,), ()))
    monkeypatch.setattr(catalogue, "load_catalogue", lambda: cases)
    assert main(["conform", "controller", "--version", "2", "--cases", "controller.x.mux*",
                 "--cases", "controller.x.v3", "--list"]) == 2
    assert capsys.readouterr() == ("", (
        "flodl-proto conform controller: error: no case selected: 3 cases match but are left "
        "out (needs --port-mux and --version 3: 1; needs --port-mux: 1; needs --version 3: 1)\n"))
    assert main(["conform", "controller", "--version", "3", "--port-mux", "--level", "should",
                 "--launch", "true"]) == 2
    assert capsys.readouterr() == ("", (
        "flodl-proto conform controller: error: no case selected: 4 cases match but are left "
        "out (needs --level must: 3; needs a target without the port mux and --version 2: "
        "1)\n"))


def test_left_out_by_names_every_filter_in_the_order_select_cases_applies_them() -> None:
    from flodl_proto.conform.catalogue import FILTERS, left_out_by, matching_cases

    case = _case("controller.x.y", "SHOULD", (3,), ("port_mux",))
    assert FILTERS == ("level", "needs", "version")
    assert left_out_by(case, versions=[2], level="must") == [
        ("level", "--level should"), ("needs", "--port-mux"), ("version", "--version 3")]
    assert left_out_by(case, versions=[2, 3], level="SHOULD") == [("needs", "--port-mux")]
    assert left_out_by(case, versions=[3], port_mux=True) == []
    direct = _case("controller.x.z", "MUST", (2, 3), ("direct",))
    assert left_out_by(direct, versions=[2], port_mux=True) == [
        ("needs", "a target without the port mux")]
    # a case every filter lets through runs; one any filter leaves out is named by it
    for level in (None, "MUST", "SHOULD"):
        for versions in ([2], [3], [2, 3]):
            for port_mux in (False, True):
                runs, skipped = select_cases(CATALOGUE, role="controller", versions=versions,
                                             level=level, port_mux=port_mux)
                selected = {c.id for c, _ in runs}
                for c in matching_cases(CATALOGUE, role="controller"):
                    why = left_out_by(c, versions=versions, level=level, port_mux=port_mux)
                    assert (not why) == (c.id in selected), (c.id, level, versions, port_mux)
                    if why and why[0][0] == "needs":
                        assert (c, f"needs {why[0][1]}") in skipped


def test_cli_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conform", "controller"]) == 2
    assert "argument --launch: is required, unless --list is given" in capsys.readouterr().err
    assert main(["conform", "relay", "--launch", "x {port}"]) == 2
    assert "unknown placeholder {port}" in capsys.readouterr().err
    assert main(["conform", "controller", "--launch", "x", "--cases", "nothing.*"]) == 2
    assert capsys.readouterr().err == (
        "flodl-proto conform controller: error: argument --cases: no controller case id matches "
        "'nothing.*'; 'flodl-proto conform controller --list' without --cases lists the ids\n")
    assert main(["conform", "controller", "--launch", "x", "--timeout-scale", "0"]) == 2
    capsys.readouterr()
    for option in ("--json", "--junit"):  # it wrote a file named "-"
        with pytest.raises(SystemExit) as info:
            main(["conform", "controller", "--launch", "x {port}", option, "-"])
        assert info.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1] == (
            f"flodl-proto conform controller: error: argument {option}: cannot be - (stdout "
            "carries the case lines); give a file path")


def test_cli_junit_and_json_to_one_file_is_a_usage_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the JSON report replaced the JUnit one; /dev/null takes both
    monkeypatch.chdir(tmp_path)
    (tmp_path / "link.json").symlink_to("r.xml")
    run = ["conform", "controller", "--launch", "true {port}", "--timeout-scale", "0.1",
           "--cases", "controller.session.one-relay-one-round", "--version", "2"]
    for junit, json_path in (("r.xml", "r.xml"), ("r.xml", str(tmp_path / "r.xml")),
                             ("r.xml", "link.json")):
        assert main([*run, "--junit", junit, "--json", json_path]) == 2
        assert capsys.readouterr() == (
            "", f"flodl-proto conform controller: error: argument --json: {shown(json_path)}: "
            f"the same file as --junit {shown(junit)} (one report would replace the other); "
            "give two paths\n")
    assert not (tmp_path / "r.xml").exists()
    assert main([*run, "--junit", os.devnull, "--json", os.devnull]) == 1  # the run: FAIL
    assert capsys.readouterr().err == ""


def test_cli_report_that_cannot_be_written_is_exit_1(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # an output file written after the run, as `docs --out`: exit 1 (2 is a bad command line:
    # a path that names a folder or runs through a file); missing parent folders are created,
    # as a generator's
    run = ["conform", "controller", "--launch", "true {port}", "--timeout-scale", "0.1",
           "--cases", "controller.session.one-relay-one-round", "--version", "2"]
    nested = tmp_path / "reports" / "ci" / "r.json"
    assert main([*run, "--json", str(nested)]) == 1  # the target is no controller: FAIL
    assert json.loads(nested.read_text(encoding="utf-8"))["must_failed"] == 1
    assert capsys.readouterr().err == ""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    # a file where a folder of the path should be, at any level: refused with the command
    # line, before any case runs or any report is written (it was found as the first reports
    # were written, exit 1)
    for junit in (blocker / "j.xml", blocker / "ci" / "j.xml"):
        json_path = tmp_path / "kept.json"
        with pytest.raises(SystemExit) as stop:
            main([*run, "--json", str(json_path), "--junit", str(junit)])
        assert stop.value.code == 2
        assert capsys.readouterr() == (
            "", f"flodl-proto conform controller: error: argument --junit: {shown(str(junit))}: "
            f"Not a directory ({shown_name(str(blocker))} is a file, not a folder)\n")
        assert not json_path.exists()
    # a folder that exists is refused with the command line, as one ending with /
    with pytest.raises(SystemExit) as stop:
        main([*run, "--json", str(tmp_path)])
    assert stop.value.code == 2
    assert capsys.readouterr() == (
        "", f"flodl-proto conform controller: error: argument --json: {shown(str(tmp_path))} "
        "names a folder (an existing one); give a file path in it\n")


@pytest.mark.parametrize("jobs", ["1", "3"])
def test_cli_launch_that_cannot_start_is_one_line_exit_2(
        jobs: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # the program named by --launch cannot be executed: one usage line naming it and the OS
    # error, exit 2, no case runs (nothing on stdout; no "target: not reaped"); the programs
    # are named from the test's folder as the working directory, short enough to be shown whole
    monkeypatch.chdir(tmp_path)
    run = ["conform", "controller", "--timeout-scale", "0.1", "--version", "2", "--jobs", jobs]
    missing = "./nonexistent"
    assert main([*run, "--launch", f"{missing} --port {{port}}"]) == 2
    assert capsys.readouterr() == ("", "flodl-proto conform controller: error: argument --launch: "
                                       "cannot start the target './nonexistent': No such file or "
                                       "directory\n")
    not_executable = "./target.sh"
    (tmp_path / "target.sh").write_text("#!/bin/sh\n")
    (tmp_path / "target.sh").chmod(0o644)
    assert main([*run, "--launch", f"{not_executable} {{port}}"]) == 2
    assert capsys.readouterr() == ("", "flodl-proto conform controller: error: argument --launch: "
                                       "cannot start the target './target.sh': Permission "
                                       "denied\n")
    # a report asked for says why no case ran (and is no earlier run's)
    report = tmp_path / "r.json"
    report.write_text('{"earlier": "run"}')
    assert main([*run, "--launch", f"{missing} --port {{port}}", "--json", str(report)]) == 2
    capsys.readouterr()
    doc = json.loads(report.read_text())
    assert (doc["interrupted"], doc["stop"], doc["results"]) == (False, None, [])
    assert doc["not_run"] and {r["reason"] for r in doc["not_run"]} == {
        "not run: the --launch command cannot be started"}


def test_a_kit_stopped_before_its_first_case_leaves_no_earlier_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The reports were written only once the cases had run: a kit stopped before that (killed,
    or interrupted while it loaded) left the previous run's report, which a CI step then read
    as this run's. Before the first case starts, the report already says: interrupted, no case
    run."""
    from flodl_proto.conform import report as report_mod

    path = tmp_path / "r.json"
    path.write_text(json.dumps({"interrupted": False, "passed": 95}))
    seen: list[dict[str, Any]] = []

    def stopped_at_once(*args: Any, **kwargs: Any) -> Any:  # the report as the cases start
        seen.append(json.loads(path.read_text()))
        raise report_mod.RunInterrupted([])

    monkeypatch.setattr(report_mod, "run_cases", stopped_at_once)
    assert main(["conform", "controller", "--version", "2", "--cases", "controller.round.*",
                 "--launch", "true {port}", "--json", str(path)]) == 130
    assert capsys.readouterr().err == "flodl-proto conform controller: interrupted\n"
    runs, _ = select_cases(CATALOGUE, role="controller", versions=[2],
                           patterns=["controller.round.*"])
    want = [(c.id, "not run: the kit was interrupted") for c, _ in runs]
    for doc in (seen[0], json.loads(path.read_text())):
        assert (doc["interrupted"], doc["stop"], doc["results"], doc["passed"]) == (
            True, "interrupted", [], 0)
        assert [(r["id"], r["reason"]) for r in doc["not_run"]] == want


_CTRL_C_AT_THE_CODEC = """
import sys

class _CtrlC:  # Ctrl-C as the codec (NumPy, ml_dtypes: the slow imports) starts to load
    def find_spec(self, name, path=None, target=None):
        if name == "flodl_proto.codec":
            raise KeyboardInterrupt
        return None

sys.meta_path.insert(0, _CtrlC())
from flodl_proto.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_kit_stopped_while_its_modules_load_leaves_no_earlier_report(tmp_path: Path) -> None:
    """The first reports (interrupted, no case run) were written only once the player and the
    codec were imported, over a second after the start: a kit stopped then left the previous
    run's reports. The catalogue, the command's checks and the reports import no codec, so the
    first reports are written before it loads."""
    import subprocess

    json_path, junit_path = tmp_path / "r.json", tmp_path / "r.xml"
    for path in (json_path, junit_path):
        path.write_text("an earlier run's report")
    res = subprocess.run(
        [sys.executable, "-c", _CTRL_C_AT_THE_CODEC, "conform", "controller", "--version", "2",
         "--cases", "controller.round.*", "--launch", "true {port}", "--json", str(json_path),
         "--junit", str(junit_path)], capture_output=True, text=True, timeout=60)
    assert (res.returncode, res.stdout, res.stderr) == (
        130, "", "flodl-proto conform controller: interrupted\n")
    runs, skipped = select_cases(CATALOGUE, role="controller", versions=[2],
                                 patterns=["controller.round.*"])
    assert runs
    assert json.loads(json_path.read_text()) == {
        "role": "controller", "interrupted": True, "stop": "interrupted", "passed": 0,
        "failed": 0, "must_failed": 0,
        "results": [], "not_selected": [{"id": c.id, "reason": why} for c, why in skipped],
        "not_run": [{"id": c.id, "version": 2, "reason": "not run: the kit was interrupted"}
                    for c, _ in runs]}
    suite = ET.parse(junit_path).getroot().find("testsuite")
    assert suite is not None and suite.get("name") == "controller not run"
    assert [(tc.get("name"), [s.get("message") for s in tc.iter("skipped")])
            for tc in suite.iter("testcase")] == [
        (c.id, ["not run: the kit was interrupted"]) for c, _ in runs]


def test_launched_target_that_cannot_start_is_a_launch_error(tmp_path: Path) -> None:
    from flodl_proto.conform.target import LaunchedTarget, TargetLaunchError

    t = LaunchedTarget(f"{tmp_path / 'nonexistent'} {{port}}")
    with pytest.raises(TargetLaunchError) as info:
        t.start(_ctx(tmp_path, free_port("127.0.0.1")), 20.0)
    assert (info.value.command, info.value.reason) == (str(tmp_path / "nonexistent"),
                                                       "No such file or directory")
    assert t.stop(1.0) is None  # never started: nothing to reap


@pytest.mark.parametrize("where", ["flodl_proto.conform.catalogue.select_cases",
                                   "flodl_proto.conform.report.write_json",
                                   "flodl_proto.conform.report.summary_by_section",
                                   "flodl_proto.commands.conform._prepare",
                                   "flodl_proto.commands.conform._title"])
def test_cli_out_of_memory_outside_a_case_is_one_line(
        where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # selecting the cases, writing a report: no traceback, exit 1
    def no_memory(*_args: Any, **_kwargs: Any) -> None:
        raise MemoryError

    monkeypatch.setattr(where, no_memory)
    run = ["conform", "controller", "--launch", "true {port}", "--timeout-scale", "0.1",
           "--cases", "controller.session.one-relay-one-round", "--version", "2",
           "--json", str(tmp_path / "r.json")]
    assert main(run) == 1
    assert capsys.readouterr().err == "flodl-proto conform controller: error: out of memory\n"


def test_summary_by_section_sorts_the_sections_by_number() -> None:
    """``conform controller`` printed the sections in the order their first case completed
    (15.9, 15.4, 15.2, 3.3, 3.7, 4., 3.6, 15.5, 13.); they come by number, compared as numbers,
    a title without one (a doc key no heading matched) last."""
    from types import SimpleNamespace

    keys = ["semantics:clean_exit", "semantics:bf16_rounding", "section:Nowhere",
            "semantics:fold_order", "message:channel_magic", "message:relay_control_msg",
            "section:Authentication tags", "message:mux_record", "semantics:zero_mass",
            "section:Lifecycle", "semantics:clean_exit"]
    results = [SimpleNamespace(case=SimpleNamespace(section=k, level="MUST"), passed=i != 1)
               for i, k in enumerate(keys)]

    def title_of(key: str) -> str:
        return key if key == "section:Nowhere" else resolve_section(key).heading

    got = summary_by_section(results, title_of)  # type: ignore[arg-type]
    assert [(title.split()[0], ok, bad, must) for title, ok, bad, must in got] == [
        ("3.3", 1, 0, 0), ("3.6", 1, 0, 0), ("3.7", 1, 0, 0), ("4.", 1, 0, 0),
        ("13.", 1, 0, 0), ("15.2", 1, 0, 0), ("15.4", 0, 1, 1), ("15.5", 1, 0, 0),
        ("15.9", 2, 0, 0), ("section:Nowhere", 1, 0, 0)]
    assert section_order("15.10 A") > section_order("15.9 B") > section_order("15. C")
    assert section_order("4. A") < section_order("4.1 B") < section_order("13. C")


def test_summary_line_names_the_level_of_its_failures() -> None:
    """A section whose only failures were SHOULD cases read ``ok ...: 0 passed, 1 failed``; its
    failures are counted by level, so a SHOULD failure does not read as a MUST one."""
    from flodl_proto.conform.report import section_line

    assert section_line("15.9 T", 3, 0, 0) == "  ok   15.9 T: 3 passed, 0 failed"
    assert section_line("12. T", 0, 1, 0) == "  ok   12. T: 0 passed, 1 SHOULD failed"
    assert section_line("15.2 T", 1, 2, 2) == "  FAIL 15.2 T: 1 passed, 2 MUST failed"
    assert section_line("15.2 T", 1, 3, 2) == \
        "  FAIL 15.2 T: 1 passed, 2 MUST failed, 1 SHOULD failed"


def test_cli_summary_of_a_should_failure(capsys: pytest.CaptureFixture[str]) -> None:
    """The summary of a run whose only failure is a SHOULD case: the section is ok and its line
    says the failure is a SHOULD one."""
    run = ["conform", "controller", "--version", "3", "--jobs", "1", "--level", "should",
           "--cases", "controller.lifecycle.foreign-rank-exit", "--launch", "false {port}"]
    assert main(run) == 0
    out = capsys.readouterr().out
    assert out.split("summary by section:\n", 1)[1].splitlines() == [
        "  ok   12. Departures from upstream: 0 passed, 1 SHOULD failed",
        "controller: 0 passed, 0 MUST failed, 1 SHOULD failed, 0 not selected"]


_CLI = f"{shlex.quote(sys.executable)} -m flodl_proto.cli"
_LAUNCH = {
    "controller": f"{_CLI} controller --listen {{host}}:{{port}} --world-size {{world_size}} "
                  "--salt-file {salt_file} --protocol-version {version} --no-port-mux",
    "relay": f"{_CLI} relay --controller {{controller}} --ranks {{ranks}} "
             "--world-size {world_size} --salt-file {salt_file} --protocol-version {version} "
             "--listen-port {listen_port}",
}
_E2E_CASES = {
    "controller": ["controller.session.bf16-round", "controller.round.f32-weighted",
                   "controller.hello.rank-out-of-range", "controller.lifecycle.sigterm-clean-exit"],
    "relay": ["relay.fold.two-ranks", "relay.handshake.duplicate-rank",
              "relay.lifecycle.sigterm-clean-exit"],
}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("role", ["controller", "relay"])
def test_cli_end_to_end_launch(role: str, version: int, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["conform", role, "--version", str(version), "--timeout-scale", "0.1",
            "--jobs", "2", "--junit", str(tmp_path / "j.xml"), "--json", str(tmp_path / "r.json"),
            "--launch", _LAUNCH[role]]
    for c in _E2E_CASES[role]:
        argv += ["--cases", c]
    assert main(argv) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    for c in _E2E_CASES[role]:
        assert f"PASS {c} v{version}" in out
    assert "summary by section:" in out
    root = ET.parse(tmp_path / "j.xml").getroot()
    suite = root.find("testsuite")
    assert suite is not None and suite.get("tests") == str(len(_E2E_CASES[role]))
    assert suite.get("failures") == "0"
    doc = json.loads((tmp_path / "r.json").read_text())
    assert {r["id"] for r in doc["results"]} == set(_E2E_CASES[role])
    # the reports keep catalogue order, whatever order the two jobs completed the cases in
    ordered = [c.id for c in load_catalogue() if c.id in _E2E_CASES[role]]
    assert [r["id"] for r in doc["results"]] == ordered
    assert [tc.get("name") for tc in suite.iter("testcase")] == ordered
    # the summary by section in section-number order
    summary = out.split("summary by section:\n", 1)[1].splitlines()
    numbers = [line.split()[1] for line in summary if line.startswith(("  ok  ", "  FAIL "))]
    assert numbers == sorted(numbers, key=section_order), summary
    by_id = {r["id"]: r for r in doc["results"]}
    sig = f"{role}.lifecycle.sigterm-clean-exit"
    assert by_id[sig]["exit_status"] == 0 and by_id[sig]["exited_by_itself"]


# -- docs ---------------------------------------------------------------------------------------


def test_conformance_doc_is_current() -> None:
    text = render_conformance_doc()
    current = (ROOT / "docs" / "conformance.md").read_text(encoding="utf-8")
    assert current == text, "docs/conformance.md is stale: run `flodl-proto conform docs`"
    for c in CATALOGUE:
        assert f"| `{c.id}` | {c.level} |" in text
        assert resolve_section(c.section).anchor in text
    assert "--salt-file {salt_file}" in text


def test_conform_docs_unwritable_or_missing_output_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    out = blocker / "docs" / "conformance.md"
    with pytest.raises(SystemExit) as stop:
        main(["conform", "docs", "--out", str(out)])
    assert stop.value.code == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err == (f"flodl-proto conform docs: error: argument --out: {shown(str(out))}: Not "
                       f"a directory ({shown_name(str(blocker))} is a file, not a folder)\n")
    missing = tmp_path / "conformance.md"
    assert main(["conform", "docs", "--check", "--out", str(missing)]) == 1
    cap = capsys.readouterr()
    assert cap.err == (f"flodl-proto conform docs: error: {shown(str(missing))}: missing; run "
                       f"`flodl-proto conform docs --out {missing}`\n")
    assert not missing.exists()


def test_readme_has_a_conformance_section() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "## Conformance kit" in readme
    assert "flodl-proto conform controller" in readme and "docs/conformance.md" in readme


# -- launched targets: readiness without a listening line, SIGTERM then SIGKILL -----------------


def _ctx(tmp_path: Path, port: int) -> Any:
    from flodl_proto.conform.target import CaseContext

    return CaseContext("controller", 3, 1, SALT, tmp_path / "salt", "127.0.0.1", port, 0, (), 0.1)


_SILENT_LISTENER = ("import signal, socket, time; {ignore}"
                    "s = socket.socket(); s.bind(('127.0.0.1', {{port}})); s.listen(); "
                    "time.sleep(60)")


@pytest.mark.timeout(60)
def test_launched_target_ready_from_proc_net_and_stopped_by_sigterm(tmp_path: Path) -> None:
    from flodl_proto.conform.target import LaunchedTarget, port_listening

    port = free_port("127.0.0.1")
    code = _SILENT_LISTENER.format(ignore="")
    t = LaunchedTarget(f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}")
    assert t.start(_ctx(tmp_path, port), 20.0) == ("127.0.0.1", port)
    assert port_listening(port) is True
    assert t.wait_exit(0.1) is None
    ex = t.stop(5.0)
    assert (ex.status, ex.by_itself, ex.killed) == (-15, False, False)
    assert ex.describe() == "ended by SIGTERM (no handler)"
    assert port_listening(port) is False


@pytest.mark.timeout(60)
def test_launched_target_ignoring_sigterm_is_killed(tmp_path: Path) -> None:
    from flodl_proto.conform.target import LaunchedTarget

    port = free_port("127.0.0.1")
    code = _SILENT_LISTENER.format(ignore="signal.signal(signal.SIGTERM, signal.SIG_IGN); ")
    t = LaunchedTarget(f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}")
    t.start(_ctx(tmp_path, port), 20.0)
    ex = t.stop(0.5)
    assert (ex.status, ex.by_itself, ex.killed) == (-9, False, True)
    assert ex.describe() == "killed by SIGKILL (SIGTERM ignored)"


def test_launched_target_that_exits_early_is_reported(tmp_path: Path) -> None:
    from flodl_proto.conform.target import LaunchedTarget, TargetError

    t = LaunchedTarget(f"{shlex.quote(sys.executable)} -c 'import sys; sys.exit(3)'")
    with pytest.raises(TargetError, match=r"exited \(3\) before listening"):
        t.start(_ctx(tmp_path, free_port("127.0.0.1")), 20.0)
    assert t.stop(1.0).status == 3


@pytest.mark.parametrize("option", ["--json", "--junit"])
def test_cli_report_write_that_fails_midway_leaves_the_old_file(option: str,
                                                                  tmp_path: Path) -> None:
    """A ``--json`` / ``--junit`` report over an existing file, in a process that cannot write
    more than 256 bytes to a file (as a full disk): the report (over 800 bytes) fails partway.
    The old report must be as it was and the folder must hold nothing else; one line names the
    report and why, exit 1."""
    out = tmp_path / "report"
    old = b"the previous report\n"
    out.write_bytes(old)
    res = run_with_file_size_limit(
        ["conform", "controller", "--launch", "true {port}", "--timeout-scale", "0.1",
         "--cases", "controller.session.one-relay-one-round", "--version", "2", option,
         str(out)], 256)
    assert res.returncode == 1
    assert res.stderr == ("flodl-proto conform controller: error: cannot write the report "
                          f"{shown(str(out))}: File too large\n")
    assert out.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]


def _targets_with(marker: str, but: int) -> list[int]:
    """Pids of live processes whose command line carries ``marker``, but not ``but``."""
    import contextlib
    import os

    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError):
                cmdline = Path(f"/proc/{d}/cmdline").read_bytes()
                state = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if marker.encode() in cmdline and state != "Z" and int(d) != but:
                    pids.append(int(d))
    return pids


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc")
@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_interrupted_kit_stops_its_targets_and_removes_their_salt_files(
        sig: str, tmp_path: Path) -> None:
    """The targets run in sessions of their own, so neither a SIGTERM to the kit nor a
    terminal's Ctrl-C reached them: they were left running, with their salt files, when the kit
    was stopped. Now the kit stops them, removes the files, and ends with one line: exit 143,
    ``terminated`` after SIGTERM (it was 130, ``interrupted``, as after Ctrl-C), exit 130,
    ``interrupted`` after Ctrl-C.
    The ``--json`` and ``--junit`` reports (none were written) hold the cases that ended and
    list the others as not run."""
    import json
    import os
    import signal
    import subprocess
    import time
    import uuid
    import xml.etree.ElementTree as ET

    reports, tmp_path = tmp_path, tmp_path / "tmp"
    tmp_path.mkdir()
    marker = f"flodl-conform-test-{uuid.uuid4().hex}"
    # a target that listens and never answers: each case waits on it
    code = ("import socket, sys, time; s = socket.socket(); "
            "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); time.sleep(100)")
    launch = f"{shlex.quote(sys.executable)} -c {shlex.quote(code)} {{port}} {marker}"
    kit = subprocess.Popen(
        [sys.executable, "-m", "flodl_proto.cli", "conform", "controller", "--version", "3",
         "--jobs", "2", "--cases", "controller.round.*", "--launch", launch,
         "--json", str(reports / "r.json"), "--junit", str(reports / "r.xml")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        deadline = time.monotonic() + 60
        while (seen := len(_targets_with(marker, kit.pid))) < 2 and time.monotonic() < deadline:
            assert kit.poll() is None, kit.communicate()
            time.sleep(0.05)
        assert seen == 2  # both jobs' targets run (and each case has its salt file)
        assert 1 <= len(list(tmp_path.glob("flodl-conform-*.salt"))) <= 2
        kit.send_signal(getattr(signal, sig))
        out, err = kit.communicate(timeout=60)
    finally:
        if kit.poll() is None:
            kit.kill()
            kit.communicate()
        for pid in _targets_with(marker, kit.pid):
            os.kill(pid, signal.SIGKILL)
    word, code = ("terminated", 143) if sig == "SIGTERM" else ("interrupted", 130)
    assert kit.returncode == code, err
    assert err == f"flodl-proto conform controller: {word}\n"
    # no verdict on the cases cut short: a case reported here ran to its own end (on a busy
    # machine some may, each waiting its 5 s on the silent target) and the kit then stopped
    # its target; a case cut short would show its target ended by the interruption's SIGTERM
    # before the kit stopped it ("ended by SIGTERM", "did not start", "connection refused")
    heads = [ln for ln in out.splitlines() if ln.startswith("FAIL ")]
    targets = [ln for ln in out.splitlines() if ln.startswith("     target")]
    assert targets == ["     target: ended by SIGTERM (no handler)"] * len(heads), out
    assert _targets_with(marker, kit.pid) == []
    assert list(tmp_path.iterdir()) == []
    doc = json.loads((reports / "r.json").read_text())
    listed = subprocess.run(
        [sys.executable, "-m", "flodl_proto.cli", "conform", "controller", "--version", "3",
         "--cases", "controller.round.*", "--list"], capture_output=True, text=True, check=True)
    selected = sum(1 for ln in listed.stdout.splitlines() if ln.startswith("controller.round."))
    assert (doc["interrupted"], doc["stop"], doc["passed"]) == (True, word, 0)
    assert sorted(f"FAIL {r['id']} v3 [{r['level']}] ({r['section_title']})"
                  for r in doc["results"]) == sorted(heads)  # the cases reported, no other
    assert len(doc["results"]) + len(doc["not_run"]) == selected >= 3
    assert doc["not_run"] and {r["reason"] for r in doc["not_run"]} \
        == {f"not run: the kit was {word}"}  # SIGTERM: it said "interrupted"
    root = ET.parse(reports / "r.xml").getroot()
    assert all(s.find("properties/property[@name='interrupted'][@value='true']") is not None
               and s.find(f"properties/property[@name='stop'][@value='{word}']") is not None
               for s in root.iter("testsuite"))
    skipped = root.findall("testsuite[@name='controller not run']/testcase/skipped")
    assert len(skipped) == len(doc["not_run"])
    assert {e.get("message") for e in skipped} == {f"not run: the kit was {word}"}


#: run in a fresh interpreter: cases of a target that never listens, four at a time; once the
#: four targets started, SIGUSR1 is given to a thread of its own (the caller's thread blocks
#: it), as the kernel may give a process's SIGTERM to any of its threads
_SIGNAL_TO_A_WORKER = """
import signal, sys, threading, time
from flodl_proto.conform import KitSettings, load_catalogue, run_cases, select_cases
from flodl_proto.conform.report import RunInterrupted
from flodl_proto.conform.target import LaunchedTarget

stop = threading.Event()
launched = []
def handler(signum, frame):  # as the kit's: stop, end the targets, raise
    stop.set()
    for t in list(launched):
        t.send_signal(signal.SIGTERM)
    raise KeyboardInterrupt
signal.signal(signal.SIGUSR1, handler)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})  # the pool's threads inherit it
def send_once_started():  # on a thread of its own: the signal is given to this thread
    while len(launched) < 4 or any(t._proc is None for t in launched):
        time.sleep(0.01)
    time.sleep(0.2)  # the cases wait for their targets to listen
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
    signal.raise_signal(signal.SIGUSR1)
def make_target():
    t = LaunchedTarget(sys.executable + " -c 'import time; time.sleep(60)'")
    launched.append(t)
    return t
threading.Thread(target=send_once_started, daemon=True).start()  # SIGUSR1 blocked: inherited
runs, _ = select_cases(load_catalogue(), role="controller", versions=[2], port_mux=False,
                       patterns=["controller.round.*"])
began = time.monotonic()
try:
    run_cases(runs[:4], make_target, KitSettings(ready_timeout=30.0), jobs=4, stop=stop)
except RunInterrupted:
    print(f"interrupted after {time.monotonic() - began:.1f}s")
for t in launched:
    t.send_signal(signal.SIGKILL)
"""


@pytest.mark.timeout(120)
def test_a_signal_another_thread_received_stops_the_run_at_once() -> None:
    """The caller's thread waits on the cases in short steps: a signal the kernel gave a case's
    thread ran its handler only once a case ended (here a target's whole start timeout, 30 s),
    so a SIGTERM could leave the kit playing its cases for that long."""
    res = subprocess.run([sys.executable, "-c", _SIGNAL_TO_A_WORKER], capture_output=True,
                         text=True, timeout=100)
    assert res.returncode == 0, res.stderr
    words, seconds = res.stdout.rsplit(" ", 1)
    assert words == "interrupted after", res.stdout
    assert float(seconds.rstrip("s\n")) < 10.0, res.stdout


def test_the_kit_s_salts_take_their_length_from_the_spec(tmp_path: Path) -> None:
    """The kit's salts are ``SESSION_SALT_BYTES`` long, where it wrote 16 by hand: under a spec
    whose salt is 24 bytes (``FLODL_PROTO_SPEC_DIR``) a case's fresh salt and a step's ``zero``
    salt are 24 bytes, a step's salt of 24 bytes in hex is taken and one of 16 is refused
    naming 48 hex digits."""
    spec_dir = spec_with_constant(tmp_path, "SESSION_SALT_BYTES", 16, 24)
    code = (
        "from types import SimpleNamespace\n"
        "from flodl_proto.conform import builders, player\n"
        "from flodl_proto.conform.catalogue import CatalogueError\n"
        "ctx = builders.BuildContext(salt=bytes(24), version=2, world_size=1)\n"
        "print(len(player.case_salt(SimpleNamespace(salt=None))),\n"
        "      player.case_salt(SimpleNamespace(salt=b'k')),\n"
        "      builders._salt('zero', ctx, 'step 1'), len(builders._salt('ab' * 24, ctx, 's')))\n"
        "try:\n    builders._salt('ab' * 16, ctx, 'step 2')\n"
        "except CatalogueError as e:\n    print(e)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "FLODL_PROTO_SPEC_DIR": str(spec_dir)})
    assert (res.returncode, res.stderr) == (0, "")
    assert res.stdout == (
        f"24 b'k' {bytes(24)!r} 24\n"
        f"step 2: salt must be wrong, zero or 48 hex digits, got '{'ab' * 16}'\n")
