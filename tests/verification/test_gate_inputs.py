"""The gate's inputs and the key-creation lock (issue 34 item 8).

``MIXLE_PARALLEL_CERTIFICATE`` (or ``certificate=``) naming anything but a readable certificate file is a
``NotAdmittedError`` naming it; ``ensure_signer`` reads the store's policy under the lock that creates the
key, so a store switched to ``trusted-keys-only`` while a key is being made gets none.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from mixle_parallel.contracts import NotAdmittedError, ParallelPlan
from mixle_parallel.verification.admission import require_admission
from mixle_parallel.verification.keys import LOCK_FILE, TrustStore, TrustStoreError
from mixle_parallel.verification.safe_files import exclusive_lock
from tests.verification.vhelpers import StubExecutor

PLAN = ParallelPlan(dp_shard=2, tp=2)


@pytest.fixture(autouse=True)
def home(monkeypatch, tmp_path) -> Path:
    monkeypatch.delenv("MIXLE_PARALLEL_CERTIFICATE", raising=False)
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _targets(tmp_path: Path) -> dict[str, str]:
    fifo = tmp_path / "cert.fifo"
    os.mkfifo(fifo)
    return {"device": "/dev/zero", "folder": str(tmp_path), "missing": str(tmp_path / "nope.json"),
            "fifo": str(fifo)}


@pytest.mark.parametrize("kind", ["device", "folder", "missing", "fifo"])
def test_a_certificate_variable_naming_no_certificate_file_is_not_admitted(tmp_path, monkeypatch, kind):
    target = _targets(tmp_path)[kind]
    monkeypatch.setenv("MIXLE_PARALLEL_CERTIFICATE", target)
    with pytest.raises(NotAdmittedError) as refused:
        require_admission(StubExecutor(), PLAN, "fp32", world_size=4)
    text = str(refused.value)
    assert "MIXLE_PARALLEL_CERTIFICATE" in text and repr(target) in text and "check 'certificate' failed" in text
    monkeypatch.delenv("MIXLE_PARALLEL_CERTIFICATE")
    with pytest.raises(FileNotFoundError, match="mixle-parallel certify"):  # a path passed in: as before
        require_admission(StubExecutor(), PLAN, "fp32", world_size=4, certificate=target)


def test_the_policy_is_read_under_the_lock_that_creates_the_key(home):
    store = TrustStore()
    home.mkdir(parents=True, mode=0o700)
    outcome: list[object] = []
    with exclusive_lock(home / LOCK_FILE):  # another process holds the lock (as `keys policy` does to write it)
        worker = threading.Thread(target=lambda: outcome.append(_try_signer(store)))
        worker.start()
        time.sleep(1.0)  # the worker has read the policy 'on' (main's order) and waits for the lock
        (home / "policy.json").write_text(json.dumps({"certification": "trusted-keys-only"}))
    worker.join(timeout=60)
    assert isinstance(outcome[0], TrustStoreError) and "trusted-keys-only" in str(outcome[0])
    assert not store.has_signing_key()


def _try_signer(store: TrustStore) -> object:
    try:
        return store.ensure_signer()
    except TrustStoreError as exc:
        return exc
