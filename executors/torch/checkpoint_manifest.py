"""Torch-free half of checkpoints: JSON state codec, generation folders, manifest, pointer.

A checkpoint root holds generations and one pointer::

    ROOT/LATEST                      pointer (JSON): {"generation": "gen-00000003", "manifest_sha256": ...}
    ROOT/CURRENT, ROOT/_SUCCESS      mixle 0.8.2's pointer name and completion marker (written after LATEST)
    ROOT/gen-00000003/MANIFEST.json  sha256 and size of every other file of the generation
    ROOT/gen-00000003/MANIFEST.sig   Ed25519-signed statement over the manifest (``checkpoint_trust``)
    ROOT/gen-00000003/_SUCCESS       completion marker, written when the generation is published
    ROOT/gen-00000003/state.json     global non-tensor state (clocks, scheduler, optimizer hyper-parameters)
    ROOT/gen-00000003/ranks/rank-00000.json   rank-local state (RNG, loader position)
    ROOT/gen-00000003/dcp/...        tensors, written by torch.distributed.checkpoint

A save writes a new generation folder, then its manifest, then replaces the pointer (temporary
file + ``os.replace``); a reader trusts only what the pointer names and only after every file
matches the manifest, so a crash at any moment leaves the previous checkpoint readable and a
torn or tampered one is refused with an error naming the file. Everything written here is
JSON (no pickle); non-JSON values use a small tagged encoding (``to_json_value``). Every file is read
through ``contracts.safe_read`` (a regular file, never a link, FIFO or device, within its size) and
every document is decoded by the one strict parser (``contracts.bounded_json``).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import math
import os
import re
import stat
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ...contracts import ContractError
from ...contracts.bounded_json import CHECKPOINT_STATE_LIMITS, MANIFEST_LIMITS, DocumentLimits, parse_object
from ...contracts.safe_read import OversizeFileError, describe_kind, open_regular, read_regular

FORMAT = "mixle-parallel-checkpoint"
"""Value of the ``format`` field of every JSON document a checkpoint holds."""
FORMAT_VERSION = 1
"""Version of the layout; a reader refuses other versions."""
POINTER_NAME = "LATEST"
MIXLE_POINTER_NAME = "CURRENT"
"""mixle 0.8.2's name for the pointer: written with the same content after ``LATEST`` (readers here use ``LATEST``)."""
SUCCESS_NAME = "_SUCCESS"
"""mixle 0.8.2's completion marker, written in the generation and at the root once the generation is published."""
MANIFEST_NAME = "MANIFEST.json"
SIGNATURE_NAME = "MANIFEST.sig"
"""The manifest's signature (see ``checkpoint_trust``); like the manifest, not listed in it."""
STATE_NAME = "state.json"
RANKS_DIR = "ranks"
DCP_DIR = "dcp"
GENERATION_PREFIX = "gen-"
_GENERATION_RE = re.compile(r"^gen-(\d{8})$")
TAG = "__mp_type__"
"""Key that marks a tagged (non-plain-JSON) value in checkpoint JSON."""


class CheckpointError(RuntimeError):
    """A checkpoint cannot be saved or loaded as asked; the message says why and what to do."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint file is missing, torn or does not match its manifest; ``path`` names it."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(
            f"checkpoint file {self.path}: {problem}. The checkpoint is incomplete or corrupted "
            "and was refused; load an earlier generation (pass its gen-* folder) or save again"
        )

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        """Picklable with its fields (DCP gathers its readers' errors across ranks)."""
        return (type(self), (self.path, self.problem))


class UntrustedCheckpointError(CheckpointError):
    """A checkpoint is unsigned, signed by an untrusted key, altered since signing, foreign, or a rollback
    (signatures and lineage: ``checkpoint_trust``, which exports it)."""


class WorldSizeChangeError(CheckpointError):
    """A checkpoint saved at one world size was loaded at another without permission."""


# ---- JSON codec -----------------------------------------------------------------------------
def to_json_value(value: Any, *, where: str = "state",
                  default: Callable[[Any, str], Any] | None = None) -> Any:
    """Encode plain data as JSON, tagging tuples, non-finite floats, non-str keys and arrays.

    ``default(value, where)`` encodes any other type (the torch side passes tensors through it)
    and returns NotImplemented for types it does not know; those raise a ``TypeError`` naming
    ``where``.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        if abs(value) > CHECKPOINT_STATE_LIMITS.max_int:  # beyond what the strict parser reads back as a number
            return {TAG: "int", "value": str(int(value))}
        return int(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return {TAG: "float", "value": repr(value)}
    if isinstance(value, np.generic) and not isinstance(value, (np.void, np.object_)):
        return to_json_value(value.item(), where=where, default=default)
    if isinstance(value, np.ndarray):
        return _encode_array(value, where)
    if isinstance(value, list):
        return [to_json_value(v, where=f"{where}[{i}]", default=default) for i, v in enumerate(value)]
    if isinstance(value, tuple):
        return {TAG: "tuple",
                "items": [to_json_value(v, where=f"{where}[{i}]", default=default)
                          for i, v in enumerate(value)]}
    if isinstance(value, Mapping):
        if all(isinstance(k, str) for k in value) and TAG not in value:
            return {k: to_json_value(v, where=f"{where}[{k!r}]", default=default)
                    for k, v in value.items()}
        return {TAG: "dict",
                "items": [[to_json_value(k, where=f"{where} key {k!r}", default=default),
                           to_json_value(v, where=f"{where}[{k!r}]", default=default)]
                          for k, v in value.items()]}
    if default is not None:
        encoded = default(value, where)
        if encoded is not NotImplemented:
            return encoded
    raise TypeError(
        f"{where} is a {type(value).__module__}.{type(value).__qualname__}, which checkpoint JSON "
        "cannot hold; pass plain data (numbers, strings, lists, dicts, tuples, numpy arrays, "
        "tensors) — checkpoints never pickle"
    )


def from_json_value(doc: Any, *, where: str = "state",
                    decoders: Mapping[str, Callable[[Mapping[str, Any], str], Any]] | None = None) -> Any:
    """Inverse of ``to_json_value``; ``decoders`` maps extra tag names to decoding functions."""
    if isinstance(doc, list):
        return [from_json_value(v, where=f"{where}[{i}]", decoders=decoders) for i, v in enumerate(doc)]
    if not isinstance(doc, dict):
        return doc
    tag = doc.get(TAG)
    if tag is None:
        return {k: from_json_value(v, where=f"{where}[{k!r}]", decoders=decoders) for k, v in doc.items()}
    if tag == "float":
        return float(doc["value"])
    if tag == "int":
        return int(doc["value"])
    if tag == "tuple":
        return tuple(from_json_value(v, where=f"{where}[{i}]", decoders=decoders)
                     for i, v in enumerate(doc["items"]))
    if tag == "dict":
        return {_hashable(from_json_value(k, where=f"{where} key", decoders=decoders)):
                from_json_value(v, where=f"{where}[{k!r}]", decoders=decoders) for k, v in doc["items"]}
    if tag == "ndarray":
        return _decode_array(doc)
    if decoders and tag in decoders:
        return decoders[tag](doc, where)
    raise CheckpointError(f"{where}: unknown tagged value {tag!r}; was it written by a newer version?")


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


def _encode_array(array: np.ndarray, where: str) -> dict[str, Any]:
    if array.dtype.hasobject or array.dtype.fields is not None:
        raise TypeError(f"{where} is a numpy array of dtype {array.dtype}, which checkpoint JSON cannot hold")
    little = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    return {TAG: "ndarray", "dtype": array.dtype.str.lstrip("<>|="), "shape": list(array.shape),
            "data": base64.b64encode(little.tobytes()).decode("ascii")}


def _decode_array(doc: Mapping[str, Any]) -> np.ndarray:
    dtype = np.dtype("<" + doc["dtype"]) if np.dtype(doc["dtype"]).itemsize > 1 else np.dtype(doc["dtype"])
    flat = np.frombuffer(base64.b64decode(doc["data"]), dtype=dtype)
    return flat.reshape(doc["shape"]).astype(dtype.newbyteorder("="), copy=True)


# ---- files ----------------------------------------------------------------------------------
def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # platforms without directory descriptors
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: str | os.PathLike[str], doc: Any) -> bytes:
    """Write ``doc`` as JSON to ``path`` through a temporary file and ``os.replace``; returns the bytes."""
    target = Path(path)
    data = (json.dumps(doc, sort_keys=True, indent=1, allow_nan=False) + "\n").encode("utf-8")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(target.parent)
    return data


def parse_json(data: bytes, path: str | os.PathLike[str], *, what: str, limits: DocumentLimits | None = None) -> Any:
    """Decode checkpoint JSON from bytes already read (and checked); anything but strict JSON is a
    ``CorruptCheckpointError``.

    The one strict parser (``contracts.bounded_json``): no duplicate keys, no NaN/Infinity, bounded size, depth
    and items (``limits``: the manifest and pointer use ``MANIFEST_LIMITS``; state and rank files, default,
    ``CHECKPOINT_STATE_LIMITS``), and a JSON object at the top level.
    """
    try:
        return parse_object(data, limits or CHECKPOINT_STATE_LIMITS, what=f"{what} {path}")
    except ContractError as err:
        raise CorruptCheckpointError(path, f"the {what} is not valid JSON, likely a torn write ({err})") from None


def read_json(path: str | os.PathLike[str], *, what: str, limits: DocumentLimits | None = None) -> Any:
    """Read a checkpoint JSON document that no manifest covers (the pointer); missing, torn, or anything but a
    regular file (a link, FIFO, device) is refused naming it."""
    try:
        data = _read_no_follow(Path(path), _MAX_POINTER_BYTES)
    except FileNotFoundError:
        raise CorruptCheckpointError(path, f"the {what} is missing") from None
    return parse_json(data, path, what=what, limits=limits)


_MAX_POINTER_BYTES = 1 << 16
_MAX_MANIFEST_BYTES = MANIFEST_LIMITS.max_bytes


def _read_no_follow(path: Path, limit: int) -> bytes:
    """All bytes of the regular file ``path`` (``safe_read``: never a link, FIFO or device), at most ``limit``.

    ``FileNotFoundError`` passes through; every other refusal is a ``CorruptCheckpointError`` naming the file.
    """
    try:
        return read_regular(path, limit, what="checkpoint file")
    except OversizeFileError as err:
        held = f"{err.size} bytes" if err.size is not None else f"more than {limit} bytes"
        raise CorruptCheckpointError(path, f"{held} where at most {limit} are expected (truncated or "
                                           "rewritten): refused before decoding") from None
    except FileNotFoundError:
        raise
    except OSError as err:  # UnsafeFileError (a link, FIFO, device, socket, folder) or unreadable
        raise CorruptCheckpointError(path, f"cannot be read as a regular file ({err})") from None


def read_verified(generation_dir: Path, manifest: Mapping[str, Any], rel: str) -> bytes:
    """The bytes of file ``rel`` of a generation, read once and checked against the manifest's size and sha256.

    The caller uses exactly these bytes (nothing reopens the file by path afterwards), so a file swapped at
    any moment is either the checked one or refused. A symlink or an unlisted file is refused.
    """
    path = generation_dir / rel
    entry = manifest["files"].get(rel)
    if not isinstance(entry, dict):
        raise CorruptCheckpointError(path, "not listed in the manifest")
    try:
        data = _read_no_follow(path, int(entry.get("bytes", -1)) if isinstance(entry.get("bytes"), int) else 0)
    except FileNotFoundError:
        raise CorruptCheckpointError(path, "missing (the manifest lists it)") from None
    if len(data) != entry.get("bytes"):
        raise CorruptCheckpointError(path, f"{len(data)} bytes where the manifest records {entry.get('bytes')} "
                                           "(truncated or rewritten)")
    if hashlib.sha256(data).hexdigest() != entry.get("sha256"):
        raise CorruptCheckpointError(path, "its sha256 differs from the manifest's (corrupted or swapped)")
    return data


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open_regular(path, what="checkpoint file") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _check_header(doc: Any, path: Path, what: str) -> dict[str, Any]:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CorruptCheckpointError(path, f"the {what} is not a {FORMAT} document")
    if doc.get("version") != FORMAT_VERSION:
        raise CorruptCheckpointError(
            path, f"the {what} has layout version {doc.get('version')!r}; this reader knows {FORMAT_VERSION}")
    return doc


# ---- generations, manifest, pointer ---------------------------------------------------------
def generation_name(number: int) -> str:
    """Folder name of generation ``number``: ``gen-%08d``."""
    return f"{GENERATION_PREFIX}{number:08d}"


def generation_number(name: str) -> int | None:
    """The number of a ``gen-%08d`` folder name, or None for any other name."""
    match = _GENERATION_RE.match(name)
    return int(match.group(1)) if match else None


def next_generation(root: str | os.PathLike[str], *, after: int | None = None) -> str:
    """Name for a new generation: the first free ``gen-*`` name past ``after``.

    ``after`` defaults to the generation the pointer names (0 without one), so stray or planted folders
    (``gen-99999999``) never push the number out of range; a name already taken is skipped.
    """
    root = Path(root)
    if after is None:
        after = 0
        if (root / POINTER_NAME).is_file():
            with contextlib.suppress(CheckpointError, OSError):
                after = generation_number(resolve(root)[0].name) or 0
    for number in range(after + 1, _LAST_GENERATION + 1):
        if not os.path.lexists(root / generation_name(number)):
            return generation_name(number)
    raise CheckpointError(f"no free generation name past gen-{after:08d} under {root}; start a new checkpoint root")


_LAST_GENERATION = 99_999_999


def create_generation(root: str | os.PathLike[str], name: str) -> Path:
    """Create the (new, empty) folders of generation ``name`` under ``root``."""
    gen = Path(root) / name
    gen.mkdir(parents=True, exist_ok=False)
    (gen / RANKS_DIR).mkdir()
    (gen / DCP_DIR).mkdir()
    return gen


def rank_file(generation_dir: str | os.PathLike[str], rank: int) -> Path:
    """Path of the rank-local state file of ``rank``."""
    return Path(generation_dir) / RANKS_DIR / f"rank-{rank:05d}.json"


def _listed_files(generation_dir: Path) -> list[str]:
    return sorted(p.relative_to(generation_dir).as_posix() for p in generation_dir.rglob("*")
                  if p.is_file() and p.name not in (MANIFEST_NAME, SIGNATURE_NAME, SUCCESS_NAME))


def write_manifest(generation_dir: str | os.PathLike[str], *, world_size: int,
                   info: Mapping[str, Any] | None = None) -> str:
    """Hash every file of the generation into MANIFEST.json; returns the manifest's sha256."""
    gen = Path(generation_dir)
    files = {rel: {"sha256": sha256_file(gen / rel), "bytes": (gen / rel).stat().st_size}
             for rel in _listed_files(gen)}
    doc = {"format": FORMAT, "version": FORMAT_VERSION, "kind": "manifest", "generation": gen.name,
           "world_size": world_size, "created_unix": time.time(), "files": files, "info": dict(info or {})}
    return hashlib.sha256(write_json_atomic(gen / MANIFEST_NAME, doc)).hexdigest()


def publish(root: str | os.PathLike[str], generation: str, manifest_sha256: str) -> None:
    """Make ``generation`` the one a reader loads: atomically replace the pointer file.

    mixle 0.8.2's markers follow (``_SUCCESS`` in the generation, the ``CURRENT`` pointer, ``_SUCCESS`` at the
    root), so tools that look for them find a published checkpoint; a failed save writes none of them.
    """
    root = Path(root)
    pointer = {"format": FORMAT, "version": FORMAT_VERSION, "kind": "pointer",
               "generation": generation, "manifest_sha256": manifest_sha256}
    marker = {"format": FORMAT, "version": FORMAT_VERSION, "kind": "success", "generation": generation}
    write_json_atomic(root / generation / SUCCESS_NAME, marker)
    write_json_atomic(root / POINTER_NAME, pointer)
    write_json_atomic(root / MIXLE_POINTER_NAME, pointer)
    write_json_atomic(root / SUCCESS_NAME, marker)


def resolve(path: str | os.PathLike[str]) -> tuple[Path, str | None]:
    """The generation folder ``path`` designates and the manifest sha256 its pointer records.

    ``path`` is a checkpoint root (its pointer is followed) or one ``gen-*`` folder (loaded as
    is; its manifest is still checked file by file, but no pointer vouches for the manifest).
    """
    root = Path(path)
    pointer = root / POINTER_NAME
    if os.path.lexists(pointer):  # a link, FIFO or device there is refused by the read, naming it
        document = read_json(pointer, what="checkpoint pointer", limits=MANIFEST_LIMITS)
        doc = _check_header(document, pointer, "checkpoint pointer")
        name, digest = doc.get("generation"), doc.get("manifest_sha256")
        if not isinstance(name, str) or not _GENERATION_RE.match(name) or not isinstance(digest, str):
            raise CorruptCheckpointError(pointer, "the pointer lacks a valid generation name or manifest sha256")
        return root / name, digest
    if (root / MANIFEST_NAME).is_file() or _GENERATION_RE.match(root.name):
        return root, None
    if not root.exists():
        raise CheckpointError(f"no checkpoint at {root}: the folder does not exist")
    unpublished = sorted(p.name for p in root.iterdir() if _GENERATION_RE.match(p.name))
    if unpublished:
        raise CorruptCheckpointError(
            pointer, f"the pointer is missing although generations {unpublished} exist (a save that "
                     "never published?)")
    raise CheckpointError(f"no checkpoint at {root}: neither a {POINTER_NAME} pointer nor a {MANIFEST_NAME}")


def read_manifest(generation_dir: Path, expected_sha256: str | None) -> dict[str, Any]:
    """Read and check the manifest (its own sha256 against the pointer's record)."""
    path = generation_dir / MANIFEST_NAME
    try:
        data = _read_no_follow(path, _MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        raise CorruptCheckpointError(path, "the manifest is missing (the save never finished?)") from None
    if expected_sha256 is not None and hashlib.sha256(data).hexdigest() != expected_sha256:
        raise CorruptCheckpointError(path, "the manifest's sha256 differs from the one the pointer records")
    doc = _check_header(parse_json(data, path, what="manifest", limits=MANIFEST_LIMITS), path, "manifest")
    if doc.get("generation") != generation_dir.name or not isinstance(doc.get("files"), dict) \
            or not isinstance(doc.get("world_size"), int):
        raise CorruptCheckpointError(path, "the manifest names another generation or lacks files/world_size")
    return doc


def manifest_problems(generation_dir: Path, manifest: Mapping[str, Any], *,
                      shard: int = 0, shards: int = 1, contents: bool = True) -> list[tuple[str, str]]:
    """``(file, problem)`` pairs for the files of share ``shard`` of ``shards`` (file i: i % shards).

    ``contents=False`` checks presence, size and unlisted files only: a load hashes each file on the bytes
    it uses (``read_verified``), so it reads every file once.
    """
    problems: list[tuple[str, str]] = []
    listed = manifest["files"]
    for index, rel in enumerate(sorted(listed)):
        if index % shards != shard:
            continue
        entry, file = listed[rel], generation_dir / rel
        try:
            info: os.stat_result | None = os.lstat(file)
        except OSError:
            info = None
        if info is None:
            problems.append((str(file), "missing (the manifest lists it)"))
        elif not stat.S_ISREG(info.st_mode):
            problems.append((str(file), f"{describe_kind(info.st_mode)}, not a regular file (refused unread)"))
        elif info.st_size != entry.get("bytes"):
            problems.append((str(file), f"{info.st_size} bytes where the manifest records "
                                        f"{entry.get('bytes')} (truncated or rewritten)"))
        elif contents and sha256_file(file) != entry.get("sha256"):
            problems.append((str(file), "its sha256 differs from the manifest's (corrupted)"))
    if shard == 0:
        for rel in _listed_files(generation_dir):
            if rel not in listed:
                problems.append((str(generation_dir / rel), "not listed in the manifest"))
    return problems


# ---- rank-local state rule ------------------------------------------------------------------
def derive_seed(*material: Any) -> int:
    """A 63-bit seed from JSON-able material: sha256 of its canonical JSON, first 8 bytes."""
    text = json.dumps(list(material), sort_keys=True, separators=(",", ":"))
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big") & ((1 << 63) - 1)


def rederived_loader_state(saved: Iterable[Any], *, new_world_size: int) -> Any:
    """The loader state every rank gets after a world-size change: the common saved value.

    Rank-local loader positions cannot be mapped to another world size in general, so the rule
    is that a reshardable loader state is global (the same on every rank: e.g. epoch and samples
    consumed, from which each rank derives its shard by rank and world size). Different values
    are refused with the ranks that differ.
    """
    states = list(saved)
    first = states[0] if states else None
    differing = [r for r, s in enumerate(states) if s != first]
    if differing:
        raise CheckpointError(
            f"cannot re-derive the loader state for world size {new_world_size}: saved ranks "
            f"{differing} hold a loader state different from rank 0's ({first!r}); save a "
            "world-size-independent loader state (the same on every rank, e.g. epoch and "
            "samples consumed) or pass loader_state=None and reposition the loader yourself"
        )
    return first
