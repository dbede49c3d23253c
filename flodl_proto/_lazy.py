"""Names of a package imported from their modules on first access (PEP 562), for the package
``__getattr__`` of :mod:`flodl_proto` and :mod:`flodl_proto.runner`: a process loads only the
modules it uses (NumPy, the codec, the runners, python-statemachine).

No upstream counterpart (upstream's crates are compiled; nothing loads at run time).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import MutableMapping

__all__ = ["load_attribute"]


def load_attribute(package: str, namespace: MutableMapping[str, object], name: str,
                   home: str | None) -> object:
    """The attribute ``name`` of the package ``package``: the name of that module ``home`` of
    the package (a submodule name, e.g. ``"codec"``) when ``home`` is given, else a public
    submodule called ``name`` (``flodl_proto.runner.stages``). The value is stored in
    ``namespace`` (the package's globals), so later lookups skip the package's
    ``__getattr__``.

    Raises:
        AttributeError: ``home`` is None and ``name`` is no public submodule (as for any module
            attribute); the import's own errors otherwise.
    """
    if home is not None:
        value: object = getattr(importlib.import_module(f".{home}", package), name)
    elif (name.isidentifier() and not name.startswith("_")
          and importlib.util.find_spec(f"{package}.{name}")):
        value = importlib.import_module(f".{name}", package)
    else:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    namespace[name] = value
    return value
