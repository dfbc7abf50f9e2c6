"""Signed checkpoint manifests and rollback protection (torch-free).

At save, rank 0 signs ``MANIFEST.json`` before publishing: ``MANIFEST.sig`` beside it is a DSSE
envelope (in-toto Statement, subject the generation) whose predicate binds the manifest's sha256,
the run id, the generation number and the previous generation's name and manifest sha256 (a save
continues the run ``LATEST`` names; a root without one starts a new run id). The trust store keeps,
per run id, the highest generation signed or loaded here and its manifest sha256
(``<home>/checkpoints/run-<sha256 of the run id>.json``), and per root path the run it held
(``root-<sha256 of the path>.json``); both are raised on every save and every load.
At load, before any file of the checkpoint is unpickled or any state changes, ``verify_generation``
checks the signature against trusted, unrevoked keys, that the generation folder is no symlink and
its name is the signed number, and (unless ``allow_rollback=True``) its lineage: the root held no
other run here, the previous generation, if present, is the signed one of the same run, and no
newer generation of the run was signed or seen here (a rollback). ``trust="unsigned"`` is the
explicit opt-out for checkpoints of an older
release or a machine whose key is not trusted here; it is logged.
"""

from __future__ import annotations

import logging
import os
import re
import uuid
from pathlib import Path
from typing import Any

import attrs

from ...contracts import CertificateEnvelope, ContractError, NotAdmittedError, from_dict, to_dict
from ...contracts.bounded_json import (
    MANIFEST_LIMITS,
    MANIFEST_SIGNATURE_LIMITS,
    SIGNED_LIMITS,
    parse_json,
    read_limited,
)
from ...verification.attestation import CHECKPOINT_MANIFEST_PREDICATE, STATEMENT_TYPE, open_statement, sign_statement
from ...verification.keys import TrustStore, TrustStoreError
from .checkpoint_manifest import (
    MANIFEST_NAME,
    POINTER_NAME,
    SIGNATURE_NAME,
    CheckpointError,
    CorruptCheckpointError,
    UntrustedCheckpointError,
    create_generation,
    generation_number,
    next_generation,
    read_json,
    resolve,
    write_json_atomic,
)
from .checkpoint_marks import (
    DamagedRecordError,
    keep_damaged,
    raise_marks,
    read_root_record,
    read_run_mark,
    record_path,
    write_root_record,
    write_run_mark,
)

__all__ = ["CHECKPOINT_TRUST_MODES", "MANIFEST_TYPE", "SIGNATURE_NAME", "DamagedRecordError", "Lineage",
           "UntrustedCheckpointError", "generation_lineage", "lineage_for_save", "locate_generation", "open_generation",
           "repair_marks", "sign_generation", "verify_generation"]


MANIFEST_TYPE = CHECKPOINT_MANIFEST_PREDICATE
"""Predicate type of a checkpoint manifest signature."""

CHECKPOINT_TRUST_MODES = ("signed", "unsigned")
"""``trust=`` values of ``load_checkpoint``: require a trusted signature (default), or skip it."""

_GENERATION = re.compile(r"^gen-(\d{8})$")
_log = logging.getLogger(__name__)


@attrs.frozen
class Lineage:
    """What a generation's signature binds besides its manifest: run, number, and the generation before it."""

    run_id: str
    number: int
    previous: str | None = None
    previous_manifest_sha256: str | None = None


def _number(generation: str) -> int:
    match = _GENERATION.match(generation)
    if match is None:
        raise UntrustedCheckpointError(f"{generation!r} is not a generation folder name")
    return int(match.group(1))


def _run_mark(store: TrustStore, run_id: str, root: Path) -> tuple[int, str | None]:
    return read_run_mark(store, run_id, root)


def _raise_marks(store: TrustStore, root: Path, lineage: Lineage, digest: str) -> None:
    """Record generation ``lineage.number`` of its run (if higher) and the run this root holds."""
    raise_marks(store, root, lineage.run_id, lineage.number, digest)


def lineage_for_save(root: Path, *, trust_store: TrustStore | None = None) -> Lineage:
    """The lineage of the next generation under ``root``: continue the run ``LATEST`` names when its
    signature verifies here, else start a new run id. ``number`` is the least it may be (past the pointer's
    generation and past every generation of the run signed or seen here)."""
    store = trust_store or TrustStore()
    try:
        pointer = read_json(root / POINTER_NAME, what="checkpoint pointer", limits=MANIFEST_LIMITS)
        previous = root / pointer["generation"]
        digest, lineage = _signed(previous, store)
    except (OSError, ValueError, KeyError, TypeError, CheckpointError):
        return Lineage(run_id=uuid.uuid4().hex, number=1)
    after = max(lineage.number, _run_mark(store, lineage.run_id, root)[0])
    return Lineage(run_id=lineage.run_id, number=after + 1, previous=previous.name, previous_manifest_sha256=digest)


def open_generation(root: Path, *, trust_store: TrustStore | None = None) -> tuple[str, Lineage]:
    """Rank 0 of a save: create the next generation folder under ``root`` (planted or stray ``gen-*`` folders are
    skipped) and return its name with the lineage it will be signed with (the run ``LATEST`` names, continued)."""
    root.mkdir(parents=True, exist_ok=True)
    lineage = lineage_for_save(root, trust_store=trust_store)
    name = next_generation(root, after=lineage.number - 1)
    create_generation(root, name)
    return name, attrs.evolve(lineage, number=int(name.removeprefix("gen-")))


def sign_generation(generation_dir: str | os.PathLike[str], manifest_sha256: str, lineage: Lineage, *,
                    trust_store: TrustStore | None = None) -> Path:
    """Write ``MANIFEST.sig`` over the manifest's sha256 and ``lineage``; raise the run's high-water mark."""
    gen = Path(generation_dir)
    store = trust_store or TrustStore()
    if _number(gen.name) != lineage.number:
        raise CheckpointError(f"{gen} is not generation {lineage.number}")
    statement = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": gen.name, "digest": {"sha256": manifest_sha256}}],
        "predicateType": MANIFEST_TYPE,
        "predicate": {"generation": gen.name, "manifest_sha256": manifest_sha256, "run_id": lineage.run_id,
                      "number": lineage.number, "previous": lineage.previous,
                      "previous_manifest_sha256": lineage.previous_manifest_sha256},
    }
    envelope = sign_statement(statement, store.ensure_signer())
    target = gen / SIGNATURE_NAME
    write_json_atomic(target, to_dict(envelope))
    _raise_marks(store, gen.parent, lineage, manifest_sha256)
    return target


_HINT = ("load it with trust='unsigned' if you know where it came from, or trust its signer's key "
         "(`mixle-parallel keys trust PUBKEY`)")


def _signed(generation_dir: Path, store: TrustStore) -> tuple[str, Lineage]:
    """(manifest sha256, lineage) a trusted key signed for this generation; ``UntrustedCheckpointError`` otherwise."""
    path = generation_dir / SIGNATURE_NAME
    if generation_dir.is_symlink():
        raise UntrustedCheckpointError(f"{generation_dir} is a symlink; a generation is a folder of its own root")
    try:
        document = parse_json(read_limited(path, MANIFEST_SIGNATURE_LIMITS), MANIFEST_SIGNATURE_LIMITS,
                              what=f"manifest signature {path}")
        envelope = from_dict(document, CertificateEnvelope, limits=SIGNED_LIMITS)
        statement, _ = open_statement(envelope, store, predicate_type=MANIFEST_TYPE)
        predicate = statement["predicate"]
        digest, generation = predicate["manifest_sha256"], predicate["generation"]
        lineage = Lineage(run_id=predicate["run_id"], number=predicate["number"], previous=predicate["previous"],
                          previous_manifest_sha256=predicate["previous_manifest_sha256"])
    except FileNotFoundError:
        raise UntrustedCheckpointError(f"checkpoint {generation_dir} is unsigned (no {SIGNATURE_NAME}); "
                                       + _HINT) from None
    except NotAdmittedError as exc:
        raise UntrustedCheckpointError(f"{path}: {'; '.join(exc.reasons)}; " + _HINT) from None
    except (OSError, ValueError, UnicodeDecodeError, RecursionError, ContractError, KeyError, TypeError) as exc:
        raise UntrustedCheckpointError(f"{path} is not a manifest signature of this release ({exc}); "
                                       + _HINT) from None
    if generation != generation_dir.name or not isinstance(digest, str) or lineage.number != _number(generation) \
            or not isinstance(lineage.run_id, str):
        raise UntrustedCheckpointError(f"{path} signs generation {generation!r} (number {lineage.number!r}), "
                                       f"not {generation_dir.name}")
    return digest, lineage


def generation_lineage(generation_dir: str | os.PathLike[str], *, trust_store: TrustStore | None = None
                       ) -> tuple[str, Lineage]:
    """(manifest sha256, lineage) a trusted key signed for a generation, checked without recording anything
    in the trust store (an auditor's check); ``UntrustedCheckpointError`` otherwise."""
    return _signed(Path(generation_dir), trust_store or TrustStore())


MAX_NEWER_CANDIDATES = 32
"""Most ``gen-*`` folders numbered above a generation whose signatures a load opens to look for a newer one of
the same run (nearest first). The trust store's high-water mark is what refuses a rollback for sure; this scan
only adds what another machine signed, and must not let planted folders make a load slow."""


def _newest_signed(root: Path, store: TrustStore, run_id: str, above: int) -> int:
    """A generation of run ``run_id`` numbered above ``above`` and validly signed in ``root``, else 0.

    Work is bounded whatever was planted: only folders numbered above ``above`` are candidates, nearest first,
    at most ``MAX_NEWER_CANDIDATES`` signatures are opened, each read through ``safe_read`` under
    ``SIGNATURE_LIMITS`` (an oversized, linked or FIFO signature is refused from ``fstat``, unread), and the scan
    stops at the first that verifies (one proves the rollback).
    """
    numbers = sorted(n for n in (generation_number(name) for name in _names(root)) if n is not None and n > above)
    for number in numbers[:MAX_NEWER_CANDIDATES]:
        candidate = root / f"gen-{number:08d}"
        try:
            _, lineage = _signed(candidate, store)
        except UntrustedCheckpointError:
            continue
        if lineage.run_id == run_id:
            return lineage.number
    return 0


def _names(root: Path) -> list[str]:
    try:
        return os.listdir(root) if root.is_dir() else []
    except OSError:
        return []


def _check_lineage(gen: Path, digest: str, lineage: Lineage, store: TrustStore) -> None:
    """Refuse a generation of another run than the root held, a broken chain, or a rollback."""
    held = read_root_record(store, gen.parent)
    if held is not None and held != lineage.run_id:
        raise UntrustedCheckpointError(
            f"{gen} belongs to run {lineage.run_id}, but {gen.parent} held run {held} when it was last saved or "
            "loaded here: another run's generation was copied in or swapped for ours; pass allow_rollback=True "
            "to load it on purpose")
    previous = gen.parent / lineage.previous if lineage.previous else None
    if previous is not None and os.path.lexists(previous):
        try:
            prev_digest, prev_lineage = _signed(previous, store)
        except UntrustedCheckpointError as exc:
            raise UntrustedCheckpointError(f"{gen}: its previous generation is not the signed one ({exc})") from None
        if prev_lineage.run_id != lineage.run_id or prev_digest != lineage.previous_manifest_sha256:
            raise UntrustedCheckpointError(
                f"{gen} (run {lineage.run_id}) does not follow {previous} (run {prev_lineage.run_id}): a generation "
                "of another run or lineage was copied in; pass allow_rollback=True to load it on purpose")
    mark, mark_digest = _run_mark(store, lineage.run_id, gen.parent)
    newest = max(mark, _newest_signed(gen.parent, store, lineage.run_id, max(lineage.number, mark)))
    if lineage.number < newest:
        raise UntrustedCheckpointError(
            f"{gen} is generation {lineage.number}, but generation {newest} of this checkpoint was signed or "
            f"seen here (run {lineage.run_id}): LATEST was rolled back; pass allow_rollback=True to load "
            "an older generation on purpose")
    if lineage.number == mark and mark_digest is not None and mark_digest != digest:
        raise UntrustedCheckpointError(
            f"{gen} is generation {mark} of run {lineage.run_id}, but another generation {mark} of that run was "
            "signed or seen here: it was swapped; pass allow_rollback=True to load it on purpose")


def verify_generation(generation_dir: str | os.PathLike[str], *, trust: str = "signed",
                      allow_rollback: bool = False, trust_store: TrustStore | None = None) -> dict[str, Any]:
    """Check a generation before anything in it is read: trusted signature over its manifest and lineage.

    Returns what was checked (``signed_by_trusted_key``, ``rollback_checked``) and the signed
    ``manifest_sha256`` (None when unsigned) that every later read is checked against; raises
    ``UntrustedCheckpointError`` naming the problem and the opt-out. A verified generation raises the
    run's high-water mark here, as a save does.
    """
    if trust not in CHECKPOINT_TRUST_MODES:
        raise ValueError(f"trust={trust!r}; expected one of {CHECKPOINT_TRUST_MODES}")
    gen = Path(generation_dir)
    store = trust_store or TrustStore()
    if trust == "unsigned":
        _log.warning("loading checkpoint %s WITHOUT checking its signature (trust='unsigned')", gen)
        return {"signed_by_trusted_key": False, "rollback_checked": False, "manifest_sha256": None}
    if not (gen / MANIFEST_NAME).is_file():
        raise CorruptCheckpointError(gen / MANIFEST_NAME, "the manifest is missing (the save never finished?)")
    try:
        digest, lineage = _signed(gen, store)
        if not allow_rollback:
            _check_lineage(gen, digest, lineage, store)
        _raise_marks(store, gen.parent, lineage, digest)
    except TrustStoreError as exc:
        raise UntrustedCheckpointError(str(exc)) from None
    return {"signed_by_trusted_key": True, "rollback_checked": not allow_rollback, "manifest_sha256": digest,
            "run_id": lineage.run_id, "number": lineage.number}


def locate_generation(path: str | os.PathLike[str], *, trust: str = "signed", allow_rollback: bool = False,
                      trust_store: TrustStore | None = None) -> tuple[Path, str | None]:
    """The generation ``path`` designates (a root's ``LATEST``, or a ``gen-*`` folder) and the manifest sha256 every
    read of it must match, after ``verify_generation``: every reader of checkpoint state starts here.

    Signed (default): the sha256 is the one the trusted signature covers (and ``LATEST``'s record must equal it);
    ``trust="unsigned"``: the one ``LATEST`` records (None for a folder passed directly). ``allow_rollback`` as in
    ``verify_generation`` (a ``gen-*`` folder passed directly is an explicit choice, not a rollback).
    """
    gen_dir, digest = resolve(path)
    signed = verify_generation(gen_dir, trust=trust, allow_rollback=allow_rollback or digest is None,
                               trust_store=trust_store)
    if signed["manifest_sha256"] is not None:
        if digest is not None and digest != signed["manifest_sha256"]:
            raise UntrustedCheckpointError(
                f"{gen_dir / MANIFEST_NAME} that LATEST names differs from the manifest its signature covers: the "
                "checkpoint was changed after it was signed")
        digest = signed["manifest_sha256"]
    return gen_dir, digest


def repair_marks(root: str | os.PathLike[str], *, trust_store: TrustStore | None = None) -> list[str]:
    """Rebuild this machine's damaged high-water records for the checkpoint at ``root``, deliberately.

    The run is the one ``LATEST``'s generation is signed for by a trusted key; its mark becomes the newest
    generation of that run validly signed in ``root`` (every ``gen-*`` folder is examined), never lower than an
    intact mark. Each damaged record is moved aside (``.damaged-<time>``), not deleted; intact records are left as
    they are. Returns one line per thing done. Run it only once you know why the record was damaged: a rebuilt
    mark knows only the generations still in ``root``.
    """
    store = trust_store or TrustStore()
    folder = Path(root)
    gen_dir, _ = resolve(folder)
    digest, lineage = _signed(gen_dir, store)
    best_number, best_digest = lineage.number, digest
    for number in sorted(n for n in (generation_number(name) for name in _names(folder)) if n is not None):
        try:
            other_digest, other = _signed(folder / f"gen-{number:08d}", store)
        except UntrustedCheckpointError:
            continue
        if other.run_id == lineage.run_id and other.number > best_number:
            best_number, best_digest = other.number, other_digest
    done: list[str] = []
    try:
        intact = read_run_mark(store, lineage.run_id, folder)
    except DamagedRecordError as exc:
        moved = keep_damaged(exc.path)
        write_run_mark(store, lineage.run_id, best_number, best_digest)
        done.append(f"run record {exc.path} rebuilt at generation {best_number} of run {lineage.run_id} "
                    f"(the damaged one kept as {moved})")
    else:
        if intact[0] < best_number:
            write_run_mark(store, lineage.run_id, best_number, best_digest)
            done.append(f"run record {record_path(store, 'run', lineage.run_id)} raised to generation {best_number}")
    try:
        read_root_record(store, folder)
    except DamagedRecordError as exc:
        moved = keep_damaged(exc.path)
        write_root_record(store, folder, lineage.run_id)
        done.append(f"root record {exc.path} rebuilt for run {lineage.run_id} (the damaged one kept as {moved})")
    return done or [f"the records of {folder} (run {lineage.run_id}) are intact; nothing to repair"]
