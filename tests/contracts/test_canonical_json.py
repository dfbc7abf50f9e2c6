"""One canonical JSON module (contracts.canonical_json) for everything signed or hashed.

Signed payloads are RFC 8785; content ids and ledger hashes keep the form they were recorded in: the values pinned
here were computed on main before the three canonicalisations became one module, and must not move.
"""

from __future__ import annotations

import ast
import base64
import os
from pathlib import Path

import pytest

from mixle_parallel.contracts.canonical_json import hashed_json_bytes, ledger_line_text, signed_json_bytes
from mixle_parallel.contracts.evidence import Tolerance
from mixle_parallel.contracts.serialization import canonical_json, content_digest
from mixle_parallel.verification.attestation import sign_statement
from mixle_parallel.verification.keys import TrustStore
from mixle_parallel.verification.ledger.entries import LedgerEntry, entry_hash

ROOT = Path(__file__).resolve().parents[2]
BODY = {"seq": 3, "kind": "receipt", "time": "2026-01-01T00:00:00+00:00", "certificate": "unverified",
        "payload": {"loss": 0.1, "tiny": 1e-07, "big": 1e16, "name": "caf\u00e9 \U0001F600", "n": 2**60},
        "prev": "sha256:" + "0" * 64}


def test_content_ids_are_the_ones_recorded_before():
    tolerance = Tolerance(atol=1e-7, rtol=100.0)
    assert canonical_json(tolerance) == '{"data":{"atol":1e-07,"bitwise":false,"rtol":100.0,"source":""},' \
                                        '"kind":"Tolerance","version":1}'
    assert content_digest(tolerance) == "sha256:06d81d257266d16b8646b8a6cf2fdf43c80d8391ff66ca5240e568ba17fa2a30"


def test_ledger_hashes_and_lines_are_the_ones_recorded_before():
    assert entry_hash(BODY) == "sha256:4f12025f38009792e96e3453066140c9031ca26f723285bb2b6bed18062161ba"
    assert entry_hash(BODY, b"k") == "hmac-sha256:762723d9d48c08a3e92424e63b046dad24e616ab0074399a80cdc7d6d6270c11"
    line = LedgerEntry(**BODY, hash=entry_hash(BODY)).to_line()
    assert line.startswith('{"certificate":"unverified","hash":"sha256:4f12025f') and line.isascii()
    assert '"payload":{"big":1e+16,"loss":0.1,"n":1152921504606846976,"name":"caf\\u00e9 \\ud83d\\ude00",' in line


def test_the_hashed_form_refuses_what_strict_json_cannot_say():
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="JSON compliant"):
            hashed_json_bytes({"x": bad})
        with pytest.raises(ValueError, match="JSON compliant"):
            ledger_line_text({"x": bad})


def test_a_signed_payload_is_rfc8785():
    document = {"b": [1e-7, 100.0, 0.1], "a": "caf\u00e9", "\U0001F600": 1, "\uff21": 2}
    assert signed_json_bytes(document) == '{"a":"café","b":[1e-7,100,0.1],"😀":1,"Ａ":2}'.encode()
    envelope = sign_statement(document, TrustStore().ensure_signer())
    assert base64.b64decode(envelope.payload) == signed_json_bytes(document)


def _project_files() -> list[Path]:
    """The package's modules, each once (the facade's links to the three folders are not followed)."""
    files = []
    for folder in ("contracts", "verification", "executors", "mixle_parallel"):
        for where, dirs, names in os.walk(ROOT / folder, followlinks=False):
            dirs[:] = [d for d in dirs if not (Path(where) / d).is_symlink()]
            files += [Path(where) / n for n in names if n.endswith(".py")]
    return files


def _canonicalises(node: ast.AST) -> bool:
    """An import of rfc8785, or a ``json.dumps(..., separators=...)`` (the compact form hashes are taken over)."""
    if isinstance(node, ast.Import):
        return any(alias.name.split(".")[0] == "rfc8785" for alias in node.names)
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").split(".")[0] == "rfc8785"
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "dumps"
            and any(k.arg == "separators" for k in node.keywords))


def test_nothing_else_canonicalises_json_for_a_signature_or_a_hash():
    """rfc8785 and compact json.dumps live in contracts/canonical_json.py only (parsing lives elsewhere)."""
    elsewhere = {"executors/torch/checkpoint_manifest.py"}  # its material digest: the checkpoint readers' rewrite
    found = {path.relative_to(ROOT).as_posix() for path in _project_files()
             if any(_canonicalises(node) for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))))}
    assert "contracts/canonical_json.py" in found  # the check sees the one module that does it
    found.discard("contracts/canonical_json.py")
    assert found <= elsewhere, f"canonicalise through contracts.canonical_json, not in {sorted(found - elsewhere)}"
