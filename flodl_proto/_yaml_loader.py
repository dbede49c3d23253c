"""The YAML loader of the spec files (``wire.yaml``, ``lifecycle.yaml``, ``conformance.yaml``):
PyYAML's safe loader refusing a mapping that holds one key twice and resolving merge keys
(``<<``) as YAML says. A leaf module (PyYAML only), cut out of ``spec.py``, which re-exports
:data:`YAML_LOADER`.

No upstream counterpart: upstream's spec is its code; the spec files are this package's.
"""

from __future__ import annotations

from typing import Any, Final

import yaml

__all__ = ["YAML_LOADER"]

_MERGE_TAG: Final = "tag:yaml.org,2002:merge"


def _unique_keys(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    """``construct_mapping`` of :data:`YAML_LOADER`: the safe loader's, on the mapping as
    :func:`_flatten_merges` leaves it (its keys checked, its merge keys resolved)."""
    _flatten_merges(loader, node)
    return yaml.constructor.SafeConstructor.construct_mapping(loader, node, deep=deep)


def _flatten_merges(loader: yaml.SafeLoader, node: yaml.MappingNode) -> None:
    """``flatten_mapping`` of :data:`YAML_LOADER`: refuse a mapping that holds one key twice
    (YAML keeps the last silently: a constant or a field's ``type`` written again in an edited
    spec replaced the first), with a ``ConstructorError`` naming the key and its first line,
    marked where the second one starts; then put the pairs of the mappings its merge keys
    (``<<``) name before its own, so its own keys win over merged ones and an earlier merged
    mapping wins over a later one, as YAML's merge key says. Each mapping is checked once, as
    written: a mapping merged into another before it is built itself (an anchor defined inside
    a merge and used again) holds its merged pairs by then, and an own key that overrides one
    is no second key. PyYAML's own flattening keeps the first pair of a key whose text Python
    happens to intern (a one-letter key), so a mapping merging one that overrides a key of a
    third took the third's value; here the override holds whatever the key."""
    done: set[int] = loader.__dict__.setdefault("_flodl_flattened", set())
    if id(node) in done:
        return
    firsts: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:
            continue
        if key_node.tag == "tag:yaml.org,2002:value":  # '=' as a key: a string, as PyYAML's
            key_node.tag = "tag:yaml.org,2002:str"
        key = loader.construct_object(key_node, deep=False)
        try:
            first = firsts.get(key)
        except TypeError:  # an unhashable key: the safe loader's own error names it
            break
        if first is not None:
            raise yaml.constructor.ConstructorError(
                None, None, _duplicate(key, first, key_node), key_node.start_mark)
        firsts[key] = key_node
    done.add(id(node))
    merged: list[tuple[Any, Any]] = []
    own: list[tuple[Any, Any]] = []
    for key_node, value_node in node.value:
        if key_node.tag != _MERGE_TAG:
            own.append((key_node, value_node))
            continue
        if isinstance(value_node, yaml.MappingNode):
            sources = [value_node]
        elif isinstance(value_node, yaml.SequenceNode):
            sources = value_node.value
        else:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark,
                f"expected a mapping or list of mappings for merging, but found {value_node.id}",
                value_node.start_mark)
        for source in sources:
            if not isinstance(source, yaml.MappingNode):
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"expected a mapping for merging, but found {source.id}", source.start_mark)
            _flatten_merges(loader, source)
        # the mapping is built pair by pair, the last of a key winning: the first source last
        merged = [pair for source in reversed(sources) for pair in source.value] + merged
    node.value = merged + own


def _duplicate(key: Any, first: yaml.Node, second: yaml.Node) -> str:
    """The problem of a mapping whose key node ``second`` is the key ``key`` its earlier key
    node ``first`` is: ``duplicate key 'title' (first at line 3)`` for one key written twice;
    both keys as written when their texts differ (``1`` beside ``true``, ``1.0`` beside ``1``:
    one key to Python, ``1 == True``), ``duplicate key 'true' (the same key as '1' at line
    1)``."""
    line = first.start_mark.line + 1
    texts = [n.value if isinstance(n, yaml.ScalarNode) else None for n in (first, second)]
    if texts[0] is None or texts[1] is None or texts[0] == texts[1]:
        return f"duplicate key {key!r} (first at line {line})"
    return f"duplicate key {texts[1]!r} (the same key as {texts[0]!r} at line {line})"


#: the fastest safe YAML loader available (libyaml's when PyYAML was built with it; same result),
#: refusing a mapping that holds one key twice (:func:`_unique_keys`) and taking merge keys
#: as YAML says (:func:`_flatten_merges`)
YAML_LOADER: Final[type[yaml.SafeLoader]] = type(
    "UniqueKeySafeLoader", (getattr(yaml, "CSafeLoader", yaml.SafeLoader),),
    {"construct_mapping": _unique_keys, "flatten_mapping": _flatten_merges,
     "__doc__": "PyYAML's safe loader (libyaml's when built with it) refusing a mapping that "
                "holds one key twice (a ConstructorError naming the key and both lines), its "
                "merge keys (<<) resolved as YAML says. No "
                "upstream counterpart: upstream's spec is its code; the spec files are this "
                "package's."})
