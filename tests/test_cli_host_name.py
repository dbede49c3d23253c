"""``relay --host NAME`` (:mod:`flodl_proto.commands._host_name`): invisible characters inside a
name are refused, naming the option and the code point, and shown escaped in the message."""

from __future__ import annotations

import argparse

import pytest

from .cli_util import run_main as _run_main

_RELAY = ("relay", "--controller", "127.0.0.1:1", "--ranks", "0", "--world-size", "1", "--salt",
          "00112233445566778899aabbccddeeff", "--frame-ceiling", "4G")

#: Unicode's Default_Ignorable_Code_Point ranges (DerivedCoreProperties.txt, Unicode 14.0 on),
#: written here apart from the package's copy
_DEFAULT_IGNORABLE = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
    (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164),
    (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF))

_UNSEEN = ("such characters are refused, as a host name is shown in log lines, where one would "
           "pass unseen")


def _escaped(code: int) -> str:
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


#: the ends of each range of default-ignorable code points a name took in its middle (marks that
#: show nothing, unassigned code points kept for more of them), and U+2800
_ADDED = (0x034F, 0x17B4, 0x17B5, 0x180B, 0x180D, 0x180F, 0x2065, 0xFE00, 0xFE0F, 0xFFF0, 0xFFF8,
          0xE0000, 0xE0002, 0xE001F, 0xE0080, 0xE00FF, 0xE0100, 0xE01EF, 0xE01F0, 0xE0FFF, 0x2800)


@pytest.mark.parametrize("code", _ADDED, ids=[f"U+{c:04X}" for c in _ADDED])
def test_an_invisible_character_inside_a_host_name_is_refused(
        code: int, capsys: pytest.CaptureFixture[str]) -> None:
    """A grapheme joiner, a variation selector, an unassigned default-ignorable code point or
    the braille blank inside a name was taken: ``a<U+FE0F>b`` was announced, and shown in every
    log line, as ``ab``."""
    code_, out, err = _run_main(capsys, *_RELAY, "--host", f"a{chr(code)}b")
    assert (code_, out) == (2, "")
    assert err == (f"flodl-proto relay: error: argument --host: 'a{_escaped(code)}b' holds an "
                   f"invisible character (U+{code:04X} at character 2); {_UNSEEN}\n")


def test_every_default_ignorable_code_point_is_refused_and_shown_escaped() -> None:
    """Each of Unicode's 4174 default-ignorable code points, and U+2800, is refused inside a
    name, its code point named; the message escapes it (``\\uXXXX``, or as ``repr`` does), so
    the quoted name does not read as ``'ab'``."""
    from flodl_proto.commands._host_name import host_name

    codes = [c for first, last in _DEFAULT_IGNORABLE for c in range(first, last + 1)]
    assert len(codes) == 4174
    for code in (*codes, 0x2800):
        with pytest.raises(argparse.ArgumentTypeError) as ei:
            host_name(f"a{chr(code)}b")
        name = f"a{chr(code)}b"  # escaped by repr when not printable (U+00AD as \xad)
        quoted = repr(name) if not name.isprintable() else f"'a{_escaped(code)}b'"
        assert str(ei.value).startswith(f"{quoted} holds an invisible "), hex(code)
        assert f"(U+{code:04X} at character 2)" in str(ei.value), hex(code)


@pytest.mark.parametrize(("host", "why"), [
    # (a default-ignorable mark first is named as a mark, as any: tests/test_cli_option_lines.py)
    # an unassigned one first, the braille blank first or alone
    ("\U000e0fffab", f"'\\U000e0fffab' holds an invisible character (U+E0FFF at character 1); "
                     f"{_UNSEEN}"),
    ("\u2800", f"'\\u2800' holds an invisible character (U+2800 at character 1); {_UNSEEN}"),
    # a mark after a letter is still taken; the invisible one after it is refused
    ("no\u0301de\u034f", f"'no\\u0301de\\u034f' holds an invisible character (U+034F at "
                         f"character 6); {_UNSEEN}"),
])
def test_an_invisible_character_anywhere_is_refused(host: str, why: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run_main(capsys, *_RELAY, "--host", host)
    assert (code, out) == (2, "")
    assert err == f"flodl-proto relay: error: argument --host: {why}\n"
