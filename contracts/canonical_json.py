"""The canonical JSON of every document that is signed or hashed, in one module: what signs or hashes calls it.

* ``signed_json_bytes``: RFC 8785 (JSON Canonicalization Scheme, the ``rfc8785`` package), the payload of every
  DSSE envelope: certificates, ledger seals, checkpoint manifests (``verification.attestation.sign_statement``).
* ``hashed_json_bytes``: the form hashed into recorded artefacts since the first release: contract content ids
  (``serialization.content_digest``: ``certificate_id``, ``evidence_id``) and ledger entry hashes. Keys sorted, no
  spaces, UTF-8 unescaped, NaN and infinities refused. It is frozen rather than moved to RFC 8785, because
  the two differ in how numbers are written (``1e-07`` and ``100.0`` here, ``1e-7`` and ``100`` there): moving
  would change the id of every stored certificate and evidence record and break every existing ledger chain.
* ``ledger_line_text``: the text of a ledger line, the same form with non-ASCII escaped, so a line whose text has
  no escape holds exactly its body's hashed bytes (the ledger's fast path cuts them from the line).
"""

from __future__ import annotations

import json
from typing import Any

import rfc8785

__all__ = ["hashed_json_bytes", "ledger_line_text", "signed_json_bytes"]


def signed_json_bytes(document: Any) -> bytes:
    """RFC 8785 bytes of a JSON document (sorted keys by UTF-16, ECMAScript numbers): what a signature covers."""
    return rfc8785.dumps(document)


def hashed_json_bytes(document: Any) -> bytes:
    """The frozen canonical form that content ids and ledger entry hashes cover (see the module docstring)."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def ledger_line_text(document: Any) -> str:
    """One ledger line: ``hashed_json_bytes``' form, ASCII only (non-ASCII as ``\\u`` escapes)."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), allow_nan=False)
