"""Opening a file a user names, safely: the one way every reader of a declaration, a log or a
credential file opens it.

Opened without blocking and refused unless it is a regular file: a FIFO would wait for a writer
for ever, and a device (``/dev/zero``) never ends, whatever ``st_size`` says (0 for a device).
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO


class NotRegularFile(OSError):
    """The path names a FIFO, a device, a socket: something that is not a regular file."""


def open_regular(path: str | os.PathLike[str], why: str = "not a regular file") -> BinaryIO:
    """``path`` opened for binary reading if it is a regular file; else ``NotRegularFile`` (``why``
    is its message), ``IsADirectoryError`` for a folder, or the ``OSError`` of opening it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
        if not stat.S_ISREG(mode):
            raise NotRegularFile(errno.EINVAL, why)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike[str], limit: int, why: str = "not a regular file") -> bytes:
    """At most ``limit`` bytes of the regular file ``path`` (see ``open_regular``)."""
    with open_regular(path, why) as f:
        return f.read(limit)
