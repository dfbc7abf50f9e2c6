"""Signed seals and signed heads: what makes a ledger tamper-evident without a shared secret.

A seal is an in-toto Statement (predicate type ``LEDGER_HEAD_TYPE``: entry count and chain head,
the hash of the last entry before the seal) in a DSSE envelope signed with the trust store's
Ed25519 key. Every ``run_end`` carries one (``payload["seal"]``) over the entries before it, and
the same statement is written beside the ledger as ``<ledger>.head`` after each run. The chain
proves order and integrity; the signatures prove who vouched for a length, so rewriting the chain
(rehashing every entry) breaks the seals, and deleting whole runs leaves the ledger shorter than
its signed head, the way Certificate Transparency's signed tree heads pin a log (RFC 9162).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from securesystemslib.signer import Signer

from ...contracts import (
    CertificateEnvelope,
    ContractError,
    FrozenDict,
    NotAdmittedError,
    from_dict,
    to_dict,
)
from ...contracts.bounded_json import SIGNED_LIMITS, parse_json, read_limited
from ..attestation import LEDGER_HEAD_PREDICATE, STATEMENT_TYPE, open_statement, sign_statement
from ..keys import TrustStore
from ..safe_files import write_atomic

__all__ = ["LEDGER_HEAD_TYPE", "check_head", "check_seal", "head_path", "read_head", "sign_head", "write_head"]

LEDGER_HEAD_TYPE = LEDGER_HEAD_PREDICATE
"""Predicate type of a ledger seal / signed head."""


def head_path(ledger: str | os.PathLike[str]) -> Path:
    """``<ledger>.head``: the signed head kept beside a ledger."""
    return Path(f"{os.fspath(ledger)}.head")


def sign_head(signer: Signer, ledger: str | os.PathLike[str], entries: int, head: str) -> dict[str, Any]:
    """The seal document (a ``CertificateEnvelope`` as a dict) over ``entries`` entries ending in ``head``."""
    statement = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": Path(ledger).name, "digest": {"sha256": head.split(":", 1)[-1]}}],
        "predicateType": LEDGER_HEAD_TYPE,
        "predicate": {"entries": entries, "head": head},
    }
    return to_dict(sign_statement(statement, signer))


def write_head(path: str | os.PathLike[str], seal: dict[str, Any]) -> Path:
    """Write ``seal`` as the signed head beside the ledger (atomically, never through a link)."""
    return write_atomic(head_path(path), json.dumps(seal, indent=2, sort_keys=True) + "\n")


def _open(document: Any, store: TrustStore) -> tuple[int, str, str]:
    """(entries, head, signing key id) of a seal document; ``ValueError`` naming what is wrong."""
    if isinstance(document, FrozenDict):
        document = document.to_dict()
    try:
        envelope = from_dict(document, CertificateEnvelope, limits=SIGNED_LIMITS)
        statement, keyid = open_statement(envelope, store, predicate_type=LEDGER_HEAD_TYPE)
        predicate = statement["predicate"]
        entries, head = predicate["entries"], predicate["head"]
    except NotAdmittedError as exc:
        raise ValueError("; ".join(exc.reasons)) from None
    except (ContractError, KeyError, TypeError) as exc:
        raise ValueError(f"not a signed ledger head: {exc}") from None
    if isinstance(entries, bool) or not isinstance(entries, int) or not isinstance(head, str):
        raise ValueError("a signed ledger head holds an integer entry count and a hash")
    return entries, head, keyid


def check_seal(document: Any, seq: int, prev: str, store: TrustStore) -> str | None:
    """None when a run_end's seal is signed by a trusted key and covers exactly the ``seq`` entries before it."""
    try:
        entries, head, _ = _open(document, store)
    except ValueError as exc:
        return f"run_end seal does not verify: {exc}"
    if (entries, head) != (seq, prev):
        return f"run_end seal covers {entries} entries ending {head[:23]}..., the chain has {seq} ending {prev[:23]}..."
    return None


def read_head(path: str | os.PathLike[str], store: TrustStore) -> tuple[int, str, str]:
    """(entries, head hash, key id) of a signed head file; ``ValueError`` when missing, unreadable or untrusted."""
    source = Path(path)
    try:  # size before decoding, strict JSON (SIGNED_LIMITS)
        document = parse_json(read_limited(source, SIGNED_LIMITS), SIGNED_LIMITS, what=f"signed head {source}")
    except FileNotFoundError:
        raise ValueError(f"no signed head at {source}") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"signed head {source} is not a JSON document: {exc}") from None
    return _open(document, store)


def check_head(path: str | os.PathLike[str], hashes: Sequence[str], store: TrustStore) -> tuple[str | None, str]:
    """(problem or None, description) of a signed head file against the ledger's entry hashes."""
    try:
        entries, head, keyid = read_head(path, store)
    except ValueError as exc:
        return str(exc), ""
    described = f"signed head: {entries} entries, head {head[:23]}..., key {keyid[:16]}..."
    if entries > len(hashes):
        return (f"the ledger has {len(hashes)} entries but its signed head ({path}) vouches for {entries}: "
                "entries were deleted (truncation or rollback)"), described
    if entries and hashes[entries - 1] != head:
        return (f"entry {entries - 1} hashes to {hashes[entries - 1][:23]}..., the signed head ({path}) says "
                f"{head[:23]}...: the ledger was rewritten"), described
    return None, described
