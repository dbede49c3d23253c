"""The numbers the Wireshark dissector writes: a RoundFrame's weight (its tree item, the Info
column, the expert info of a weight the reader refuses) and a tensor's first values, each in the
shortest decimal form that reads back as the value in its own format (f64, f32, bf16), checked
against an exact reference for every bf16 bit pattern, every power of two of an f32 and its
neighbours, and random f32 and f64 bit patterns (``tshark`` marker). The f64 reference is
checked against Python's repr; the f32 and bf16 one takes its digits from NumPy (and ml_dtypes'
rounding for bf16) and lays them out with NumPy's formatters, apart from the package's layout
code, so that a fault there is not in the reference too."""

from __future__ import annotations

import decimal
import math
import struct
import subprocess
from fractions import Fraction
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from flodl_proto.codec import (
    Dtype,
    Hello,
    MuxRecord,
    RecordKind,
    RoundFrame,
    RoundKind,
    TensorPayload,
    decode_round_frame,
    encode_channel_magic,
    encode_frame_record,
    encode_mux_record_bytes,
    encode_round_frame_bytes,
)
from flodl_proto.dissector import PROTO_NAME, render_dissector
from flodl_proto.errors import RemoteProtocolError

from .pcap_writer import Capture

SALT = bytes(16)
PORT = 23456
PER_TENSOR = 8  # the values the tree shows of a tensor (the spec's preview_values)
PER_FRAME = 1000  # the tensors the tree lists of a frame


def _round(q: Fraction) -> Fraction:
    """``q`` rounded to an f64's 53 significant bits, ties to even, with its subnormal step
    (smallest normal exponent -1022)."""
    if q == 0:
        return q
    a = abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()  # 2^e <= a < 2^(e+1)
    if Fraction(2) ** e > a:
        e -= 1
    e = max(e, -1022)
    step = Fraction(2) ** (e - 53 + 1)
    return round(a / step) * step * (1 if q > 0 else -1)  # round(): ties to even


def shortest(x: float) -> str:
    """The reference for an f64 (a weight): ``x`` as Python's repr writes a float: a whole
    number below 1e16 as one, with ``.0``; else its fewest significant digits that round back
    to it exactly (of the two decimals of that many digits on either side of it, the nearer one
    that does, the one of even last digit at equal distances: at a power of two the lower
    neighbour is nearer, and the decimal above may read back where the nearest below does
    not), written out for a decimal exponent from -4 to 15 (``0.0001``,
    ``0.30000000000000004``) and as ``d.ddde+XX`` outside (``9.99e-05``, ``1e+16``). Checked
    against repr itself; the elements' reference, :func:`element_text`, shares none of this
    code."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == int(x) and abs(x) < 1e16:
        return f"{x:.1f}"
    a = Fraction(abs(x))
    exact = decimal.Decimal(abs(x))
    with decimal.localcontext() as ctx:
        ctx.prec = 2000
        for p in range(1, 18):
            step = decimal.Decimal(1).scaleb(exact.adjusted() - p + 1)
            near = [d for d in (exact.quantize(step, decimal.ROUND_FLOOR),
                                exact.quantize(step, decimal.ROUND_CEILING))
                    if _round(Fraction(d)) == a]
            if near:
                # the nearer; at equal distances the even last digit, as printf rounds
                d = min(near, key=lambda d: (abs(Fraction(d) - a), d.as_tuple().digits[-1] % 2))
                break
        else:
            raise AssertionError(x)
    digits = "".join(map(str, d.as_tuple().digits)).rstrip("0")
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
    return ("-" if x < 0 else "") + text


def _digits(scientific: str) -> tuple[str, int]:
    """NumPy's ``d.ddde+XX`` (no sign) as its significant digits and its decimal exponent."""
    mantissa, exponent = scientific.split("e")
    return mantissa.replace(".", "").rstrip("0") or "0", int(exponent)


def _bf16_shortest(a: float) -> float:
    """The fewest significant digits that read back as the bf16 ``a`` (positive, finite) through
    ml_dtypes' rounding, as an f64: of ``p`` digits, NumPy's nearest (``precision=p - 1``), or
    else the nearer of the two beside it that reads back (at a power of two the decimal above
    may, where the nearest below does not), the even last digit at equal distances. The f64 of
    a decimal of at most 9 digits writes back as those digits."""
    want = ml_dtypes.bfloat16(a)
    for p in range(1, 10):
        digits, e = _digits(np.format_float_scientific(a, precision=p - 1, unique=False,
                                                       trim="k"))
        nearest = int(digits.ljust(p, "0"))
        scale = Fraction(10) ** (e - p + 1)
        back = [n for n in (nearest, nearest - 1, nearest + 1)
                if n > 0 and ml_dtypes.bfloat16(float(n * scale)) == want]
        if nearest in back:
            return float(nearest * scale)
        if back:
            n = min(back, key=lambda n: (abs(n * scale - Fraction(a)), n % 2))
            return float(n * scale)
    raise AssertionError(a)


def element_text(x: float, dtype: str) -> str:
    """The reference for an f32 or bf16 element, built apart from the package's layout code
    (``_decode_table._repr_layout`` and the dissector's ``repr_layout``): a whole number below
    1e16 as one with ``.0``; else the fewest digits that read back as the value (an f32's from
    NumPy's shortest form, ``unique=True``; a bf16's from :func:`_bf16_shortest`), laid out by
    NumPy, positional (``format_float_positional``) for a decimal exponent from -4 to 15 and
    scientific (``format_float_scientific``) outside, where Python's repr changes form."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == int(x) and abs(x) < 1e16:
        return f"{x:.1f}"
    value: np.floating = (np.float32(abs(x)) if dtype == "f32"
                          else np.float64(_bf16_shortest(abs(x))))
    _, e = _digits(np.format_float_scientific(value, unique=True, trim="-"))
    if e < -4 or e >= 16:
        text = np.format_float_scientific(value, unique=True, trim="-", exp_digits=2)
    else:
        text = np.format_float_positional(value, unique=True, trim="0")
    return ("-" if x < 0 else "") + text


def test_the_element_reference_lays_out_digits_as_repr_does() -> None:
    """The reference of an f32 or bf16 element writes its fewest digits out for a decimal
    exponent from -4 to 15 and in exponent form outside, as repr writes a float."""
    f32 = [float(np.float32(v)) for v in (1e-4, 9.99e-5, -0.42945603, 2.0 ** -96, 1.5e16,
                                          0.1, 123.456, 3.4028235e38, 1e-45)]
    assert [element_text(v, "f32") for v in f32] == [
        "0.0001", "9.99e-05", "-0.42945603", "1.2621775e-29", "1.5e+16", "0.1", "123.456",
        "3.4028235e+38", "1e-45"]
    bf16 = [float(np.float32(ml_dtypes.bfloat16(v))) for v in (0.1, 1 / 3, -1e-4, 9.9e-5,
                                                                 2.0 ** -119, 1.5e16, 1e16)]
    assert [element_text(v, "bf16") for v in bf16] == [
        "0.1", "0.334", "-0.0001", "9.9e-05", "1.51e-36", "1.5e+16", "9992361673228288.0"]
    assert [element_text(v, d) for v in (-0.0, float("nan"), float("-inf"))
            for d in ("f32", "bf16")] == ["-0.0", "-0.0", "NaN", "NaN", "-inf", "-inf"]


#: f64 values at the edges of repr's forms: whole numbers from 1e15 up to 1e16 (written out),
#: 1e16 and a 17-digit number above it (exponent form), 1e-4 and below it, -0.0, subnormals, a
#: power of two whose fewest digits are the decimal above it (7.120236347223045e-307)
REPR_EDGES = [1e15, 9.999e15, 1e16, 9007199254740994.0, 1.2345678901234568e16, -1e15, 1e-4,
              9.99e-5, -0.0, 0.0, 5e-324, 2.2250738585072009e-308, 1e-310, 2.0 ** -1017,
              2.0 ** -1022, 1e22, 0.1, 123456.789]


def test_the_reference_is_python_repr_for_an_f64() -> None:
    """The reference wrote a whole number from 1e15 up to 1e16 as 1e+15 (repr: 1000000000000000.0),
    a 17-digit number from 1e16 without its exponent (12345678901234568, repr:
    1.2345678901234568e+16) and 2**-1017 in 17 digits (repr's 16 read back): it is repr."""
    rng = np.random.default_rng(8)
    rand = rng.integers(0, 2 ** 63, 2000, dtype=np.uint64).view(np.float64)
    values = REPR_EDGES + [float(v) for v in rand[np.isfinite(rand)]] + [
        2.0 ** e for e in range(-1074, 1024)]
    wrong = [(v, shortest(v)) for v in values if shortest(v) != repr(v)]
    assert not wrong, wrong[:10]
    assert [shortest(v) for v in REPR_EDGES[:4]] == [
        "1000000000000000.0", "9999000000000000.0", "1e+16", "9007199254740994.0"]


def _capture(frames: list[RoundFrame], path: Path) -> Path:
    cap = Capture()
    mux = cap.connect(("10.0.0.2", 40001), ("10.0.0.1", PORT))
    hello = MuxRecord.control_msg(Hello("host-a", [0]), version=2)
    cap.send(mux, True, encode_channel_magic("data") + encode_mux_record_bytes(hello, SALT))
    for f in frames:
        cap.send(mux, True, b"".join(encode_frame_record(RecordKind.HOST_FRAME, f, SALT)))
    cap.close(mux)
    path.write_bytes(cap.pcap())
    return path


def _tshark(pcap: Path, lua: Path, *args: str) -> str:
    res = subprocess.run(["tshark", "-n", "-r", str(pcap), "-X", f"lua_script:{lua}", "-o",
                          f"{PROTO_NAME}.ports:{PORT}", *args],
                         capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0 and "Lua" not in res.stderr, res.stderr
    return res.stdout


@pytest.fixture(scope="module")
def lua(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("lua") / "flodl_proto.lua"
    path.write_text(render_dissector(), encoding="utf-8")
    return path


def _f32_bits() -> np.ndarray:
    """Every power of two of an f32 (subnormal ones included) with its two neighbours, the
    largest and smallest values, and 4000 random finite bit patterns of either sign."""
    powers = np.array([struct.unpack("<I", struct.pack("<f", 2.0 ** e))[0]
                       for e in range(-149, 128)], np.int64)
    edges = np.array([0x7F7FFFFF, 0x00000001, 0x00800000, 0x007FFFFF, 0x80000000], np.int64)
    rng = np.random.default_rng(44)
    rand = rng.integers(0, 0xFF000000, 4000, dtype=np.int64)
    rand = rand[(rand & 0x7F800000) != 0x7F800000]
    bits = np.concatenate([powers, powers + 1, powers - 1, edges, rand]) & 0xFFFFFFFF
    bits = np.concatenate([bits, bits | 0x80000000])
    bits = bits[(bits & 0x7F800000) != 0x7F800000]  # no NaN or infinity from powers + 1
    out: np.ndarray = bits.astype(np.uint32)
    return out


def _frames_of(dtype: int, payload: bytes, size: int) -> list[RoundFrame]:
    per = PER_TENSOR * size
    tensors = [TensorPayload(dtype, [PER_TENSOR], payload[i:i + per])
               for i in range(0, len(payload), per)]
    return [RoundFrame(RoundKind.MODEL, 1.0, tensors[i:i + PER_FRAME])
            for i in range(0, len(tensors), PER_FRAME)]


def _shown_values(pcap: Path, lua: Path) -> list[str]:
    out = _tshark(pcap, lua, "-Y", f'{PROTO_NAME}.kind == "HostFrame"', "-T", "fields",
                  "-E", "aggregator=|", "-e", f"{PROTO_NAME}.round_frame.values")
    vals: list[str] = []
    for line in out.splitlines():
        for text in line.split("|"):
            assert text.startswith("[") and text.endswith("]"), text
            vals += text[1:-1].split(", ")
    return vals


@pytest.mark.tshark
@pytest.mark.timeout(600)
def test_every_bf16_value_is_shown_in_its_shortest_form(lua: Path, tmp_path: Path) -> None:
    """A bf16 element was written to 6 significant digits (0.1 as 0.100098, 1/3 as 0.333984),
    as its f32 widening: now as the fewest digits that give the same bf16 back (0.1, 0.334),
    for all 65536 bit patterns (NaN as NaN, the infinities as inf and -inf)."""
    bits = np.arange(1 << 16, dtype=np.uint32)
    payload = bits.astype("<u2").tobytes()
    pcap = _capture(_frames_of(Dtype.BF16, payload, 2), tmp_path / "bf16.pcap")
    with np.errstate(invalid="ignore"):  # the signalling NaNs
        widened = (bits << 16).astype("<u4").view("<f4").astype(np.float64)
    want = [element_text(float(v), "bf16") for v in widened]
    got = _shown_values(pcap, lua)
    assert len(got) == len(want) == 65536
    wrong = [(hex(int(b)), g, w) for b, g, w in zip(bits, got, want, strict=True) if g != w]
    assert not wrong, (len(wrong), wrong[:10])
    assert got[0x3DCD] == "0.1" and got[0x3EAB] == "0.334" and got[0x8000] == "-0.0"


@pytest.mark.tshark
@pytest.mark.timeout(600)
def test_f32_values_are_shown_in_their_shortest_form(lua: Path, tmp_path: Path) -> None:
    """An f32 element was written to 6 significant digits (-0.42945603 as -0.429456, which
    reads back as another f32): now as the fewest digits that give the same f32 back, as numpy
    writes it, for every power of two and its neighbours and 8000 random values."""
    bits = _f32_bits()
    bits = bits[: len(bits) // PER_TENSOR * PER_TENSOR]
    payload = bits.astype("<u4").tobytes()
    pcap = _capture(_frames_of(Dtype.F32, payload, 4), tmp_path / "f32.pcap")
    values = bits.view("<f4").astype(np.float64)
    want = [element_text(float(v), "f32") for v in values]
    got = _shown_values(pcap, lua)
    assert len(got) == len(want) > 8000
    wrong = [(hex(int(b)), g, w) for b, g, w in zip(bits, got, want, strict=True) if g != w]
    assert not wrong, (len(wrong), wrong[:10])
    # the same digits as numpy's shortest form of the f32
    for v, g in zip(values[:40], got[:40], strict=True):
        assert float(g) == float(np.format_float_scientific(np.float32(v), unique=True))
    assert element_text(float(np.float32(-0.42945603)), "f32") == "-0.42945603"


WEIGHTS = [0.1 + 0.2, 1 / 3, 5e-324, 1.7976931348623157e308, 2.0 ** -1022, 1e21, 1.5, 2.5e-8,
           123456789.123, 4.0, 0.0, -0.0, 9007199254740993.0,
           *[w for w in REPR_EDGES if w >= 0.0]]


@pytest.mark.tshark
def test_the_weight_is_shown_exactly_in_the_tree_and_the_info_column(lua: Path,
                                                                     tmp_path: Path) -> None:
    """The weight was written to 6 significant digits in the Info column (w=0.3 for
    0.30000000000000004) and to Wireshark's 15 in the tree (Weight: 0.3): both now show the
    shortest form that reads back as the f64, as Python's repr does; the field's value was and
    is the f64 itself."""
    rng = np.random.default_rng(7)
    weights = WEIGHTS + [float(w) for w in rng.random(40) * 10.0 ** rng.integers(-12, 12, 40)]
    frames = [RoundFrame(RoundKind.MODEL, w, [TensorPayload.from_array(
        np.array([1.0], np.float32))]) for w in weights]
    pcap = _capture(frames, tmp_path / "weights.pcap")
    out = _tshark(pcap, lua, "-Y", f'{PROTO_NAME}.kind == "HostFrame"', "-T", "fields",
                  "-e", "_ws.col.Info")
    want = [shortest(w) for w in weights]
    assert want == [repr(w) for w in weights]  # Python's repr, as decode's JSON writes them
    assert out.splitlines() == [f"HostFrame relay→ctl ranks [0] Model w={w} 1 tensor 4 B"
                                for w in want]
    assert want[:3] == ["0.30000000000000004", "0.3333333333333333", "5e-324"]
    tree = _tshark(pcap, lua, "-Y", f'{PROTO_NAME}.kind == "HostFrame"', "-V")
    shown = [line.strip() for line in tree.splitlines() if line.strip().startswith("Weight: ")]
    assert shown == [f"Weight: {w}" for w in want]
    # the filter field holds the f64 itself
    hits = _tshark(pcap, lua, "-Y", f"{PROTO_NAME}.round_frame.weight == 0.30000000000000004",
                   "-T", "fields", "-e", "frame.number")
    assert len(hits.split()) == 1


@pytest.mark.parametrize(("weight", "text"), [(-1.0, "-1"), (-0.123456789, "-0.123456789"),
                                              (-1.5e-30, "-0." + "0" * 29 + "15"),
                                              (-2.5e16, "-25000000000000000"),
                                              (-1.5e-5, "-0.000015"), (float("nan"), "NaN"),
                                              (float("inf"), "inf")])
@pytest.mark.tshark
def test_a_refused_weight_is_named_as_the_reader_names_it(weight: float, text: str, lua: Path,
                                                         tmp_path: Path) -> None:
    """The expert info of a weight the reader refuses quoted it to 6 significant digits and a
    whole one with ".0" (-1.0, -0.123457), where the reader's error says -1 and -0.123456789:
    the two texts are now the same. Both write the weight as Rust's Display does, with no
    exponent (-25000000000000000, where Python writes -2.5e+16). (A weight of -1e-300 is 303
    characters so: Wireshark cuts an expert text at 240.)"""
    frame = RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload.from_array(
        np.array([1.0], np.float32))])
    wire = bytearray(encode_round_frame_bytes(frame, SALT))
    wire[9:17] = struct.pack("<d", weight)  # after the magic, the count and the kind byte
    with pytest.raises(RemoteProtocolError) as e:
        decode_round_frame(bytes(wire), SALT)
    assert f"frame weight {text} is not" in str(e.value)
    cap = Capture()
    mux = cap.connect(("10.0.0.2", 40001), ("10.0.0.1", PORT))
    cap.send(mux, True, struct.pack("<I", len(wire)) + bytes(wire))
    cap.close(mux)
    pcap = tmp_path / "bad.pcap"
    pcap.write_bytes(cap.pcap())
    out = _tshark(pcap, lua, "-T", "fields", "-e", "_ws.expert.message")
    assert str(e.value) in out.splitlines(), (str(e.value), out)
