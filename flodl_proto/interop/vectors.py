"""Load golden vector folders and run their cases.

A folder holds ``*.json`` files of the shared schema (``flodl-oracle-vectors/1``) and usually a
``v2/`` subfolder of the same; each file's top-level ``protocol_version`` says which version its
cases are for. ``manifest.json`` counts the cases per file.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import shown, shown_file, shown_name
from ..spec import SUPPORTED_VERSIONS
from .registry import (
    EXPECT_VALUES,
    EXPECTS,
    OPS,
    NotImplementedOp,
    VectorMismatch,
    field_problem,
    json_name,
    kind_problem,
)

# every ops_* module of this package registers its handlers on import
for _info in pkgutil.iter_modules([str(Path(__file__).parent)]):
    if _info.name.startswith("ops_"):
        importlib.import_module(f"{__package__}.{_info.name}")

__all__ = ["Case", "VectorFileError", "file_manifest_count", "iter_cases", "iter_file_cases",
           "manifest_total", "run_case", "shown_id", "vector_folders"]


class VectorFileError(ValueError):
    """A ``*.json`` file of a vector folder that is not a vector file of the shared schema (not
    a regular file, over :data:`MAX_VECTOR_FILE_BYTES`, not JSON, without ``protocol_version``
    / ``cases``, with a case outside the schema or two cases of one id); the message names the
    file.

    No upstream counterpart: upstream ships no golden vectors; this runs the shared set against
    this package.
    """


#: the largest vector file read (the shared files are tens of KiB); a larger one, or a link to
#: ``/dev/zero``, is refused before it is read whole
MAX_VECTOR_FILE_BYTES = 64 << 20


def _read_json(path: Path) -> Any:
    """The JSON document of ``path``, read only when it is a regular file of at most
    :data:`MAX_VECTOR_FILE_BYTES` (a FIFO would block, a device would never end).

    Raises:
        OSError: the file cannot be read. VectorFileError: not a regular file, too large, or not
            UTF-8 JSON.
    """
    # O_NONBLOCK: opening a FIFO waits for a writer; a regular file ignores the flag
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:  # checked before a file object is made of it (one of a folder names no path)
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            what = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
            raise VectorFileError(f"{shown_file(path)}: not a vector file ({what})")
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        raw = f.read(MAX_VECTOR_FILE_BYTES + 1)
    if len(raw) > MAX_VECTOR_FILE_BYTES:
        raise VectorFileError(f"{shown_file(path)}: not a vector file (larger than "
                              f"{MAX_VECTOR_FILE_BYTES} bytes)")
    try:
        return json.loads(raw.decode("utf-8"))
    except ValueError as e:  # UnicodeDecodeError included
        why = str(e)
        if why.startswith("Exceeds the limit"):  # Python's int conversion limit, not JSON's
            why = f"a number of more than {sys.get_int_max_str_digits()} digits"
        raise VectorFileError(f"{shown_file(path)}: not a vector file ({why})") from None
    except RecursionError:  # arrays or objects nested deeper than the decoder recurses
        raise VectorFileError(f"{shown_file(path)}: not a vector file (JSON nested too "
                              "deeply to read)") from None


@dataclass(frozen=True, slots=True)
class Case:
    """One vector case: its file stem, protocol version and JSON object.

    No upstream counterpart: upstream ships no golden vectors; this runs the shared set against
    this package.
    """

    file: str
    version: int
    data: dict[str, Any]

    @property
    def id(self) -> str:
        """The case's unique id."""
        return str(self.data["id"])


def vector_folders(root: Path) -> list[Path]:
    """``root`` and its ``v2/`` subfolder (when present).

    No upstream counterpart: upstream ships no golden vectors; this runs the shared set against
    this package.
    """
    out = [root]
    if (root / "v2").is_dir():
        out.append(root / "v2")
    return out


def iter_cases(root: Path) -> Iterator[Case]:
    """Yield every case of every ``*.json`` (manifest excluded) in ``root`` and ``root/v2``.

    Raises:
        OSError: a file cannot be read. VectorFileError: a file is not a vector file (a case id
            that an earlier case has, of the same file or another of ``root``).

    No upstream counterpart: upstream ships no golden vectors; this runs the shared set against
    this package.
    """
    first: dict[str, tuple[Path, int]] = {}  # id -> the file and index of the case that has it
    for folder in vector_folders(root):
        for path in sorted(folder.glob("*.json")):
            if path.name == "manifest.json":
                continue
            yield from _file_cases(path, first)


def iter_file_cases(path: Path) -> Iterator[Case]:
    """Yield every case of the one vector file ``path`` (a ``*.json`` of a vector folder).

    Raises:
        OSError: the file cannot be read. VectorFileError: it is not a vector file (as
            :func:`iter_cases` says of a folder's files; two cases of one id within it).

    No upstream counterpart: upstream ships no golden vectors; this runs the shared set against
    this package.
    """
    yield from _file_cases(path, {})


def _file_cases(path: Path, first: dict[str, tuple[Path, int]]) -> Iterator[Case]:
    """The cases of the vector file ``path``; ``first`` maps the ids of the cases seen before
    (of this file or others) to their file and index, and takes this file's.

    Raises:
        OSError, VectorFileError: as :func:`iter_file_cases`.
    """
    doc = _read_json(path)
    named = shown_file(path)
    if not isinstance(doc, dict):
        raise VectorFileError(f"{named}: not a vector file (a JSON {json_name(doc)}, "
                              "not an object)")
    for key in ("protocol_version", "cases"):
        if key not in doc:
            raise VectorFileError(f"{named}: not a vector file (no key {key!r})")
    version, cases = doc["protocol_version"], doc["cases"]
    if version not in SUPPORTED_VERSIONS or isinstance(version, bool | float):
        raise VectorFileError(
            f"{named}: not a vector file (protocol_version {shown(version)} is not one "
            f"this implementation speaks: {', '.join(map(str, SUPPORTED_VERSIONS))})")
    if not isinstance(cases, list):
        raise VectorFileError(f"{named}: not a vector file (cases is a JSON "
                              f"{json_name(cases)}, not an array)")
    for i, case in enumerate(cases):
        problem = _case_problem(case)
        if problem is None and case["id"] in first:
            # reports name a case by its id: two of one id could not be told apart
            where, at = first[case["id"]]
            problem = (f"{shown_id(case['id'])}: duplicate id, first at case {at}"
                       + ("" if where == path else f" of {shown_name(str(where))}"))
        if problem is not None:
            raise VectorFileError(f"{named}: not a vector file (case {i}: {problem})")
        first[case["id"]] = (path, i)
        yield Case(path.stem, version, case)


def _case_problem(case: Any) -> str | None:
    """Why ``case`` is not a case of the shared schema (an object with a string ``id`` and
    ``op``, an ``expect`` of :data:`~flodl_proto.interop.registry.EXPECT_VALUES` and the fields
    its op's handler reads, :data:`~flodl_proto.interop.registry.FIELDS`), or None."""
    if not isinstance(case, dict):
        return f"not an object but a JSON {json_name(case)}"
    problem = kind_problem(case, "id", "string")
    if problem is not None:
        return problem
    case_id = shown_id(case["id"])
    problem = kind_problem(case, "op", "string")
    if problem is not None:
        return f"{case_id}: {problem}"
    if "expect" not in case:
        return f"{case_id}: field 'expect' is missing"
    if case["expect"] not in EXPECT_VALUES:
        return (f"{case_id}: expect {shown(case['expect'])} is not one of "
                + ", ".join(repr(e) for e in EXPECT_VALUES))
    if case["expect"] not in EXPECTS.get(case["op"], EXPECT_VALUES):
        return None  # run_case reports the outcome the op does not have, as a failed case
    problem = field_problem(case)
    return None if problem is None else f"{case_id}: {problem}"


def shown_id(case_id: str) -> str:
    """A case's id as a line names the case (``case 3: ID: duplicate id``, ``FAIL ID: ...``):
    as :func:`~flodl_proto.errors.shown_name` shows a name (as it is, unless it is empty,
    longer than :data:`~flodl_proto.errors.SHOWN_CHARS` characters, not printable or starts or
    ends with white space; then quoted, ``''``, ``'aaa...a' (5000 characters)``), so that the
    line still shows where the id ends.

    No upstream counterpart: upstream's vector runner is its test suite."""
    return shown_name(case_id)


def manifest_total(root: Path) -> int:
    """Sum of ``total_cases`` over the manifests of ``root`` and ``root/v2``.

    Raises:
        OSError: a manifest cannot be read. VectorFileError: a manifest without a whole
            ``total_cases`` (the message names it).

    No upstream counterpart: upstream ships no golden vectors; this runs the shared set against
    this package.
    """
    total = 0
    for folder in vector_folders(root):
        m = folder / "manifest.json"
        if m.is_file():
            doc = _read_json(m)
            count = doc.get("total_cases") if isinstance(doc, dict) else None
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise VectorFileError(f"{shown_file(m)}: not a manifest (total_cases "
                                      f"{shown(count)} is not a whole number >= 0)")
            total += count
    return total


def file_manifest_count(path: Path) -> int | None:
    """The number of cases the ``manifest.json`` beside the vector file ``path`` declares for
    it (its ``files`` entry named by the file's stem: ``{"files": {"bf16": {"cases": 32}}}``),
    or None when there is no such manifest or it lists no such file.

    Raises:
        OSError: the manifest cannot be read. VectorFileError: the manifest is not JSON, or
            the file's entry holds no whole ``cases`` (the message names the manifest).

    No upstream counterpart: upstream ships no golden vectors; this runs the shared set against
    this package.
    """
    m = path.parent / "manifest.json"
    if not m.is_file():
        return None
    doc = _read_json(m)
    files = doc.get("files") if isinstance(doc, dict) else None
    entry = files.get(path.stem) if isinstance(files, dict) else None
    if entry is None:
        return None
    count = entry.get("cases") if isinstance(entry, dict) else None
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise VectorFileError(f"{shown_file(m)}: not a manifest (the cases of its file "
                              f"{shown(path.stem)}, {shown(count)}, is not a whole number "
                              ">= 0)")
    return count


def run_case(case: Case) -> None:
    """Run one case; return on success.

    Raises:
        VectorMismatch: this implementation's result differs from the case, or the case expects
            an outcome its op does not have (a write or a round trip expecting an error).
        NotImplementedOp: no handler is registered for the case's ``op``.

    No upstream counterpart: upstream ships no golden vectors; this runs the shared set against
    this package.
    """
    op_name, expect = case.data["op"], case.data["expect"]
    handler = OPS.get(op_name)
    if handler is None:
        raise NotImplementedOp(op_name)
    if expect not in EXPECTS[op_name]:
        judged = ", ".join(repr(e) for e in EXPECT_VALUES if e in EXPECTS[op_name])
        raise VectorMismatch(f"expect {shown(expect)}: a {op_name} case expects {judged}")
    handler(case.data, case.version)
