"""``files(paths_or_glob, columns=None)``: Parquet and ``.npy`` files the workers open themselves.

The driver reads only the files' metadata (Parquet footers, ``.npy`` headers: row counts, row groups,
columns); every chunk is a row range of one file, read and encoded by the worker that holds it
(:class:`FileChunk`). Parquet is read one row group at a time (the last one kept, so consecutive chunks
of a group read it once), ``.npy`` through a memory map. The workers must see the same paths as the
driver (a shared or replicated filesystem). Every open, the driver's and the workers', is of a regular file
(:func:`_regular`; links are followed): a FIFO or device planted under a data file's name, even after
``files()`` returned, is refused with ``contracts.safe_read.UnsafeFileError``, never read (a FIFO would block
the reader forever).
"""

from __future__ import annotations

import glob
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import attrs
import numpy as np

from ....contracts.safe_read import open_regular
from ..em_pass.chunks import EncodedChunk
from .arrow_rows import check_schema, table_rows
from .recipes import ChunkRecipe, encode_rows

__all__ = ["FILE_FORMATS", "FileChunk", "FilePart", "FileSource", "build_chunks", "file_recipes", "files",
           "forget_reads"]

FILE_FORMATS = {".parquet": "parquet", ".pq": "parquet", ".npy": "npy"}
"""File name endings ``files`` reads, and their format."""


@attrs.frozen
class FilePart:
    """One file of a source: its path, format, rows, and (Parquet) the rows of each row group."""

    path: str
    format: str
    rows: int
    row_groups: tuple[int, ...] = ()


def _expand(item: str) -> list[str]:
    """A path, a directory (its data files, recursively, in name order) or a glob (its matches in name order)."""
    if os.path.isdir(item):
        found = [os.path.join(root, name) for root, dirs, names in os.walk(item) for name in names
                 if not name.startswith((".", "_")) and os.path.splitext(name)[1].lower() in FILE_FORMATS]
        return sorted(found)
    if glob.has_magic(item):
        return sorted(p for p in glob.glob(item, recursive=True) if os.path.isfile(p))
    return [item]


def _paths(paths_or_glob: Any) -> tuple[str, ...]:
    items: Iterable[Any] = [paths_or_glob] if isinstance(paths_or_glob, (str, os.PathLike)) else paths_or_glob
    if not isinstance(items, Iterable):
        raise TypeError("files() takes a path, a glob, a directory or a list of them, got "
                        f"{type(paths_or_glob).__name__}")
    out: list[str] = []
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(f"files() takes paths (str or os.PathLike), got {type(item).__name__} {item!r}")
        found = _expand(os.fspath(item))
        if not found:
            raise FileNotFoundError(f"files(): {os.fspath(item)!r} matches no .parquet, .pq or .npy file")
        out.extend(os.path.abspath(p) for p in found)
    if not out:
        raise ValueError("files() was given no paths")
    return tuple(out)


def _format(path: str) -> str:
    fmt = FILE_FORMATS.get(os.path.splitext(path)[1].lower())
    if fmt is None:
        raise ValueError(f"files(): cannot read {path!r}: name Parquet files *.parquet or *.pq and numpy files *.npy")
    if not os.path.exists(path):
        raise FileNotFoundError(f"files(): {path!r} does not exist")
    return fmt


@contextmanager
def _regular(path: str) -> Iterator[str]:
    """A name to open ``path`` by, once it is shown to be a regular file (``contracts.safe_read``; links followed,
    a dataset may link its files): on Linux ``/proc/self/fd/N`` of the checked descriptor, so what is read is what
    was checked; elsewhere the path itself, checked just before."""
    with open_regular(path, what="data file", follow_symlinks=True) as opened:
        by_descriptor = f"/proc/self/fd/{opened.fileno()}"
        yield by_descriptor if os.path.exists(by_descriptor) else path


def _map_npy(path: str) -> np.ndarray:
    """The ``.npy`` file at ``path`` as a read-only memory map (the map outlives the checked descriptor)."""
    with _regular(path) as name:
        return np.load(name, mmap_mode="r", allow_pickle=False)


def _columns(columns: Any) -> tuple[Any, ...] | None:
    if columns is None:
        return None
    if isinstance(columns, (str, int)):
        columns = [columns]
    out = tuple(columns)
    if not out or not all(isinstance(c, str) for c in out) and not all(
            isinstance(c, (int, np.integer)) and not isinstance(c, bool) for c in out):
        raise TypeError(f"columns= takes Parquet column names or .npy column indices (ints), got {columns!r}")
    return tuple(c if isinstance(c, str) else int(c) for c in out)


def _npy_part(path: str, columns: tuple[Any, ...] | None) -> tuple[FilePart, tuple[int, ...]]:
    try:
        arr = _map_npy(path)
    except ValueError as exc:  # not a .npy file, or one holding pickled objects
        raise ValueError(f"files(): {path} is not a .npy array numpy can read without pickle ({exc}); save the rows "
                         "with numpy.save") from exc
    if arr.ndim not in (1, 2) or arr.dtype.kind not in "biuf":
        raise ValueError(f"files(): {path} holds a {arr.ndim}-D {arr.dtype} array; .npy rows must be a 1-D or 2-D "
                         "numeric array")
    if columns is not None:
        if arr.ndim != 2 or not all(isinstance(c, int) and -arr.shape[1] <= c < arr.shape[1] for c in columns):
            raise ValueError(f"files(): columns={list(columns)} do not index the columns of {path} (shape "
                             f"{arr.shape}); .npy columns are ints")
    return FilePart(path, "npy", int(arr.shape[0])), tuple(arr.shape[1:])


def _parquet_part(path: str, columns: tuple[Any, ...] | None) -> tuple[FilePart, tuple[str, ...]]:
    import pyarrow.parquet as pq

    if columns is not None and not all(isinstance(c, str) for c in columns):
        raise ValueError(f"files(): columns={list(columns)} must be column names for Parquet file {path}")
    with _regular(path) as name:
        try:
            meta = pq.ParquetFile(name).metadata
        except ValueError as exc:  # pyarrow's ArrowInvalid: not a Parquet file, or a torn one
            raise ValueError(f"files(): {path} is not a Parquet file pyarrow can read ({exc})") from exc
    names = check_schema(meta.schema.to_arrow_schema(), columns, f"file {path}")
    groups = tuple(int(meta.row_group(g).num_rows) for g in range(meta.num_row_groups))
    return FilePart(path, "parquet", int(meta.num_rows), groups), names


@attrs.frozen(eq=False)
class FileSource:
    """Rows in Parquet / ``.npy`` files, read by the workers (see :func:`files`); ``parts`` in order."""

    parts: tuple[FilePart, ...]
    columns: tuple[Any, ...] | None
    """The columns read (Parquet names, ``.npy`` indices); None: every column."""

    kind = "files"

    @property
    def num_rows(self) -> int:
        """Rows of every file together."""
        return sum(p.rows for p in self.parts)

    def __repr__(self) -> str:
        return f"files({len(self.parts)} file(s), {self.num_rows} rows, columns={self.columns})"


def files(paths_or_glob: Any, columns: Any = None) -> FileSource:
    """Rows kept in Parquet or ``.npy`` files, to pass as ``data=`` to ``fit``/``optimize``/``encoded_data``.

    ``paths_or_glob``: a path, a glob (``"table/*.parquet"``), a directory (its data files, recursively) or a
    list of them; files are taken in that order, each glob and directory in name order. ``columns``: Parquet
    column names or ``.npy`` column indices (default: every column; numeric scalar columns, or one column of
    number lists). Only the metadata is read here; the workers read the rows, each its own chunks.
    """
    chosen = _columns(columns)
    parts: list[FilePart] = []
    layouts: dict[Any, str] = {}
    for path in _paths(paths_or_glob):
        fmt = _format(path)
        part, shape = _npy_part(path, chosen) if fmt == "npy" else _parquet_part(path, chosen)
        parts.append(part)
        layouts.setdefault((fmt, shape if chosen is None or fmt == "parquet" else (len(chosen),)), path)
    if len(layouts) > 1:
        first, other = list(layouts.items())[:2]
        raise ValueError(f"files(): {first[1]} and {other[1]} differ in format or columns ({first[0]} vs {other[0]}); "
                         "give files of one format and the same columns (or pick them with columns=)")
    if sum(p.rows for p in parts) == 0:
        raise ValueError("files(): the files hold no rows; pass at least one row to fit")
    return FileSource(tuple(parts), chosen)


@attrs.frozen(kw_only=True)
class FileChunk(ChunkRecipe):
    """A chunk that is rows ``[offset, stop_offset)`` of one file, read where it is built."""

    path: str
    format: str
    columns: tuple[Any, ...] | None
    row_groups: tuple[int, ...] = ()

    @property
    def where(self) -> str:
        """The file, in words."""
        return f"file {self.path}"

    def rows(self) -> Any:
        """The rows, read from the file here."""
        if self.format == "npy":
            return _npy_rows(self.path, self.columns, self.offset, self.stop_offset)
        return _parquet_rows(self, self.offset, self.stop_offset)


def file_recipes(source: FileSource, places: Sequence[Any], encoder: Any) -> list[FileChunk]:
    """One :class:`FileChunk` per chunk place of ``source``."""
    out = []
    for p in places:
        part = source.parts[p.part]
        out.append(FileChunk(chunk_id=p.chunk_id, start=p.start, stop=p.stop, part=p.part, offset=p.offset,
                             stop_offset=p.stop_offset, encoder=encoder, path=part.path, format=part.format,
                             columns=source.columns, row_groups=part.row_groups))
    return out


# ---- reading, on the worker -------------------------------------------------------------------------
_LOCK = threading.Lock()
_OPEN: OrderedDict[str, Any] = OrderedDict()
"""Recently opened Parquet files of this process (their footers parsed once), at most ``_OPEN_FILES``."""
_OPEN_FILES = 8
_GROUP: dict[str, Any] = {}
"""The last row group read in this process: ``{"key": (path, group, columns), "rows": array}``."""


def _npy_rows(path: str, columns: tuple[Any, ...] | None, lo: int, hi: int) -> np.ndarray:
    return _mapped_rows(_map_npy(path), columns, lo, hi)


def _mapped_rows(mapped: np.ndarray, columns: tuple[Any, ...] | None, lo: int, hi: int) -> np.ndarray:
    rows = mapped[lo:hi] if columns is None else mapped[lo:hi, list(columns)]
    return np.array(rows)  # memory of its own: the chunk outlives the map


def build_chunks(recipes: Sequence[FileChunk]) -> list[EncodedChunk]:
    """Every recipe's chunk built here, as :meth:`FileChunk.build` builds it, each ``.npy`` file mapped once for
    all of its chunks (a batch of the audit's references reads dozens of one file's ranges)."""
    maps: dict[str, np.ndarray] = {}
    out = []
    for recipe in recipes:
        if recipe.format != "npy":
            out.append(recipe.build())
            continue
        mapped = maps.get(recipe.path)
        if mapped is None:
            mapped = maps[recipe.path] = _map_npy(recipe.path)
        out.append(encode_rows(recipe, _mapped_rows(mapped, recipe.columns, recipe.offset, recipe.stop_offset)))
    return out


def _parquet_file(path: str) -> Any:
    import pyarrow.parquet as pq

    handle = _OPEN.pop(path, None)
    if handle is None:
        with _regular(path) as name:
            handle = pq.ParquetFile(name, memory_map=True)
    _OPEN[path] = handle
    while len(_OPEN) > _OPEN_FILES:
        _OPEN.popitem(last=False)
    return handle


def _group_rows(chunk: FileChunk, group: int, first_row: int) -> np.ndarray:
    key = (chunk.path, group, chunk.columns)
    if _GROUP.get("key") != key:
        handle = _parquet_file(chunk.path)
        names = check_schema(handle.schema_arrow, chunk.columns, chunk.where)
        table = handle.read_row_group(group, columns=list(names))
        _GROUP.update(key=key, rows=table_rows(table, names, chunk.where, first_row))
    rows: np.ndarray = _GROUP["rows"]  # the array cached just above
    return rows


def _parquet_rows(chunk: FileChunk, lo: int, hi: int) -> np.ndarray:
    """Rows ``[lo, hi)`` of a Parquet file: the row groups that hold them, one at a time."""
    pieces = []
    first = 0
    with _LOCK:
        for group, rows in enumerate(chunk.row_groups):
            a, b = max(lo, first), min(hi, first + rows)
            if a < b:
                pieces.append(_group_rows(chunk, group, first)[a - first:b - first])
            first += rows
    if not pieces:
        raise ValueError(f"{chunk.where} holds no rows {lo}..{hi - 1}; it changed since files() read its metadata")
    return np.array(pieces[0]) if len(pieces) == 1 else np.concatenate(pieces)


def forget_reads() -> None:
    """Drop this process's cached row group and open files (after a driver-side build, say)."""
    with _LOCK:
        _GROUP.clear()
        _OPEN.clear()
