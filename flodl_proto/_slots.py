"""Fast constructors for frozen, slotted dataclasses built once per record or round.

A frozen dataclass's ``__init__`` sets each field with ``object.__setattr__`` (its own
``__setattr__`` refuses), which costs a lookup and a call per field. Where a hot path builds one
per record from values it already checked, :func:`slot_builder` gives a function that sets the
same fields through the slots' descriptors instead, in field order, and checks nothing: the same
object ``cls(*args)`` gives, for a class whose ``__init__`` only stores its arguments (no
``InitVar``, no ``init=False`` field, no default factory; a ``__post_init__`` only when the
caller says its values already pass it).

Upstream: none (a Python construction detail; upstream builds plain Rust structs).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from types import MemberDescriptorType
from typing import Any, TypeVar

__all__ = ["slot_builder"]

T = TypeVar("T")

#: what a builder's parameter defaults to when its field has no default
_NO_DEFAULT: Any = dataclasses.MISSING


def _slot(cls: type, name: str) -> Any:
    """The slot descriptor of field ``name`` of ``cls``: the first class along ``cls``'s MRO
    whose ``__dict__`` holds ``name`` (a field of a slotted base class has its slot there).

    Raises:
        TypeError: the first such attribute is not a slot (a subclass redefines the name, say
            as a property), or there is none.

    Upstream: none."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            found = klass.__dict__[name]
            if isinstance(found, MemberDescriptorType):
                return found
            raise TypeError(f"slot_builder: {cls.__name__}.{name} is not a slot: "
                            f"{klass.__name__}.{name} is of type {type(found).__name__}")
    raise TypeError(f"slot_builder: {cls.__name__}.{name} has no slot")


def slot_builder(cls: type[T], fixed: Mapping[str, Any] | None = None, *,
                 skip_post_init: bool = False) -> Callable[..., T]:
    """A function building ``cls`` without its ``__init__``: ``build(*args)`` returns what
    ``cls(*args)`` returns, with every field set through its slot's descriptor.

    The function is generated once (as :mod:`dataclasses` generates ``__init__``): it takes the
    fields not named in ``fixed`` as the constructor does, in field order, with the fields' own
    defaults (positional-or-keyword parameters, then a ``kw_only`` field's keyword-only ones); a
    field named in ``fixed`` is always set to that value. Any field name may be a parameter
    (the generated names cannot collide with one), and a field declared on a slotted dataclass
    base class is set through the base's slot.

    Args:
        cls: a frozen or plain dataclass declared with ``slots=True`` whose ``__init__`` only
            stores its arguments.
        fixed: field name -> the value every object built gets for that field.
        skip_post_init: build a class that has a ``__post_init__`` without running it (the
            caller passes only values that ``__post_init__`` accepts and leaves unchanged).

    Returns:
        The builder; it checks nothing (its callers pass values they already checked).

    Raises:
        TypeError: ``cls`` is not a slotted dataclass, has a ``__post_init__`` (unless
            ``skip_post_init``), an ``InitVar`` (with or without ``skip_post_init``: an
            ``__init__`` argument that is no field), a field left out of ``__init__``, a
            default factory or without a slot (a subclass redefining a field's name), or
            ``fixed`` names a field it does not have.

    Upstream: none (see the module doc).
    """
    if not dataclasses.is_dataclass(cls) or "__slots__" not in cls.__dict__:
        raise TypeError(f"slot_builder: {cls!r} is not a dataclass declared with slots=True")
    if hasattr(cls, "__post_init__") and not skip_post_init:
        raise TypeError(f"slot_builder: {cls.__name__} has a __post_init__ (its checks would "
                        "be skipped)")
    fields = dataclasses.fields(cls)
    names = [f.name for f in fields]
    # an InitVar: a pseudo-field dataclasses.fields leaves out (as a ClassVar) that __init__
    # takes (unlike a ClassVar)
    pseudo = set(cls.__dataclass_fields__) - set(names)
    for name in inspect.signature(cls.__init__).parameters:
        if name in pseudo:
            raise TypeError(f"slot_builder: {cls.__name__}.{name} is an InitVar: an __init__ "
                            "argument with no slot, which the builder would not take")
    pinned = dict(fixed or {})
    unknown = sorted(set(pinned) - set(names))
    if unknown:
        raise TypeError(f"slot_builder: {cls.__name__} has no field {', '.join(unknown)}")
    # the generated names start with a prefix no field name starts with: a field named `o`,
    # `_new` or `_cls` is a parameter like any other
    pre = "_sb_"
    while any(name.startswith(pre) for name in names):
        pre += "_"
    ns: dict[str, Any] = {"__name__": __name__, f"{pre}new": object.__new__, f"{pre}cls": cls}
    params: list[str] = []
    keyword_params: list[str] = []  # kw_only fields: after `*`, as the constructor takes them
    body = [f"    {pre}o = {pre}new({pre}cls)"]
    for f in fields:
        if not f.init or f.default_factory is not dataclasses.MISSING:
            raise TypeError(f"slot_builder: {cls.__name__}.{f.name} is not a plain __init__ "
                            "argument")
        ns[f"{pre}set_{f.name}"] = _slot(cls, f.name).__set__
        if f.name in pinned:
            ns[f"{pre}fixed_{f.name}"] = pinned[f.name]
            body.append(f"    {pre}set_{f.name}({pre}o, {pre}fixed_{f.name})")
            continue
        into = keyword_params if f.kw_only else params
        if f.default is _NO_DEFAULT:
            into.append(f.name)
        else:
            ns[f"{pre}default_{f.name}"] = f.default
            into.append(f"{f.name}={pre}default_{f.name}")
        body.append(f"    {pre}set_{f.name}({pre}o, {f.name})")
    if keyword_params:
        params += ["*", *keyword_params]
    # only field names (Python identifiers) and generated names reach the source
    src = f"def build({', '.join(params)}):\n" + "\n".join(body) + f"\n    return {pre}o\n"
    exec(src, ns)
    build: Callable[..., T] = ns["build"]
    build.__name__ = build.__qualname__ = f"build_{cls.__name__}"
    build.__doc__ = (f"``{cls.__name__}(...)`` built through its slots (no ``__init__``, no "
                     "checks).")
    return build
