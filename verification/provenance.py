"""Provenance of a run's artefacts: an in-toto Statement v1 with a SLSA Provenance v1 predicate, DSSE-signed.

``write_provenance(artefact, ledger=..., kind=...)`` writes ``<artefact>.intoto.json`` beside a
checkpoint generation folder or a saved model (file or folder). The file is a plain DSSE envelope
(``payloadType``, ``payload``, ``signatures``) that securesystemslib and the in-toto tools read as is.

* **subjects**: every file of the artefact with its sha256, a folder listed file by file (as the
  OpenSSF model-signing format lists a model directory), named relative to the folder the statement
  is in;
* **predicate** (``https://slsa.dev/provenance/v1``): ``buildType`` says training run or EM fit;
  ``externalParameters`` the run id, the artefact, the plan, the precision and the data's identity;
  ``internalParameters`` the admission mode and library versions; ``resolvedDependencies`` the
  executor's code (its digest, from the certificate), the certificate (its id and the sha256 of its
  envelope) and the data files or array; ``byproducts`` the ledger's signed head at that point
  (entries, last hash, the run's ``run_start`` entry) and the audit summary read from the ledger
  (audited steps or chunks, findings by cause);
* signed by the trust store's key under purpose ``provenance`` (``keys trust --for provenance``).

Everything but the run id, the artefact and the data is read from the run's ledger, after its signed
head verifies: the statement says what the ledger vouched for when the artefact was written.
``open_provenance`` checks a statement's signature; ``subject_problems`` its files on disk.
Every file is read through ``contracts.safe_read`` (no link followed, no FIFO opened, a regular file, a size limit).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs
from securesystemslib.dsse import Envelope

from ..contracts import (
    CertificateEnvelope,
    ContractError,
    EnvelopeSignature,
    NotAdmittedError,
    from_dict,
    to_dict,
)
from ..contracts.bounded_json import SIGNED_LIMITS, parse_json
from ..contracts.canonical_json import signed_json_bytes
from ..contracts.safe_read import open_regular
from .attestation import (
    PROVENANCE_PREDICATE,
    STATEMENT_TYPE,
    current_library_versions,
    open_statement,
    read_unverified,
)
from .keys import KeyPurpose, TrustStore
from .ledger.entries import UNVERIFIED, iter_ledger
from .ledger.seal import head_path, read_head
from .safe_files import write_atomic

__all__ = [
    "ARTEFACT_KINDS", "BUILD_TYPES", "LedgerBinding", "ProvenanceError", "STATEMENT_SUFFIX", "artefact_subjects",
    "certificate_digest", "data_identity", "ledger_binding", "open_provenance", "provenance_statement",
    "read_provenance", "statement_path", "subject_problems", "write_provenance",
]

STATEMENT_SUFFIX = ".intoto.json"
"""``<artefact>.intoto.json``: where an artefact's provenance statement is written, beside it."""
BUILD_TYPES = {
    "training": "https://mixle-parallel.dev/provenance/training-run/v1",
    "em": "https://mixle-parallel.dev/provenance/em-fit/v1",
}
"""SLSA ``buildType`` of each kind of run (documented in docs/verification.md)."""
ARTEFACT_KINDS = ("checkpoint-generation", "model")
"""What a statement's ``externalParameters.artefact.kind`` may say."""
MAX_FILE_BYTES = 1 << 40
"""Largest artefact file hashed (1 TiB): a file growing without end is refused, not hashed forever."""
_BLOCK = 1 << 20


class ProvenanceError(ValueError):
    """A provenance statement cannot be written or does not hold; the message says what and what to do."""


# ---- the one read of storage ----------------------------------------------------------------
def _open_regular(path: Path, limit: int) -> Iterator[bytes]:
    """The blocks of the regular file ``path``, opened by ``contracts.safe_read`` (no link followed, no FIFO,
    device or socket opened: ``UnsafeFileError``, an ``OSError``), never read past ``limit`` (``ProvenanceError``
    for a file over it). Streamed, so a large model file is hashed without being held in memory."""
    with open_regular(path, what="provenance file") as source:
        size = os.fstat(source.fileno()).st_size
        if size > limit:
            raise ProvenanceError(f"{path} is {size:,} bytes, over the limit of {limit:,}; refused unread")
        read = 0
        while block := source.read(min(_BLOCK, limit + 1 - read)):
            read += len(block)
            if read > limit:
                raise ProvenanceError(f"{path} grew past the limit of {limit:,} bytes while being read")
            yield block


def read_bytes(path: str | os.PathLike[str], limit: int) -> bytes:
    """All bytes of the regular file ``path`` (``_open_regular``'s checks), at most ``limit``."""
    return b"".join(_open_regular(Path(path), limit))


def sha256_of(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of the regular file ``path`` (``_open_regular``'s checks)."""
    digest = hashlib.sha256()
    for block in _open_regular(Path(path), MAX_FILE_BYTES):
        digest.update(block)
    return digest.hexdigest()


# ---- subjects ---------------------------------------------------------------------------------
def statement_path(artefact: str | os.PathLike[str]) -> Path:
    """Where the statement of ``artefact`` goes: ``<artefact>.intoto.json`` beside it."""
    path = Path(artefact)
    return path.parent / (path.name + STATEMENT_SUFFIX)


def artefact_files(artefact: Path) -> list[str]:
    """The files of ``artefact`` named relative to its folder (a folder: every file under it, sorted); a link
    anywhere is a ``ProvenanceError``."""
    if artefact.is_symlink():
        raise ProvenanceError(f"{artefact} is a link; provenance covers files of their own")
    if artefact.is_file():
        return [artefact.name]
    if not artefact.is_dir():
        raise ProvenanceError(f"no artefact at {artefact}: neither a file nor a folder")
    names = []
    for path in sorted(artefact.rglob("*")):
        if path.is_symlink():
            raise ProvenanceError(f"{path} is a link inside the artefact; provenance covers files of their own")
        if path.is_file():
            names.append(path.relative_to(artefact.parent).as_posix())
    if not names:
        raise ProvenanceError(f"the artefact folder {artefact} holds no file")
    return names


def artefact_subjects(artefact: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The in-toto subjects of ``artefact``: each file's name (relative to the artefact's folder) and sha256."""
    path = Path(artefact)
    return [{"name": name, "digest": {"sha256": sha256_of(path.parent / name)}} for name in artefact_files(path)]


# ---- data identity ------------------------------------------------------------------------------
def data_identity(data: Any) -> dict[str, Any]:
    """What identifies a run's data: file digests (a path, paths, a ``files(...)`` source), a content digest (an
    in-memory array), or the lineage / a description (an engine collection, anything else)."""
    if isinstance(data, Mapping):  # the caller's own description: never read as digests it did not compute here
        return {**{str(k): v for k, v in data.items()}, "kind": "described"}
    if isinstance(data, str) and not os.path.exists(data):
        return {"kind": "described", "description": data}
    paths = _data_paths(data)
    if paths is not None:
        return {"kind": "files", "files": [{"name": os.fspath(p), "sha256": sha256_of(p),
                                            "bytes": os.stat(p).st_size} for p in paths]}
    if hasattr(data, "__array__") and hasattr(data, "dtype") and hasattr(data, "shape"):
        import numpy as np

        array = np.ascontiguousarray(data)
        return {"kind": "array", "dtype": array.dtype.str, "shape": list(array.shape),
                "sha256": hashlib.sha256(array.tobytes()).hexdigest()}
    lineage = getattr(data, "toDebugString", None)  # a Spark RDD's lineage
    if callable(lineage):
        text = lineage()
        return {"kind": "collection", "type": type(data).__name__,
                "lineage": text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)}
    name = getattr(data, "name", None)  # a dask collection's deterministic token
    description = f"{type(data).__module__}.{type(data).__qualname__}" + (f" {name}" if isinstance(name, str) else "")
    return {"kind": "collection", "type": type(data).__name__, "description": description[:500]}


def _data_paths(data: Any) -> list[Path] | None:
    parts = getattr(data, "parts", None)
    if getattr(data, "kind", None) == "files" and parts is not None:
        return [Path(p.path) for p in parts]
    if isinstance(data, (str, os.PathLike)):
        data = [data]
    if isinstance(data, (list, tuple)) and data and all(isinstance(d, (str, os.PathLike)) for d in data):
        paths: list[Path] = []
        for item in map(Path, data):  # a folder: every regular file under it, in order
            paths += sorted(p for p in item.rglob("*") if p.is_file()) if item.is_dir() else [item]
        return paths
    return None


# ---- the ledger's head and the run it covers --------------------------------------------------------
@attrs.frozen
class LedgerBinding:
    """What a ledger's signed head vouched for at one point, and the run it ended in."""

    name: str
    entries: int
    head: str
    signed_by: str
    run_start_seq: int
    run_start_hash: str
    certificate: str
    executor: str
    plan: Mapping[str, Any]
    precision: str
    admission: str
    certificate_document: Mapping[str, Any] | None
    audit: Mapping[str, Any]


def _audit_summary(records: list[Mapping[str, Any]]) -> dict[str, Any]:
    causes: dict[str, int] = {}
    for record in records:
        if not record.get("matched", True):
            cause = str(record.get("cause") or "unattributed")
            causes[cause] = causes.get(cause, 0) + 1
    families = sorted({str(r.get("family", "")) for r in records})
    return {"records": len(records), "audited_steps": len({r.get("step") for r in records}),
            "audited_units": len({(r.get("step"), r.get("unit")) for r in records}), "families": families,
            "findings": sum(causes.values()), "findings_by_cause": dict(sorted(causes.items()))}


def ledger_binding(ledger: str | os.PathLike[str], *, trust_store: TrustStore | None = None,
                   entries: int | None = None) -> LedgerBinding:
    """The ledger's signed head (verified) and the run its last covered entry belongs to: the run_start, the
    certificate link, plan, executor, and the audit records of that run up to the head.

    ``entries``: read the ledger up to that count instead of the signed head's (a verifier re-deriving what a
    statement recorded); the entry there must still be the one recorded. ``ProvenanceError`` when the head does
    not verify, the ledger is shorter than it or its last covered entry is not the head.
    """
    path = Path(ledger)
    store = trust_store or TrustStore()
    try:
        count, head, keyid, _ = read_head(head_path(path), store)
    except ValueError as exc:
        raise ProvenanceError(f"the ledger's signed head does not verify: {exc}") from None
    wanted = count if entries is None else entries
    if wanted < 1 or wanted > count:
        raise ProvenanceError(f"the ledger's signed head vouches for {count} entries, not {wanted}")
    start: Any = None
    records: list[Mapping[str, Any]] = []
    last = None
    for index, line in enumerate(iter_ledger(path, raw=True)):
        if index >= wanted:
            break
        if line.entry is None:
            raise ProvenanceError(f"{path} line {line.number}: {line.problem}; run `mixle-parallel audit {path}`")
        last = line.entry
        if last.kind == "run_start":
            start, records = last, []
        elif last.kind == "audit":
            records.append(_data(last.payload.get("record")))
    if last is None or last.seq != wanted - 1 or start is None:
        raise ProvenanceError(f"{path} has fewer than {wanted} entries or no run_start; it does not match its head")
    if entries is None and last.hash != head:
        raise ProvenanceError(f"{path}: entry {wanted - 1} is not the one its signed head vouches for (rewritten)")
    payload = start.payload
    extra = payload.get("extra") or {}
    document = payload.get("certificate_document")
    return LedgerBinding(
        name=path.name, entries=wanted, head=last.hash, signed_by=keyid, run_start_seq=start.seq,
        run_start_hash=start.hash, certificate=start.certificate, executor=str(payload.get("executor") or ""),
        plan=_data(payload.get("plan")),
        precision=str(extra.get("precision", "")), admission=str(extra.get("admission", "")),
        certificate_document=dict(document) if isinstance(document, Mapping) else None,
        audit=_audit_summary(records))


def _data(document: Any) -> dict[str, Any]:
    """The fields of a contract document as a ledger stores it (``{"kind", "version", "data"}``), else {}."""
    if not isinstance(document, Mapping):
        return {}
    inner = document.get("data", document)
    return dict(inner) if isinstance(inner, Mapping) else {}


def certificate_digest(envelope: CertificateEnvelope) -> str:
    """``sha256:`` of a certificate envelope's canonical JSON document (RFC 8785): what a statement binds."""
    return "sha256:" + hashlib.sha256(signed_json_bytes(to_dict(envelope))).hexdigest()


# ---- the statement ------------------------------------------------------------------------------------
def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _certificate_parts(binding: LedgerBinding) -> tuple[list[dict[str, Any]], str]:
    """The resolved dependencies a certificate gives (executor code, the certificate) and the executor version."""
    if binding.certificate == UNVERIFIED or binding.certificate_document is None:
        return [], ""
    try:
        envelope = from_dict(binding.certificate_document, CertificateEnvelope, limits=SIGNED_LIMITS)
        certificate = read_unverified(envelope)
    except (ContractError, NotAdmittedError) as exc:
        raise ProvenanceError(f"the run's certificate in the ledger is unreadable: {exc}") from None
    code = {"name": f"executor:{certificate.executor}@{certificate.executor_version}",
            "digest": {"sha256": certificate.source_digest.removeprefix("sha256:")}}
    cert = {"name": "certificate", "digest": {"sha256": certificate_digest(envelope).removeprefix("sha256:")},
            "annotations": {"certificate_id": certificate.certificate_id, "executor": certificate.executor,
                            "precision": certificate.precision, "tolerance": to_dict(certificate.tolerance),
                            "in_situ": certificate.measurement is not None}}
    return [code, cert], certificate.executor_version


def _data_dependencies(identity: Mapping[str, Any]) -> list[dict[str, Any]]:
    if identity.get("kind") == "files":
        return [{"name": f"data:{f['name']}", "digest": {"sha256": f["sha256"]}} for f in identity["files"]]
    if identity.get("kind") == "array":
        return [{"name": "data:array", "digest": {"sha256": identity["sha256"]}}]
    return []


def provenance_statement(artefact: str | os.PathLike[str], *, ledger: str | os.PathLike[str], kind: str,
                         run_id: str | None = None, data: Any = None, artefact_kind: str = "model",
                         trust_store: TrustStore | None = None) -> dict[str, Any]:
    """The in-toto Statement v1 (SLSA Provenance v1 predicate) of ``artefact``, as the ledger vouches for it now.

    ``kind``: ``"training"`` or ``"em"``; ``run_id``: the run's id (a checkpoint's lineage run id; a new one when
    None); ``data``: what ``data_identity`` identifies; ``artefact_kind``: one of ``ARTEFACT_KINDS``.
    """
    if kind not in BUILD_TYPES:
        raise ProvenanceError(f"kind={kind!r}; expected one of {sorted(BUILD_TYPES)}")
    if artefact_kind not in ARTEFACT_KINDS:
        raise ProvenanceError(f"artefact_kind={artefact_kind!r}; expected one of {ARTEFACT_KINDS}")
    path = Path(artefact)
    subjects = artefact_subjects(path)
    binding = ledger_binding(ledger, trust_store=trust_store)
    certificate_deps, executor_version = _certificate_parts(binding)
    identity = data_identity(data) if data is not None else {"kind": "described", "description": "not given"}
    run = run_id or uuid.uuid4().hex

    predicate = {
        "buildDefinition": {
            "buildType": BUILD_TYPES[kind],
            "externalParameters": {
                "run_id": run,
                "artefact": {"name": path.name, "kind": artefact_kind, "files": len(subjects)},
                "plan": dict(binding.plan), "precision": binding.precision, "data": identity,
            },
            "internalParameters": {"admission": binding.admission or ("unverified" if binding.certificate ==
                                                                      UNVERIFIED else "certified"),
                                   "library_versions": current_library_versions()},
            "resolvedDependencies": certificate_deps + _data_dependencies(identity),
        },
        "runDetails": {
            "builder": {"id": f"https://mixle-parallel.dev/executor/{binding.executor or 'unknown'}",
                        "version": {"mixle-parallel": _library_version(),
                                    **({"executor": executor_version} if executor_version else {})}},
            "metadata": {"invocationId": run, "finishedOn": _now()},
            "byproducts": [
                {"name": f"ledger:{binding.name}", "digest": {"sha256": binding.head.removeprefix("sha256:")},
                 "annotations": {"entries": binding.entries, "head": binding.head, "signed_by": binding.signed_by,
                                 "certificate": binding.certificate, "run_start_seq": binding.run_start_seq,
                                 "run_start_hash": binding.run_start_hash}},
                {"name": "audit", "annotations": dict(binding.audit)},
            ],
        },
    }
    return {"_type": STATEMENT_TYPE, "subject": subjects, "predicateType": PROVENANCE_PREDICATE,
            "predicate": predicate}


def _library_version() -> str:
    try:
        return importlib.metadata.version("mixle-parallel")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def write_provenance(artefact: str | os.PathLike[str], *, ledger: str | os.PathLike[str], kind: str,
                     run_id: str | None = None, data: Any = None, artefact_kind: str = "model",
                     trust_store: TrustStore | None = None) -> Path:
    """Sign ``provenance_statement(...)`` with the trust store's key (purpose ``provenance``) and write the DSSE
    envelope to ``<artefact>.intoto.json`` (atomically, never through a link); returns its path."""
    store = trust_store or TrustStore()
    document = provenance_statement(artefact, ledger=ledger, kind=kind, run_id=run_id, data=data,
                                    artefact_kind=artefact_kind, trust_store=store)
    envelope = Envelope(signed_json_bytes(document), "application/vnd.in-toto+json", {})
    envelope.sign(store.ensure_signer())
    target = statement_path(artefact)
    return write_atomic(target, signed_json_bytes(envelope.to_dict()) + b"\n", mode=0o644)


# ---- reading one back ---------------------------------------------------------------------------------
def read_provenance(path: str | os.PathLike[str]) -> CertificateEnvelope:
    """The DSSE envelope in a statement file, bounded (``SIGNED_LIMITS``) and strict; ``ProvenanceError``."""
    try:
        raw = parse_json(read_bytes(path, SIGNED_LIMITS.max_bytes), SIGNED_LIMITS, what=f"statement {path}")
        if not isinstance(raw, dict) or set(raw) != {"payload", "payloadType", "signatures"} \
                or not isinstance(raw["signatures"], list):
            raise ValueError("not a DSSE envelope (payload, payloadType, signatures)")
        return CertificateEnvelope(payload_type=raw["payloadType"], payload=raw["payload"], signatures=tuple(
            EnvelopeSignature(keyid=s.get("keyid"), sig=s.get("sig")) for s in raw["signatures"]))
    except (OSError, ValueError, TypeError, AttributeError, ContractError) as exc:
        raise ProvenanceError(f"{path} is not a provenance statement: {exc}") from None


def open_provenance(path: str | os.PathLike[str], *, trust_store: TrustStore | None = None
                    ) -> tuple[dict[str, Any], str]:
    """The verified Statement in ``path`` and the key that signed it (trusted for ``provenance``)."""
    envelope = read_provenance(path)
    try:
        statement, keyid = open_statement(envelope, trust_store or TrustStore(),
                                          predicate_type=PROVENANCE_PREDICATE, purpose=KeyPurpose.PROVENANCE)
    except NotAdmittedError as exc:
        raise ProvenanceError(f"{path}: {'; '.join(exc.reasons)}") from None
    if not isinstance(statement.get("subject"), list) or not isinstance(statement.get("predicate"), dict):
        raise ProvenanceError(f"{path}: the statement has no subject list or predicate")
    return statement, keyid


def subject_problems(path: str | os.PathLike[str], statement: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(file, problem)`` for each subject missing or changed on disk, and each file of the artefact no subject
    names (an extra file); the files are looked up beside the statement ``path``."""
    folder = Path(path).parent
    problems: list[tuple[str, str]] = []
    named: set[str] = set()
    for subject in statement.get("subject", []):
        name = subject.get("name") if isinstance(subject, Mapping) else None
        digest = (subject.get("digest") or {}).get("sha256") if isinstance(subject, Mapping) else None
        if not isinstance(name, str) or not name or Path(name).is_absolute() or ".." in Path(name).parts:
            problems.append((str(name), "a subject name outside the statement's folder"))
            continue
        named.add(name)
        file = folder / name
        try:
            actual = sha256_of(file)
        except FileNotFoundError:
            problems.append((str(file), "missing (the provenance statement lists it)"))
            continue
        except (OSError, ProvenanceError) as exc:
            problems.append((str(file), f"cannot be read as a regular file ({exc})"))
            continue
        if actual != digest:
            problems.append((str(file), "its sha256 differs from the provenance statement's (tampered)"))
    artefact = ((statement.get("predicate") or {}).get("buildDefinition") or {}).get("externalParameters", {})
    name = (artefact.get("artefact") or {}).get("name") if isinstance(artefact, Mapping) else None
    root = folder / name if isinstance(name, str) and name and "/" not in name else None
    if root is not None and root.is_dir() and not root.is_symlink():
        for file in sorted(root.rglob("*")):
            rel = file.relative_to(folder).as_posix()
            if (file.is_file() or file.is_symlink()) and rel not in named:
                problems.append((str(file), "extra: in the artefact but not in its provenance statement"))
    return problems
