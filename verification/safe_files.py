"""File writes nobody can redirect: exclusive temporary files, no symlinks followed, atomic publication.

Every file the verification layer writes into a folder someone else might also write to (the trust
store, certificates, ledger heads, checkpoint manifests and marks) goes through these functions:

* ``write_atomic(path, data)``: the bytes go into a new temporary file created in the same folder
  with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (a planted file or link is never opened), are fsync'd, and
  the temporary file is renamed over ``path``. ``rename`` replaces a link at ``path`` itself; it
  never writes through it. Readers see the old bytes or the new bytes, never a torn file.
* ``publish_exclusive(path, data)``: the same, but the final step is ``link``, which fails when
  ``path`` exists: exactly one of many racing writers publishes, the others get ``False`` (key creation).
* ``exclusive_lock(path)``: an advisory ``flock`` on a lock file (opened without following links)
  that serializes read-modify-write cycles across processes.
* ``refuse_world_writable(path)``: ``UnsafeFileError`` naming the ``chmod`` to run when any user may
  write ``path``.

Reading is the other half: ``contracts.safe_read`` (``read_regular``, ``open_regular``) opens only regular
files, never through a link, never blocking; ``UnsafeFileError`` is defined there and re-exported here.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

from ..contracts.safe_read import UnsafeFileError

__all__ = ["UnsafeFileError", "exclusive_lock", "publish_exclusive", "refuse_world_writable", "write_atomic"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def refuse_world_writable(path: str | os.PathLike[str], what: str) -> None:
    """Raise ``UnsafeFileError`` (with the ``chmod`` to run) when ``path`` exists and every user may write it."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return
    if info.st_mode & stat.S_IWOTH:
        raise UnsafeFileError(f"{what} {os.fspath(path)} is writable by every user (mode {info.st_mode & 0o7777:o}): "
                              f"anyone could change what it vouches for; run `chmod o-w {os.fspath(path)}`")


def _temporary(folder: Path, name: str, mode: int) -> tuple[int, Path]:
    """A new file in ``folder``, created exclusively and without following links; (fd, path)."""
    for _ in range(16):
        candidate = folder / f".{name}.{secrets.token_hex(8)}.tmp"
        try:
            fd = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode)
        except FileExistsError:
            continue
        return fd, candidate
    raise FileExistsError(errno.EEXIST, f"could not create a temporary file in {folder}")


def _fill(fd: int, data: bytes, mode: int) -> None:
    with os.fdopen(fd, "wb", closefd=True) as out:
        os.fchmod(out.fileno(), mode)  # the umask may have narrowed it; never widen past what was asked
        out.write(data)
        out.flush()
        os.fsync(out.fileno())


def _sync_folder(folder: Path) -> None:
    with contextlib.suppress(OSError):  # not every filesystem lets a folder be fsync'd
        fd = os.open(folder, os.O_RDONLY | _CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _as_bytes(data: bytes | str) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)


def write_atomic(path: str | os.PathLike[str], data: bytes | str, *, mode: int = 0o644) -> Path:
    """Replace ``path`` with ``data`` atomically, never writing through a link; returns the path.

    The folder must exist. A link at ``path`` is replaced by the file, not followed.
    """
    target = Path(path)
    fd, tmp = _temporary(target.parent, target.name, mode)
    try:
        _fill(fd, _as_bytes(data), mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _sync_folder(target.parent)
    return target


def publish_exclusive(path: str | os.PathLike[str], data: bytes | str, *, mode: int = 0o600) -> bool:
    """Create ``path`` holding ``data`` only if nothing (file or link) is there; True if this call created it.

    The bytes are complete and fsync'd before the name appears (``link`` of a finished temporary file),
    so no reader ever sees a half-written file, and of many racing callers exactly one returns True.
    """
    target = Path(path)
    fd, tmp = _temporary(target.parent, target.name, mode)
    try:
        _fill(fd, _as_bytes(data), mode)
        try:
            os.link(tmp, target, follow_symlinks=False)
        except FileExistsError:
            return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    _sync_folder(target.parent)
    return True


@contextlib.contextmanager
def exclusive_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created 0600 if missing, never through a link) for the block."""
    import fcntl  # POSIX; imported here so importing this module stays portable

    fd = os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock
