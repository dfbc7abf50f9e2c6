"""The trust store: this machine's Ed25519 signing key and the public keys whose signatures it accepts.

Where it lives: ``$MIXLE_PARALLEL_HOME`` if set, else ``$XDG_CONFIG_HOME/mixle-parallel``, else
``~/.config/mixle-parallel``. Inside:

* ``signing-key.pem``: the private Ed25519 key (PKCS#8 PEM, file mode 0600), made by ``keys init``;
* ``signing-key.pub``: its public key (PEM), the file to hand to other machines' ``keys trust``;
* ``trust.json``: trusted public keys by key id (securesystemslib's key id: the sha256 of the
  canonical key), each with a label, when it was added and, once revoked, when.

Keys are generated, loaded and used through securesystemslib's ``CryptoSigner``/``SSlibKey``
(pyca/cryptography underneath); nothing here implements a primitive. The HMAC ``load_key`` is kept
only for ledgers written before signed seals (purpose ``"ledger"``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

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

__all__ = [
    "HOME_ENV", "KEY_ENV", "TrustStore", "TrustStoreError", "TrustedKey", "config_home", "load_key",
]

HOME_ENV = "MIXLE_PARALLEL_HOME"
"""Overrides the config directory of the trust store (and the certificate store)."""

KEY_ENV = {"ledger": ("MIXLE_PARALLEL_LEDGER_KEY_FILE", "MIXLE_PARALLEL_LEDGER_KEY")}
"""Environment variable names (file, literal) of the legacy ledger HMAC key."""

SIGNING_KEY = "signing-key.pem"
PUBLIC_KEY = "signing-key.pub"
TRUST_FILE = "trust.json"


class TrustStoreError(ValueError):
    """The trust store is missing, unreadable, or asked to do something it cannot; says what to run."""


def config_home(environ: Mapping[str, str] | None = None) -> Path:
    """The trust store's directory: MIXLE_PARALLEL_HOME, else XDG_CONFIG_HOME/mixle-parallel, else ~/.config/..."""
    env = os.environ if environ is None else environ
    if env.get(HOME_ENV):
        return Path(env[HOME_ENV])
    base = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else Path.home() / ".config"
    return base / "mixle-parallel"


@attrs.frozen
class TrustedKey:
    """One entry of ``trust.json``: a public key, its id, a label, and whether it was revoked."""

    keyid: str
    public_pem: str
    label: str = ""
    added_at: str = ""
    revoked_at: str | None = None

    @property
    def revoked(self) -> bool:
        """True once ``keys revoke`` was run for this key."""
        return self.revoked_at is not None

    def sslib_key(self) -> SSlibKey:
        """The key as securesystemslib's ``SSlibKey`` (what DSSE verification takes)."""
        return public_key_from_pem(self.public_pem)


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


class TrustStore:
    """The signing key and trusted keys under one config directory (``config_home()`` by default)."""

    def __init__(self, home: str | os.PathLike[str] | None = None) -> None:
        self.home = Path(home) if home is not None else config_home()

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
        """True when ``keys init`` has run here."""
        return self.signing_key_path.is_file()

    def init(self, *, label: str = "this machine") -> TrustedKey:
        """Make a signing key (refused when one exists) and trust its public key; returns the entry."""
        if self.has_signing_key():
            raise TrustStoreError(f"a signing key already exists at {self.signing_key_path}; "
                                  "revoke it with `mixle-parallel keys revoke KEYID` before making a new one")
        private = Ed25519PrivateKey.generate()
        self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.signing_key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
        os.chmod(self.signing_key_path, 0o600)
        pem = private.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode("ascii")
        self.public_key_path.write_text(pem, encoding="ascii")
        return self.trust(pem, label=label)

    def signer(self) -> CryptoSigner:
        """The signing key as a securesystemslib signer; ``TrustStoreError`` naming ``keys init`` if none."""
        path = self.signing_key_path
        if not path.is_file():
            raise TrustStoreError(f"no signing key at {path}; run `mixle-parallel keys init` "
                                  f"(directory from {HOME_ENV}, XDG_CONFIG_HOME or ~/.config)")
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            raise TrustStoreError(f"signing key {path} is readable by others (mode {mode:o}); run `chmod 600 {path}`")
        try:
            private = load_pem_private_key(path.read_bytes(), password=None)
        except (ValueError, TypeError) as exc:
            raise TrustStoreError(f"signing key {path} is not a PEM private key: {exc}") from None
        return CryptoSigner(private)

    def ensure_signer(self) -> CryptoSigner:
        """The signing key, made (``init``) on first use."""
        if not self.has_signing_key():
            self.init()
        return self.signer()

    # ---- trusted keys ----------------------------------------------------------------
    def keys(self) -> tuple[TrustedKey, ...]:
        """Every key in ``trust.json`` (trusted and revoked), oldest first."""
        path = self.home / TRUST_FILE
        if not path.is_file():
            return ()
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
            entries = document["keys"]
            return tuple(TrustedKey(**{k: e[k] for k in ("keyid", "public_pem", "label", "added_at", "revoked_at")})
                         for e in entries)
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise TrustStoreError(f"trust store {path} is damaged ({exc}); fix or remove it, then re-trust keys"
                                  ) from None

    def _write(self, keys: tuple[TrustedKey, ...]) -> None:
        self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self.home / TRUST_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"keys": [attrs.asdict(k) for k in keys]}, indent=2, sort_keys=True) + "\n",
                       encoding="utf-8")
        os.replace(tmp, path)

    def trust(self, pem: str, *, label: str = "") -> TrustedKey:
        """Trust a PEM public key (text, or the path of a file holding it); returns its entry."""
        if "BEGIN" not in pem and Path(pem).is_file():
            pem = Path(pem).read_text(encoding="ascii")
        keyid = public_key_from_pem(pem).keyid
        known = self.keys()
        for entry in known:
            if entry.keyid == keyid:
                if entry.revoked:
                    raise TrustStoreError(f"key {keyid} was revoked at {entry.revoked_at}; a revoked key stays revoked")
                return entry
        entry = TrustedKey(keyid=keyid, public_pem=pem.strip() + "\n", label=label, added_at=_now())
        self._write((*known, entry))
        return entry

    def revoke(self, keyid: str) -> TrustedKey:
        """Mark a key revoked (a prefix of at least 8 hex digits is enough); returns its entry."""
        known = self.keys()
        matches = [k for k in known if len(keyid) >= 8 and k.keyid.startswith(keyid.lower())]
        if len(matches) != 1:
            raise TrustStoreError(f"{'no' if not matches else 'more than one'} trusted key matches {keyid!r}; "
                                  "`mixle-parallel keys list` shows the ids")
        target = matches[0]
        if target.revoked:
            return target
        revoked = attrs.evolve(target, revoked_at=_now())
        self._write(tuple(revoked if k.keyid == target.keyid else k for k in known))
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
        return _decode(path.read_bytes(), str(path))
    if env.get(literal_var):
        return _decode(env[literal_var].encode("utf-8"), literal_var)
    return None
