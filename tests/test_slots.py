"""``_slots.slot_builder``: the generated builder gives the object the class's constructor gives
(every field, in order, defaults and pinned fields included, still frozen), and refuses the
classes whose ``__init__`` does more than store its arguments; every per-record builder of the
package is one of its builders."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flodl_proto._slots import slot_builder
from flodl_proto.codec import mux, plans, stream
from flodl_proto.codec.auth import Premac, new_mac
from flodl_proto.fsm import controller_core
from flodl_proto.runner import rank


@dataclasses.dataclass(frozen=True, slots=True)
class _Four:
    a: int
    b: str
    c: bytes
    d: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class _Checked:
    a: int

    def __post_init__(self) -> None:
        if self.a < 0:
            raise ValueError("a < 0")


def _fields(obj: Any) -> list[Any]:
    return [getattr(obj, f.name) for f in dataclasses.fields(obj)]


@settings(max_examples=60, deadline=None)
@given(st.integers(), st.text(max_size=8), st.binary(max_size=8),
       st.none() | st.floats(allow_nan=False))
def test_the_builder_gives_what_the_constructor_gives(a: int, b: str, c: bytes,
                                                       d: float | None) -> None:
    build = slot_builder(_Four)
    got = build(a, b, c, d)
    assert type(got) is _Four and got == _Four(a, b, c, d) and _fields(got) == [a, b, c, d]
    assert build(a, b, c) == _Four(a, b, c)  # the field's default
    assert build(c=c, b=b, a=a) == _Four(a, b, c)  # by keyword, as the constructor
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.a = 1  # type: ignore[misc]


def test_a_pinned_field_is_set_and_leaves_the_parameters() -> None:
    build = slot_builder(_Four, fixed={"b": "pinned"})
    assert build(1, b"x", 2.5) == _Four(1, "pinned", b"x", 2.5)
    assert build(1, b"x") == _Four(1, "pinned", b"x")
    with pytest.raises(TypeError):
        build(1, "b", b"x", 2.5)


def test_the_builder_has_the_constructor_arity() -> None:
    build = slot_builder(_Four)
    with pytest.raises(TypeError):
        build(1, "b")
    with pytest.raises(TypeError):
        build(1, "b", b"c", 1.0, 2)


def test_classes_whose_init_does_more_are_refused() -> None:
    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Factory:
        a: list[int] = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(frozen=True, slots=True)
    class NotInit:
        a: int = dataclasses.field(default=0, init=False)

    for cls, words in ((NoSlots, "slots=True"), (int, "slots=True"),
                       (_Checked, "__post_init__"), (Factory, "Factory.a"),
                       (NotInit, "NotInit.a")):
        with pytest.raises(TypeError, match=words):
            slot_builder(cls)
    with pytest.raises(TypeError, match="_Four has no field e, z"):
        slot_builder(_Four, fixed={"z": 1, "e": 2})


def test_skip_post_init_builds_without_running_it() -> None:
    build = slot_builder(_Checked, skip_post_init=True)
    assert build(3) == _Checked(3)
    assert build(-1).a == -1  # the caller's promise: not checked here


@dataclasses.dataclass(frozen=True, slots=True)
class _Scaled:
    a: int
    scale: dataclasses.InitVar[int]
    b: int = 0

    def __post_init__(self, scale: int) -> None:
        if self.a * scale < 0:
            raise ValueError("a * scale < 0")


@dataclasses.dataclass(frozen=True, slots=True)
class _Unused:
    a: int
    unused: dataclasses.InitVar[int] = 0


@dataclasses.dataclass(frozen=True, slots=True)
class _Counted:
    a: int
    made: ClassVar[int] = 0


@pytest.mark.parametrize(("cls", "name", "skip"), [(_Scaled, "scale", True),
                                                   (_Unused, "unused", False),
                                                   (_Unused, "unused", True)])
def test_a_class_with_an_init_var_is_refused(cls: type, name: str, skip: bool) -> None:
    """Its builder took the fields only (``build(1, 2)`` set ``b`` to what ``cls(1, 2)``
    passes as the InitVar): skipping ``__post_init__`` did not make the arguments the same."""
    with pytest.raises(TypeError) as e:
        slot_builder(cls, skip_post_init=skip)
    assert str(e.value) == (f"slot_builder: {cls.__name__}.{name} is an InitVar: an __init__ "
                            "argument with no slot, which the builder would not take")


def test_a_class_variable_is_no_init_var() -> None:
    build = slot_builder(_Counted)
    assert build(3) == _Counted(3) and _fields(build(3)) == [3]


def test_the_premac_builder_gives_the_constructor_s_premac() -> None:
    salt = bytes(range(16))
    frame = memoryview(bytes(range(40)))
    mac = new_mac(salt)
    mac.update(frame[:32])
    want = Premac(32, mac.digest())
    got = plans.frame_premac_for(salt)(frame)
    assert type(got) is Premac and got == want
    assert plans.frame_premac(frame, salt) == want
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.covered = 1  # type: ignore[misc]


def test_every_per_record_builder_is_generated_by_slot_builder() -> None:
    for build in (mux._record, mux._header, stream._received, controller_core._broadcast_to,
                  controller_core._scattered, rank._new_reply, plans._premac):
        assert build.__module__ == slot_builder.__module__
        assert build.__name__.startswith("build_")


@dataclasses.dataclass(frozen=True, slots=True)
class _Named:
    o: int
    _new: str
    _cls: bytes
    build: int = 7


def test_a_field_may_have_any_name() -> None:
    # `o` was set to the object itself; `_new`, `_cls` replaced the builder's own names
    build = slot_builder(_Named)
    got = build(1, "n", b"c")
    assert type(got) is _Named and _fields(got) == [1, "n", b"c", 7]
    assert build(o=2, _new="m", _cls=b"d", build=3) == _Named(2, "m", b"d", 3)
    assert slot_builder(_Named, fixed={"o": 5})("n", b"c") == _Named(5, "n", b"c")


@dataclasses.dataclass(frozen=True, slots=True)
class _KwOnly:
    a: int
    b: str = dataclasses.field(kw_only=True)
    c: float = dataclasses.field(default=1.5, kw_only=True)
    d: bytes = b"d"


def test_kw_only_fields_are_keyword_parameters_as_in_the_constructor() -> None:
    # (b and c were positional parameters, in field order: b given by keyword was given twice;
    # and a kw_only field without a default after one with a default was a SyntaxError)
    build = slot_builder(_KwOnly)
    got = build(1, b"x", b="s")
    assert type(got) is _KwOnly and _fields(got) == [1, "s", 1.5, b"x"]
    assert got == _KwOnly(1, b"x", b="s")
    assert build(2, b="t", c=2.5) == _KwOnly(2, b="t", c=2.5)
    with pytest.raises(TypeError):
        build(1, b"x", "s")  # b is keyword-only, as in the constructor
    assert slot_builder(_KwOnly, fixed={"b": "p"})(3) == _KwOnly(3, b="p")


@dataclasses.dataclass(frozen=True, slots=True)
class _Base:
    a: int
    b: str = "b"


@dataclasses.dataclass(frozen=True, slots=True)
class _Derived(_Base):
    c: bytes = b"c"


def test_a_field_of_a_slotted_base_class_is_set_through_the_base_s_slot() -> None:
    # (it was a KeyError: the base's slot is not in the subclass's __dict__)
    build = slot_builder(_Derived)
    got = build(1, "x", b"y")
    assert type(got) is _Derived and got == _Derived(1, "x", b"y")
    assert _fields(got) == [1, "x", b"y"]
    assert build(2) == _Derived(2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.a = 3  # type: ignore[misc]


def test_a_field_whose_name_is_no_longer_a_slot_is_refused() -> None:
    # (it was a KeyError for the base's field b; the first `a` along the MRO is a property,
    # which is no slot: setting through it fails at build time)
    class Shadowed(_Base):
        __slots__ = ()

        @property  # type: ignore[misc]
        def a(self) -> int:
            return 0

    with pytest.raises(TypeError, match=r"^slot_builder: Shadowed\.a is not a slot: "
                                        r"Shadowed\.a is of type property$"):
        slot_builder(Shadowed)


def test_a_field_shadowed_by_a_value_names_the_value_s_type() -> None:
    """The type is named after "of type", right for any name (it read ``is a int``)."""
    class ShadowedByInt(_Base):
        __slots__ = ()
        a = 5

    with pytest.raises(TypeError, match=r"^slot_builder: ShadowedByInt\.a is not a slot: "
                                        r"ShadowedByInt\.a is of type int$"):
        slot_builder(ShadowedByInt)
