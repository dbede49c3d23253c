"""The session salt of the command line, in one place: ``--salt HEX``, ``--salt-file PATH`` and
``$FLODL_SESSION_SALT`` read and refused in the same words by every command (``controller``,
``relay``, ``rank``, ``decode``, ``demo``) and by the processes whose parent passes the salt in
the variable alone (the demo's rank workers, the benchmarks' workers). Exported by
:mod:`flodl_proto.commands.relay`.

A salt is a secret: no message shows the digits of a near miss, only what is wrong with them.

No upstream counterpart: the command line is this package's own; the salt is the 16-byte
``SessionSalt`` of ``wire.rs``.
"""

from __future__ import annotations

import errno
import os
import string
from pathlib import Path
from time import monotonic, sleep
from typing import Final

from .._files import create_file, make_folders
from .._oserr import file_kind
from ..errors import ProtocolError, protocol_error, shown
from ..spec import SESSION_SALT_BYTES
from ._option_error import OptionError
from ._paths import file_in_the_way, input_path_problem

__all__ = [
    "RACED_SALT_STEP",
    "RACED_SALT_WAIT",
    "SALT_ENV",
    "SALT_FILE_BYTES",
    "SALT_FILE_MAX_BYTES",
    "SaltNotWritten",
    "SaltPathInTheWay",
    "cli_salt",
    "demo_salt",
    "env_salt",
    "parse_salt",
    "resolve_raced_salt",
    "resolve_salt",
    "salt_text_problem",
]

#: environment variable holding the session salt (hex) when ``--salt`` is not given
SALT_ENV = "FLODL_SESSION_SALT"


def parse_salt(text: str | None) -> bytes:
    """Parse a session salt written as 32 hex digits (``--salt``, else ``$FLODL_SESSION_SALT``;
    that variable empty or blank is no salt, as unset).

    Raises:
        InvalidValue (local): missing (``salt.missing``) or not 16 bytes of hex (``salt.bad_hex``).

    No upstream counterpart: the command line is this package's own; the salt is the 16-byte
    ``SessionSalt`` of ``wire.rs``.
    """
    if text is None:
        text = _env_text()
    if text is None:
        raise protocol_error("salt.missing", env=SALT_ENV)
    clean = text.strip()
    try:
        raw = bytes.fromhex(clean)
    except ValueError:
        raw = b""
    if len(raw) != SESSION_SALT_BYTES:
        raise protocol_error("salt.bad_hex", expected=SESSION_SALT_BYTES,
                             digits=2 * SESSION_SALT_BYTES, got=salt_text_problem(clean))
    return raw


def salt_text_problem(text: str) -> str:
    """What is wrong with ``text`` as a salt, without its digits (a near-miss salt is a secret
    that must not reach a log): its count of characters and the first one that is neither a hex
    digit nor a space between bytes (shown by its code point when it is not printable ASCII);
    for a text of hex digits and spaces, also its count of hex digits when the two counts
    differ (``32 characters, 31 hex digits``), and ``a space inside a byte`` when it has the
    digits of a whole salt (:data:`~flodl_proto.spec.SESSION_SALT_BYTES` bytes) but a space
    splits one of them (``bytes.fromhex`` takes spaces between bytes only).

    No upstream counterpart: upstream reads the salt from its environment and reports no text.
    """
    count = f"{len(text)} character{'s' * (len(text) != 1)}"
    for i, ch in enumerate(text):
        if ch not in _HEX_OR_SPACE:
            shown = repr(ch) if " " < ch <= "~" else f"U+{ord(ch):04X}"
            return f"{count}, character {i + 1} ({shown}) not a hex digit"
    digits = sum(1 for ch in text if ch in _HEX)
    if digits == len(text):
        return count
    told = f"{count}, {digits} hex digit{'s' * (digits != 1)}"
    return told + (", a space inside a byte" if digits == 2 * SESSION_SALT_BYTES else "")


_HEX_OR_SPACE: Final = frozenset("0123456789abcdefABCDEF \t\n\r\v\f")
_HEX: Final = frozenset("0123456789abcdefABCDEF")


#: the most a salt file is read (32 hex digits and a line end, or 16 raw bytes, fit many times)
SALT_FILE_MAX_BYTES = 4096


def resolve_salt(salt: str | None, salt_file: str | None) -> bytes:
    """The session salt from ``--salt HEX``, ``--salt-file PATH`` (32 hex digits, or exactly 16
    raw bytes) or ``$FLODL_SESSION_SALT``.

    Raises:
        InvalidValue (local): missing or malformed (``salt.missing``, ``salt.bad_hex``; for a
            file of whitespace alone or an empty one, its count of bytes: ``got 17 bytes, all
            whitespace (a raw salt file holds exactly 16 bytes)``, ``got 0 bytes (an empty
            file)``, or what a path that is not a regular file is: ``got 0 bytes (a character
            device)`` for ``/dev/null``).
        OSError: the salt file cannot be read (a path ending with ``/`` that names a file is
            ``Not a directory``, as the OS has it), or is longer than
            :data:`SALT_FILE_MAX_BYTES` (``/dev/zero``: read no further, so memory stays
            bounded).

    No upstream counterpart: the command line is this package's own; the salt is the 16-byte
    ``SessionSalt`` of ``wire.rs``.
    """
    if salt_file is not None:
        # the text as given, not a Path: ``key/`` names a folder, refused as the OS refuses it
        # (``Not a directory``), where a Path drops the slash and reads the file ``key``
        with open(salt_file, "rb") as f:
            raw = f.read(SALT_FILE_MAX_BYTES + 1)
            mode = os.fstat(f.fileno()).st_mode
        if len(raw) > SALT_FILE_MAX_BYTES:
            raise OSError(errno.EFBIG, f"longer than {SALT_FILE_MAX_BYTES} bytes: not a session "
                          "salt (32 hex digits, or 16 raw bytes)", salt_file)
        try:
            return parse_salt(raw.decode("ascii"))
        except (UnicodeDecodeError, ProtocolError) as e:
            if len(raw) == SESSION_SALT_BYTES:
                return raw
            if not isinstance(e, UnicodeDecodeError):
                if raw.decode("ascii").strip():
                    raise
                # nothing left once stripped ("got 0 characters"): say what the file holds
                held = (f"0 bytes ({file_kind(mode)})" if not raw else
                        f"{len(raw)} byte{'s' * (len(raw) != 1)}, all whitespace (a raw salt "
                        f"file holds exactly {SESSION_SALT_BYTES} bytes)")
                raise protocol_error("salt.bad_hex", expected=SESSION_SALT_BYTES,
                                     digits=2 * SESSION_SALT_BYTES, got=held) from None
            # neither hex text nor a raw salt: counted in bytes, the first one text cannot hold
            raise protocol_error(
                "salt.bad_hex", expected=SESSION_SALT_BYTES, digits=2 * SESSION_SALT_BYTES,
                got=f"{len(raw)} bytes, byte {e.start + 1} (0x{raw[e.start]:02x}) not ASCII "
                    f"(a raw salt file holds exactly {SESSION_SALT_BYTES} bytes)") from None
    return parse_salt(salt)


#: the bytes of a salt file as the demo writes it: 32 hex digits and a line end
SALT_FILE_BYTES: Final = 2 * SESSION_SALT_BYTES + 1
#: seconds :func:`resolve_raced_salt` waits at most for a salt file to be whole, and the
#: seconds between two of its reads
RACED_SALT_WAIT: Final = 1.0
RACED_SALT_STEP: Final = 0.02
_HEX_DIGITS: Final = frozenset(string.hexdigits.encode("ascii"))
_HEX_OR_SPACE_BYTES: Final = frozenset(string.hexdigits.encode("ascii") + b" \t\n\r\v\f")


def resolve_raced_salt(path: str) -> bytes:
    """:func:`resolve_salt` of the salt file ``path`` that another process created while this
    one tried to create it (the demo's ``--salt-file``: its exclusive creation lost the race),
    and may not have written whole yet. While the file holds hex digits short of 32, alone or
    with spaces between them (none at all included: the first 16 bytes would read as a raw
    salt, and a salt written with spaces is longer than :data:`SALT_FILE_BYTES`), or is
    shorter than :data:`SALT_FILE_BYTES` and holds no salt (a part of a raw salt), it is read
    again every :data:`RACED_SALT_STEP` seconds, for up to :data:`RACED_SALT_WAIT` seconds;
    then it is read as it is.

    Raises:
        what :func:`resolve_salt` raises, in its words (a file still short of a salt after
        the wait: ``got 0 bytes (an empty file)``, ...).

    No upstream counterpart: upstream's processes read the salt from the environment.
    """
    deadline = monotonic() + RACED_SALT_WAIT
    while _partial_salt(path) and monotonic() < deadline:
        sleep(RACED_SALT_STEP)
    return resolve_salt(None, path)


def _partial_salt(path: str) -> bool:
    """Whether the salt file ``path`` may still be being written (:func:`resolve_raced_salt`);
    False when it cannot be read (:func:`resolve_salt` then says why)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(SALT_FILE_MAX_BYTES + 1)
    except OSError:
        return False
    if _HEX_OR_SPACE_BYTES.issuperset(raw):  # the beginning of a hex salt (none at all included)
        return sum(b in _HEX_DIGITS for b in raw) < 2 * SESSION_SALT_BYTES
    if len(raw) >= SALT_FILE_BYTES:
        return False
    try:
        parse_salt(raw.decode("ascii"))
    except (UnicodeDecodeError, ProtocolError):
        return len(raw) != SESSION_SALT_BYTES  # not a raw salt either
    return False


def cli_salt(salt: str | None, salt_file: str | None) -> bytes:
    """:func:`resolve_salt` for a command line: a failure names the option that caused it.

    Raises:
        ValueError: one line naming where the salt came from, as argparse names an option
            (an :class:`~._option_error.OptionError` for an option)
            (``argument --salt-file: 'PATH': ...``, the path quoted as an output path's
            error quotes it: unreadable file, a loop of symbolic links, or not a salt; ``argument
            --salt: ...``: malformed), ``$FLODL_SESSION_SALT`` (malformed, in the words of
            :func:`env_salt`), or saying there is none.

    No upstream counterpart: the command line is this package's own.
    """
    try:
        return resolve_salt(salt, salt_file)
    except OSError as e:
        raise OptionError("--salt-file", input_path_problem(str(salt_file), e)) from None
    except ProtocolError as e:
        if salt_file is not None:
            raise OptionError("--salt-file", f"{shown(salt_file)}: {e}") from None
        if salt is not None:
            raise OptionError("--salt", str(e)) from None
        if _env_text() is not None:
            raise _env_error(e) from None
        raise ValueError(str(e)) from None


def env_salt(who: str, *, missing: str | None = None) -> bytes:
    """The session salt of a process whose parent passes it in ``$FLODL_SESSION_SALT`` alone (the
    demo's rank workers, the benchmarks' workers, the test suite's network-lab ranks): 32 hex
    digits, read by :func:`parse_salt`, so it is taken and refused as the commands' ``--salt``
    is (spaces between bytes and around them allowed).

    Args:
        who: what reads it, named when the variable is missing (``"the demo's rank worker"``).
        missing: the words after ``is not set:`` or ``is empty:`` when the variable is missing
            (default: ``WHO takes the session salt from it, as 32 hex digits``).

    Returns:
        the 16 salt bytes.

    Raises:
        ValueError: one line naming the variable and what is wrong, never the digits of a near
            miss (a salt is a secret): unset, empty or blank (``$FLODL_SESSION_SALT is not set:
            WHO takes the session salt from it, as 32 hex digits``; ``is empty: ...``), or not
            16 bytes of hex (``$FLODL_SESSION_SALT: session salt must be 16 bytes written as 32
            hex digits, got 2 characters, character 1 ('z') not a hex digit``).

    No upstream counterpart: upstream reads its salt from its configuration, not this variable.
    """
    text = _env_text()
    if text is None:
        state = "not set" if os.environ.get(SALT_ENV) is None else "empty"
        raise ValueError(f"${SALT_ENV} is {state}: " + (
            missing if missing is not None
            else f"{who} takes the session salt from it, as {2 * SESSION_SALT_BYTES} hex digits"))
    try:
        return parse_salt(text)
    except ProtocolError as e:
        raise _env_error(e) from None


def _env_text() -> str | None:
    """The text of ``$FLODL_SESSION_SALT``, or None when it is unset, empty or blank (no salt,
    as unset)."""
    text = os.environ.get(SALT_ENV)
    return text if text is not None and text.strip() else None


def _env_error(e: ProtocolError) -> ValueError:
    """The one line of a ``$FLODL_SESSION_SALT`` that is not 16 bytes of hex: the variable's
    name, then the salt's error (``$FLODL_SESSION_SALT: session salt must be ...``)."""
    return ValueError(f"${SALT_ENV}: {e}")


class SaltNotWritten(Exception):
    """The demo's new salt file could not be written (``error``: the ``OSError``, naming the
    step that failed): exit 1, as an output file of the other commands that cannot be written.

    No upstream counterpart: upstream has no demo."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


class SaltPathInTheWay(Exception):
    """A file (not a folder) stands where a folder of the new salt file's path should be
    (``why``: :func:`~flodl_proto.commands._paths.file_in_the_way`'s words, ``'a-file/salt.hex':
    Not a directory (a-file is a file, not a folder)``), or a loop of symbolic links
    (``'loop1/salt.hex': Too many levels of symbolic links (loop1 is a loop of symbolic
    links)``, as an existing ``--salt-file`` that is one: ``'loop1': Too many levels of
    symbolic links (loop1 is a loop of symbolic links)``): exit 2, ``argument --salt-file:``,
    as the other output paths with a file in their way; found before any folder of the path is
    made.

    No upstream counterpart: upstream has no demo."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def demo_salt(path: str | None) -> tuple[str, str]:
    """The run's salt (str: ``SESSION_SALT_BYTES`` random bytes, 16 by the spec, in hex, 32
    digits) and the line saying where it is: read from ``path``
    when that file exists (or a link of that name, even to no file), else random (and written
    to ``path`` when given: its missing folders created, the file created atomically and only
    if no file of that name exists by then (:func:`flodl_proto._files.create_file`): one that
    another process created after the check is read, never replaced, once whole (its creator
    gets up to a second to write it: :func:`resolve_raced_salt`); mode 0600 less the
    umask, the salt's hex digits and a line end).

    Raises:
        OSError: ``path`` ends with ``/`` (``IsADirectoryError``: ``names a folder (it ends
            with /); give a file path in it``, as an output option is refused), or the file
            cannot be read; InvalidValue (local): it holds no salt.
        SaltPathInTheWay: a file, or a loop of symbolic links, stands where a folder of the
            new file's path should be (found before any folder is made).
        SaltNotWritten: the new file, or a folder of its path, cannot be written
            (:func:`flodl_proto._files.make_folders` names the folder that failed).

    No upstream counterpart: upstream has no demo (its processes read the salt from
    ``FLODL_SESSION_SALT``).
    """
    if path is None:
        return os.urandom(SESSION_SALT_BYTES).hex(), ("session salt: random, not kept "
                                                      "(--salt-file PATH keeps it for decode "
                                                      "--salt-file PATH)")
    if path.endswith(("/", os.sep)):  # else a new salt went to the folder's name, as a file
        raise IsADirectoryError(errno.EISDIR, "names a folder (it ends with /); give a file "
                                "path in it")
    target = Path(path)
    if not os.path.lexists(target):  # a link to no file is read (and refused), not written
        # a file, or a loop of links (as for an existing --salt-file), where a folder of the
        # path should be: a usage error, found before any folder is made
        if (why := file_in_the_way(path, target.parent)) is not None:
            raise SaltPathInTheWay(why)
        salt = os.urandom(SESSION_SALT_BYTES).hex()
        try:
            make_folders(target.parent)
            create_file(target, (salt + "\n").encode("ascii"), new_mode=0o600)
            return salt, f"session salt: written to {shown(path)}"
        except OSError as e:  # one created meanwhile (FileExistsError) is read as it is
            if e.errno == errno.ENOTDIR:  # a file made meanwhile where a folder should be
                if (why := file_in_the_way(path, target.parent)) is not None:
                    raise SaltPathInTheWay(why) from None
            if not (isinstance(e, FileExistsError) and os.path.lexists(target)):
                raise SaltNotWritten(e) from None
            # once whole: its creator may still be writing it
            return resolve_raced_salt(path).hex(), f"session salt: read from {shown(path)}"
    return resolve_salt(None, path).hex(), f"session salt: read from {shown(path)}"
