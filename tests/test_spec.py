"""The spec is the single source of truth: structs match its tables, errors come from its
catalogue, and constants are not written anywhere else."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from construct import Array, Bytes, FormatField

from flodl_proto import errors, spec
from flodl_proto.codec import structs
from flodl_proto.codec._common import check_version

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


def test_net_timeout_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLODL_NET_TIMEOUT_SCALE", "0.01")
    assert spec.net_timeout_scale() == 0.1
    monkeypatch.setenv("FLODL_NET_TIMEOUT_SCALE", "nan")
    assert spec.net_timeout_scale() == 1.0
    monkeypatch.setenv("FLODL_NET_TIMEOUT_SCALE", "2.5")
    assert spec.net_timeout_scale() == 2.5


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
