"""Doc keys of the case catalogue -> headings and anchors of ``docs/protocol.md``.

A case names the section it checks with a *doc key*, which survives renumbering:

* ``message:<name>`` — the message's section (``### 3.4 RoundFrame (`round_frame`)``);
* ``semantics:<id>`` — a section of the round semantics (``spec/wire.yaml`` ``semantics``);
* ``section:<title>`` — a top-level section by its title (``section:Departures from upstream``).
"""

from __future__ import annotations

import re
from functools import cache
from typing import Final

from .._markdown import _anchor
from ..docs import render_protocol_doc

__all__ = ["DocSection", "resolve_section"]

_HEADING: Final = re.compile(r"^(#{2,3}) (\d+(?:\.\d+)?\.?) (.+)$")


class DocSection:
    """A resolved heading of ``docs/protocol.md``: its text and its anchor.

    No upstream counterpart: upstream has no conformance kit.
    """

    __slots__ = ("anchor", "heading")

    def __init__(self, heading: str) -> None:
        self.heading = heading
        self.anchor = _anchor(heading)

    def link(self, doc: str = "protocol.md") -> str:
        """A Markdown link to the section in ``doc``."""
        return f"[{self.heading}]({doc}#{self.anchor})"


@cache
def _headings() -> tuple[tuple[str, str, str], ...]:
    out = []
    for line in render_protocol_doc().splitlines():
        m = _HEADING.match(line)
        if m:
            out.append((m.group(1), m.group(2), m.group(3)))
    return tuple(out)


@cache
def resolve_section(key: str) -> DocSection:
    """The heading a doc key names.

    Raises:
        KeyError: no heading of the generated ``docs/protocol.md`` matches the key.
    """
    kind, _, name = key.partition(":")
    for level, number, title in _headings():
        full = f"{number} {title}"
        if kind == "message" and level == "###" and title.endswith(f"(`{name}`)"):
            return DocSection(full)
        if kind == "section" and level == "##" and title == name:
            return DocSection(full)
        if kind == "semantics" and level == "###" and title.endswith(f"(`{name}`)"):
            return DocSection(full)
    raise KeyError(f"doc key {key!r} names no section of docs/protocol.md")
