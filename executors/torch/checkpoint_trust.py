"""Signed checkpoint manifests and rollback protection (torch-free).

At save, rank 0 signs ``MANIFEST.json`` before publishing: ``MANIFEST.sig`` beside it is a DSSE
envelope (in-toto Statement, subject the generation, predicate the manifest's sha256) signed with
the trust store's Ed25519 key, and the generation number is recorded as this checkpoint root's
high-water mark under the trust store (``<home>/checkpoints/<sha256 of the root path>.json``).
At load, before any file of the checkpoint is unpickled or any state changes, ``verify_generation``
checks the signature against trusted, unrevoked keys and refuses a ``LATEST`` that points below the
high-water mark or below a newer signed generation in the folder (a rollback) unless
``allow_rollback=True``. ``trust="unsigned"`` is the explicit opt-out for checkpoints of an older
release or a machine whose key is not trusted here; it is logged.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from ...contracts import CertificateEnvelope, ContractError, NotAdmittedError, from_dict, to_dict
from ...contracts.bounded_json import SIGNED_LIMITS, parse_json, read_limited
from ...verification.attestation import STATEMENT_TYPE, open_statement, sign_statement
from ...verification.keys import TrustStore, TrustStoreError
from .checkpoint_manifest import (
    MANIFEST_NAME,
    SIGNATURE_NAME,
    CheckpointError,
    CorruptCheckpointError,
)

__all__ = ["CHECKPOINT_TRUST_MODES", "MANIFEST_TYPE", "SIGNATURE_NAME", "UntrustedCheckpointError",
           "sign_generation", "verify_generation"]


MANIFEST_TYPE = "https://mixle-parallel.dev/attestation/checkpoint-manifest/v1"
"""Predicate type of a checkpoint manifest signature."""

CHECKPOINT_TRUST_MODES = ("signed", "unsigned")
"""``trust=`` values of ``load_checkpoint``: require a trusted signature (default), or skip it."""

_GENERATION = re.compile(r"^gen-(\d{8})$")
_log = logging.getLogger(__name__)


class UntrustedCheckpointError(CheckpointError):
    """A checkpoint is unsigned, signed by an untrusted key, altered since signing, or a rollback."""


def _number(generation: str) -> int:
    match = _GENERATION.match(generation)
    if match is None:
        raise UntrustedCheckpointError(f"{generation!r} is not a generation folder name")
    return int(match.group(1))


def _mark_file(store: TrustStore, root: Path) -> Path:
    key = hashlib.sha256(str(root.resolve()).encode("utf-8")).hexdigest()
    return store.home / "checkpoints" / f"{key}.json"


def _high_water(store: TrustStore, root: Path) -> int:
    try:
        doc = json.loads(_mark_file(store, root).read_text(encoding="utf-8"))
        value = doc["generation"]
        return value if isinstance(value, int) and not isinstance(value, bool) else 0
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def _raise_mark(store: TrustStore, root: Path, number: int) -> None:
    if number <= _high_water(store, root):
        return
    target = _mark_file(store, root)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps({"root": str(root.resolve()), "generation": number}) + "\n", encoding="utf-8")
    os.replace(tmp, target)


def sign_generation(generation_dir: str | os.PathLike[str], manifest_sha256: str, *,
                    trust_store: TrustStore | None = None) -> Path:
    """Write ``MANIFEST.sig`` over the manifest's sha256 and raise the root's high-water mark."""
    gen = Path(generation_dir)
    store = trust_store or TrustStore()
    statement = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": gen.name, "digest": {"sha256": manifest_sha256}}],
        "predicateType": MANIFEST_TYPE,
        "predicate": {"generation": gen.name, "manifest_sha256": manifest_sha256},
    }
    envelope = sign_statement(statement, store.ensure_signer())
    target = gen / SIGNATURE_NAME
    target.write_text(json.dumps(to_dict(envelope), sort_keys=True) + "\n", encoding="utf-8")
    _raise_mark(store, gen.parent, _number(gen.name))
    return target


def _signed_digest(generation_dir: Path, store: TrustStore) -> str:
    """The manifest sha256 a trusted key signed for this generation; ``UntrustedCheckpointError`` otherwise."""
    path = generation_dir / SIGNATURE_NAME
    hint = ("load it with trust='unsigned' if you know where it came from, or trust its signer's key "
            "(`mixle-parallel keys trust PUBKEY`)")
    try:
        document = parse_json(read_limited(path, SIGNED_LIMITS), SIGNED_LIMITS, what=f"manifest signature {path}")
        envelope = from_dict(document, CertificateEnvelope, limits=SIGNED_LIMITS)
        statement, _ = open_statement(envelope, store, predicate_type=MANIFEST_TYPE)
        predicate = statement["predicate"]
        digest, generation = predicate["manifest_sha256"], predicate["generation"]
    except FileNotFoundError:
        raise UntrustedCheckpointError(f"checkpoint {generation_dir} is unsigned (no {SIGNATURE_NAME}); "
                                       + hint) from None
    except NotAdmittedError as exc:
        raise UntrustedCheckpointError(f"{path}: {'; '.join(exc.reasons)}; " + hint) from None
    except (OSError, ValueError, UnicodeDecodeError, RecursionError, ContractError, KeyError, TypeError) as exc:
        raise UntrustedCheckpointError(f"{path} is not a manifest signature ({exc}); " + hint) from None
    if generation != generation_dir.name or not isinstance(digest, str):
        raise UntrustedCheckpointError(f"{path} signs generation {generation!r}, not {generation_dir.name}")
    return digest


def _newest_signed(root: Path, store: TrustStore) -> int:
    newest = 0
    for candidate in root.iterdir() if root.is_dir() else ():
        if _GENERATION.match(candidate.name) and (candidate / SIGNATURE_NAME).is_file():
            try:
                _signed_digest(candidate, store)
            except UntrustedCheckpointError:
                continue
            newest = max(newest, _number(candidate.name))
    return newest


def verify_generation(generation_dir: str | os.PathLike[str], *, trust: str = "signed",
                      allow_rollback: bool = False, trust_store: TrustStore | None = None) -> dict[str, Any]:
    """Check a generation before anything in it is read: trusted signature over its manifest, no rollback.

    Returns what was checked (``signed_by_trusted_key``, ``rollback_checked``); raises
    ``UntrustedCheckpointError`` naming the problem and the opt-out.
    """
    if trust not in CHECKPOINT_TRUST_MODES:
        raise ValueError(f"trust={trust!r}; expected one of {CHECKPOINT_TRUST_MODES}")
    gen = Path(generation_dir)
    store = trust_store or TrustStore()
    if trust == "unsigned":
        _log.warning("loading checkpoint %s WITHOUT checking its signature (trust='unsigned')", gen)
        return {"signed_by_trusted_key": False, "rollback_checked": False}
    try:
        manifest = (gen / MANIFEST_NAME).read_bytes()
    except FileNotFoundError:
        raise CorruptCheckpointError(gen / MANIFEST_NAME, "the manifest is missing (the save never finished?)"
                                     ) from None
    if hashlib.sha256(manifest).hexdigest() != _signed_digest(gen, store):
        raise UntrustedCheckpointError(f"{gen / MANIFEST_NAME} differs from the manifest its signature covers: "
                                       "the checkpoint was changed after it was signed")
    if not allow_rollback:
        number = _number(gen.name)
        try:
            newest = max(_high_water(store, gen.parent), _newest_signed(gen.parent, store))
        except TrustStoreError as exc:
            raise UntrustedCheckpointError(str(exc)) from None
        if number < newest:
            raise UntrustedCheckpointError(
                f"{gen} is generation {number}, but generation {newest} of this checkpoint was signed or seen "
                "here: LATEST was rolled back; pass allow_rollback=True to load an older generation on purpose")
    return {"signed_by_trusted_key": True, "rollback_checked": not allow_rollback}
