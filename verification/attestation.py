"""Certificates as in-toto Statements in DSSE envelopes, signed with the trust store's Ed25519 key.

* ``statement(certificate)``: the in-toto Statement v1 (subject: the executor as
  ``<name>@<version>`` with the sha256 of its source files; predicate: the certificate document).
* ``sign_certificate(certificate, signer)`` -> ``CertificateEnvelope`` (payload = RFC 8785
  canonical JSON of the Statement; signature by securesystemslib's DSSE ``Envelope``).
* ``open_envelope(envelope, store)`` -> the certificate and the signing key's id, after checking
  the signature against keys trusted, unrevoked, *for the purpose of the predicate type*
  (``PURPOSE_OF_PREDICATE``: certificates need ``certify``, ledger heads ``ledger``, checkpoint
  manifests ``checkpoint``, artefact provenance ``provenance``); every failure is a ``NotAdmittedError``
  naming check ``signature`` or ``certificate`` (malformed input never escapes as another exception).
* ``save_certificate`` / ``load_certificate``: the envelope as a versioned JSON document, written
  atomically without following links, read under ``SIGNED_LIMITS`` (size before decoding, strict
  JSON, at most ``MAX_SIGNATURES`` signatures); the signed payload is parsed under the same limits.
* ``executor_source_digest(executor)``: sha256 over every file of the code the executor runs
  (``source_binding``: the whole library for built-ins, the defining package for others, plus
  ``source_files()``), hashed from the bytes on every call;
  ``current_library_versions(executor)``: the libraries a certificate binds.
"""

from __future__ import annotations

import base64
import binascii
import importlib.metadata
import os
import platform
from pathlib import Path
from typing import Any

from securesystemslib.dsse import Envelope
from securesystemslib.signer import Signature, Signer

from ..contracts import (
    IN_TOTO_PAYLOAD_TYPE,
    AdmissionCertificate,
    CertificateEnvelope,
    ContractError,
    EnvelopeSignature,
    NotAdmittedError,
    from_dict,
    to_dict,
    to_json,
)
from ..contracts.bounded_json import SIGNED_LIMITS, parse_json, read_limited
from ..contracts.canonical_json import signed_json_bytes
from .keys import KeyPurpose, TrustStore, TrustStoreError
from .safe_files import write_atomic
from .source_binding import builtin_files, code_files, file_digests, files_digest

__all__ = [
    "CHECKPOINT_MANIFEST_PREDICATE", "LEDGER_HEAD_PREDICATE", "PREDICATE_TYPE", "PROVENANCE_PREDICATE",
    "PURPOSE_OF_PREDICATE",
    "STATEMENT_TYPE", "current_library_versions", "executor_source_digest", "executor_source_files",
    "load_certificate", "open_envelope", "open_statement", "read_unverified", "reissue_hint", "save_certificate",
    "sign_certificate", "sign_statement", "statement",
]

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://mixle-parallel.dev/attestation/admission/v1"
LEDGER_HEAD_PREDICATE = "https://mixle-parallel.dev/attestation/ledger-head/v1"
"""Predicate type of a ledger seal / signed head (``ledger.seal.LEDGER_HEAD_TYPE``)."""
CHECKPOINT_MANIFEST_PREDICATE = "https://mixle-parallel.dev/attestation/checkpoint-manifest/v2"
"""Predicate type of a checkpoint manifest signature (``executors.torch.checkpoint_trust.MANIFEST_TYPE``)."""
PROVENANCE_PREDICATE = "https://slsa.dev/provenance/v1"
"""Predicate type of an artefact's provenance statement (SLSA Provenance v1; ``verification.provenance``)."""

PURPOSE_OF_PREDICATE: dict[str, KeyPurpose] = {
    PREDICATE_TYPE: KeyPurpose.CERTIFY,
    LEDGER_HEAD_PREDICATE: KeyPurpose.LEDGER,
    CHECKPOINT_MANIFEST_PREDICATE: KeyPurpose.CHECKPOINT,
    PROVENANCE_PREDICATE: KeyPurpose.PROVENANCE,
}
"""The purpose a key must be trusted for to sign a statement of each predicate type (``keys trust --for``)."""

_MAX_PAYLOAD_B64 = (SIGNED_LIMITS.max_bytes + 2) // 3 * 4
"""Longest base64 payload whose decoded bytes fit ``SIGNED_LIMITS`` (checked before decoding)."""

_BASE_LIBRARIES = ("numpy", "torch")


def reissue_hint() -> str:
    """How to get a signed certificate (said wherever an unsigned or HMAC one is refused)."""
    return ("re-certify: `mixle-parallel keys init` (once per machine), then `mixle-parallel certify --backend ... "
            "--plan ... --out cert.json`, which writes a DSSE envelope signed with this machine's Ed25519 key")


# ---- what a certificate binds ------------------------------------------------------------
def executor_source_digest(executor: Any) -> str:
    """``sha256:<hex>`` over every file of the code ``executor`` runs (``source_binding.code_files``), read now."""
    return files_digest(code_files(executor))


def executor_source_files(executor: Any) -> dict[str, str] | None:
    """sha256 of each third-party file ``executor_source_digest`` covers, by path relative to their common folder
    (what a certificate records so a refusal names the files that changed); None when all of it is built in."""
    return file_digests(sorted(set(code_files(executor)) - builtin_files())) or None


def _installed(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def current_library_versions(executor: Any = None) -> dict[str, str]:
    """python, numpy, torch (when installed) and every engine the executor declares in ``certified_libraries``."""
    versions = {"python": platform.python_version()}
    names = list(_BASE_LIBRARIES) + list(getattr(executor, "certified_libraries", ()) or ())
    for name in names:
        found = _installed(name)
        if found is not None:
            versions[name] = found
    return versions


# ---- statements and envelopes ------------------------------------------------------------
def statement(certificate: AdmissionCertificate) -> dict[str, Any]:
    """The in-toto Statement v1 whose predicate is ``certificate``."""
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": f"{certificate.executor}@{certificate.executor_version}",
                     "digest": {"sha256": certificate.source_digest.removeprefix("sha256:")}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": to_dict(certificate),
    }


def sign_certificate(certificate: AdmissionCertificate, signer: Signer) -> CertificateEnvelope:
    """A DSSE envelope around the canonical Statement of ``certificate``, signed by ``signer``."""
    return sign_statement(statement(certificate), signer)


def sign_statement(document: dict[str, Any], signer: Signer) -> CertificateEnvelope:
    """A DSSE envelope around any in-toto Statement (RFC 8785 canonical JSON), signed by ``signer``."""
    envelope = Envelope(signed_json_bytes(document), IN_TOTO_PAYLOAD_TYPE, {})
    envelope.sign(signer)
    document = envelope.to_dict()
    return CertificateEnvelope(
        payload_type=document["payloadType"],
        payload=document["payload"],
        signatures=tuple(EnvelopeSignature(keyid=s["keyid"], sig=s["sig"]) for s in document["signatures"]),
    )


def _refuse(check: str, message: str) -> NotAdmittedError:
    return NotAdmittedError((f"check '{check}' failed: {message}",))


def _verify_signature(envelope: CertificateEnvelope, payload: bytes, store: TrustStore, purpose: KeyPurpose) -> str:
    try:
        known = {k.keyid: k for k in store.keys()}
    except TrustStoreError as exc:
        raise _refuse("signature", str(exc)) from None
    pae = Envelope(payload, envelope.payload_type, {}).pae()
    reasons = []
    for sig in envelope.signatures:  # at most MAX_SIGNATURES (the envelope contract refuses more)
        entry = known.get(sig.keyid)
        if entry is None:
            reasons.append(f"signed by key {sig.keyid[:16]}..., which this trust store ({store.home}) does not trust; "
                           "trust it with `mixle-parallel keys trust PUBKEY` if it is yours")
            continue
        if entry.revoked:
            reasons.append(f"signed by key {sig.keyid[:16]}..., revoked at {entry.revoked_at}")
            continue
        if not entry.trusted_for(purpose):
            reasons.append(f"signed by key {sig.keyid[:16]}..., which this trust store trusts only for "
                           f"{entry.describe_purposes() or 'nothing'}, not to {purpose.value} "
                           f"(`mixle-parallel keys trust PUBKEY --for {','.join(sorted({*entry.purposes, purpose}))}` "
                           "widens it)")
            continue
        try:
            raw = base64.b64decode(sig.sig, validate=True)
            entry.sslib_key().verify_signature(Signature(sig.keyid, raw.hex()), pae)
        except Exception:  # noqa: BLE001 - securesystemslib raises several types for a bad signature
            reasons.append(f"the signature by key {sig.keyid[:16]}... does not verify (payload or signature changed)")
            continue
        return sig.keyid
    raise _refuse("signature", "; ".join(reasons))


def open_statement(envelope: CertificateEnvelope, store: TrustStore | None = None, *,
                   predicate_type: str = PREDICATE_TYPE, purpose: KeyPurpose | str | None = None,
                   ) -> tuple[dict[str, Any], str]:
    """The verified Statement inside ``envelope`` and the trusted key id that signed it; ``NotAdmittedError``.

    The signing key must be trusted for ``purpose`` (default: ``PURPOSE_OF_PREDICATE[predicate_type]``).
    The payload's size is checked before it is decoded, and it is parsed strictly (``SIGNED_LIMITS``).
    """
    if not isinstance(envelope, CertificateEnvelope):
        raise _refuse("certificate", f"expected a signed CertificateEnvelope, got {type(envelope).__name__}; "
                      + reissue_hint())
    wanted = KeyPurpose(purpose) if purpose is not None else PURPOSE_OF_PREDICATE.get(predicate_type)
    if wanted is None:
        raise ValueError(f"no key purpose is known for predicate type {predicate_type!r}; pass purpose=")
    if len(envelope.payload) > _MAX_PAYLOAD_B64:
        raise _refuse("certificate", f"the envelope's payload is {len(envelope.payload):,} base64 characters, over "
                      f"the limit of {_MAX_PAYLOAD_B64:,}; refused before decoding")
    try:
        payload = base64.b64decode(envelope.payload, validate=True)
    except (binascii.Error, ValueError):
        raise _refuse("certificate", "the envelope's payload is not base64") from None
    keyid = _verify_signature(envelope, payload, store or TrustStore(), wanted)
    try:
        document = parse_json(payload, SIGNED_LIMITS, what="signed payload")
        if (not isinstance(document, dict) or document.get("_type") != STATEMENT_TYPE
                or document.get("predicateType") != predicate_type):
            raise ValueError(f"not an in-toto Statement with predicate type {predicate_type}")
    except ValueError as exc:
        raise _refuse("certificate", f"the signed payload is not a valid statement: {exc}") from None
    return document, keyid


def open_envelope(envelope: CertificateEnvelope, store: TrustStore | None = None) -> tuple[AdmissionCertificate, str]:
    """The certificate inside ``envelope`` and the ``certify``-trusted key id that signed it; ``NotAdmittedError``."""
    document, keyid = open_statement(envelope, store)
    try:
        certificate = from_dict(document["predicate"], AdmissionCertificate, limits=SIGNED_LIMITS)
        subject = document["subject"]
        if subject != statement(certificate)["subject"]:
            raise ValueError("the Statement's subject does not match its predicate")
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise _refuse("certificate", f"the signed payload is not a valid certificate statement: {exc}") from None
    return certificate, keyid


def read_unverified(envelope: CertificateEnvelope) -> AdmissionCertificate:
    """The certificate inside ``envelope`` WITHOUT checking its signature (for linking and display only)."""
    try:
        if len(envelope.payload) > _MAX_PAYLOAD_B64:
            raise ValueError(f"the payload is over the limit of {_MAX_PAYLOAD_B64:,} base64 characters")
        document = parse_json(base64.b64decode(envelope.payload, validate=True), SIGNED_LIMITS, what="signed payload")
        return from_dict(document["predicate"], AdmissionCertificate, limits=SIGNED_LIMITS)
    except (binascii.Error, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise _refuse("certificate", f"the envelope's payload is not a certificate statement: {exc}") from None


def save_certificate(envelope: CertificateEnvelope, path: str | os.PathLike[str]) -> Path:
    """Write a signed certificate envelope as a versioned JSON document (atomically, never through a link)."""
    if not isinstance(envelope, CertificateEnvelope):
        raise TypeError(f"save_certificate takes the signed CertificateEnvelope, got {type(envelope).__name__}")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(target, to_json(envelope, indent=2) + "\n", mode=0o644)


def load_certificate(path: str | os.PathLike[str]) -> CertificateEnvelope:
    """Read a certificate envelope under ``SIGNED_LIMITS``; an unsigned, HMAC, oversized or malformed document is a
    ``NotAdmittedError``."""
    source = Path(path)
    if not source.is_file():
        raise FileNotFoundError(f"no certificate at {str(source)!r}; create one with `mixle-parallel certify`")
    try:
        document = parse_json(read_limited(source, SIGNED_LIMITS), SIGNED_LIMITS, what=f"certificate {source}")
    except ContractError as exc:
        raise _refuse("certificate", str(exc)) from None
    if isinstance(document, dict) and document.get("kind") == "AdmissionCertificate":
        raise _refuse("signature", f"{source} is an unsigned (or HMAC-signed) certificate of an older release; "
                      + reissue_hint())
    try:
        return from_dict(document, CertificateEnvelope, limits=SIGNED_LIMITS)
    except (ContractError, ValueError, TypeError) as exc:
        raise _refuse("certificate", f"{source} is not a signed certificate envelope: {exc}") from None
