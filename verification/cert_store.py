"""The local certificate store: signed certificates kept under the trust store's directory.

``<home>/certificates/<certificate id hex>.json`` holds one ``CertificateEnvelope`` each.
Automatic admission asks ``find`` for a certificate that is signed by a trusted, unrevoked key and
passes every check for the run about to start; a damaged or foreign file is skipped, never trusted.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..contracts import (
    AdmissibleExecutor,
    AdmissionCertificate,
    AdmissionContext,
    CertificateEnvelope,
    NotAdmittedError,
    ParallelPlan,
    admission_problems,
)
from .attestation import load_certificate, open_envelope, save_certificate
from .keys import TrustStore

__all__ = ["CertificateStore"]


class CertificateStore:
    """Signed certificates under ``<home>/certificates`` (``home``: the trust store's directory)."""

    def __init__(self, home: str | os.PathLike[str] | None = None) -> None:
        self.trust = TrustStore(home)
        self.folder = self.trust.home / "certificates"

    def add(self, envelope: CertificateEnvelope) -> Path:
        """Keep a signed certificate (it must open under this trust store); returns its file."""
        certificate, _ = open_envelope(envelope, self.trust)
        return save_certificate(envelope, self.folder / f"{certificate.certificate_id.removeprefix('sha256:')}.json")

    def entries(self) -> list[tuple[CertificateEnvelope, AdmissionCertificate, str]]:
        """Every stored certificate that opens (trusted signature), newest first: (envelope, certificate, key id)."""
        found = []
        for path in sorted(self.folder.glob("*.json")) if self.folder.is_dir() else ():
            try:
                envelope = load_certificate(path)
                certificate, keyid = open_envelope(envelope, self.trust)
            except (NotAdmittedError, OSError):
                continue
            found.append((envelope, certificate, keyid))
        return sorted(found, key=lambda item: item[1].issued, reverse=True)

    def find(self, executor: AdmissibleExecutor, plan: ParallelPlan, precision: str,
             context: AdmissionContext) -> tuple[CertificateEnvelope, AdmissionCertificate, str] | None:
        """The newest stored certificate that admits this run, or None."""
        for envelope, certificate, keyid in self.entries():
            if not admission_problems(certificate, executor, plan, precision, context):
                return envelope, certificate, keyid
        return None

    def changed_code(self, executor: AdmissibleExecutor, plan: ParallelPlan, precision: str,
                     context: AdmissionContext) -> tuple[AdmissionCertificate, str] | None:
        """The newest stored certificate of ``executor`` that fails on its code digest (its code changed since),
        with that check's reason (it names the changed files where the certificate records them), or None."""
        for _, certificate, _ in self.entries():
            if certificate.executor != executor.capabilities.name:
                continue
            changed = [p for p in admission_problems(certificate, executor, plan, precision, context)
                       if p.startswith("check 'source_digest'")]
            if changed:
                return certificate, changed[0]
        return None
