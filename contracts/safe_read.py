"""Reading stored evidence safely: how every file of a checkpoint root, a ledger's folder or the trust store is read.

Anyone who may write to shared storage can plant a FIFO (a read blocks forever), a device
(``/dev/zero`` never ends), a socket, or a symbolic link (the bytes come from somewhere else) where
a document belongs. Every reader of checkpoints, ledgers, head files, high-water records and trust
store files therefore goes through this module, which

1. refuses a path that is not a regular file *before opening it* (``lstat``: a link, FIFO, device,
   socket or folder is never opened, so no device's open has side effects);
2. opens it with ``O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC`` (a link swapped in after the
   check fails with ``ELOOP``; a FIFO swapped in does not block the open);
3. checks with ``fstat`` on the open descriptor that it is a regular file before the first byte is
   read (what was opened is what is judged: no race with the ``lstat``);
4. reads at most ``max_bytes`` (``read_regular``): the size from ``fstat`` is checked first, and at
   most ``max_bytes + 1`` bytes are read, so a file that grows meanwhile is refused too (memory follows
   the file's size, not the limit).

API (reused by the checkpoint readers, the ledger, the trust store and provenance/``verify-run``):

* ``read_regular(path, max_bytes, *, what)`` -> ``bytes``: the whole file, refused past ``max_bytes``.
* ``open_regular(path, *, what)`` -> a binary file object positioned at 0 (for streaming reads of
  files with no size bound, such as a ledger or a hashed checkpoint file); the caller closes it.
* ``UnsafeFileError`` (a ``PermissionError``, so an ``OSError``): the path is a link, FIFO, device,
  socket or folder, or is writable by every user; the message names the path and what it is.
* ``OversizeFileError`` (a ``ValueError``): the file holds more than ``max_bytes``; ``path``, ``size``
  and ``limit`` are attributes, so each reader words its own refusal (a torn checkpoint, a document
  over its limit).

``follow_symlinks=True`` is only for a path a person typed (a PEM file to trust); even then the target
must be a regular file. A missing file is the ordinary ``FileNotFoundError``.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

__all__ = ["OversizeFileError", "UnsafeFileError", "describe_kind", "open_regular", "read_regular"]

_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
          | getattr(os, "O_CLOEXEC", 0))
_FOLLOW_FLAGS = _FLAGS & ~getattr(os, "O_NOFOLLOW", 0)


class UnsafeFileError(PermissionError):
    """A file or folder is writable by every user, or a path is a link, FIFO, device, socket or folder where a
    regular file must be; the message names the path and what to do."""


class OversizeFileError(ValueError):
    """A file holds more bytes than its reader accepts; refused before (or instead of) reading the rest."""

    def __init__(self, path: str, size: int | None, limit: int, what: str) -> None:
        self.path, self.size, self.limit, self.what = path, size, limit, what
        held = f"{size:,} bytes" if size is not None else f"more than {limit:,} bytes"
        super().__init__(f"{what} {path} holds {held}, over the limit of {limit:,} bytes; refused before reading it")


def describe_kind(mode: int) -> str:
    """What a ``st_mode`` is, in words ("a FIFO", "a symbolic link", ...), for messages."""
    for test, words in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                        (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                        (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return words
    return f"a file of type {stat.S_IFMT(mode):o}"


def _refuse(path: str, mode: int, what: str) -> UnsafeFileError:
    return UnsafeFileError(f"{what} {path} is {describe_kind(mode)}, not a regular file: refused unread (a planted "
                           "link, pipe or device could redirect or block the read); replace it with the real file "
                           "or remove it")


def open_regular(path: str | os.PathLike[str], *, what: str = "file", follow_symlinks: bool = False) -> BinaryIO:
    """``path`` opened for reading once it is shown to be a regular file (never a link unless ``follow_symlinks``,
    never a FIFO, device, socket or folder); ``UnsafeFileError`` naming it otherwise. The caller closes it."""
    name = os.fspath(path)
    before = os.stat(name, follow_symlinks=follow_symlinks)  # FileNotFoundError passes through
    if not stat.S_ISREG(before.st_mode):
        raise _refuse(name, before.st_mode, what)
    try:
        fd = os.open(name, _FOLLOW_FLAGS if follow_symlinks else _FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):  # swapped for a link after the lstat
            raise _refuse(name, stat.S_IFLNK, what) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # swapped for a FIFO or device after the lstat: judged on what was opened
            raise _refuse(name, mode, what)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike[str], max_bytes: int, *, what: str = "file",
                 follow_symlinks: bool = False) -> bytes:
    """All bytes of the regular file ``path`` (see ``open_regular``); ``OversizeFileError`` past ``max_bytes``,
    decided from ``fstat`` before reading and again on what was read (a file growing meanwhile)."""
    name = os.fspath(path)
    with open_regular(name, what=what, follow_symlinks=follow_symlinks) as source:
        size = os.fstat(source.fileno()).st_size
        if size > max_bytes:
            raise OversizeFileError(name, size, max_bytes, what)
        want = size + 1  # one byte more than fstat said: a file that grew is read on, still within the limit
        data = source.read(want)
        if len(data) == want:
            data += source.read(max_bytes + 1 - len(data))
    if len(data) > max_bytes:
        raise OversizeFileError(name, None, max_bytes, what)
    return data
