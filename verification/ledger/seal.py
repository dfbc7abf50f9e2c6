"""Signed seals and signed heads: what makes a ledger tamper-evident without a shared secret.

A seal is an in-toto Statement (predicate type ``LEDGER_HEAD_TYPE``: entry count, chain head —
the hash of the last entry covered — and its ``role``) in a DSSE envelope signed with the trust
store's Ed25519 key. Every ``run_end`` carries one with role ``"seal"`` (``payload["seal"]``) over
the entries before it; the head file ``<ledger>.head`` holds one with role ``"head"``, refreshed
after every append, so it always covers the whole ledger. Because the role is signed, a seal
copied out of the ledger is never accepted as a head (a head of the older release, without a
role, is accepted only when the entry it ends at is a ``run_end``, where such heads were written). The chain
proves order and integrity; the signatures prove who vouched for a length, so rewriting the chain
(rehashing every entry) breaks the seals, and deleting whole runs leaves the ledger shorter than
its signed head, the way Certificate Transparency's signed tree heads pin a log (RFC 9162).
"""

from __future__ import annotations

import json
import os
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

__all__ = ["HEAD_ROLE", "LEDGER_HEAD_TYPE", "SEAL_ROLE", "check_head", "check_seal", "head_path", "read_head",
           "sign_head", "write_head"]

LEDGER_HEAD_TYPE = LEDGER_HEAD_PREDICATE
"""Predicate type of a ledger seal / signed head."""


def head_path(ledger: str | os.PathLike[str]) -> Path:
    """``<ledger>.head``: the signed head kept beside a ledger."""
    return Path(f"{os.fspath(ledger)}.head")


SEAL_ROLE = "seal"
"""Role of the seal a ``run_end`` carries."""
HEAD_ROLE = "head"
"""Role of the head file beside the ledger."""


def sign_head(signer: Signer, ledger: str | os.PathLike[str], entries: int, head: str, *,
              role: str = HEAD_ROLE) -> dict[str, Any]:
    """The signed document (a ``CertificateEnvelope`` as a dict) over ``entries`` entries ending in ``head``."""
    if role not in (SEAL_ROLE, HEAD_ROLE):
        raise ValueError(f"role={role!r}; expected {SEAL_ROLE!r} or {HEAD_ROLE!r}")
    statement = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": Path(ledger).name, "digest": {"sha256": head.split(":", 1)[-1]}}],
        "predicateType": LEDGER_HEAD_TYPE,
        "predicate": {"entries": entries, "head": head, "role": role},
    }
    return to_dict(sign_statement(statement, signer))


def write_head(path: str | os.PathLike[str], seal: dict[str, Any]) -> Path:
    """Write ``seal`` as the signed head beside the ledger (atomically, never through a link)."""
    return write_atomic(head_path(path), json.dumps(seal, indent=2, sort_keys=True) + "\n")


def _open(document: Any, store: TrustStore) -> tuple[int, str, str, str | None]:
    """(entries, head, signing key id, role) of a seal document; ``ValueError`` naming what is wrong."""
    if isinstance(document, FrozenDict):
        document = document.to_dict()
    try:
        envelope = from_dict(document, CertificateEnvelope, limits=SIGNED_LIMITS)
        statement, keyid = open_statement(envelope, store, predicate_type=LEDGER_HEAD_TYPE)
        predicate = statement["predicate"]
        entries, head, role = predicate["entries"], predicate["head"], predicate.get("role")
    except NotAdmittedError as exc:
        raise ValueError("; ".join(exc.reasons)) from None
    except (ContractError, KeyError, TypeError) as exc:
        raise ValueError(f"not a signed ledger head: {exc}") from None
    if isinstance(entries, bool) or not isinstance(entries, int) or not isinstance(head, str):
        raise ValueError("a signed ledger head holds an integer entry count and a hash")
    if role not in (None, SEAL_ROLE, HEAD_ROLE):
        raise ValueError(f"a signed ledger head has role {role!r}")
    return entries, head, keyid, role


def check_seal(document: Any, seq: int, prev: str, store: TrustStore) -> str | None:
    """None when a run_end's seal is signed by a trusted key and covers exactly the ``seq`` entries before it."""
    try:
        entries, head, _, role = _open(document, store)
    except ValueError as exc:
        return f"run_end seal does not verify: {exc}"
    if role == HEAD_ROLE:
        return "run_end carries a signed head, not a seal"
    if (entries, head) != (seq, prev):
        return f"run_end seal covers {entries} entries ending {head[:23]}..., the chain has {seq} ending {prev[:23]}..."
    return None


def read_head(path: str | os.PathLike[str], store: TrustStore) -> tuple[int, str, str, str | None]:
    """(entries, head hash, key id, role) of a signed head file; ``ValueError`` when missing, unreadable or
    untrusted."""
    source = Path(path)
    try:  # size before decoding, strict JSON (SIGNED_LIMITS)
        document = parse_json(read_limited(source, SIGNED_LIMITS), SIGNED_LIMITS, what=f"signed head {source}")
    except FileNotFoundError:
        raise ValueError(f"no signed head at {source}") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"signed head {source} is not a JSON document: {exc}") from None
    return _open(document, store)


def check_head(path: str | os.PathLike[str], count: int, covered: tuple[str, str] | None, entries: int,
               head: str, role: str | None) -> str | None:
    """The problem of a signed head (``read_head``'s ``entries``, ``head``, ``role``) against a ledger of ``count``
    entries whose entry number ``entries - 1`` has (hash, kind) ``covered``; None when it holds."""
    if role == SEAL_ROLE:
        return (f"the signed head ({path}) is a run_end seal, not a head: a seal copied from inside the ledger "
                "vouches only for the entries before its run_end")
    if entries > count:
        return (f"the ledger has {count} entries but its signed head ({path}) vouches for {entries}: "
                "entries were deleted (truncation or rollback)")
    if entries and covered is not None and covered[0] != head:
        return (f"entry {entries - 1} hashes to {covered[0][:23]}..., the signed head ({path}) says "
                f"{head[:23]}...: the ledger was rewritten")
    if role is None and entries and covered is not None and covered[1] != "run_end":
        return (f"the signed head ({path}) has no role and ends at a {covered[1]} entry, where only run_end seals "
                "end: it is a seal copied from inside the ledger, not a head")
    return None
