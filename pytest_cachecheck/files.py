"""Writing the run's files, with every known secret scrubbed first.

Every output file (the JSON report, a recorded baseline, the HTML page) is written by :func:`write_text`,
which decides by what the path is now (:func:`output_target`): a regular file, or a path that does not
exist yet, is replaced atomically (a temporary file beside it, then a rename); a symlink is followed and its
final target replaced, so the link stays a link; a character device (``/dev/null``) is written through; a
FIFO is written through when a process reads it; anything else (a directory, a socket, a block device) is
refused with an ``OSError``.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from typing import Any, Callable, Optional, Tuple

from .model import RunReport
from .redact import scrub_data

#: how :func:`write_text` writes to a path: replaced atomically, or opened and written through
REPLACE, DEVICE, FIFO = "file", "character device", "FIFO"


def output_target(path: str) -> Tuple[str, str]:
    """The file a report written to ``path`` lands in (symlinks resolved) and how it is written (``REPLACE``,
    ``DEVICE`` or ``FIFO``). Raises OSError for a directory, a socket, a block device or any other kind."""
    real = os.path.realpath(path)
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        return real, REPLACE
    if stat.S_ISREG(mode):
        return real, REPLACE
    if stat.S_ISCHR(mode):
        return real, DEVICE
    if stat.S_ISFIFO(mode):
        return real, FIFO
    what = ("a directory" if stat.S_ISDIR(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a block device" if stat.S_ISBLK(mode) else "of another kind")
    raise OSError(errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL,
                  f"{real} is {what}, not a regular file, a character device or a FIFO")


def _encoded(text: str) -> bytes:
    # a lone surrogate from a server becomes \\udXXX: in JSON a valid escape, never a crash
    return text.encode("utf-8", errors="backslashreplace")


def _replace(real: str, data: bytes, suffix: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".cachecheck-", suffix=suffix, dir=os.path.dirname(real))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, real)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _write_through(real: str, kind: str, data: bytes) -> None:
    flags = os.O_WRONLY | getattr(os, "O_NOCTTY", 0)  # a terminal never becomes the controlling one
    if kind == FIFO:
        try:  # without O_NONBLOCK, opening a FIFO nobody reads waits for a reader for ever
            fd = os.open(real, flags | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
            raise OSError(errno.ENXIO, f"no process reads the FIFO {real}") from None
    else:
        fd = os.open(real, flags)
    with os.fdopen(fd, "wb") as f:  # a failed write (ENOSPC from /dev/full) raises here or on close
        if kind == FIFO:
            import fcntl  # only POSIX has FIFOs

            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)  # a reader is there
        f.write(data)


def write_text(path: str, text: str, suffix: str = ".tmp") -> None:
    """Write an output file (see the module docstring for what each kind of path gets)."""
    real, kind = output_target(path)
    if kind == REPLACE:
        _replace(real, _encoded(text), suffix)
    else:
        _write_through(real, kind, _encoded(text))


def write_report(path: str, report: RunReport, scrub: Optional[Callable[[str], str]] = None) -> None:
    """The JSON report, its strings scrubbed one by one (never the serialized text: a short secret must not
    rewrite keys or literals)."""
    data: Any = report.to_json()
    if scrub is not None:
        data = scrub_data(data, scrub)
    write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n", ".json.tmp")
