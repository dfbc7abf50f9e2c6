"""Tamper-evident run ledger: append-only JSON Lines, each entry hash-chained to the one before.

One line per entry::

    {"seq": 0, "kind": "run_start", "time": "...+00:00", "certificate": "sha256:..." | "unverified",
     "payload": {...}, "prev": "sha256:000...", "hash": "sha256:..."}

``hash`` is the SHA-256 (HMAC-SHA256 under a key, prefixed ``hmac-sha256:``) of the canonical
JSON of every other field, ``prev`` is the previous entry's ``hash`` (64 zeros for the first).
Payload contracts are serialized with the one converter (``contracts.to_dict``). Appends are
flushed and fsync'd; a crash mid-append leaves a torn last line, which reading reports and
``truncate_torn_tail`` removes on purpose. Each ``run_end`` carries a signed seal (entry count and
chain head) and every append refreshes the signed head file ``<ledger>.head`` (see ``seal``).
Opening an existing ledger verifies its whole chain and its signed head first (``verify_for_append``):
a rewritten, truncated or unvouched tail is refused before anything is appended. ``verify_ledger`` /
``main_audit`` check the chain, the seals, the head, step monotonicity per rank and certificate
links and name the first bad entry.
"""

from __future__ import annotations

import os
import platform
import socket
import stat
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ...contracts import (
    AdmissionCertificate,
    CertificateEnvelope,
    ParallelPlan,
    SDCAuditRecord,
    StepReceipt,
    to_dict,
)
from ...contracts.frozen_mapping import FrozenDict
from ..attestation import read_unverified
from ..keys import TrustStore
from .entries import (
    ENTRY_KINDS,
    GENESIS,
    UNVERIFIED,
    LedgerEntry,
    LedgerError,
    ReadResult,
    entry_hash,
    iter_ledger,
    read_ledger,
    truncate_torn_tail,
)
from .seal import SEAL_ROLE, head_path, sign_head, write_head
from .verify import verify_for_append

__all__ = ["ENTRY_KINDS", "GENESIS", "UNVERIFIED", "Ledger", "LedgerEntry", "LedgerError", "ReadResult",
           "entry_hash", "iter_ledger", "library_versions", "read_ledger", "truncate_torn_tail"]

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


class Ledger:
    """An append-only, hash-chained JSON Lines ledger; one writer process per file."""

    def __init__(self, path: str | os.PathLike[str], *, key: bytes | None = None,
                 trust_store: TrustStore | None = None) -> None:
        self.path = Path(path)
        self._key = key
        self._trust = trust_store
        self._lock = threading.RLock()  # run_end holds it across its seal and its append
        self._certificate: str | None = None
        self._signer: Any = None
        self._seq = 0
        self._prev = GENESIS
        try:
            info: os.stat_result | None = os.lstat(self.path)
        except FileNotFoundError:
            info = None
        existing = info is not None and (info.st_size > 0 or not stat.S_ISREG(info.st_mode))  # a FIFO is refused
        if existing or os.path.lexists(head_path(self.path)):
            # the chain and the signed head are verified before anything is appended (one streaming pass)
            self._seq, self._prev, self._certificate = verify_for_append(self.path, key=key, trust_store=trust_store)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def _sign(self) -> Any:
        if self._signer is None:
            self._signer = (self._trust or TrustStore()).ensure_signer()
        return self._signer

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
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
                         | getattr(os, "O_NONBLOCK", 0), 0o644)  # a FIFO swapped in fails, never blocks
            try:
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)
            self._seq, self._prev = self._seq + 1, entry.hash
            write_head(self.path, sign_head(self._sign(), self.path, self._seq, self._prev))  # covers every entry
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
        with self._lock:
            seal = sign_head(self._sign(), self.path, self._seq, self._prev, role=SEAL_ROLE)
            return self.append("run_end", {"status": status, "steps": steps, "extra": dict(extra or {}),
                                           "seal": seal})
