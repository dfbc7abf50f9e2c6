"""The trust store and ``mixle-parallel keys``: where it lives, init (mode 0600), trust, list, revoke."""

from __future__ import annotations

import json

import pytest

from mixle_parallel.cli import main
from mixle_parallel.verification.keys import TrustStore, TrustStoreError, config_home


def test_config_home_precedence(tmp_path, monkeypatch):
    assert config_home({"MIXLE_PARALLEL_HOME": "/a", "XDG_CONFIG_HOME": "/b"}).as_posix() == "/a"
    assert config_home({"XDG_CONFIG_HOME": "/b"}).as_posix() == "/b/mixle-parallel"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert config_home({}) == tmp_path / ".config" / "mixle-parallel"


def test_init_makes_a_private_key_and_trusts_it(tmp_path):
    store = TrustStore(tmp_path / "home")
    entry = store.init(label="laptop")
    assert store.signing_key_path.stat().st_mode & 0o777 == 0o600
    assert [k.keyid for k in store.keys()] == [entry.keyid] and len(entry.keyid) == 64
    assert store.signer().public_key.keyid == entry.keyid
    with pytest.raises(TrustStoreError, match="already exists"):
        store.init()
    store.signing_key_path.chmod(0o644)
    with pytest.raises(TrustStoreError, match="chmod 600"):
        store.signer()


def test_trust_list_and_revoke(tmp_path):
    ours, ci = TrustStore(tmp_path / "ours"), TrustStore(tmp_path / "ci")
    ours.init()
    ci_entry = ci.init(label="CI")
    added = ours.trust(str(ci.public_key_path), label="org CI")
    assert added.keyid == ci_entry.keyid and ours.trust(ci.public_key_path.read_text()) == added  # idempotent
    assert len(ours.keys()) == 2
    revoked = ours.revoke(added.keyid[:8])
    assert revoked.revoked and ours.lookup(added.keyid).revoked
    with pytest.raises(TrustStoreError, match="stays revoked"):
        ours.trust(str(ci.public_key_path))
    with pytest.raises(TrustStoreError, match="no trusted key matches"):
        ours.revoke("abc")  # too short to be a prefix
    with pytest.raises(TrustStoreError, match="not a PEM public key"):
        ours.trust("-----BEGIN PUBLIC KEY-----\nnope\n-----END PUBLIC KEY-----\n")


def test_a_damaged_trust_file_is_named(tmp_path):
    store = TrustStore(tmp_path)
    (tmp_path / "trust.json").write_text(json.dumps({"keys": [{"keyid": 5}]}))
    with pytest.raises(TrustStoreError, match="is damaged"):
        store.keys()


def test_keys_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "home"))
    assert main(["keys", "init"]) == 0
    out = capsys.readouterr().out
    assert "mode 0600" in out and "signing-key.pub" in out
    assert main(["keys", "init"]) == 2 and "already exists" in capsys.readouterr().err
    other = TrustStore(tmp_path / "other")
    other.init()
    assert main(["keys", "trust", str(other.public_key_path), "--label", "CI"]) == 0
    keyid = other.keys()[0].keyid
    assert main(["keys", "list"]) == 0
    listing = capsys.readouterr().out
    assert f"{keyid}  trusted" in listing and "CI" in listing
    assert main(["keys", "revoke", keyid[:10]]) == 0
    assert main(["keys", "list"]) == 0
    assert f"{keyid}  revoked" in capsys.readouterr().out
    assert main(["keys", "trust", str(tmp_path / "missing.pub")]) == 2
