"""The trust store's checkpoint high-water records, read strictly and failing closed (torch-free).

Per run id the trust store keeps the highest generation signed or loaded here and its manifest sha256
(``<home>/checkpoints/run-<sha256 of the run id>.json``), and per root path the run it held
(``root-<sha256 of the resolved path>.json``). They are what refuses a rolled-back ``LATEST`` after the
newer generations were deleted, so a damaged record must never read as "nothing seen here":
a record that is not a regular file, not strict JSON (duplicate keys, ``NaN``), not an object, or
whose fields have the wrong type (generation ``2.0``, a list, a bool, a negative number; a digest
that is not 64 hex digits) raises ``DamagedRecordError`` naming the file and the command that
rebuilds it deliberately, ``mixle-parallel checkpoint repair-mark ROOT`` (``checkpoint_trust.repair_marks``).
Only a missing record means "nothing seen here yet".
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from pathlib import Path
from typing import Any

from ...contracts import ContractError
from ...contracts.bounded_json import CHECKPOINT_RECORD_LIMITS, parse_object
from ...contracts.safe_read import OversizeFileError, read_regular
from ...verification.keys import TrustStore
from .checkpoint_manifest import UntrustedCheckpointError, write_json_atomic

__all__ = ["REPAIR_COMMAND", "DamagedRecordError", "keep_damaged", "raise_marks",
           "read_root_record", "read_run_mark", "record_path", "write_root_record", "write_run_mark"]

REPAIR_COMMAND = "mixle-parallel checkpoint repair-mark"
"""The command (followed by the checkpoint root) that rebuilds a damaged record from the root's signed generations."""

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_MAX_GENERATION = 99_999_999


class DamagedRecordError(UntrustedCheckpointError):
    """A checkpoint high-water record is unreadable or malformed; it names the file and the repair command."""

    def __init__(self, path: Path, problem: str, root: Path | None) -> None:
        self.path, self.problem, self.root = path, problem, root
        where = str(root) if root is not None else "ROOT"
        super().__init__(
            f"checkpoint high-water record {path} is damaged ({problem}); it is not read as 'no generation seen', "
            f"because that would let a rolled-back checkpoint load. Find out who changed it; then rebuild it "
            f"deliberately from the root's signed generations with `{REPAIR_COMMAND} {where}`")


def record_path(store: TrustStore, kind: str, key: str) -> Path:
    """Where the ``kind`` ("run" or "root") record of ``key`` (a run id, or a resolved root path) lives."""
    return store.home / "checkpoints" / f"{kind}-{hashlib.sha256(key.encode('utf-8')).hexdigest()}.json"


def _read(path: Path, root: Path | None) -> dict[str, Any] | None:
    """The record's object; None when missing; ``DamagedRecordError`` for anything else that is not one."""
    try:
        data = read_regular(path, CHECKPOINT_RECORD_LIMITS.max_bytes, what="checkpoint high-water record")
    except FileNotFoundError:
        return None
    except (OSError, OversizeFileError) as exc:
        raise DamagedRecordError(path, f"unreadable: {exc}", root) from None
    try:
        return parse_object(data, CHECKPOINT_RECORD_LIMITS, what=str(path))
    except ContractError as exc:
        raise DamagedRecordError(path, f"not a strict JSON object: {exc}", root) from None


def _field(doc: dict[str, Any], name: str, path: Path, root: Path | None, *, digest: bool = False) -> Any:
    value = doc.get(name)
    if digest:
        if not isinstance(value, str) or not _SHA256.match(value):
            raise DamagedRecordError(path, f"{name} is {value!r}, not a sha256 of 64 hex digits", root)
    elif isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= _MAX_GENERATION:
        raise DamagedRecordError(path, f"{name} is {value!r} ({type(value).__name__}), not a generation number "
                                       f"from 1 to {_MAX_GENERATION}", root)
    return value


def read_run_mark(store: TrustStore, run_id: str, root: Path | None = None) -> tuple[int, str | None]:
    """The run's high-water mark, ``(0, None)`` when no record exists; ``DamagedRecordError`` when one is damaged.

    ``root`` only completes the repair command in the message.
    """
    path = record_path(store, "run", run_id)
    doc = _read(path, root)
    if doc is None:
        return 0, None
    if doc.get("run_id") != run_id:
        raise DamagedRecordError(path, f"it names run {doc.get('run_id')!r}, not {run_id!r}", root)
    return _field(doc, "generation", path, root), _field(doc, "manifest_sha256", path, root, digest=True)


def read_root_record(store: TrustStore, root: Path) -> str | None:
    """The run id ``root`` held here, None when no record exists; ``DamagedRecordError`` when one is damaged."""
    key = str(root.resolve())
    path = record_path(store, "root", key)
    doc = _read(path, root)
    if doc is None:
        return None
    run_id = doc.get("run_id")
    if doc.get("root") != key or not isinstance(run_id, str) or not run_id:
        raise DamagedRecordError(path, f"it is not the record of root {key} with a run id", root)
    return run_id


def write_run_mark(store: TrustStore, run_id: str, number: int, digest: str) -> None:
    """Record generation ``number`` (manifest ``digest``) as the run's high-water mark (atomically)."""
    path = record_path(store, "run", run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"run_id": run_id, "generation": number, "manifest_sha256": digest})


def write_root_record(store: TrustStore, root: Path, run_id: str) -> None:
    """Record that ``root`` holds run ``run_id`` (atomically)."""
    key = str(root.resolve())
    path = record_path(store, "root", key)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"root": key, "run_id": run_id})


def raise_marks(store: TrustStore, root: Path, run_id: str, number: int, digest: str) -> None:
    """Record generation ``number`` of ``run_id`` (if higher than its mark) and the run ``root`` holds.

    A damaged record raises (``DamagedRecordError``): it is never silently overwritten.
    """
    if number > read_run_mark(store, run_id, root)[0]:
        write_run_mark(store, run_id, number, digest)
    read_root_record(store, root)
    write_root_record(store, root, run_id)


def keep_damaged(path: Path) -> Path | None:
    """Move a damaged record aside (``<name>.damaged-<unix time>``, never deleted) before it is rebuilt; returns
    where it went, None when there was nothing there."""
    if not os.path.lexists(path):
        return None
    target = path.with_name(f"{path.name}.damaged-{int(time.time())}")
    os.replace(path, target)
    return target
