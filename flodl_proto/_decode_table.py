"""The human-readable table of :mod:`flodl_proto.decode` (``decode --format table``): a header,
one line per record, the end of the stream. The functions are exported by
:mod:`flodl_proto.decode`; no upstream counterpart (upstream has no decoder tool)."""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterator, Mapping
from decimal import ROUND_HALF_EVEN, Decimal
from fractions import Fraction
from typing import Any, Final, Protocol

from .errors import ProtocolError, protocol_error, shown, shown_type

__all__ = ["format_table", "table_end", "table_head", "table_line"]


class DecodeReport(Protocol):
    """What the table reads of a :class:`flodl_proto.decode.DecodeReport` (named so here, not
    imported: the decoder imports this module)."""

    @property
    def records(self) -> list[dict[str, Any]]:
        """The records kept, in stream order."""

    def final_record(self) -> dict[str, Any]:
        """The closing record: ``end``, ``capture_ended`` or ``error``."""


#: the spacing of an element format's values in the bits of the f32 that holds it: an f32 steps by
#: one, a bf16 (an f32's upper 16 bits) by 2**16
_ELEMENT_UNIT: Final[Mapping[str, int]] = {"f32": 1, "bf16": 1 << 16}
_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")


def _num(x: Any, element: str | None = None) -> str:
    """``x`` as the table writes a number: a float as Python's repr writes it (the fewest
    significant digits that read back as the same f64, written out for a decimal exponent from
    -4 to 15, ``1000000000000000.0``, and as ``1e+16``, ``9.99e-05`` outside), or, with
    ``element`` (``f32``, ``bf16``), in the fewest digits that read back as the same value of
    that format (0.1 for the bf16 0.10009765625), laid out so; a whole number below 1e16 as one
    with ``.0`` (``-0.0`` for -0.0), a NaN as ``NaN`` and an infinity as ``inf``/``-inf``, the
    forms the dissector writes; anything else (an int, the strings JSON gives a NaN or an
    infinity) as ``str`` gives it."""
    if not isinstance(x, float):
        return str(x)
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == int(x) and abs(x) < 1e16:
        return f"{x:.1f}"
    unit = _ELEMENT_UNIT.get(element or "")
    if unit is None or not _is_element(abs(x), unit):
        return repr(x)  # an f64, or not a value of the format (a report built by hand)
    exact = Decimal(abs(x))
    reads_back = _element_reader(abs(x), unit)
    for p in range(1, 10):
        step = Decimal(1).scaleb(exact.adjusted() - p + 1)
        near = exact.quantize(step, ROUND_HALF_EVEN)  # the nearest of p digits, as %.{p-1}e
        if reads_back(str(near)):
            return _repr_layout(near, x < 0)
        if near < exact and reads_back(str(near + step)):  # at a power of two, the one above
            return _repr_layout(near + step, x < 0)
    return repr(x)  # not reached: 9 digits read back as any f32


def _repr_layout(d: Decimal, negative: bool) -> str:
    """The digits of ``d`` laid out as Python's repr lays out a float's: written out for a
    decimal exponent from -4 to 15 (``0.0001``, ``1000000000000000.0``), in exponent form
    outside it (``9.99e-05``, ``1e+16``)."""
    digits = "".join(map(str, d.as_tuple().digits)).rstrip("0") or "0"
    e = d.adjusted()
    if -4 <= e < 16:
        if e >= len(digits) - 1:
            text = digits + "0" * (e - len(digits) + 1) + ".0"
        elif e >= 0:
            text = digits[:e + 1] + "." + digits[e + 1:]
        else:
            text = "0." + "0" * (-e - 1) + digits
    else:
        text = digits[0] + ("." + digits[1:] if len(digits) > 1 else "") + f"e{e:+03d}"
    return ("-" if negative else "") + text


def _is_element(a: float, unit: int) -> bool:
    """Whether ``a`` (positive, finite) is a value of the element format whose values are
    ``unit`` apart in f32 bits."""
    if a > 3.4028234663852886e38:
        return False
    f: float = _F32.unpack(_F32.pack(a))[0]
    n: int = _U32.unpack(_F32.pack(a))[0]
    return f == a and n % unit == 0


def _element_reader(a: float, unit: int) -> Callable[[str], bool]:
    """Whether a decimal (a string, positive) reads back as ``a`` (a positive, finite value of
    the element format whose values are ``unit`` apart in f32 bits), rounded to nearest, ties to
    the value whose last bit is 0: it lies strictly between the midpoints to ``a``'s neighbours,
    or on one when ``a``'s last bit is 0. The midpoints are exact f64 values; a decimal whose
    f64 falls on one is compared exactly."""
    n = _U32.unpack(_F32.pack(a))[0]
    lo = _F32.unpack(_U32.pack(n - unit))[0]
    hi = _F32.unpack(_U32.pack(n + unit))[0] if n + unit < 0x7F800000 else a + (a - lo)
    lo_mid, hi_mid, even = (a + lo) / 2, (a + hi) / 2, (n // unit) % 2 == 0

    def reads_back(s: str) -> bool:
        v = float(s)
        if lo_mid < v < hi_mid:
            return True
        if v not in (lo_mid, hi_mid):
            return False
        q = Fraction(s)
        # on a midpoint: reached by four f32 from 1.5e16 up (15728640536870912, whose fewest
        # digits 1.572864e+16 are its midpoint to the value below), never by a bf16
        return (lo_mid < q < hi_mid) or (even and q in (lo_mid, hi_mid))

    return reads_back


def _tensor_summary(t: Mapping[str, Any], where: str) -> str:
    s = f"{t['dtype']}{t['shape']} {t['nbytes']}B"
    if t.get("elided"):
        s += " elided"
    element = t["dtype"]
    if "min" in t:
        s += (f" min={_num(t['min'], element)} max={_num(t['max'], element)}"
              f" mean={_num(t['mean'])}")
    if "values" in t:
        s += " values=[" + ", ".join(_num(v, element)
                                     for v in _part(t, "values", where)) + "]"
    elif "data" in t:
        s += f" data={t['data']}"
    if "note" in t:
        s += f" ({t['note']})"
    return s


def _tag(status: str) -> str:
    return {"ok": "ok", "bad": "BAD"}.get(status, "-")


#: what a record's typed parts must be (the key as it appears in a record, at any depth): its
#: accepted types and how a message names them; other parts are printed as they are
_PARTS: Final[Mapping[str, tuple[type | tuple[type, ...], str]]] = {
    "offset": (int, "a byte offset (an int)"),
    "length": (int, "a byte count (an int)"),
    "kind": (str, "a record kind's name (a str)"),
    "tag_status": (str, "a tag status (a str: 'ok', 'bad' or 'unchecked')"),
    "control": (Mapping, "a mapping of the control message's fields"),
    "frame": (Mapping, "a mapping of the frame's fields"),
    "tensors": ((list, tuple), "a list of the frame's tensors (mappings)"),
    "tensor": (Mapping, "a mapping of the tensor's fields"),
    "values": ((list, tuple), "a list of the tensor's values"),
    "type": (str, "a record type's name (a str)"),
    "error": (str, "an error message (a str)"),
    "bad_tags": (int, "a count of bad tags (an int)"),
}


def _part(parent: Mapping[str, Any], key: str, where: str) -> Any:
    """``parent[key]`` (a part of record ``rec``, at the path ``where``), refused unless it has
    the type :data:`_PARTS` gives for ``key``.

    Raises:
        KeyError: no ``key`` (the caller names the record and the key).
        InvalidValue (local, ``capture.bad_type``): a value of another type, naming its path
            (``rec['frame']['tensors']``), its type and the value."""
    return _typed(parent[key], key, f"{where}[{key!r}]")


def _typed(value: Any, part: str, field: str) -> Any:
    """``value``, the part ``field`` of a record, when it has the type :data:`_PARTS` gives for
    ``part`` (an int is no bool); else the local ``capture.bad_type`` naming ``field``."""
    kinds, expected = _PARTS[part]
    if not isinstance(value, kinds) or (kinds is int and isinstance(value, bool)):
        raise protocol_error("capture.bad_type", field=field, expected=expected,
                             got=shown_type(value),
                             hint="" if value is None else f" ({shown(value)})")
    return value


def _details(rec: Mapping[str, Any]) -> tuple[str, str, str]:
    t = rec["type"]
    if t == "channel_magic":
        return "channel_magic", "-", f"{rec['channel']} ({rec['magic']})"
    if t == "handshake":
        return "handshake", "-", (f"rank={rec['rank']} world_size={rec['world_size']} "
                                  f"version={rec['version']}")
    if t == "handshake_ack":
        return "handshake_ack", "-", f"version={rec['version']}"
    if t == "mux_record":
        name = _part(rec, "kind", "rec")
        tag = _tag(_part(rec, "tag_status", "rec"))
        if "control" in rec:
            c = _part(rec, "control", "rec")
            name = f"control {c['variant']}"
            fields = " ".join(f"{k}={v}" for k, v in c.items()
                              if k not in ("variant", "variant_index"))
            if rec.get("trailing_bytes"):
                fields += f"; +{rec['trailing_bytes']} trailing bytes"
            if "note" in rec:
                fields += f" ({rec['note']})"
            return name, tag, fields
        if "frame" in rec:
            frame = _part(rec, "frame", "rec")
            frame_tag = _tag(_part(frame, "tag_status", "rec['frame']"))
            return name, f"{tag}/{frame_tag}", _frame_summary(frame)
        return name, tag, f"rank={rec['rank']} payload={rec.get('payload', '')}"
    if t in ("len_framed", "round_frame"):
        frame = _part(rec, "frame", "rec")
        return t, _tag(_part(frame, "tag_status", "rec['frame']")), _frame_summary(frame)
    return t, "-", ""


def _frame_summary(f: Mapping[str, Any]) -> str:
    parts = [f"{f['kind']} weight={_num(f['weight'])} tensors={f['num_tensors']}"]
    where = "rec['frame']['tensors']"
    parts += [_tensor_summary(_typed(t, "tensor", f"{where}[{i}]"), f"{where}[{i}]")
              for i, t in enumerate(_part(f, "tensors", "rec['frame']"))]
    if f.get("trailing_bytes"):
        parts.append(f"+{f['trailing_bytes']} trailing bytes")
    return "; ".join(parts)


def _check_report(report: object) -> None:
    """Refuse a ``report`` that is no :class:`DecodeReport` (text, None, its list of records) as
    a local error naming the argument and its type; a report whose ``records`` is no list as
    one naming ``report.records``."""
    records = getattr(report, "records", None)
    if not isinstance(records, list) or not callable(getattr(report, "final_record", None)):
        if hasattr(report, "records") and callable(getattr(report, "final_record", None)):
            raise protocol_error("capture.bad_type", field="report.records",
                                 expected="a list of records (decode_stream's)",
                                 got=shown_type(records), hint="")
        raise protocol_error("capture.bad_type", field="report",
                             expected="a DecodeReport (what decode_stream returns)",
                             got=shown_type(report), hint="")


_RECORD = "a record decode_stream made (a dict with its type, offset, length and fields)"


def _bad_record(rec: object, missing: object = None) -> ProtocolError:
    """The local error for a ``rec`` that is no record of :func:`decode_stream`: no mapping, or
    one without the key ``missing``."""
    hint = "" if missing is None else f" without {missing!r}"
    return protocol_error("capture.bad_type", field="rec", expected=_RECORD,
                          got=shown_type(rec), hint=hint)


def format_table(report: DecodeReport, stream: str | None = None) -> Iterator[str]:
    """The report as human-readable table lines (header, one line per record, the end), yielded
    as they are formatted; ``report`` is checked when this is called, before the first line.

    Args:
        report: a :class:`DecodeReport`.
        stream: a label printed before the table (e.g. a TCP stream of a capture).

    Raises:
        InvalidValue (local, ``capture.bad_type``): ``report`` is no :class:`DecodeReport`
            (text, None, a list of records), naming ``report`` and its type, or one whose
            ``records`` is no list (naming ``report.records`` and its type).

    No upstream counterpart: upstream has no decoder tool.
    """
    _check_report(report)
    return _table_lines(report, stream)


def _table_lines(report: DecodeReport, stream: str | None) -> Iterator[str]:
    yield from table_head(stream)
    for rec in report.records:
        yield table_line(rec)
    yield table_end(report)


def table_head(stream: str | None = None) -> list[str]:
    """The first lines of :func:`format_table` (the stream's label, when given, and the column
    names). Raises nothing. No upstream counterpart: upstream has no decoder tool."""
    label = [f"== {stream}"] if stream is not None else []
    return [*label, f"{'offset':>8}  {'length':>8}  {'record':<20} {'tag':<9} details"]


def table_line(rec: Mapping[str, Any]) -> str:
    """The :func:`format_table` line of one record (for records handed on as they are decoded:
    :func:`decode_stream`'s ``on_record``): offset and length in bytes, record name, tag
    status, details.

    Raises:
        InvalidValue (local, ``capture.bad_type``): ``rec`` is not a record
            :func:`decode_stream` made: no mapping (naming ``rec`` and its type), one that
            lacks a key its type has (naming the key), or one whose part has another type than
            such a record's (naming the part's path, ``rec['frame']['tensors'][0]``, its type
            and its value: an offset that is no int, a frame that is no mapping...).

    No upstream counterpart: upstream has no decoder tool.
    """
    if not isinstance(rec, Mapping):
        raise _bad_record(rec)
    try:
        name, tag, details = _details(rec)
        offset, length = _part(rec, "offset", "rec"), _part(rec, "length", "rec")
        return f"{offset:>8}  {length:>8}  {name:<20} {tag:<9} {details}"
    except KeyError as e:
        raise _bad_record(rec, e.args[0] if e.args else None) from None


def table_end(report: DecodeReport) -> str:
    """The last line of :func:`format_table`: the clean end, the capture's end or the error,
    with its byte offset.

    Raises:
        InvalidValue (local, ``capture.bad_type``): ``report`` is no :class:`DecodeReport`, as
            :func:`format_table`, or its ``final_record()`` is no closing record: no mapping
            (naming ``report.final_record()`` and its type), one that lacks a key its type has
            (naming the key), or one whose ``type``, ``offset``, ``error`` or ``bad_tags`` has
            another type than such a record's (naming the part's path, its type and its
            value); a ``report.failure`` that is neither None nor a :class:`DecodeFailure`
            (naming ``report.failure`` and its type).

    No upstream counterpart: upstream has no decoder tool."""
    _check_report(report)
    try:
        fin = report.final_record()
    except AttributeError:  # its failure is no DecodeFailure (text, a number)
        raise protocol_error("capture.bad_type", field="report.failure",
                             expected="None or a DecodeFailure (decode_stream's)",
                             got=shown_type(getattr(report, "failure", None)), hint="") from None
    if not isinstance(fin, Mapping):
        raise _bad_final(fin)
    try:
        kind, offset = _part(fin, "type", _FIN), _part(fin, "offset", _FIN)
        if kind == "error":
            return f"{offset:>8}  {'':>8}  {'ERROR':<20} {'':<9} {_part(fin, 'error', _FIN)}"
        if kind == "capture_ended":
            return (f"{offset:>8}  {'':>8}  {'CAPTURE ENDED':<20} {'':<9} "
                    f"{_part(fin, 'error', _FIN)}")
        tags = f"; {_part(fin, 'bad_tags', _FIN)} bad tags" if "bad_tags" in fin else ""
    except KeyError as e:
        raise _bad_final(fin, e.args[0] if e.args else None) from None
    return f"{offset:>8}  {'':>8}  {'END':<20} {'':<9} clean end of stream{tags}"


#: how a message names the report's closing record
_FIN = "report.final_record()"


def _bad_final(fin: object, missing: object = None) -> ProtocolError:
    """The local error for a report whose closing record ``fin`` is no mapping, or one without
    the key ``missing``."""
    hint = "" if missing is None else f" without {missing!r}"
    return protocol_error("capture.bad_type", field=_FIN,
                          expected="a closing record (a dict with its type, offset and fields)",
                          got=shown_type(fin), hint=hint)
