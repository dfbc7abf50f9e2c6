"""A DCP ``StorageReader`` that loads only bytes it checked against the generation's manifest.

``torch.distributed.checkpoint``'s ``FileSystemReader`` opens ``.metadata`` (a pickle) and each
``.distcp`` shard by path. Checking the files beforehand leaves a window: a file swapped between
the check and DCP's open is used unchecked (a swapped ``.metadata`` runs its pickle; a swapped
shard loads another run's weights). ``VerifiedReader`` closes it: every file DCP asks for is read
once (no symlink followed), its size and sha256 compared with the manifest (whose own sha256 the
signature vouches for), and DCP is handed exactly those bytes. ``read_data`` reads and checks every
file of the plan before the first tensor is copied, so a refused file changes nothing (this rank's
share of the shard bytes is held in memory meanwhile). A refusal is kept in ``failure``, because DCP
wraps the errors of its readers.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Generator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import Metadata
from torch.futures import Future

from .checkpoint_manifest import CorruptCheckpointError, read_verified

__all__ = ["VerifiedReader"]


class _VerifiedFileSystem(FileSystem):
    """DCP's file system, read-only, serving each file as the checked bytes of one read."""

    def __init__(self, generation_dir: Path, manifest: Mapping[str, Any]) -> None:
        self._gen, self._manifest = generation_dir, manifest
        self.checked: dict[str, bytes] = {}
        self.failure: CorruptCheckpointError | None = None

    def relative(self, path: str | os.PathLike[str]) -> str:
        """``path`` as the manifest names it (relative to the generation folder)."""
        return Path(path).relative_to(self._gen).as_posix()

    def check(self, path: str | os.PathLike[str]) -> bytes:
        """Read ``path`` once and check it against the manifest; remember a refusal."""
        rel = self.relative(path)
        try:
            return read_verified(self._gen, self._manifest, rel)
        except CorruptCheckpointError as err:
            self.failure = self.failure or err
            raise

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Generator[io.IOBase, None, None]:
        if mode != "rb":
            raise PermissionError(f"a verified checkpoint reader does not write ({path}, mode {mode!r})")
        rel = self.relative(path)
        data = self.checked.pop(rel) if rel in self.checked else self.check(path)
        yield cast(io.IOBase, io.BytesIO(data))


class VerifiedReader(FileSystemReader):
    """``FileSystemReader`` over ``generation_dir/dcp`` that uses only bytes matching ``manifest``.

    ``agree(error_or_None)`` is called on every rank once its share is checked and before any tensor is
    copied; it raises on every rank if any rank refused a file (so no rank changes its model alone).
    """

    def __init__(self, generation_dir: Path, manifest: Mapping[str, Any], dcp_dir: str,
                 agree: Callable[[BaseException | None], None]) -> None:
        super().__init__(str(generation_dir / dcp_dir))
        self._agree = agree
        self.fs = _VerifiedFileSystem(generation_dir, manifest)
        self.path = generation_dir / dcp_dir

    @property
    def failure(self) -> CorruptCheckpointError | None:
        """The first file refused during the load, if any."""
        return cast(_VerifiedFileSystem, self.fs).failure

    def read_metadata(self) -> Metadata:  # no **kwargs: DCP then never falls back to per-rank metadata
        """DCP's index, unpickled from the checked bytes of ``.metadata`` only."""
        return super().read_metadata()

    def read_data(self, plan: Any, planner: Any) -> Future[None]:
        """Check every file of the plan first, then let DCP copy tensors from those bytes."""
        fs = cast(_VerifiedFileSystem, self.fs)
        error: CorruptCheckpointError | None = None
        try:
            for rel in sorted({self.storage_data[item.storage_index].relative_path for item in plan.items}):
                fs.checked[fs.relative(self.path / rel)] = fs.check(self.path / rel)
        except CorruptCheckpointError as err:
            error = err
        self._agree(error)
        return super().read_data(plan, planner)
