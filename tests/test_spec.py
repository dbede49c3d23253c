"""The spec is the single source of truth: structs match its tables, errors come from its
catalogue, and constants are not written anywhere else."""

from __future__ import annotations

import collections
import datetime
import logging
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from construct import Array, Bytes, FormatField

from flodl_proto import _spec_shapes, errors, spec
from flodl_proto.codec import structs
from flodl_proto.codec._common import check_version
from flodl_proto.codec.handshake import encode_handshake

PKG = Path(spec.__file__).resolve().parent

_TYPE_OF_FORMAT = {"<B": "u8", "<I": "u32", "<L": "u32", "<Q": "u64", "<d": "f64"}


def _tables() -> list[tuple[str, str, list[dict[str, Any]]]]:
    out = []
    for mname, msg in spec.SPEC.raw["messages"].items():
        if "struct" in msg and "fields" in msg:
            fixed = [f for f in msg["fields"] if f["type"] != "bytes"]
            out.append((mname, msg["struct"], fixed))
        for part in msg.get("parts", []):
            if "struct" in part:
                out.append((f"{mname}.{part['name']}", part["struct"], part["fields"]))
    return out


def _wire_type(subcon: Any) -> tuple[str, int]:
    if isinstance(subcon, FormatField):
        return _TYPE_OF_FORMAT[subcon.fmtstr], subcon.length
    if isinstance(subcon, Bytes):
        return "tag8", int(subcon.length)
    raise AssertionError(f"unexpected construct {subcon!r}")


@pytest.mark.parametrize("name,struct_name,fields", _tables(), ids=[t[0] for t in _tables()])
def test_struct_matches_spec_table(name: str, struct_name: str,
                                   fields: list[dict[str, Any]]) -> None:
    st = structs.STRUCTS[struct_name]
    subs = [s for s in st.subcons]
    assert [s.name for s in subs] == [f["name"] for f in fields]
    offset = 0
    for s, f in zip(subs, fields, strict=True):
        wtype, size = _wire_type(s.subcon)
        assert wtype == f["type"], f"{name}.{f['name']}: {wtype} != {f['type']}"
        assert size == f["size"] == spec.SPEC.raw["types"][f["type"]]["size"]
        if "offset" in f and not name.startswith("round_frame."):
            assert f["offset"] == offset, f"{name}.{f['name']} offset"
        offset += size
        if "const" in f:
            assert f["const"] in spec.SPEC.constants


def test_every_struct_has_a_table() -> None:
    assert {t[1] for t in _tables()} == set(structs.STRUCTS)


def test_tensor_dims_is_ndim_u32s() -> None:
    sub = structs.TENSOR_DIMS.subcons[0].subcon
    assert isinstance(sub, Array)
    assert _wire_type(sub.subcon) == ("u32", 4)


def test_header_sizes_agree_with_constants() -> None:
    assert structs.MUX_HEADER.sizeof() == spec.MUX_HEADER_LEN
    assert structs.HANDSHAKE.sizeof() == spec.HANDSHAKE_LEN
    assert structs.HANDSHAKE_ACK.sizeof() == spec.HANDSHAKE_ACK_LEN
    assert structs.ROUND_FRAME_HEADER.sizeof() == spec.ROUND_FRAME_HEADER_LEN
    covered = sum(f["size"] for f in spec.SPEC.raw["messages"]["mux_record"]["fields"][:5])
    assert covered == spec.MUX_AUTH_COVERED_HEADER_LEN


def _source_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in PKG.rglob("*.py"))


def test_every_catalogue_error_is_raised_somewhere() -> None:
    # every id is passed (as a string literal) to protocol_error or to a helper that raises it
    text = _source_text()
    missing = sorted(e for e in spec.SPEC.errors if f'"{e}"' not in text)
    assert not missing, f"catalogue errors never raised: {missing}"
    used = set(re.findall(r"""protocol_error\(\s*["']([a-z_0-9.]+)["']""", text))
    unknown = sorted(used - set(spec.SPEC.errors))
    assert not unknown, f"errors raised but not catalogued: {unknown}"


def test_error_templates_format_and_kinds_map_to_classes() -> None:
    for eid, entry in spec.SPEC.errors.items():
        assert entry.kind in errors.KIND_CLASSES, eid
        fields = set(re.findall(r"{(\w+)", entry.template))
        sample = {f: 1 for f in fields}
        err = errors.protocol_error(eid, **sample)
        assert isinstance(err, errors.KIND_CLASSES[entry.kind])
        assert isinstance(err, errors.RemoteProtocolError if entry.remote
                          else errors.LocalProtocolError)
        assert err.error_id == eid


def test_magic_constants_written_only_in_the_spec() -> None:
    magics = [v for k, v in spec.SPEC.constants.items() if "MAGIC" in k]
    text = _source_text().lower()
    for m in magics:
        assert f"0x{m:08x}" not in text, f"magic 0x{m:08x} hard-coded in the package"
    # nor any other member of the 0xF10D17xx magic family
    assert not re.findall(r"0xf10d17[0-9a-f]{2}", text)


def test_versions() -> None:
    assert spec.DEFAULT_VERSION == 2
    assert spec.SUPPORTED_VERSIONS == (2, 3)
    assert check_version(3) == 3
    with pytest.raises(errors.VersionMismatch) as ei:
        check_version(4)
    assert isinstance(ei.value, errors.LocalProtocolError)


def test_error_side_and_kind_axes() -> None:
    e = errors.TruncatedInput("x")
    assert isinstance(e, errors.RemoteProtocolError) and e.kind == "truncated"
    e2 = errors.AuthenticationError("y", remote=False)
    assert isinstance(e2, errors.LocalProtocolError)
    assert isinstance(e2, errors.AuthenticationError)
    assert not isinstance(e2, errors.RemoteProtocolError)


@pytest.mark.parametrize(("text", "want"), [
    (None, 1.0), ("2.5", 2.5), (" 3\n", 3.0), ("0.1", 0.1), ("1000", 1000.0), ("1e2", 100.0),
    ("+1.5", 1.5), (".5", 0.5),
])
def test_read_net_timeout_scale(text: str | None, want: float) -> None:
    assert spec.read_net_timeout_scale(text) == (want, None)


@pytest.mark.parametrize(("text", "problem"), [
    ("", "is not a number"), ("soon", "is not a number"),
    # text float() reads says why it is refused
    ("1_0", "is not a number (a number is written in ASCII digits, without '_')"),
    # a non-ASCII digit: upstream's parse refuses it too
    ("\u0661", "is not a number (a number is written in ASCII digits, without '_')"),
    ("0.0999", "is out of range"), ("0", "is out of range"), ("-1", "is out of range"),
    ("1000.001", "is out of range"), ("1e308", "is out of range"), ("inf", "is not finite"),
    ("-inf", "is not finite"), ("nan", "is not finite"), ("NaN", "is not finite"),
])
def test_read_net_timeout_scale_of_an_invalid_value(text: str, problem: str) -> None:
    """The default, and the fields of ``timeout_scale.invalid`` but the field's name."""
    assert spec.read_net_timeout_scale(f" {text} ") == (1.0, {
        "value": text, "problem": problem, "minimum": 0.1, "maximum": 1000.0})


def test_net_timeout_scale_falls_back_to_1_with_one_warning_per_value(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """As upstream's library: an invalid value is the default, 1.0 (0.01 was raised to 0.1),
    said once on stderr; the commands refuse it (``commands.relay.check_net_timeout_scale``)."""
    monkeypatch.setattr(spec, "_SCALES", {})
    monkeypatch.delenv("FLODL_NET_TIMEOUT_SCALE", raising=False)
    assert spec.net_timeout_scale() == 1.0
    monkeypatch.setenv("FLODL_NET_TIMEOUT_SCALE", "2.5")
    assert spec.net_timeout_scale() == 2.5
    with caplog.at_level(logging.WARNING, logger="flodl_proto.spec"):
        for value in ("0.01", "1e308", "0.01", "1e308", "nan"):
            monkeypatch.setenv("FLODL_NET_TIMEOUT_SCALE", value)
            assert spec.net_timeout_scale() == 1.0
    assert [r.getMessage() for r in caplog.records] == [
        f"FLODL_NET_TIMEOUT_SCALE={v!r} {p}; expected a finite scale factor from 0.1 "
        "to 1000; using default scale 1.0" for v, p in (("0.01", "is out of range"),
                                                       ("1e308", "is out of range"),
                                                       ("nan", "is not finite"))]
    monkeypatch.setenv("FLODL_NET_TIMEOUT_SCALE", "7")
    assert spec.net_timeout_scale() == 7.0  # read at every call


def test_every_timeout_at_the_largest_scale_is_within_the_limits_of_its_call(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Departure ``net_timeout_scale_maximum``: at 1000 the longest scaled timeout is 120000 s,
    the keepalive idle time within Linux's TCP_KEEPIDLE maximum (32767 s), TCP_USER_TIMEOUT
    (ms) within a C int, and a socket takes them all."""
    import socket
    import threading

    from flodl_proto.runner import _netio
    from flodl_proto.runner.controller import peek_timeout

    top = spec.SPEC.raw["timeouts"]["ENV_NET_TIMEOUT_SCALE"]["maximum"]
    monkeypatch.setenv("FLODL_NET_TIMEOUT_SCALE", str(top))
    assert spec.net_timeout_scale() == top == 1000.0
    idle, interval, probes = _netio.keepalive_settings()
    assert (idle, interval, probes) == (30000, 5000, 3)
    assert idle <= 32767 and interval <= 32767
    assert _netio.keepalive_bound() * 1000 == 45_000_000 <= 2**31 - 1
    longest = max(_netio.write_stall_timeout(), _netio.reduce_read_deadline(),
                  _netio.connect_attempts() * spec.SPEC.timeout("CONNECT_BACKOFF"),
                  peek_timeout())
    assert longest == 120000.0 < threading.TIMEOUT_MAX
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        _netio.configure_socket(sock, recv=longest)  # keepalive, user timeout, write stall
        if hasattr(socket, "TCP_KEEPIDLE"):  # taken, not refused (refusals are ignored)
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == idle
        if hasattr(socket, "TCP_USER_TIMEOUT"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 45_000_000


def _sample(subcon: Any, k: int) -> Any:
    """A distinct in-range value for one field (k-th sample): ints near the top of their range,
    floats with a fraction, tag bytes."""
    if isinstance(subcon, Bytes):
        return bytes((k + i) & 0xFF for i in range(int(subcon.length)))
    if subcon.fmtstr.endswith("d"):
        return -1.5 * (k + 1)
    return (1 << (8 * subcon.length)) - 1 - k


@pytest.mark.parametrize("struct_name", sorted(structs.STRUCTS))
def test_packed_form_is_the_same_layout(struct_name: str) -> None:
    """The precompiled struct the hot path uses writes and reads exactly what the construct
    declaration does, field for field."""
    st = structs.STRUCTS[struct_name]
    packed = structs.PACKED[struct_name]
    assert packed.size == st.sizeof()
    values = [_sample(s.subcon, k) for k, s in enumerate(st.subcons)]
    wire = st.build(dict(zip([s.name for s in st.subcons], values, strict=True)))
    assert packed.pack(*values) == wire
    assert list(packed.unpack(wire)) == values


@pytest.mark.parametrize("ndim", [1, 2, 5])
def test_dims_packed_is_tensor_dims(ndim: int) -> None:
    dims = [0xFFFF_FFFF - i for i in range(ndim)]
    wire = structs.TENSOR_DIMS.build({"dims": dims}, ndim=ndim)
    assert structs.dims_packed(ndim).pack(*dims) == wire
    assert list(structs.dims_packed(ndim).unpack(wire)) == dims


def test_an_integer_too_wide_to_print_is_shown_by_its_size() -> None:
    """A value of more than 4300 decimal digits (Python refuses to print one) made building the
    message raise ValueError ("Exceeds the limit (4300 digits) ..."), where the caller's mistake
    was to be reported: ``RoundFrame(MODEL, 10**5000, ...)``, ``HostFold([10**5000], ...)``."""
    big = 10**5000
    err = errors.protocol_error("mux.bad_field", field="rank", value=big, reason="not a u32")
    assert isinstance(err, errors.LocalProtocolError)
    assert str(err) == ("relay_mux: rank = <an integer of 16610 bits> is invalid: not a u32")
    assert err.fields["value"] == big  # the value itself is kept
    err = errors.protocol_error("addr.invalid", field="--listen", value=("h", -big),
                                reason="out of range")
    assert str(err) == ("--listen ('h', <a negative integer of 16610 bits>): not a HOST:PORT "
                        "address: out of range")
    # up to 80 digits, integers print whole
    err = errors.protocol_error("mux.bad_field", field="rank", value=10**80 - 1, reason="r")
    assert str(err) == f"relay_mux: rank = {'9' * 80} is invalid: r"


@pytest.mark.parametrize(("value", "size"), [
    (10**80, "an integer of 266 bits"), (-(10**80), "a negative integer of 266 bits"),
    (10**4000, "an integer of 13288 bits"), (10**4299, "an integer of 14281 bits")],
    ids=["81-digits", "81-digits-negative", "4001-digits", "4300-digits"])
def test_an_integer_of_more_than_80_digits_is_shown_by_its_size(value: int, size: str) -> None:
    """An integer of 81 to 4300 digits (which Python can print) was printed whole in a library
    message, a line of up to 4300 characters (``encode_handshake(1, 4, 10**4000)``); it is
    shown by its size, as one of more digits was, the error keeping the value itself."""
    err = errors.protocol_error("mux.bad_field", field="rank", value=value, reason="r")
    assert str(err) == f"relay_mux: rank = <{size}> is invalid: r"
    assert err.fields["value"] == value
    assert errors.shown(value) == f"<{size}>"
    with pytest.raises(errors.VersionMismatch) as e:
        encode_handshake(1, 4, value)
    assert str(e.value) == f"protocol version <{size}> is not supported (supported: [2, 3])"


def test_a_long_list_or_bytes_value_is_shown_by_the_ends_of_its_repr() -> None:
    """:func:`~flodl_proto.errors.shown` shortened texts and integers only: a list of 100000
    numbers (a vector file's ``expect``) or a megabyte of bytes was quoted whole."""
    assert errors.shown(list(range(100000))) == (
        "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 1...99997, 99998, 99999] (688890 characters)")
    x00 = "\\x00"
    assert errors.shown(b"\0" * 1000) == (
        "b'" + x00 * 9 + "\\x..." + "x00" + x00 * 4 + "' (4003 characters)")
    err = errors.protocol_error("mux.bad_field", field="model_sigs", value=[7] * 1000,
                                reason="r")
    assert str(err) == (f"relay_mux: model_sigs = [{'7, ' * 13}...7{', 7' * 6}] "
                        f"(3000 characters) is invalid: r")
    assert errors.shown([1, "x" * 100]) == f"[1, '{'x' * 40}...{'x' * 20}' (100 characters)]"
    assert errors.shown(list(range(20))) == repr(list(range(20)))


def test_a_long_text_is_quoted_by_its_ends() -> None:
    """A text value of thousands of characters (an address given on the command line) was
    quoted whole in the message; it is quoted by its first 40 and last 20 characters and its
    length, in a tuple too, while a text formatted without ``!r`` (the reason) stays whole and
    the error's fields keep the value itself."""
    text = "x" * 4000 + "yz"
    reason = "r" * 200
    err = errors.protocol_error("addr.invalid", field="--listen", value=text, reason=reason)
    assert str(err) == (f"--listen '{'x' * 40}...{'x' * 18}yz' (4002 characters): not a "
                        f"HOST:PORT address: {reason}")
    assert err.fields["value"] == text
    err = errors.protocol_error("addr.invalid", field="--listen", value=(text, 1), reason="r")
    assert str(err) == (f"--listen ('{'x' * 40}...{'x' * 18}yz' (4002 characters), 1): not "
                        f"a HOST:PORT address: r")
    assert errors.shown("x" * errors.SHOWN_CHARS) == repr("x" * errors.SHOWN_CHARS)
    assert errors.shown("x" * 81) == f"'{'x' * 40}...{'x' * 20}' (81 characters)"
    assert errors.shown(10**5000) == "<an integer of 16610 bits>"
    assert errors.shown(5) == "5"


@pytest.mark.parametrize(("value", "named"), [
    (b"x", "bytes"), ({1}, "set"), (datetime.date(2026, 1, 1), "date"), (object(), "object")])
def test_a_spec_value_of_another_python_type_is_named_by_its_type(value: Any, named: str) -> None:
    """YAML's ``!!binary``, ``!!set`` and dates load as bytes, a set, a date: a spec line read
    ``is a bytes``; it names the type after "a value of type", right for any name."""
    with pytest.raises(_spec_shapes.ShapeError) as ei:
        _spec_shapes.check_shape(value, str, "wire.yaml", "title")
    assert str(ei.value) == f"wire.yaml: title is a value of type {named}, not a string"


@pytest.mark.parametrize(("value", "named"), [
    (None, "None"), (5, "int"), (True, "bool"), ("x", "str"), (b"", "bytes"),
    (bytearray(), "bytearray"), ([], "list"), ({}, "dict"), (2.5, "float"),
    (object(), "object"), (memoryview(b""), "memoryview"),
    (collections.OrderedDict(), "OrderedDict"), (np.zeros(1), "ndarray"),
    (np.uint8(1), "uint8"), (np.int64(1), "int64"), (uuid.UUID(int=0), "UUID"),
])
def test_a_refused_value_s_type_is_named_by_its_name_alone(value: Any, named: str) -> None:
    """Type errors read ``got int``, ``got bytes`` and ``got None`` (the catalogue's ``got
    {got}``), as Python's own messages name a type: no article to get wrong (``got a int``,
    ``got a bytes``, ``got an uint8``, ``got a NoneType`` were written)."""
    assert errors.shown_type(value) == named
    err = errors.protocol_error("capture.bad_type", field="rec", expected="a record",
                                got=errors.shown_type(value), hint="")
    assert str(err) == f"rec must be a record, got {named}"


@pytest.mark.parametrize("name", ["a\x1b[31mb", "x\u202eq", "line\nbreak"])
def test_spec_load_error_quotes_a_path_with_controls(tmp_path: Path, name: str) -> None:
    """A spec folder (``docs --spec``) whose path holds an escape, a bidi control or a line
    break is named quoted in the load error, one line that plays nothing on a terminal."""
    folder = tmp_path / name
    with pytest.raises(spec.SpecError) as info:
        spec.Spec(folder)
    assert str(info.value) == (f"cannot load {str(folder / 'wire.yaml')!r}: "
                               "No such file or directory")
    folder.mkdir()
    (folder / "wire.yaml").write_bytes((spec.SPEC.path / "wire.yaml").read_bytes())
    with pytest.raises(spec.SpecError) as info:
        spec.Spec(folder).lifecycle()
    assert str(info.value) == (f"cannot load {str(folder / 'lifecycle.yaml')!r}: "
                               "No such file or directory")


#: (folder as given, the folder as a load error writes it, a load error of that folder's spec
#: that holds the folder's name elsewhere than as the folder)
FOLDER_NAMES = [
    ("s", "s", "wire.yaml: constants.MAX_NDIM.value is the string 'lots', not an integer"),
    ("spec", "spec", "wire.yaml: topology.legs[0]: message 'spec' is not in the 'messages' "
     "section"),
    ("./s/", "s", "lifecycle.yaml: relay: state 'tests' is reached by no transition"),
    ("my spec", "my spec", "wire.yaml: constants.MAX_NDIM.value is the string 'my spec', not "
     "an integer"),
]


@pytest.mark.parametrize(("given", "written", "text"), FOLDER_NAMES,
                         ids=[c[0] for c in FOLDER_NAMES])
def test_a_spec_load_error_names_its_folder_unless_it_starts_with_the_loaders_words(
        given: str, written: str, text: str) -> None:
    """Whether a load error names its folder already was a plain substring test: for a folder
    ``s`` (or ``spec``, or ``my spec``) a line holding those letters anywhere was left without
    its folder. Only the loader's own words, ``cannot load FOLDER/wire.yaml: `` or ``cannot
    load FOLDER/lifecycle.yaml: `` (that folder as it writes it), count."""
    folder = Path(given)
    assert spec.in_spec_folder(folder, text) == f"spec folder {written}: {text}"
    assert spec.in_given_folder(folder, text) == f"{written}: {text}"
    for name in ("wire.yaml", "lifecycle.yaml"):
        loaded = f"cannot load {written}/{name}: No such file or directory"
        assert spec.in_spec_folder(folder, loaded) == loaded
        assert spec.in_given_folder(folder, loaded) == loaded
        other = f"cannot load other/{written}/{name}: No such file or directory"
        assert spec.in_spec_folder(folder, other) == f"spec folder {written}: {other}"
        assert spec.in_given_folder(folder, other) == f"{written}: {other}"
    for named in (f"FLODL_PROTO_SPEC_DIR={written}: {text}", f"spec folder {written}: {text}"):
        assert spec.in_spec_folder(folder, named) == named


def test_a_spec_load_error_of_a_folder_with_a_blank_at_its_start_quotes_it() -> None:
    """A folder whose name starts with a blank is written quoted, by the loader and by the line
    that names it; the loader's words with the quoted path name it already."""
    folder = Path(" s")
    text = "wire.yaml: constants.MAX_NDIM.value is the string ' s', not an integer"
    assert spec.in_spec_folder(folder, text) == f"spec folder ' s': {text}"
    assert spec.in_given_folder(folder, text) == f"' s': {text}"
    loaded = "cannot load ' s/wire.yaml': No such file or directory"
    with pytest.raises(spec.SpecError) as info:
        spec.Spec(folder)
    assert str(info.value) == loaded
    assert spec.in_spec_folder(folder, loaded) == loaded
    assert spec.in_given_folder(folder, loaded) == loaded




@pytest.mark.parametrize(("file", "old", "new", "key", "both_in_edit"), [
    ("wire.yaml", "  DEFAULT_CONTROLLER_PORT:\n",
     "  AUTH_TAG_LEN: {value: 9, type: size, doc: a second entry, source: wire.rs}\n"
     "  DEFAULT_CONTROLLER_PORT:\n", "AUTH_TAG_LEN", False),
    ("wire.yaml", "{name: rank, type: u32, size: 4, offset: 8, doc:",
     "{name: rank, type: u32, size: 4, offset: 8, type: u64, doc:", "type", True),
    ("lifecycle.yaml", "          relay_eof:\n            - target: shutdown\n",
     "          relay_eof:\n            - target: shutdown\n          relay_eof:\n"
     "            - target: accepting\n", "relay_eof", False),
])
def test_a_key_written_twice_in_a_spec_file_is_refused_naming_the_key_and_both_lines(
        file: str, old: str, new: str, key: str, both_in_edit: bool, tmp_path: Path) -> None:
    """YAML keeps the last of two equal keys of a mapping: an edited spec holding a second
    ``AUTH_TAG_LEN`` (value 9) was loaded as if the first did not exist, and the package then
    read 9-byte tags; a field's second ``type`` replaced its first. The loader refuses it, in
    one line naming the file, the key, the line of each and the column of the second."""
    folder = tmp_path / "spec"
    folder.mkdir()
    for name in ("wire.yaml", "lifecycle.yaml"):
        (folder / name).write_bytes((PKG.parent / "spec" / name).read_bytes())
    text = (folder / file).read_text(encoding="utf-8")
    assert text.count(old) == 1
    start = text.index(old)
    edited = text[:start] + new + text[start + len(old):]
    (folder / file).write_text(edited, encoding="utf-8")
    first = edited.index(f"{key}:", start if both_in_edit else 0)
    second = edited.index(f"{key}:", max(first + 1, start))
    assert edited.count(f"{key}:", first, second + len(key) + 1) == 2  # none between them
    first_line, second_line = (edited[:at].count("\n") + 1 for at in (first, second))
    column = second - edited.rfind("\n", 0, second)
    with pytest.raises(spec.SpecError) as info:
        spec.Spec(folder).lifecycle()
    assert str(info.value) == (f"cannot load {folder / file}: not YAML: duplicate key {key!r} "
                               f"(first at line {first_line}) at line {second_line}, "
                               f"column {column}")


@pytest.mark.parametrize(("text", "reason"), [
    ("a: {1: x, true: y}\n",
     "duplicate key 'true' (the same key as '1' at line 1) at line 1, column 11"),
    ("a: {true: x, 1: y}\n",
     "duplicate key '1' (the same key as 'true' at line 1) at line 1, column 14"),
    ("a:\n  1.0: x\n  1: y\n",
     "duplicate key '1' (the same key as '1.0' at line 2) at line 3, column 3"),
    ("a: {0x1: x, 1: y}\n",
     "duplicate key '1' (the same key as '0x1' at line 1) at line 1, column 13"),
    ("a: {yes: x, true: y}\n",
     "duplicate key 'true' (the same key as 'yes' at line 1) at line 1, column 13"),
    ("a: {k: 1, k: 2}\n", "duplicate key 'k' (first at line 1) at line 1, column 11"),
    ("a: {1: x, 1: y}\n", "duplicate key 1 (first at line 1) at line 1, column 11"),
], ids=["one-then-true", "true-then-one", "float-then-int", "hex-then-decimal", "yes-then-true",
        "same-text", "same-number"])
def test_two_keys_written_apart_that_are_one_key_are_named_as_written(text: str,
                                                                        reason: str) -> None:
    """``1`` beside ``true`` in one mapping (one key to Python: ``1 == True``) is refused, as a
    key written twice is, but was named ``duplicate key True``, a word in neither place."""
    with pytest.raises(yaml.constructor.ConstructorError) as info:
        yaml.load(text, Loader=spec.YAML_LOADER)
    assert spec.load_reason(info.value) == f"not YAML: {reason}"


def test_a_spec_file_with_two_keys_that_are_one_names_both(tmp_path: Path) -> None:
    folder = tmp_path / "spec"
    shutil.copytree(PKG.parent / "spec", folder)
    lifecycle = folder / "lifecycle.yaml"
    text = lifecycle.read_text(encoding="utf-8")
    at = text.index("\n    guards:\n") + 1
    line = text[:at].count("\n") + 2
    lifecycle.write_text(text[:at] + "    guards:\n      1: one\n      true: yes\n"
                         + text[at + len("    guards:\n"):], encoding="utf-8")
    with pytest.raises(spec.SpecError) as info:
        spec.Spec(folder).lifecycle()
    assert str(info.value) == (
        f"cannot load {lifecycle}: not YAML: duplicate key 'true' (the same key as '1' at line "
        f"{line}) at line {line + 1}, column 7")


# an anchor defined inside a merge and used again; a mapping merging one that overrides a key
_NESTED_MERGES = """\
base: &base {a: 1, b: 2, long_key: 3}
top:
  <<: &mid
    <<: *base
    b: 20
    long_key: 30
  c: 4
again: *mid
both:
  <<: [*base, {a: 9, d: 5}]
  d: 6
"""


@pytest.mark.parametrize("loader", ["YAML_LOADER", "its pure-Python base"])
def test_the_spec_loader_takes_yaml_merge_keys_as_yaml_says(loader: str) -> None:
    """YAML merge keys (``<<``): a mapping's own key wins over a merged one, an earlier merged
    mapping over a later one. An anchor defined inside a merge and used again was refused as a
    duplicate key (its own ``b`` beside the ``b`` merged into it), and PyYAML's own flattening
    kept the first value of a key Python interns (``b``, not ``long_key``), so ``top`` read
    ``b: 2`` beside ``long_key: 30``."""
    cls = spec.YAML_LOADER if loader == "YAML_LOADER" else type(
        "PurePythonUniqueKeys", (yaml.SafeLoader,), {
            "construct_mapping": spec.YAML_LOADER.construct_mapping,
            "flatten_mapping": spec.YAML_LOADER.flatten_mapping})
    mid = {"a": 1, "b": 20, "long_key": 30}
    assert yaml.load(_NESTED_MERGES, Loader=cls) == {
        "base": {"a": 1, "b": 2, "long_key": 3}, "top": {**mid, "c": 4}, "again": mid,
        "both": {"a": 1, "b": 2, "long_key": 3, "d": 6}}
    with pytest.raises(yaml.constructor.ConstructorError) as info:
        yaml.load("a: &a {k: 1}\nc: {<<: *a, k: 2, k: 3}\n", Loader=cls)
    assert spec.load_reason(info.value) == (
        "not YAML: duplicate key 'k' (first at line 2) at line 2, column 19")


def _cli_with_spec_dir(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FLODL_PROTO_SPEC_DIR": str(folder)}
    return subprocess.run([sys.executable, "-m", "flodl_proto", *args], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def test_a_spec_folder_from_the_environment_missing_a_later_file_is_named_by_it(
        tmp_path: Path) -> None:
    """A ``$FLODL_PROTO_SPEC_DIR`` folder holding ``wire.yaml`` alone: the commands that read its
    ``lifecycle.yaml`` or ``conformance.yaml`` later name the variable as every other command
    does, where ``docs`` said only 'cannot load .../lifecycle.yaml' and ``conform`` printed
    Python's '[Errno 2] No such file or directory: '.../conformance.yaml''."""
    folder = tmp_path / "spec"
    folder.mkdir()
    (folder / "wire.yaml").write_bytes((PKG.parent / "spec" / "wire.yaml").read_bytes())
    out = tmp_path / "out.md"
    for args, line in (
            (["docs", "--out", str(out)],
             f"flodl-proto docs: error: FLODL_PROTO_SPEC_DIR={folder}: cannot load "
             f"{folder / 'lifecycle.yaml'}: No such file or directory"),
            (["conform", "controller", "--list"],
             f"flodl-proto conform controller: error: FLODL_PROTO_SPEC_DIR={folder}: catalogue: "
             f"cannot load {folder / 'conformance.yaml'}: No such file or directory"),
            (["conform", "docs", "--out", str(out)],
             f"flodl-proto conform docs: error: FLODL_PROTO_SPEC_DIR={folder}: catalogue: "
             f"cannot load {folder / 'conformance.yaml'}: No such file or directory")):
        res = _cli_with_spec_dir(folder, *args)
        assert (res.returncode, res.stdout, res.stderr) == (2, "", line + "\n"), args
    assert not out.exists()
    # a catalogue that is not UTF-8 was a UnicodeDecodeError traceback
    shutil.rmtree(folder)
    shutil.copytree(PKG.parent / "spec", folder)
    catalogue = folder / "conformance.yaml"
    size = catalogue.stat().st_size
    catalogue.write_bytes(catalogue.read_bytes() + b"\xff")
    res = _cli_with_spec_dir(folder, "conform", "controller", "--list")
    assert (res.returncode, res.stdout, res.stderr) == (2, "", (
        f"flodl-proto conform controller: error: FLODL_PROTO_SPEC_DIR={folder}: catalogue: "
        f"cannot load {catalogue}: not UTF-8 (byte 0xff at offset {size})\n"))


def test_a_spec_folder_from_the_environment_that_fails_to_load_is_one_line(
        tmp_path: Path) -> None:
    """A spec folder named by ``$FLODL_PROTO_SPEC_DIR`` whose spec is refused made every command
    (``--help`` included) a ``SpecError`` traceback, exit 1; now one line naming the variable,
    its folder and what is wrong there, exit 2 (an environment value the command refuses, as a
    bad ``FLODL_NET_TIMEOUT_SCALE``)."""
    folder = tmp_path / "spec"
    shutil.copytree(PKG.parent / "spec", folder)
    wire = folder / "wire.yaml"
    wire.write_text(wire.read_text(encoding="utf-8").replace(
        "    value: 65536\n", "    value: lots\n", 1), encoding="utf-8")
    for args, prog in ((["--help"], "flodl-proto"),
                       (["decode", "--hex", "-"], "flodl-proto decode")):
        done = _cli_with_spec_dir(folder, *args)
        assert (done.returncode, done.stdout) == (2, "")
        assert done.stderr == (
            f"{prog}: error: FLODL_PROTO_SPEC_DIR={folder}: wire.yaml: "
            "constants.MAX_ROUND_FRAME_TENSORS.value is the string 'lots', not an integer\n")


@pytest.mark.parametrize("name", ["HANDSHAKE_LEN", "READ_CHUNK"])
def test_a_spec_folder_from_the_environment_without_a_constant_the_package_reads_is_one_line(
        name: str, tmp_path: Path) -> None:
    """A ``$FLODL_PROTO_SPEC_DIR`` spec without a constant the package reads (a struct's length,
    a read step) loads, and every command (``--help`` included) then ended with a ``KeyError``
    traceback, exit 1, as the package read its constants; now one line naming the variable and
    the constant, exit 2, as any other refused spec of the variable."""
    folder = tmp_path / "spec"
    shutil.copytree(PKG.parent / "spec", folder)
    wire = folder / "wire.yaml"
    doc = yaml.safe_load(wire.read_text(encoding="utf-8"))
    del doc["constants"][name]
    wire.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    for args, prog in ((["--help"], "flodl-proto"),
                       (["decode", "--hex", "-"], "flodl-proto decode")):
        done = _cli_with_spec_dir(folder, *args)
        assert (done.returncode, done.stdout, done.stderr) == (2, "", (
            f"{prog}: error: FLODL_PROTO_SPEC_DIR={folder}: wire.yaml: missing constant "
            f"{name!r} (the package reads it)\n")), args


def test_an_edited_checkout_spec_without_a_constant_the_package_reads_is_named_by_its_folder(
        tmp_path: Path) -> None:
    """The checkout's own spec without a constant the package reads is named by its folder, as
    any other load error of it is, exit 1."""
    root = _checkout_copy(tmp_path)
    wire = root / "spec" / "wire.yaml"
    doc = yaml.safe_load(wire.read_text(encoding="utf-8"))
    del doc["constants"]["READ_CHUNK"]
    wire.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "FLODL_PROTO_SPEC_DIR"}
    done = subprocess.run([sys.executable, "-m", "flodl_proto", "--help"], env=env, cwd=root,
                          capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (1, "", (
        f"flodl-proto: error: spec folder {root / 'spec'}: wire.yaml: missing constant "
        "'READ_CHUNK' (the package reads it)\n"))


def test_a_spec_folder_from_the_environment_without_a_spec_is_refused(tmp_path: Path) -> None:
    """``$FLODL_PROTO_SPEC_DIR`` naming a folder with no ``wire.yaml`` (a typo) was passed over
    without a word for the package's own spec, so an edited spec was never the one in use."""
    done = _cli_with_spec_dir(tmp_path / "nowhere", "--help")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"flodl-proto: error: FLODL_PROTO_SPEC_DIR={tmp_path / 'nowhere'}: "
                           f"no wire.yaml in that folder ({tmp_path / 'nowhere' / 'wire.yaml'}: "
                           "No such file or directory)\n")


@pytest.mark.parametrize(("make", "kind"), [
    (lambda p: p.write_text("x"), "a file"),
    (lambda p: p.symlink_to("/dev/null"), "a character device"),
    (lambda p: os.mkfifo(p), "a FIFO")], ids=["file", "device", "fifo"])
def test_a_spec_folder_from_the_environment_that_is_no_folder_is_said_so(
        tmp_path: Path, make: Any, kind: str) -> None:
    """``$FLODL_PROTO_SPEC_DIR`` naming a file read 'no wire.yaml in that folder (F/wire.yaml:
    Not a directory)', of a folder there is not."""
    make(tmp_path / "spec")
    done = _cli_with_spec_dir(tmp_path / "spec", "docs", "--out", "-")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"flodl-proto docs: error: FLODL_PROTO_SPEC_DIR={tmp_path / 'spec'}: "
                           f"{kind}, not a folder (give the folder that holds wire.yaml)\n")


@pytest.mark.parametrize(("make", "kind"), [
    (lambda p: p.write_text("x"), "a file"),
    (lambda p: p.symlink_to("/dev/null"), "a character device"),
    (lambda p: os.mkfifo(p), "a FIFO")], ids=["file", "device", "fifo"])
def test_find_spec_dir_says_a_spec_folder_that_is_no_folder_is_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: Any, kind: str) -> None:
    """find_spec_dir said 'no wire.yaml in that folder (F/wire.yaml: Not a directory)' of a
    file, which only the command line reworded: the loader says what it is itself."""
    make(tmp_path / "spec")
    monkeypatch.setenv("FLODL_PROTO_SPEC_DIR", str(tmp_path / "spec"))
    with pytest.raises(spec.SpecError) as info:
        spec.find_spec_dir()
    assert str(info.value) == (f"FLODL_PROTO_SPEC_DIR={tmp_path / 'spec'}: {kind}, not a folder "
                               "(give the folder that holds wire.yaml)")
    monkeypatch.setenv("FLODL_PROTO_SPEC_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(spec.SpecError) as info:
        spec.find_spec_dir()
    assert str(info.value) == (f"FLODL_PROTO_SPEC_DIR={tmp_path / 'nowhere'}: no wire.yaml in "
                               f"that folder ({tmp_path / 'nowhere' / 'wire.yaml'}: No such file "
                               "or directory)")


def test_a_lifecycle_event_the_package_does_not_know_is_named(tmp_path: Path) -> None:
    """A lifecycle.yaml with an event the package's code has no member for was refused as
    ``controller events [...] != LifecycleEvent``, naming neither the package's events nor the
    one that differs."""
    folder = tmp_path / "spec"
    shutil.copytree(PKG.parent / "spec", folder)
    lifecycle = folder / "lifecycle.yaml"
    lifecycle.write_text(lifecycle.read_text(encoding="utf-8").replace(
        "          relay_eof:\n            - target: shutdown\n",
        "          relay_eof:\n            - target: shutdown\n          pause:\n"
        "            - target: accepting\n", 1).replace(
        "      stop: the controller was told to stop (clean end)\n",
        "      stop: the controller was told to stop (clean end)\n      pause: a pause\n", 1),
        encoding="utf-8")
    done = _cli_with_spec_dir(folder, "controller", "--world-size", "1", "--listen",
                              "127.0.0.1:0", "--salt", "00" * 16)
    known = ["all_covered", "all_dead", "fail", "hello_accepted", "rank_exit", "relay_eof",
             "round_scattered", "start", "stop"]
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"flodl-proto controller: error: FLODL_PROTO_SPEC_DIR={folder}: lifecycle.yaml: "
        f"controller events {sorted([*known, 'pause'])} != LifecycleEvent {known} (not in the "
        "package: ['pause']; missing: [])\n")


def _checkout_copy(tmp_path: Path) -> Path:
    """A copy of this checkout's package and spec/ in ``tmp_path/co``, which ``python -m
    flodl_proto`` run there imports (its folder is first on ``sys.path``)."""
    root = tmp_path / "co"
    shutil.copytree(PKG, root / "flodl_proto", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(PKG.parent / "spec", root / "spec")
    return root


#: (file, text in it, its replacement, the load error): a broken wire.yaml (which every
#: command loads) and lifecycle.yaml (which ``docs`` reads itself)
BROKEN_SPEC_FILES: list[tuple[str, str, str, str]] = [
    ("wire.yaml", "    value: 65536\n", "    value: lots\n",
     "wire.yaml: constants.MAX_ROUND_FRAME_TENSORS.value is the string 'lots', not an integer"),
    ("lifecycle.yaml", "\nmachines:\n", "\nmachinez: {}\nmachines:\n",
     "lifecycle.yaml: unknown top-level key 'machinez' (known: machines, schema, x-docs-keys)"),
]


def _break(folder: Path, name: str, old: str, new: str) -> None:
    path = folder / name
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


@pytest.mark.parametrize(("name", "old", "new", "why"), BROKEN_SPEC_FILES,
                         ids=["wire", "lifecycle"])
def test_an_edited_checkout_spec_that_fails_to_load_is_named_by_its_folder(
        tmp_path: Path, name: str, old: str, new: str, why: str) -> None:
    """The README's first way to try an edited spec is to edit spec/ of an editable checkout;
    one with a mistake ended every command with 'wire.yaml: ...' and no word of which spec
    folder was loaded (a user with an installed package and a checkout could not tell which
    one was read). The line names the folder, as ``FLODL_PROTO_SPEC_DIR=F: ...`` does. The
    package's own spec that fails to load is a runtime failure, exit 1, whichever file fails:
    ``docs`` ended with exit 2 on its lifecycle.yaml (which it reads itself) and 1 on its
    wire.yaml."""
    root = _checkout_copy(tmp_path)
    _break(root / "spec", name, old, new)
    env = {k: v for k, v in os.environ.items() if k != "FLODL_PROTO_SPEC_DIR"}
    for args, prog in ((["docs", "--out", "-"], "flodl-proto docs"),
                       (["docs", "--out", "-", "--check"], "flodl-proto docs"),
                       (["controller", "--listen", "127.0.0.1:0", "--world-size", "1",
                         "--salt", "00" * 16], "flodl-proto controller")):
        done = subprocess.run([sys.executable, "-m", "flodl_proto", *args], env=env, cwd=root,
                              capture_output=True, text=True, timeout=60, check=False)
        assert (done.returncode, done.stdout) == (1, ""), args
        assert done.stderr == f"{prog}: error: spec folder {root / 'spec'}: {why}\n"


@pytest.mark.parametrize("way", ["checkout", "option", "variable"])
@pytest.mark.parametrize(("name", "old", "new", "why"), BROKEN_SPEC_FILES,
                         ids=["wire", "lifecycle"])
def test_docs_of_a_spec_that_fails_to_load_ends_alike_for_both_files(
        tmp_path: Path, name: str, old: str, new: str, why: str, way: str) -> None:
    """``docs`` ends on a spec that fails to load with the same exit code whichever of its two
    files fails: 1 for a source checkout's spec it documents unasked (the checkout it runs in,
    the package imported from elsewhere: it was 2, as for a spec the user named), as for the
    package's own; 2 for a spec the user named (``--spec DIR``, ``FLODL_PROTO_SPEC_DIR``: a
    bad command line, as the README's exit codes say)."""
    checkout = tmp_path / "co"
    folder = checkout / "spec"
    shutil.copytree(PKG.parent / "spec", folder)
    _break(folder, name, old, new)
    env = {k: v for k, v in os.environ.items() if k != "FLODL_PROTO_SPEC_DIR"}
    args = ["docs", "--out", "-"]
    if way == "option":
        args += ["--spec", str(folder)]
        code, line = 2, f"argument --spec: {folder}: {why}"
    elif way == "variable":
        env["FLODL_PROTO_SPEC_DIR"] = str(folder)
        code, line = 2, f"FLODL_PROTO_SPEC_DIR={folder}: {why}"
    else:
        code, line = 1, f"spec folder {folder}: {why}"
    # the package is this checkout's, imported from it (not from the copy's folder)
    env["PYTHONPATH"] = str(PKG.parent)
    done = subprocess.run([sys.executable, "-m", "flodl_proto", *args], env=env,
                          cwd=checkout if way == "checkout" else tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (
        code, "", f"flodl-proto docs: error: {line}\n")


@pytest.mark.parametrize(("path", "what"), [
    (("enums", "RoundKind", "values", "MODEL"), "member 'MODEL' of enum 'RoundKind'"),
    (("enums", "Dtype", "values", "BF16"), "member 'BF16' of enum 'Dtype'"),
    (("enums", "ControlVariant", "values", "DeclareDead"),
     "member 'DeclareDead' of enum 'ControlVariant'"),
    (("enums", "RecordKind", "values", "BROADCAST"), "member 'BROADCAST' of enum 'RecordKind'"),
    (("enums", "Channel", "values", "data"), "member 'data' of enum 'Channel'"),
    (("timeouts", "ENV_NET_TIMEOUT_SCALE"), "timeout 'ENV_NET_TIMEOUT_SCALE'"),
    (("timeouts", "WRITE_STALL"), "timeout 'WRITE_STALL'"),
], ids=["kind", "dtype", "variant", "record", "channel", "env-timeout", "run-timeout"])
def test_a_spec_folder_from_the_environment_without_an_enum_member_or_timeout_is_one_line(
        path: tuple[str, ...], what: str, tmp_path: Path) -> None:
    """A ``$FLODL_PROTO_SPEC_DIR`` spec without an enum member or a timeout the package reads
    ended every command in a ``KeyError`` traceback as the package was imported (a timeout read
    only by a run's runners, such as ``WRITE_STALL``, would have ended that run in one); now
    one line naming the variable and what is missing, exit 2."""
    folder = tmp_path / "spec"
    shutil.copytree(PKG.parent / "spec", folder)
    wire = folder / "wire.yaml"
    doc = yaml.safe_load(wire.read_text(encoding="utf-8"))
    node = doc
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    wire.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    done = _cli_with_spec_dir(folder, "--help")
    assert (done.returncode, done.stdout, done.stderr) == (2, "", (
        f"flodl-proto: error: FLODL_PROTO_SPEC_DIR={folder}: wire.yaml: missing {what} "
        "(the package reads it)\n"))


def test_the_timeouts_checked_at_import_are_those_the_package_reads() -> None:
    """:data:`~flodl_proto.spec.PACKAGE_TIMEOUTS` names every timeout the package's source reads
    by ``SPEC.timeout(...)``, no more: a timeout added to the code and not to the list would be
    missed by the import check and found only by the run that reads it."""
    from flodl_proto.spec import PACKAGE_TIMEOUTS
    read = set()
    for src in PKG.rglob("*.py"):
        read |= set(re.findall(r'SPEC\.timeout(?:_scaled)?\("([A-Z_]+)"\)',
                               src.read_text(encoding="utf-8")))
    assert sorted(PACKAGE_TIMEOUTS) == sorted(read)
