"""The reason an operation failed, in words, for one-line error messages that name the path or
the peer already, what kind of file a path is (:func:`file_kind`), and the module a failed
import names (:func:`failed_import`).

No upstream counterpart: upstream's messages carry Rust's ``io::Error`` display.
"""

from __future__ import annotations

import stat

__all__ = ["failed_import", "file_kind", "os_reason"]


def os_reason(e: BaseException) -> str:
    """Why ``e`` happened, without the errno prefix and without the path an ``OSError``'s text
    repeats: an ``OSError``'s ``strerror`` (``"No such file or directory"``, ``"Connection
    refused"``, ``"File too large"``), else the exception's text (an ``OSError`` built with no
    errno, such as ``socket.timeout("timed out")``, or any other exception, such as a YAML
    error), else its class name (an exception with no text at all), so the result is never
    empty.

    Args:
        e: the exception caught.

    Returns:
        The reason, as the exception gives it (not lower-cased, no trailing period added).

    No upstream counterpart: upstream's messages carry Rust's ``io::Error`` display.
    """
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__


def file_kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, for a message about a file that held nothing:
    ``an empty file`` (a regular one), ``a character device`` (``/dev/null``), ``a FIFO``, ``a
    block device``, else ``not a regular file``. Raises nothing.

    No upstream counterpart: upstream reads no salt file.
    """
    kinds = ((stat.S_ISREG, "an empty file"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISFIFO, "a FIFO"), (stat.S_ISBLK, "a block device"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def failed_import(exc: ImportError) -> str:
    """The module to name for the failed import ``exc``: the dependency the package imported
    (the top-level package of the first module outside ``flodl_proto`` whose top level ran:
    ``numpy`` when a module NumPy imports is missing), else ``exc.name``, else the last module
    of the package whose top level ran, else ``a module``."""
    last, tb = None, exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_globals.get("__name__")
        if tb.tb_frame.f_code.co_name == "<module>" and name and name != "__main__":
            if name.partition(".")[0] != __package__:
                return str(name.partition(".")[0])
            last = name
        tb = tb.tb_next
    return exc.name or last or "a module"
