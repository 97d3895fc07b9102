"""What comes from outside, made safe to use: text a server or a file supplies, cleaned
before it is printed (:func:`clean`, :func:`shown_url`), and local paths that may be anything
but a regular file (:func:`open_regular`: never a FIFO to wait on, nor a device)."""

from __future__ import annotations

import errno
import os
import stat
import urllib.parse
from typing import IO


def clean(text: object, limit: int = 300) -> str:
    """``text`` safe to print on one line: every control or format character (escape
    sequences, carriage returns, bidi overrides) spelled out as ``\\xNN``/``\\uNNNN``, and
    cut at ``limit`` characters. For everything a server or a file supplies (a reason phrase,
    a header, a URL it redirects to, a member name)."""
    shown = "".join(
        ch if ch.isprintable() else f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"
        for ch in str(text)[: limit + 1]
    )
    return shown if len(shown) <= limit else shown[:limit] + "..."


class NotRegularFile(OSError):
    """A path that is not a regular file (a FIFO, a device, a directory): never read."""


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def open_regular(path: str) -> IO[bytes]:
    """Open ``path`` for reading only if it is a regular file (after symlinks).

    Opened non-blocking, so a FIFO without a writer cannot hang the open, then checked with
    ``fstat`` on the open descriptor (no window for a swap between the check and the use).

    Raises:
        NotRegularFile: a FIFO, a device, a directory, a socket (``strerror`` says which).
        OSError: it cannot be opened (FileNotFoundError when missing).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a file")
            raise NotRegularFile(errno.EINVAL, f"not a regular file ({kind})", path)
        # Regular files ignore O_NONBLOCK; cleared all the same, for plain blocking reads.
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def shown_url(url: str) -> str:
    """``url`` as it may be printed: any password masked, control characters spelled out."""
    try:
        parts = urllib.parse.urlsplit(url)
        password = parts.password
    except ValueError:
        password = None
    if password is not None:
        user, _, host = parts.netloc.rpartition("@")
        user = user.split(":", 1)[0]
        url = urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
    return clean(url, 2000)
