"""The generated references render as GitHub markdown, and a ``docs --check`` of a document
generated from another spec folder names the command that regenerates it.

The rendering checks are what GitHub does with the files: a table's rows have as many cells as its
header (a ``|`` in a cell that is not escaped splits it), each table has its delimiter row, heading
anchors are unique (a second equal heading gets ``-1``, and a link meant for the first one is
silently taken by it) and every ``#anchor`` link and every link to another file of ``docs/``
lands somewhere.
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest

from flodl_proto._markdown import _text as md_text
from flodl_proto.cli import main
from flodl_proto.docs import render_protocol_doc

ROOT = Path(__file__).resolve().parent.parent


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces
    as ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _cells(row: str) -> int:
    body = row.strip()[1:]
    if body.endswith("|") and not body.endswith("\\|"):
        body = body[:-1]
    return len(re.split(r"(?<!\\)\|", body))


def markdown_problems(text: str, folder: Path) -> list[str]:
    """What would not render as meant on GitHub in the markdown ``text`` of a file in ``folder``:
    one line per problem, ``LINE: what``."""
    problems: list[str] = []
    anchors: dict[str, int] = {}
    lines = text.split("\n")
    fenced = False
    header: tuple[int, int] | None = None  # (line, cells) of the table being read
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            fenced, header = not fenced, None
            continue
        if fenced:
            continue
        heading = re.match(r"#{1,6} (.*)", line)
        if heading:
            slug = _slug(heading.group(1))
            if slug in anchors:
                problems.append(f"{number}: heading anchor #{slug} also at line {anchors[slug]}")
            anchors.setdefault(slug, number)
        prose = re.sub(r"(`+).+?\1", "", line)  # code spans show < as it is
        for tag in re.findall(r"<[A-Za-z/?!][^<>]*>", prose):
            if not tag.startswith("<!--"):  # a comment is meant to be hidden
                problems.append(f"{number}: {tag} is an HTML tag to GitHub (shown as nothing)")
        if not line.startswith("|"):
            header = None
        elif header is None:
            header = (number, _cells(line))
            below = lines[number] if number < len(lines) else ""
            if not re.fullmatch(r"\|( *:?-+:? *\|)+", below.strip()):
                problems.append(f"{number}: a table header with no delimiter row below it")
        elif _cells(line) != header[1]:
            problems.append(f"{number}: {_cells(line)} cells in a table whose header (line "
                            f"{header[0]}) has {header[1]}")
    for number, line in enumerate(lines, 1):
        for link in re.findall(r"\]\(#([^)]*)\)", line):
            if link not in anchors:
                problems.append(f"{number}: link to #{link}, which no heading has")
        for target in re.findall(r"\]\(([^):#]+\.md)(?:#[^)]*)?\)", line):
            if not (folder / target).is_file():
                problems.append(f"{number}: link to {target}, which does not exist")
    return problems


def test_the_checker_finds_each_kind_of_problem(tmp_path: Path) -> None:
    text = ("# A\n\n## A\n\n| a | b |\n|---|---|\n| 1 | 2 | 3 |\n| x \\| y | z |\n\n"
            "| c |\n| d |\n\n[to b](#b) [to a](#a) [other](gone.md) [here](here.md)\n"
            "<!-- hidden --> `Vec<T>` Vec&lt;T> v < 3 and Vec<T>\n")
    (tmp_path / "here.md").write_text("")
    assert markdown_problems(text, tmp_path) == [
        "3: heading anchor #a also at line 1",
        "7: 3 cells in a table whose header (line 5) has 2",
        "10: a table header with no delimiter row below it",
        "14: <T> is an HTML tag to GitHub (shown as nothing)",
        "13: link to #b, which no heading has",
        "13: link to gone.md, which does not exist",
    ]


def test_spec_text_that_reads_as_an_html_tag_is_escaped() -> None:
    """The bincode rule ``Vec<T>: length (u64 varint) + elements`` reached the reference as is,
    and GitHub shows ``<T>`` as an (unknown, dropped) HTML tag: ``Vec: length ...``."""
    assert md_text("Vec<T>: length; v < 251; <= 3; a<b>") == (
        "Vec&lt;T>: length; v < 251; <= 3; a&lt;b>")
    assert "Vec&lt;T>: length (u64 varint) + elements" in render_protocol_doc()


def test_a_tag_inside_a_code_span_of_spec_text_is_left_as_written() -> None:
    """Inside a code span GitHub shows an entity as its letters: ```Vec<T>``` in spec text
    was written ```Vec&lt;T>```, shown as that; only the ``<`` outside code spans is escaped."""
    assert md_text("`Vec<T>` and Vec<T>; ``a`<b>`` <i>; an unclosed ` Vec<T>") == (
        "`Vec<T>` and Vec&lt;T>; ``a`<b>`` &lt;i>; an unclosed ` Vec&lt;T>")


@pytest.mark.parametrize("name", ["protocol.md", "conformance.md"])
def test_the_generated_references_render(name: str) -> None:
    text = (ROOT / "docs" / name).read_text(encoding="utf-8")
    assert markdown_problems(text, ROOT / "docs") == []


def test_the_protocol_reference_renders_as_generated() -> None:
    """The rendering itself, not only the committed file (a spec edit shows here first)."""
    assert markdown_problems(render_protocol_doc(), ROOT / "docs") == []


def test_a_failed_check_names_the_spec_folder_it_was_given(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``docs --spec DIR --check`` of a document out of date with DIR's spec said ``run
    `flodl-proto docs --out PATH```, which regenerates PATH from the spec of the checkout PATH is
    in, not from DIR: the document stayed out of date and the next check failed again."""
    spec_dir = tmp_path / "my spec"
    shutil.copytree(ROOT / "spec", spec_dir)
    out = tmp_path / "protocol.md"
    out.write_text("stale\n", encoding="utf-8")
    assert main(["docs", "--spec", str(spec_dir), "--out", str(out), "--check"]) == 1
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err.endswith(f"; run `flodl-proto docs --out {shlex.quote(str(out))} --spec "
                            f"{shlex.quote(str(spec_dir))}`\n")
    assert len(cap.err.splitlines()) == 1
    command = shlex.split(cap.err.rsplit("; run `", 1)[1].rstrip("`\n"))
    assert main(command[1:]) == 0  # the command named does regenerate it
    assert main(["docs", "--spec", str(spec_dir), "--out", str(out), "--check"]) == 0
    capsys.readouterr()


def test_the_varint_marker_table_names_its_columns() -> None:
    """The bincode marker table read ``| varint marker | value |`` over rows ``| `u16` | 0xFB |``
    and ``| `single_byte_max` | 250 |``: the column named "varint marker" held the width that
    follows the marker, and the marker sat under "value"."""
    text = render_protocol_doc()
    start = text.index("| marker byte |")
    assert text[start:text.index("\n\n", start)].split("\n") == [
        "| marker byte | followed by |",
        "|---|---|",
        "| none: a value up to 250 is its own single byte | nothing |",
        "| `0xFB` | the value as a `u16`, little-endian |",
        "| `0xFC` | the value as a `u32`, little-endian |",
        "| `0xFD` | the value as a `u64`, little-endian |",
        "| `0xFE` | the value as a `u128`, little-endian |",
    ]
    assert "| varint marker |" not in text
