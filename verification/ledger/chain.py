"""Tamper-evident run ledger: append-only JSON Lines, each entry hash-chained to the one before.

One line per entry::

    {"seq": 0, "kind": "run_start", "time": "...+00:00", "certificate": "sha256:..." | "unverified",
     "payload": {...}, "prev": "sha256:000...", "hash": "sha256:..."}

``hash`` is the SHA-256 (HMAC-SHA256 under a key, prefixed ``hmac-sha256:``) of the canonical
JSON of every other field, ``prev`` is the previous entry's ``hash`` (64 zeros for the first).
Payload contracts are serialized with the one converter (``contracts.to_dict``). Appends are
flushed and fsync'd; a crash mid-append leaves a torn last line, which reading reports and
``truncate_torn_tail`` removes on purpose. Each ``run_end`` carries a signed seal (entry count and
chain head) and refreshes the signed head file ``<ledger>.head`` (see ``seal``). ``verify_ledger`` /
``main_audit`` check the chain, the seals, the head, step monotonicity per rank and certificate
links and name the first bad entry.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import platform
import socket
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs

from ...contracts import (
    AdmissionCertificate,
    CertificateEnvelope,
    ParallelPlan,
    SDCAuditRecord,
    StepReceipt,
    to_dict,
)
from ...contracts.bounded_json import LEDGER_LINE_LIMITS, parse_json
from ...contracts.frozen_mapping import FrozenDict, to_frozen_dict
from ..attestation import read_unverified
from ..keys import TrustStore
from .seal import sign_head, write_head

GENESIS = "sha256:" + "0" * 64
"""The ``prev`` of a ledger's first entry."""

UNVERIFIED = "unverified"
"""What an entry's ``certificate`` says when the run opted out of admission."""

ENTRY_KINDS = frozenset({"run_start", "receipt", "audit", "checkpoint", "run_end", "note"})
"""Kinds of ledger entries."""

_FIELDS = ("seq", "kind", "time", "certificate", "payload", "prev", "hash")


class LedgerError(RuntimeError):
    """A ledger file cannot be appended to or read as written (torn line, broken JSON)."""


@attrs.frozen
class LedgerEntry:
    """One ledger line: sequence number, kind, certificate link, payload, and its chain hashes."""

    seq: int
    kind: str
    time: str
    certificate: str
    payload: FrozenDict = attrs.field(converter=to_frozen_dict)
    prev: str
    hash: str

    def body(self) -> dict[str, Any]:
        """Every field but ``hash``: what the hash covers."""
        return {"seq": self.seq, "kind": self.kind, "time": self.time, "certificate": self.certificate,
                "payload": self.payload.to_dict(), "prev": self.prev}

    def to_line(self) -> str:
        """The JSON line written to the file."""
        return json.dumps({**self.body(), "hash": self.hash}, sort_keys=True, separators=(",", ":"))


def _canonical(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def entry_hash(body: Mapping[str, Any], key: bytes | None = None) -> str:
    """``sha256:<hex>`` of the canonical body, or ``hmac-sha256:<hex>`` under ``key``."""
    data = _canonical(body)
    if key:
        return "hmac-sha256:" + hmac.new(bytes(key), data, hashlib.sha256).hexdigest()
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _now() -> str:
    return datetime.now(UTC).isoformat()


def library_versions() -> dict[str, str]:
    """Versions of Python and the libraries a run depends on (torch only if already imported)."""
    import sys
    from importlib.metadata import PackageNotFoundError, version

    import numpy

    try:
        own = version("mixle-parallel")
    except PackageNotFoundError:  # running from a source tree that is not installed
        own = "unknown"
    versions = {"python": platform.python_version(), "mixle_parallel": own, "numpy": numpy.__version__}
    torch = sys.modules.get("torch")
    if torch is not None:
        versions["torch"] = str(torch.__version__)
    return versions


@attrs.frozen
class ReadResult:
    """Entries parsed from a ledger file, plus a description of a torn last line if there is one."""

    entries: tuple[LedgerEntry, ...]
    torn: str | None
    problems: tuple[tuple[int, str], ...]
    line_numbers: tuple[int, ...] = ()
    torn_line: int | None = None


def _check_record(record: Any) -> None:
    """Field names and types of one ledger line, before anything trusts them."""
    if not isinstance(record, dict) or set(record) != set(_FIELDS):
        raise ValueError(f"expected exactly the fields {sorted(_FIELDS)}")
    if isinstance(record["seq"], bool) or not isinstance(record["seq"], int) or not 0 <= record["seq"] < 2**53:
        raise ValueError(f"'seq' must be a non-negative integer, got {record['seq']!r:.40}")
    for name in ("kind", "time", "certificate", "prev", "hash"):
        if not isinstance(record[name], str):
            raise ValueError(f"{name!r} must be a string, got {type(record[name]).__name__}")
    if not isinstance(record["payload"], dict):
        raise ValueError(f"'payload' must be an object, got {type(record['payload']).__name__}")


def read_ledger(path: str | os.PathLike[str]) -> ReadResult:
    """Parse every line; malformed lines are reported (a bad final line without newline is 'torn')."""
    raw = Path(path).read_bytes()
    entries: list[LedgerEntry] = []
    numbers: list[int] = []
    problems: list[tuple[int, str]] = []
    torn = None
    lines = raw.split(b"\n")
    ends_clean = raw.endswith(b"\n") or not raw
    if ends_clean:
        lines = lines[:-1]
    for number, line in enumerate(lines, start=1):
        is_last = number == len(lines)
        try:
            record = parse_json(line, LEDGER_LINE_LIMITS, what=f"ledger line {number}")  # strict, bounded
            _check_record(record)
            entries.append(LedgerEntry(**record))
            numbers.append(number)
        except (ValueError, TypeError, UnicodeDecodeError, RecursionError) as exc:
            if is_last and not ends_clean:
                torn = (f"torn last line (no final newline, {len(line)} bytes: {exc}); "
                        "a crash during append? `truncate_torn_tail` removes it")
            else:
                problems.append((number, f"not a ledger entry: {exc}"))
    if torn is None and not ends_clean and lines:
        torn = "torn last line: it has no final newline; the last append may not have completed"
    torn_line = len(lines) if torn else None
    return ReadResult(tuple(entries), torn, tuple(problems), tuple(numbers), torn_line)


def truncate_torn_tail(path: str | os.PathLike[str]) -> int:
    """Remove a torn last line (deliberate repair after a crash); returns the bytes removed."""
    target = Path(path)
    raw = target.read_bytes()
    if raw.endswith(b"\n") or not raw:
        return 0
    keep = raw.rfind(b"\n") + 1
    with open(target, "r+b") as handle:
        handle.truncate(keep)
        handle.flush()
        os.fsync(handle.fileno())
    return len(raw) - keep


class Ledger:
    """An append-only, hash-chained JSON Lines ledger; one writer process per file."""

    def __init__(self, path: str | os.PathLike[str], *, key: bytes | None = None,
                 trust_store: TrustStore | None = None) -> None:
        self.path = Path(path)
        self._key = key
        self._trust = trust_store
        self._lock = threading.RLock()  # run_end holds it across its seal and its append
        self._certificate: str | None = None
        self._seq = 0
        self._prev = GENESIS
        if self.path.exists() and self.path.stat().st_size:
            found = read_ledger(self.path)
            if found.torn:
                raise LedgerError(f"{self.path}: {found.torn}; refusing to append after a torn line")
            if found.problems:
                number, text = found.problems[0]
                raise LedgerError(f"{self.path}: line {number} {text}; run `mixle-parallel audit {self.path}`")
            last = found.entries[-1]
            self._seq, self._prev = last.seq + 1, last.hash
            for entry in found.entries:
                if entry.kind == "run_start":
                    self._certificate = entry.certificate
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    @property
    def certificate(self) -> str | None:
        """The certificate id (or 'unverified') of the open run, None before run_start."""
        return self._certificate

    def append(self, kind: str, payload: Mapping[str, Any], *, certificate: str | None = None) -> LedgerEntry:
        """Append one entry, flushed and fsync'd before returning."""
        if kind not in ENTRY_KINDS:
            raise ValueError(f"ledger entry kind {kind!r}; allowed: {sorted(ENTRY_KINDS)}")
        with self._lock:
            link = certificate if certificate is not None else self._certificate
            if link is None:
                raise LedgerError(f"append {kind!r} before run_start: call run_start(plan=..., certificate=...) first")
            body: dict[str, Any] = {"seq": self._seq, "kind": kind, "time": _now(), "certificate": link,
                    "payload": FrozenDict(payload).to_dict(), "prev": self._prev}
            entry = LedgerEntry(**body, hash=entry_hash(body, self._key))
            line = (entry.to_line() + "\n").encode("utf-8")
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)
            self._seq, self._prev = self._seq + 1, entry.hash
            return entry

    def run_start(
        self,
        *,
        plan: ParallelPlan,
        certificate: CertificateEnvelope | AdmissionCertificate | str | None,
        executor: str = "",
        versions: Mapping[str, str] | None = None,
        host: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> LedgerEntry:
        """Open a run: plan, certificate id (or 'unverified'), versions, host."""
        if isinstance(certificate, CertificateEnvelope):
            link, document = read_unverified(certificate).certificate_id, to_dict(certificate)
        elif isinstance(certificate, AdmissionCertificate):
            link, document = certificate.certificate_id, to_dict(certificate)
        elif certificate is None or certificate == UNVERIFIED:
            link, document = UNVERIFIED, None
        elif isinstance(certificate, str) and certificate.startswith("sha256:"):
            link, document = certificate, None
        else:
            raise ValueError(
                f"certificate must be a signed CertificateEnvelope, its id or 'unverified', got {certificate!r}"
            )
        payload = {
            "plan": to_dict(plan),
            "executor": executor,
            "certificate_document": document,
            "versions": dict(versions or library_versions()),
            "host": host or socket.gethostname(),
            "pid": os.getpid(),
            "extra": dict(extra or {}),
        }
        entry = self.append("run_start", payload, certificate=link)
        self._certificate = link
        return entry

    def receipt(self, receipt: StepReceipt, *, rank: int = 0, extra: Mapping[str, Any] | None = None) -> LedgerEntry:
        """Record one StepReceipt of ``rank``."""
        return self.append(
            "receipt", {"rank": rank, "step": receipt.step, "receipt": to_dict(receipt), "extra": dict(extra or {})}
        )

    def audit(self, record: SDCAuditRecord) -> LedgerEntry:
        """Record one SDC audit finding."""
        return self.append("audit", {"rank": record.rank, "step": record.step, "record": to_dict(record)})

    def checkpoint(self, *, step: int, path: str, extra: Mapping[str, Any] | None = None) -> LedgerEntry:
        """Record a checkpoint saved (or loaded) at ``step``."""
        return self.append("checkpoint", {"step": step, "path": str(path), "extra": dict(extra or {})})

    def note(self, message: str, **extra: Any) -> LedgerEntry:
        """Record a free-form event (e.g. a quarantine decision, a resume)."""
        return self.append("note", {"message": message, "extra": extra})

    def run_end(
        self, *, status: str = "ok", steps: int | None = None, extra: Mapping[str, Any] | None = None
    ) -> LedgerEntry:
        """Close the run: a run_end carrying a signed seal over every entry before it, then the signed head."""
        signer = (self._trust or TrustStore()).ensure_signer()
        with self._lock:
            seal = sign_head(signer, self.path, self._seq, self._prev)
            entry = self.append("run_end", {"status": status, "steps": steps, "extra": dict(extra or {}),
                                            "seal": seal})
            write_head(self.path, sign_head(signer, self.path, entry.seq + 1, entry.hash))
        return entry
