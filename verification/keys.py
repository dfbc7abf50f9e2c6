"""HMAC keys for certificates and ledgers, from a file or an environment variable (never a default).

Environment variables, checked in this order for each purpose:

* certificates: ``MIXLE_PARALLEL_CERT_KEY_FILE`` (path to a file holding the key),
  ``MIXLE_PARALLEL_CERT_KEY`` (the key itself);
* ledgers: ``MIXLE_PARALLEL_LEDGER_KEY_FILE``, ``MIXLE_PARALLEL_LEDGER_KEY``.

A key file's bytes are the key, with one trailing newline stripped; a key starting ``hex:`` is
decoded from hexadecimal. An empty key is an error (an empty HMAC key proves nothing).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["KEY_ENV", "load_key"]

KEY_ENV = {
    "cert": ("MIXLE_PARALLEL_CERT_KEY_FILE", "MIXLE_PARALLEL_CERT_KEY"),
    "ledger": ("MIXLE_PARALLEL_LEDGER_KEY_FILE", "MIXLE_PARALLEL_LEDGER_KEY"),
}
"""Environment variable names (file, literal) per purpose."""


def _decode(raw: bytes, where: str) -> bytes:
    if raw.endswith(b"\r\n"):
        raw = raw[:-2]
    elif raw.endswith(b"\n"):
        raw = raw[:-1]
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
    purpose: str = "cert",
    environ: Mapping[str, str] | None = None,
) -> bytes | None:
    """The HMAC key from ``key_file``, else the purpose's environment variables, else None."""
    if purpose not in KEY_ENV:
        raise ValueError(f"purpose={purpose!r}; expected one of {sorted(KEY_ENV)}")
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
