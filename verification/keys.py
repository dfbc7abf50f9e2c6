"""The trust store: this machine's Ed25519 signing key, the public keys it trusts and for what, and its policy.

Where it lives: ``$MIXLE_PARALLEL_HOME`` if set, else ``$XDG_CONFIG_HOME/mixle-parallel``, else
``~/.config/mixle-parallel``. Inside:

* ``signing-key.pem``: the private Ed25519 key (PKCS#8 PEM, file mode 0600), made by ``keys init``
  (or on first use while the policy allows it);
* ``signing-key.pub``: its public key (PEM), the file to hand to other machines' ``keys trust``;
* ``trust.json``: trusted public keys by key id (securesystemslib's key id: the sha256 of the
  canonical key), each with a label, when it was added, the purposes it is trusted for
  (``certify``, ``ledger``, ``checkpoint``, ``provenance``) and, once revoked, when;
* ``policy.json``: automatic certification ``on`` (default), ``off`` or ``trusted-keys-only``.

Every write is atomic and never follows a link (``safe_files``); changes to ``trust.json`` and key
creation hold an exclusive lock (``.lock``), so racing processes end with one key and no lost entry.
A home, trust file or policy file that every user may write is refused, naming the ``chmod`` to run.
Keys are generated, loaded and used through securesystemslib's ``CryptoSigner``/``SSlibKey``
(pyca/cryptography underneath); nothing here implements a primitive. The HMAC ``load_key`` is kept
only for ledgers written before signed seals (purpose ``"ledger"``).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

import attrs
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
    load_pem_public_key,
)
from securesystemslib.signer import CryptoSigner, SSlibKey

from ..contracts import ContractError, choose
from ..contracts.bounded_json import TRUST_FILE_LIMITS, DocumentLimits, parse_json, read_limited
from .safe_files import UnsafeFileError, exclusive_lock, publish_exclusive, refuse_world_writable, write_atomic

__all__ = [
    "HOME_ENV", "KEY_ENV", "KEY_PURPOSES", "CertificationPolicy", "KeyPurpose", "TrustStore", "TrustStoreError",
    "TrustedKey", "config_home", "load_key", "parse_purposes",
]

HOME_ENV = "MIXLE_PARALLEL_HOME"
"""Overrides the config directory of the trust store (and the certificate store)."""

KEY_ENV = {"ledger": ("MIXLE_PARALLEL_LEDGER_KEY_FILE", "MIXLE_PARALLEL_LEDGER_KEY")}
"""Environment variable names (file, literal) of the legacy ledger HMAC key."""

SIGNING_KEY = "signing-key.pem"
PUBLIC_KEY = "signing-key.pub"
TRUST_FILE = "trust.json"
POLICY_FILE = "policy.json"
LOCK_FILE = ".lock"

_KEY_FILE_LIMITS = DocumentLimits("key file", max_bytes=64 << 10, max_items=1)


class TrustStoreError(ValueError):
    """The trust store is missing, unreadable, or asked to do something it cannot; says what to run."""


class KeyPurpose(StrEnum):
    """What a trusted key may vouch for: admission certificates, ledger seals and heads, checkpoint manifests,
    provenance statements of a run's artefacts."""

    CERTIFY = "certify"
    LEDGER = "ledger"
    CHECKPOINT = "checkpoint"
    PROVENANCE = "provenance"


KEY_PURPOSES: frozenset[KeyPurpose] = frozenset(KeyPurpose)
"""Every purpose: what ``keys init`` trusts this machine's own key for, and what an entry written before
scopes existed (no ``purposes`` field in ``trust.json``) keeps."""


class CertificationPolicy(StrEnum):
    """The trust store's policy for automatic certification (``mixle-parallel keys policy``)."""

    ON = "on"
    """Certify on the spot when no stored certificate fits; make this machine's key on first use (default)."""
    OFF = "off"
    """Never certify automatically: the gate refuses, naming the ``mixle-parallel certify`` command to run."""
    TRUSTED_KEYS_ONLY = "trusted-keys-only"
    """Never create a signing key implicitly: without a key of its own, this machine admits only certificates
    signed by keys it trusts (e.g. its organisation's CI) and signs nothing until ``keys init``."""


def parse_purposes(value: str | Iterable[str | KeyPurpose]) -> frozenset[KeyPurpose]:
    """Purposes from ``"certify,ledger"`` or an iterable; ``TrustStoreError`` naming the allowed ones."""
    names = [v.strip() for v in value.split(",")] if isinstance(value, str) else list(value)
    try:
        purposes = frozenset(KeyPurpose(choose(KeyPurpose, n, option="--for")) for n in names if n)
    except ValueError as exc:
        raise TrustStoreError(str(exc)) from None
    if not purposes:
        raise TrustStoreError(f"--for names no purpose; give some of {', '.join(p.value for p in KeyPurpose)}")
    return purposes


def config_home(environ: Mapping[str, str] | None = None) -> Path:
    """The trust store's directory: MIXLE_PARALLEL_HOME, else XDG_CONFIG_HOME/mixle-parallel, else ~/.config/..."""
    env = os.environ if environ is None else environ
    if env.get(HOME_ENV):
        return Path(env[HOME_ENV])
    base = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else Path.home() / ".config"
    return base / "mixle-parallel"


def _purpose_set(values: Iterable[Any]) -> frozenset[KeyPurpose]:
    return frozenset(KeyPurpose(v) for v in values)


@attrs.frozen
class TrustedKey:
    """One entry of ``trust.json``: a public key, its id, a label, its purposes, and whether it was revoked."""

    keyid: str
    public_pem: str
    label: str = ""
    added_at: str = ""
    revoked_at: str | None = None
    purposes: frozenset[KeyPurpose] = attrs.field(default=KEY_PURPOSES, converter=_purpose_set)

    @property
    def revoked(self) -> bool:
        """True once ``keys revoke`` was run for this key."""
        return self.revoked_at is not None

    def trusted_for(self, purpose: KeyPurpose | str) -> bool:
        """True when this key is unrevoked and trusted for ``purpose``."""
        return not self.revoked and KeyPurpose(purpose) in self.purposes

    def describe_purposes(self) -> str:
        """The purposes as ``keys trust --for`` takes them (``certify,ledger``)."""
        return ",".join(p.value for p in KeyPurpose if p in self.purposes)

    def sslib_key(self) -> SSlibKey:
        """The key as securesystemslib's ``SSlibKey`` (what DSSE verification takes)."""
        return public_key_from_pem(self.public_pem)

    def to_json(self) -> dict[str, Any]:
        """The entry as ``trust.json`` holds it (purposes written out, in a fixed order)."""
        return {"keyid": self.keyid, "public_pem": self.public_pem, "label": self.label, "added_at": self.added_at,
                "revoked_at": self.revoked_at, "purposes": [p.value for p in KeyPurpose if p in self.purposes]}


def public_key_from_pem(pem: str | bytes) -> SSlibKey:
    """An Ed25519 ``SSlibKey`` from a PEM public key; ``TrustStoreError`` for anything else."""
    data = pem.encode("ascii", "replace") if isinstance(pem, str) else pem
    try:
        key = SSlibKey.from_crypto(load_pem_public_key(data))
    except (ValueError, TypeError) as exc:
        raise TrustStoreError(f"not a PEM public key: {exc}") from None
    if key.keytype != "ed25519":
        raise TrustStoreError(f"only Ed25519 keys are trusted, got a {key.keytype} key")
    return key


def _now() -> str:
    return datetime.now(UTC).isoformat()


_ENTRY_FIELDS = ("keyid", "public_pem", "label", "added_at", "revoked_at")


def _entry(raw: Any) -> TrustedKey:
    """One ``trust.json`` entry, strictly: known fields only, right types, the key id that of the key."""
    if not isinstance(raw, dict):
        raise ValueError(f"an entry is a {type(raw).__name__}, not an object")
    unknown = sorted(set(raw) - {*_ENTRY_FIELDS, "purposes"})
    if unknown:
        raise ValueError(f"unknown field(s) {unknown} in an entry")
    fields = {k: raw[k] for k in _ENTRY_FIELDS}
    for name in ("keyid", "public_pem", "label", "added_at"):
        if not isinstance(fields[name], str):
            raise ValueError(f"entry field {name!r} is a {type(fields[name]).__name__}, not a string")
    if fields["revoked_at"] is not None and not isinstance(fields["revoked_at"], str):
        raise ValueError("entry field 'revoked_at' is neither null nor a string")
    purposes = raw.get("purposes", [p.value for p in KeyPurpose])  # written before scopes: every purpose
    if not isinstance(purposes, list) or not all(isinstance(p, str) for p in purposes):
        raise ValueError("entry field 'purposes' is not a list of names")
    entry = TrustedKey(**fields, purposes=parse_purposes(purposes) if purposes else frozenset())
    if public_key_from_pem(entry.public_pem).keyid != entry.keyid:
        raise ValueError(f"entry {entry.keyid[:16]}...: the key id is not that of its public key")
    return entry


def _merged(entries: Iterable[TrustedKey]) -> tuple[TrustedKey, ...]:
    """One entry per key id: revoked if any of its entries is, trusted only for purposes every entry grants."""
    merged: dict[str, TrustedKey] = {}
    for entry in entries:
        prior = merged.get(entry.keyid)
        if prior is None:
            merged[entry.keyid] = entry
            continue
        revoked = min((t for t in (prior.revoked_at, entry.revoked_at) if t is not None), default=None)
        merged[entry.keyid] = attrs.evolve(prior, revoked_at=revoked, purposes=prior.purposes & entry.purposes)
    return tuple(merged.values())


class TrustStore:
    """The signing key, trusted keys and policy under one config directory (``config_home()`` by default)."""

    def __init__(self, home: str | os.PathLike[str] | None = None) -> None:
        self.home = Path(home) if home is not None else config_home()

    # ---- the folder ----------------------------------------------------------------------
    @property
    def trust_path(self) -> Path:
        """``trust.json``: the trusted keys."""
        return self.home / TRUST_FILE

    @property
    def policy_path(self) -> Path:
        """``policy.json``: the automatic-certification policy, beside the trust file."""
        return self.home / POLICY_FILE

    def _check(self, *paths: Path) -> None:
        """Refuse a home (or one of ``paths``) that every user may write."""
        try:
            refuse_world_writable(self.home, "trust store folder")
            for path in paths:
                refuse_world_writable(path, "trust store file")
        except UnsafeFileError as exc:
            raise TrustStoreError(str(exc)) from None

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """The home made (0700) if missing and checked, and its lock held: one writer at a time."""
        self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._check(self.trust_path, self.policy_path)
        with exclusive_lock(self.home / LOCK_FILE):
            yield

    def _read(self, path: Path) -> Any:
        """A trust store document, bounded and strict; None when missing; ``TrustStoreError`` when unsafe or damaged."""
        self._check(path)
        try:
            raw = read_limited(path, TRUST_FILE_LIMITS, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise TrustStoreError(f"cannot read {path} ({exc.strerror or exc}); it must be a regular file, not a "
                                  "link") from None
        except ContractError as exc:
            raise TrustStoreError(f"trust store file {path} is damaged ({exc}); fix or remove it") from None
        try:
            return parse_json(raw, TRUST_FILE_LIMITS, what=str(path))
        except ContractError as exc:
            raise TrustStoreError(f"trust store file {path} is damaged ({exc}); fix or remove it") from None

    # ---- the signing key -------------------------------------------------------------
    @property
    def signing_key_path(self) -> Path:
        """Where the private key lives (mode 0600)."""
        return self.home / SIGNING_KEY

    @property
    def public_key_path(self) -> Path:
        """Where the public key lives (share this file with machines that should trust this one)."""
        return self.home / PUBLIC_KEY

    def has_signing_key(self) -> bool:
        """True when this machine has a signing key (``keys init``, or made on first use)."""
        return os.path.lexists(self.signing_key_path)

    def _create_key(self, label: str) -> TrustedKey:
        """Make the key while holding the lock: trust entry first, public key next, private key last (atomically,
        exclusively), so whoever sees the private key sees it trusted."""
        private = Ed25519PrivateKey.generate()
        pem = private.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode("ascii")
        entry = self._trust_locked(pem, label=label, purposes=None)
        write_atomic(self.public_key_path, pem, mode=0o644)
        secret = private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
        if not publish_exclusive(self.signing_key_path, secret, mode=0o600):
            raise TrustStoreError(f"a signing key appeared at {self.signing_key_path} while this one was made; "
                                  "a process not using the trust store's lock wrote it")
        return entry

    def init(self, *, label: str = "this machine") -> TrustedKey:
        """Make a signing key (refused when one exists), trust it for every purpose; returns its entry."""
        with self._locked():
            if self.has_signing_key():
                raise TrustStoreError(f"a signing key already exists at {self.signing_key_path}; "
                                      "revoke it with `mixle-parallel keys revoke KEYID` before making a new one")
            return self._create_key(label)

    def signer(self) -> CryptoSigner:
        """The signing key as a securesystemslib signer; ``TrustStoreError`` naming ``keys init`` if none."""
        path = self.signing_key_path
        if not self.has_signing_key():
            raise TrustStoreError(f"no signing key at {path}; run `mixle-parallel keys init` "
                                  f"(directory from {HOME_ENV}, XDG_CONFIG_HOME or ~/.config)")
        self._check()
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISREG(info.st_mode):
            raise TrustStoreError(f"signing key {path} is a link or not a regular file; a private key must be a file "
                                  "of its own (move the key there, or `keys init` in a fresh home)")
        mode = info.st_mode & 0o777
        if mode & 0o077:
            raise TrustStoreError(f"signing key {path} is readable by others (mode {mode:o}); run `chmod 600 {path}`")
        try:
            private = load_pem_private_key(read_limited(path, _KEY_FILE_LIMITS, follow_symlinks=False), password=None)
        except (ValueError, TypeError, OSError) as exc:
            raise TrustStoreError(f"signing key {path} is not a PEM private key: {exc}") from None
        return CryptoSigner(private)

    def ensure_signer(self) -> CryptoSigner:
        """The signing key, made on first use unless the policy is ``trusted-keys-only`` (then ``TrustStoreError``).

        Racing processes on a fresh home end with one key: creation holds the lock and publishes the
        finished key file atomically; the others use it.
        """
        if not self.has_signing_key():
            with self._locked():  # the policy is read under the lock ``set_policy`` writes it under
                if not self.has_signing_key():
                    if not self.may_create_key():
                        raise TrustStoreError(
                            f"this machine has no signing key and the trust store's policy ({self.policy_path}) is "
                            "trusted-keys-only: no key is created implicitly; run `mixle-parallel keys init` to "
                            "make one deliberately, or use certificates signed by a key this store trusts")
                    self._create_key("this machine")
        return self.signer()

    # ---- policy ----------------------------------------------------------------------
    def policy(self) -> CertificationPolicy:
        """The automatic-certification policy (``on`` when ``policy.json`` is absent)."""
        document = self._read(self.policy_path)
        if document is None:
            return CertificationPolicy.ON
        if not isinstance(document, dict) or set(document) != {"certification"}:
            raise TrustStoreError(f"policy file {self.policy_path} is damaged (expected {{\"certification\": ...}}); "
                                  "set it again with `mixle-parallel keys policy on|off|trusted-keys-only`")
        try:
            return CertificationPolicy(choose(CertificationPolicy, document["certification"],
                                              option=f"{self.policy_path}: certification"))
        except ValueError as exc:
            raise TrustStoreError(str(exc)) from None

    def set_policy(self, value: CertificationPolicy | str) -> CertificationPolicy:
        """Write the automatic-certification policy (``on``, ``off`` or ``trusted-keys-only``); returns it."""
        try:
            policy = CertificationPolicy(choose(CertificationPolicy, value, option="policy"))
        except ValueError as exc:
            raise TrustStoreError(str(exc)) from None
        with self._locked():
            write_atomic(self.policy_path, f'{{"certification": "{policy.value}"}}\n', mode=0o644)
        return policy

    def may_create_key(self) -> bool:
        """Whether a signing key may be made implicitly (on first use): not under ``trusted-keys-only``."""
        return self.policy() is not CertificationPolicy.TRUSTED_KEYS_ONLY

    def automatic_certification_refusal(self) -> str | None:
        """Why this store's policy forbids certifying on the spot right now, or None when it allows it.

        ``off``: never. ``trusted-keys-only``: only when this machine already has a signing key of its own.
        """
        policy = self.policy()
        if policy is CertificationPolicy.OFF:
            return (f"automatic certification is off in this trust store's policy ({self.policy_path}; "
                    "`mixle-parallel keys policy on` turns it back on)")
        if policy is CertificationPolicy.TRUSTED_KEYS_ONLY and not self.has_signing_key():
            return (f"the trust store's policy ({self.policy_path}) is trusted-keys-only and this machine has no "
                    "signing key of its own, so none is made implicitly: use a certificate signed by a key this "
                    "store trusts (e.g. your CI's), or make a key deliberately with `mixle-parallel keys init`")
        return None

    # ---- trusted keys ----------------------------------------------------------------
    def keys(self) -> tuple[TrustedKey, ...]:
        """Every key in ``trust.json`` (trusted and revoked), oldest first, one entry per key id (``_merged``)."""
        document = self._read(self.trust_path)
        if document is None:
            return ()
        try:
            if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
                raise ValueError("expected an object with a 'keys' list")
            return _merged(_entry(e) for e in document["keys"])
        except (ValueError, KeyError, TypeError) as exc:
            raise TrustStoreError(f"trust store {self.trust_path} is damaged ({exc}); fix or remove it, then "
                                  "re-trust keys") from None

    def _write(self, keys: Iterable[TrustedKey]) -> None:
        text = json.dumps({"keys": [k.to_json() for k in _merged(keys)]}, indent=2, sort_keys=True) + "\n"
        write_atomic(self.trust_path, text, mode=0o644)

    def trust(self, pem: str, *, label: str = "", purposes: Iterable[str | KeyPurpose] | str | None = None
              ) -> TrustedKey:
        """Trust a PEM public key (text, or the path of a file holding it) for ``purposes`` (default: all).

        Trusting a key again with other ``purposes`` replaces its purposes; a revoked key stays revoked.
        """
        if "BEGIN" not in pem and Path(pem).is_file():
            pem = read_limited(pem, _KEY_FILE_LIMITS, follow_symlinks=True).decode("ascii", "replace")  # a typed path
        scopes = None if purposes is None else parse_purposes(purposes)
        with self._locked():
            return self._trust_locked(pem, label=label, purposes=scopes)

    def _trust_locked(self, pem: str, *, label: str, purposes: frozenset[KeyPurpose] | None) -> TrustedKey:
        keyid = public_key_from_pem(pem).keyid
        known = self.keys()
        for entry in known:
            if entry.keyid == keyid:
                if entry.revoked:
                    raise TrustStoreError(f"key {keyid} was revoked at {entry.revoked_at}; a revoked key stays revoked")
                if purposes is None or purposes == entry.purposes:
                    return entry
                changed = attrs.evolve(entry, purposes=purposes)
                self._write(changed if k.keyid == keyid else k for k in known)
                return changed
        entry = TrustedKey(keyid=keyid, public_pem=pem.strip() + "\n", label=label, added_at=_now(),
                           purposes=KEY_PURPOSES if purposes is None else purposes)
        self._write((*known, entry))
        return entry

    def revoke(self, keyid: str) -> TrustedKey:
        """Revoke a key (a prefix of at least 8 hex digits is enough) in every entry it has; returns its entry."""
        with self._locked():
            known = self.keys()
            matches = {k.keyid: k for k in known if len(keyid) >= 8 and k.keyid.startswith(keyid.lower())}
            if len(matches) != 1:
                raise TrustStoreError(f"{'no' if not matches else 'more than one'} trusted key matches {keyid!r}; "
                                      "`mixle-parallel keys list` shows the ids")
            (target,) = matches.values()
            revoked = target if target.revoked else attrs.evolve(target, revoked_at=_now())
            self._write(revoked if k.keyid == target.keyid else k for k in known)  # duplicates collapse into one
            return revoked

    def lookup(self, keyid: str) -> TrustedKey | None:
        """The entry for ``keyid``, or None when the key is unknown here."""
        return next((k for k in self.keys() if k.keyid == keyid), None)


# ---- legacy ledger HMAC key ------------------------------------------------------------------
def _decode(raw: bytes, where: str) -> bytes:
    raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1] if raw.endswith(b"\n") else raw
    if raw.startswith(b"hex:"):
        try:
            raw = bytes.fromhex(raw[4:].decode("ascii"))
        except ValueError:
            raise ValueError(f"{where}: a 'hex:' key must be hexadecimal digits") from None
    if not raw:
        raise ValueError(f"{where}: the HMAC key is empty; write a random key (e.g. `openssl rand -hex 32`)")
    return raw


def load_key(
    *,
    key_file: str | os.PathLike[str] | None = None,
    purpose: str = "ledger",
    environ: Mapping[str, str] | None = None,
) -> bytes | None:
    """The legacy ledger HMAC key from ``key_file`` or the environment, else None (certificates use Ed25519)."""
    if purpose not in KEY_ENV:
        raise ValueError(f"purpose={purpose!r}; certificates are signed with the trust store's Ed25519 key "
                         "(`mixle-parallel keys init`), only 'ledger' has an HMAC key")
    env = os.environ if environ is None else environ
    file_var, literal_var = KEY_ENV[purpose]
    if key_file is None and env.get(file_var):
        key_file = env[file_var]
    if key_file is not None:
        path = Path(key_file)
        if not path.is_file():
            raise FileNotFoundError(f"HMAC key file {str(path)!r} does not exist (from {file_var} or key_file=)")
        return _decode(read_limited(path, _KEY_FILE_LIMITS, follow_symlinks=True), str(path))  # never a FIFO
    if env.get(literal_var):
        return _decode(env[literal_var].encode("utf-8"), literal_var)
    return None
