"""The classes and functions of ``codec/mux.py`` and ``codec/round_frame.py`` report the module
they are imported from, wherever their code lives (``codec/_mux_control.py``,
``codec/_frame_model.py``, ``codec/_walk.py``): ``help()``, pydoc and Sphinx name the public
module, and a pickle refers to it, so a stored pickle stays readable when code moves between
private modules. A value of each class survives ``pickle`` and ``copy``.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import pickle
import pydoc
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from flodl_proto.codec import mux, round_frame
from flodl_proto.codec.mux import (
    DeclareDead,
    Hello,
    HelloAck,
    MuxHeader,
    MuxRecord,
    RankExit,
    RecordKind,
)
from flodl_proto.codec.round_frame import Dtype, RoundFrame, RoundKind, TensorPayload

PUBLIC: tuple[ModuleType, ...] = (mux, round_frame)

#: the private modules the public names' code lives in: no pickle names them
PRIVATE = (b"_mux_control", b"_frame_model", b"_walk")


def _definitions() -> Iterator[tuple[ModuleType, str, Any]]:
    for mod in PUBLIC:
        for name in mod.__all__:
            obj = getattr(mod, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                yield mod, name, obj


DEFINITIONS = list(_definitions())


@pytest.mark.parametrize(("mod", "name", "obj"), DEFINITIONS,
                         ids=[f"{m.__name__.rpartition('.')[2]}.{n}" for m, n, _ in DEFINITIONS])
def test_a_public_name_reports_its_public_module(mod: ModuleType, name: str, obj: Any) -> None:
    assert obj.__module__ == mod.__name__
    assert obj.__name__ == obj.__qualname__ == name
    assert getattr(importlib.import_module(obj.__module__), obj.__qualname__) is obj
    kind = "class" if inspect.isclass(obj) else "function"
    assert f"{kind} {name} in module {mod.__name__}\n" in pydoc.render_doc(obj)


def test_the_moved_names_are_among_them() -> None:
    """The names whose code left the public modules are all checked above."""
    checked = {(m.__name__, n) for m, n, _ in DEFINITIONS}
    moved = {(mux.__name__, n) for n in ("Hello", "HelloAck", "RankExit", "DeclareDead",
                                         "encode_control", "decode_control",
                                         "max_hello_payload", "ranks_str")}
    moved |= {(round_frame.__name__, n) for n in ("RoundKind", "Dtype", "TensorPayload",
                                                  "RoundFrame", "round_frame_wire_len",
                                                  "known_layout", "read_known_frame")}
    assert moved <= checked


def _payload() -> TensorPayload:
    return TensorPayload.from_array(np.arange(6, dtype=np.float32).reshape(2, 3))


#: one value (or more) of each class the two modules define or re-export
VALUES: list[Any] = [
    Hello("h0", [0, 3], [bytes(range(32))]),
    HelloAck(),
    RankExit(3),
    DeclareDead(4),
    MuxHeader(1, 7, 12, bytes(range(8))),
    MuxRecord.data(7, b"abc"),
    MuxRecord.control_msg(Hello("h1", [1], [])),
    RecordKind.BROADCAST,
    RoundKind.CONTROL,
    Dtype.BF16,
    _payload(),
    TensorPayload.elide(Dtype.F32, (4, 0, 2)),
    TensorPayload(9, (3,), b"\x01\x02"),  # an unknown dtype and a byte count that fits none
    RoundFrame(RoundKind.MODEL, 2.5, [_payload(), TensorPayload.elide(Dtype.BF16, (5,))]),
    RoundFrame(RoundKind.CONTROL, -0.0, ()),
]


def test_the_values_cover_every_class() -> None:
    classes = {obj for _, _, obj in DEFINITIONS if inspect.isclass(obj)}
    assert {type(v) for v in VALUES} == classes


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, MuxRecord) and a.control != b.control:  # its == leaves the message out
        return False
    return type(a) is type(b) and bool(a == b)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize("value", VALUES, ids=[type(v).__name__ for v in VALUES])
def test_a_value_pickles_by_its_public_module(value: Any, protocol: int) -> None:
    data = pickle.dumps(value, protocol=protocol)
    assert type(value).__module__.encode() in data
    assert not [p for p in PRIVATE if p in data]
    back = pickle.loads(data)
    assert _same(back, value)
    if isinstance(value, RecordKind | RoundKind | Dtype):
        assert back is value


@pytest.mark.parametrize("value", VALUES, ids=[type(v).__name__ for v in VALUES])
def test_a_value_copies(value: Any) -> None:
    assert _same(copy.copy(value), value)
    assert _same(copy.deepcopy(value), value)


@pytest.mark.parametrize(("mod", "name", "obj"),
                         [d for d in DEFINITIONS if inspect.isfunction(d[2])],
                         ids=[f"{m.__name__.rpartition('.')[2]}.{n}" for m, n, o in DEFINITIONS
                              if inspect.isfunction(o)])
def test_a_function_pickles_by_reference(mod: ModuleType, name: str, obj: Any) -> None:
    data = pickle.dumps(obj)
    assert mod.__name__.encode() in data and not [p for p in PRIVATE if p in data]
    assert pickle.loads(data) is obj
