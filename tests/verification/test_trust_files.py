"""Files nobody can swap (issue 24 item 6): race-free key creation, no write through a link, unsafe modes refused.

* Six real processes on a fresh home at once end with one key, trusted once, and no error (before: a
  ``FileExistsError`` or a half-written key in 36 of 84 runs).
* ``keys init``, ``keys trust`` and the ledger head never write through a planted link (before: the
  public key, ``trust.tmp`` and ``<ledger>.head.tmp`` were opened by path and followed).
* A world-writable home, trust file or policy file is refused with the ``chmod`` to run.
* Revoking a key id revokes every entry for it (before: a duplicate entry survived, or revoke refused).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mixle_parallel.verification.keys import TrustStore, TrustStoreError
from mixle_parallel.verification.ledger.seal import head_path, sign_head, write_head
from mixle_parallel.verification.safe_files import publish_exclusive, write_atomic

ROOT = Path(__file__).resolve().parents[2]

_RACER = """
import sys, time
from pathlib import Path
from cryptography.hazmat.primitives.asymmetric import ed25519
from mixle_parallel.verification.keys import TrustStore
_generate = ed25519.Ed25519PrivateKey.generate
def slow_generate():
    key = _generate()
    time.sleep(0.3)  # widen the window between "no key here yet" and "the key is written"
    return key
ed25519.Ed25519PrivateKey.generate = staticmethod(slow_generate)
home, go, ready = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
ready.touch()
while not go.exists():
    time.sleep(0.002)
store = TrustStore(home)
signer = store.ensure_signer()
print(signer.public_key.keyid, len(store.keys()))
"""


def _race(home: Path, folder: Path, count: int) -> list[subprocess.CompletedProcess[str]]:
    """``count`` processes, each imported and waiting, released at once to make their key in ``home``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    go, ready = folder / "go", [folder / f"ready-{i}" for i in range(count)]
    racers = [subprocess.Popen([sys.executable, "-c", _RACER, str(home), str(go), str(ready[i])],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
              for i in range(count)]
    while not all(r.exists() for r in ready) and all(p.poll() is None for p in racers):
        time.sleep(0.01)
    go.touch()
    results = []
    for racer in racers:
        out, err = racer.communicate(timeout=300)
        results.append(subprocess.CompletedProcess(racer.args, racer.returncode, out, err))
    return results


_ROUNDS = [0, pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow)]


@pytest.mark.parametrize("round_", _ROUNDS)
def test_six_processes_on_a_fresh_home_make_one_key(tmp_path, round_):
    """Real processes; key generation is slowed by 0.3 s in each so that all six pass "no key yet" together."""
    home = tmp_path / "home"
    results = _race(home, tmp_path, 6)
    for result in results:
        assert result.returncode == 0, result.stderr
    seen = {tuple(r.stdout.split()) for r in results}
    assert len(seen) == 1, seen  # one key id, and every process saw exactly one trusted entry
    (keyid, count), = seen
    assert count == "1"
    store = TrustStore(home)
    assert [k.keyid for k in store.keys()] == [keyid] and store.signer().public_key.keyid == keyid
    assert store.signing_key_path.stat().st_mode & 0o777 == 0o600
    assert not [p.name for p in home.iterdir() if p.name.endswith(".tmp")]  # no temporary file left behind


def test_publish_exclusive_never_shows_a_partial_file_and_one_caller_wins(tmp_path):
    target = tmp_path / "key"
    assert publish_exclusive(target, b"first") and not publish_exclusive(target, b"second")
    assert target.read_bytes() == b"first"
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "link").symlink_to(victim)
    assert not publish_exclusive(tmp_path / "link", b"attack")  # a link at the name counts as taken
    assert victim.read_text() == "precious"


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    return victim


def test_keys_init_does_not_write_through_planted_links(tmp_path):
    victim = _victim(tmp_path)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "signing-key.pub").symlink_to(victim)
    (home / "trust.tmp").symlink_to(victim)
    store = TrustStore(home)
    entry = store.init()
    assert victim.read_text() == "precious"
    assert not store.public_key_path.is_symlink() and "BEGIN PUBLIC KEY" in store.public_key_path.read_text()
    assert store.signer().public_key.keyid == entry.keyid


def test_a_planted_link_as_the_signing_key_is_refused_not_followed(tmp_path):
    victim = _victim(tmp_path)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "signing-key.pem").symlink_to(victim)
    with pytest.raises(TrustStoreError, match="already exists"):
        TrustStore(home).init()
    with pytest.raises(TrustStoreError, match="link or not a regular file"):
        TrustStore(home).signer()
    assert victim.read_text() == "precious"


def test_keys_trust_does_not_write_through_planted_links(tmp_path):
    victim = _victim(tmp_path)
    ci = TrustStore(tmp_path / "ci")
    ci.init()
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "trust.tmp").symlink_to(victim)
    TrustStore(home).trust(str(ci.public_key_path), label="CI")
    assert victim.read_text() == "precious"
    (home / "trust.json").unlink()
    (home / "trust.json").symlink_to(victim)
    with pytest.raises(TrustStoreError, match="not a link"):  # read without following links
        TrustStore(home).keys()
    assert victim.read_text() == "precious"


def test_the_ledger_head_is_written_without_following_links(tmp_path):
    victim = _victim(tmp_path)
    ledger = tmp_path / "run.jsonl"
    head = head_path(ledger)
    Path(f"{head}.tmp").symlink_to(victim)
    store = TrustStore(tmp_path / "home")
    seal = sign_head(store.ensure_signer(), ledger, 3, "sha256:" + "0" * 64)
    write_head(ledger, seal)
    assert victim.read_text() == "precious" and json.loads(head.read_text())
    head.unlink()
    head.symlink_to(victim)
    write_head(ledger, seal)  # the link itself is replaced by the file
    assert victim.read_text() == "precious" and not head.is_symlink()


def test_write_atomic_replaces_a_link_and_leaves_its_target(tmp_path):
    victim = _victim(tmp_path)
    (tmp_path / "doc").symlink_to(victim)
    write_atomic(tmp_path / "doc", "new")
    assert victim.read_text() == "precious" and (tmp_path / "doc").read_text() == "new"


@pytest.mark.parametrize("which", ["home", "trust.json", "policy.json"])
def test_a_world_writable_trust_store_is_refused_with_the_chmod(tmp_path, which):
    store = TrustStore(tmp_path / "home")
    store.init()
    if which == "policy.json":
        store.set_policy("on")
    path = store.home if which == "home" else store.home / which
    path.chmod(path.stat().st_mode | 0o002)
    with pytest.raises(TrustStoreError, match=f"run `chmod o-w {path}`"):
        store.keys() if which != "policy.json" else store.policy()
    with pytest.raises(TrustStoreError, match="writable by every user"):
        store.trust(str(store.public_key_path))


def test_revoke_revokes_every_entry_of_a_key(tmp_path):
    store = TrustStore(tmp_path / "home")
    entry = store.init()
    trust_file = store.home / "trust.json"
    document = json.loads(trust_file.read_text())
    document["keys"].append(dict(document["keys"][0], label="a duplicate"))
    trust_file.write_text(json.dumps(document))
    revoked = store.revoke(entry.keyid[:12])
    assert revoked.revoked
    assert [(k.keyid, k.revoked) for k in store.keys()] == [(entry.keyid, True)]
    assert len(json.loads(trust_file.read_text())["keys"]) == 1  # the duplicate is gone from the file


def test_a_duplicate_entry_never_widens_trust(tmp_path):
    store = TrustStore(tmp_path / "home")
    entry = store.init()
    document = json.loads(store.trust_path.read_text())
    document["keys"].append(dict(document["keys"][0], revoked_at="2026-01-01T00:00:00+00:00"))
    store.trust_path.write_text(json.dumps(document))
    assert store.lookup(entry.keyid).revoked  # one revoked entry revokes the key
