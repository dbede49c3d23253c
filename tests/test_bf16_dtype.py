"""The bf16 dtype loaded on first use (flodl_proto/_bf16.py): a process that moves only f32
values (the demo's controller, relays and ranks by default) never imports ml_dtypes, whose
import registers its dtypes' casts with NumPy at a second of CPU per process, nor does one that
only encodes or widens bf16 bits (a bf16 demo's processes); bf16 values are still made, viewed and
recognised as before, also when the caller imported ml_dtypes itself."""

from __future__ import annotations

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from flodl_proto._bf16 import bf16, is_bf16, loaded_bf16
from flodl_proto.codec import Dtype
from flodl_proto.codec._frame_model import _NUMPY_DTYPE

#: run in a fresh interpreter: the f32 paths of the demo's processes, then a bf16 array the
#: caller made with its own ml_dtypes import
_F32_ONLY = """
import sys
import numpy as np
import flodl_proto.commands._demo_worker, flodl_proto.runner.controller, flodl_proto.runner.relay
from flodl_proto.codec import RoundFrame, RoundKind, TensorPayload, decode_round_frame
from flodl_proto.codec import encode_round_frame_bytes
from flodl_proto.reduce import reduce_realized_work, scale_payload, sum_frames

salt = bytes(16)
p = TensorPayload.from_array(np.array([1.0, 2.0, 3.0], np.float32))
frame = RoundFrame(RoundKind.MODEL, 2.0, (p,))
back, _ = decode_round_frame(encode_round_frame_bytes(frame, salt), salt)
total = reduce_realized_work([sum_frames([back, back])])
scaled = scale_payload(0, p.data, 0.5)
print(back.tensors[0].array().tolist(), total.tensors[0].array().tolist(), bytes(scaled).hex())
print("ml_dtypes" in sys.modules)
import ml_dtypes
q = TensorPayload.from_array(np.array([1.5, -2.0], ml_dtypes.bfloat16))
print(q.dtype, q.array().dtype, q.array().tolist())
"""


def test_f32_paths_import_no_ml_dtypes_and_a_callers_bf16_array_rides_as_bf16() -> None:
    res = subprocess.run([sys.executable, "-c", _F32_ONLY], capture_output=True, text=True,
                         timeout=120, check=True)
    assert res.stdout.splitlines() == [
        "[1.0, 2.0, 3.0] [0.5, 1.0, 1.5] 0000003f0000803f0000c03f",
        "False",
        "1 bfloat16 [1.5, -2.0]",
    ], res.stderr


def test_the_dtype_is_ml_dtypes_bfloat16_and_only_it_is_recognised() -> None:
    assert bf16() is bf16() and bf16() == np.dtype(ml_dtypes.bfloat16)
    assert is_bf16(np.dtype(ml_dtypes.bfloat16))
    for other in ("<f4", "<u2", "<f2", ">u2", "V2", "<i2"):
        assert not is_bf16(np.dtype(other)), other
    assert Dtype.BF16.numpy == np.dtype(ml_dtypes.bfloat16)
    assert Dtype.F32.numpy == np.dtype("<f4")


def test_the_numpy_dtype_table_is_keyed_by_the_two_viewable_tags() -> None:
    assert list(_NUMPY_DTYPE) == [0, 1] and len(_NUMPY_DTYPE) == 2
    assert 0 in _NUMPY_DTYPE and 1 in _NUMPY_DTYPE and 2 not in _NUMPY_DTYPE
    assert _NUMPY_DTYPE[0] == np.dtype("<f4") and _NUMPY_DTYPE[1] == np.dtype(ml_dtypes.bfloat16)
    assert dict(_NUMPY_DTYPE) == {0: np.dtype("<f4"), 1: np.dtype(ml_dtypes.bfloat16)}
    with pytest.raises(KeyError):
        _NUMPY_DTYPE[2]


#: code run in a fresh interpreter: bf16 work of a relay, a controller, an f32 rank (a reply
#: widened, a small frame pre-scaled into its template) and the demo's in-process reference,
#: each printing its result; ml_dtypes is never imported by it
_WITHOUT_ML_DTYPES = {
    "reduce": (
        "from flodl_proto.codec import RoundFrame, RoundKind, TensorPayload,"
        " encode_round_frame_bytes\n"
        "from flodl_proto.reduce import HostFold, bf16_from_f32, reduce_realized_work,"
        " scale_payload\n"
        "a = TensorPayload(1, (4,), bytes.fromhex('803f813f00807fa1'))\n"
        "b = TensorPayload(1, (4,), bytes.fromhex('c03b803b0000c07f'))\n"
        "fa, fb = RoundFrame(RoundKind.MODEL, 1.0, [a]), RoundFrame(RoundKind.MODEL, 2.0, [b])\n"
        "h = HostFold([0, 1], bytes(16), version=2)\n"
        "h.deposit(0, encode_round_frame_bytes(fa, bytes(16)))\n"
        "print(bytes(h.deposit(1, encode_round_frame_bytes(fb, bytes(16)))).hex(),"
        " bytes(reduce_realized_work([fa, fb]).tensors[0].data).hex(),"
        " bytes(scale_payload(1, bytes(a.data), 1.5)).hex(),"
        " bf16_from_f32(np.array([1.00390625, 3e38, -0.0], np.float32)).tolist())\n"),
    "rank reply": (
        "from flodl_proto.codec import RoundFrame, RoundKind, TensorPayload\n"
        "from flodl_proto.runner._rank_payloads import decode_into\n"
        "f = RoundFrame(RoundKind.MODEL, 1.0, [TensorPayload(1, (2, 2),"
        " bytes.fromhex('803f813f0080c1ff'))])\n"
        "d = np.zeros((4,), np.float32)\n"
        "decode_into(f, [d])\n"
        "print(d.view(np.uint32).tolist())\n"),
    "rank small frame": (
        "from flodl_proto.codec import Dtype, RoundKind\n"
        "from flodl_proto.runner._rank_payloads import fill_small\n"
        "from flodl_proto.runner.rank import RankClient\n"
        "c = RankClient(None, 0, 1, bytes(16), version=2, wire_dtype=Dtype.BF16,"
        " ceiling=1 << 30)\n"
        "a = np.array([1.00390625, -2.5, np.nan], np.float32)\n"
        "kept = c._template_for(RoundKind.MODEL, Dtype.BF16, [a])\n"
        "fill_small(kept, [a], np.float32(0.5))\n"
        "print(bytes(kept.template.seal(0.5, bytes(16))).hex())\n"),
    "controller outer step": (
        "from flodl_proto.codec import RoundFrame, RoundKind, TensorPayload\n"
        "from flodl_proto.reduce.outer import NesterovMomentum, OuterStepper\n"
        "s = OuterStepper(NesterovMomentum(0.5, 0.9))\n"
        "for data in ('803f0040c1ff7f800100ffff', '4040c03f0000ff7f0180fe7f'):\n"
        "    s.process_frame(RoundFrame(RoundKind.CONTROL, 0.0, []))  # a new window\n"
        "    f = RoundFrame(RoundKind.MODEL, 2.0, [TensorPayload(1, (2, 3),"
        " bytes.fromhex(data))])\n"
        "    print(bytes(s.process_frame(f).tensors[0].data).hex())\n"),
    "demo reference": (
        "from flodl_proto.commands._demo_worker import reference_loss\n"
        "print(repr(reference_loss(7, 3, 4, bf16=True, hosts=[[0, 1], [2]])))\n"),
}


@pytest.mark.parametrize("case", list(_WITHOUT_ML_DTYPES))
def test_bf16_bits_are_encoded_and_widened_without_ml_dtypes(case: str) -> None:
    """A relay's and a controller's bf16 folds, a controller's outer step on a bf16 consensus
    (it imported ml_dtypes in round 1's scatter), an f32 rank's bf16 reply and small bf16
    frame, and the demo's bf16 reference make no bf16 array, so they never import ml_dtypes
    (about a second of CPU per process); their results are those of a process that has
    imported it."""
    code = ("import sys\nimport numpy as np\n" + _WITHOUT_ML_DTYPES[case]
            + "print('ml_dtypes' in sys.modules)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    *lines, loaded = res.stdout.splitlines()
    assert loaded == "False"
    here = subprocess.run([sys.executable, "-c", "import ml_dtypes\n" + code],
                          capture_output=True, text=True, timeout=120)
    assert here.returncode == 0, here.stderr
    assert here.stdout.splitlines() == [*lines, "True"]


def test_loaded_bf16_never_imports_ml_dtypes() -> None:
    """``loaded_bf16`` is None until something imports ml_dtypes, then its bf16 dtype."""
    code = ("import sys\nfrom flodl_proto._bf16 import loaded_bf16\n"
            "print(loaded_bf16(), 'ml_dtypes' in sys.modules)\n"
            "import ml_dtypes\nprint(loaded_bf16())\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert (res.returncode, res.stdout, res.stderr) == (0, "None False\nbfloat16\n", "")
    assert loaded_bf16() == np.dtype(ml_dtypes.bfloat16)
