"""Signed seals and the signed head: rewrites, deleted runs and rollbacks are caught without a shared secret.

The attacker here can edit the ledger and its head file freely and recompute every hash, but holds
no trusted signing key (``MIXLE_PARALLEL_HOME`` points at a fresh store per test).
"""

from __future__ import annotations

import json
import shutil

import pytest

from mixle_parallel.verification.keys import TrustStore
from mixle_parallel.verification.ledger.chain import Ledger, entry_hash, read_ledger
from mixle_parallel.verification.ledger.seal import head_path
from mixle_parallel.verification.ledger.verify import main_audit, verify_ledger
from tests.verification.test_ledger import lines, write_run


@pytest.fixture(autouse=True)
def home(monkeypatch, tmp_path):
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "home"))


def _messages(report) -> str:
    return " | ".join(f.message for f in report.faults)


def test_every_run_end_is_sealed_and_the_head_is_signed(tmp_path, plan, capsys):
    path = tmp_path / "run.jsonl"
    write_run(path, plan)
    write_run(path, plan)
    ends = [e for e in read_ledger(path).entries if e.kind == "run_end"]
    assert len(ends) == 2 and all(e.payload["seal"]["kind"] == "CertificateEnvelope" for e in ends)
    assert head_path(path).is_file()
    report = verify_ledger(path)
    assert report.ok, report.summary()
    keyid = TrustStore().keys()[0].keyid
    assert report.signed_head == f"signed head: {report.entries} entries, head {ends[-1].hash[:23]}..., " \
                                 f"key {keyid[:16]}..."
    assert main_audit([str(path)]) == 0
    assert "signed head: 28 entries" in capsys.readouterr().out


def test_deleting_the_last_run_is_caught(tmp_path, plan):
    path = tmp_path / "run.jsonl"
    write_run(path, plan)
    first = len(lines(path))
    write_run(path, plan)
    path.write_text("".join(lines(path)[:first]))  # a clean, complete, correctly chained ledger of one run
    assert verify_ledger(path, head=False).ok  # the chain alone cannot tell
    report = verify_ledger(path)
    assert "has 14 entries but its signed head" in report.first_bad.message and "deleted" in report.first_bad.message
    assert main_audit([str(path)]) == 1


def _rewrite(path, change) -> None:
    """Apply ``change`` to every entry body and recompute the whole chain (what an attacker without a key can do)."""
    prev = "sha256:" + "0" * 64
    out = []
    for entry in read_ledger(path).entries:
        body = entry.body()
        change(body)
        body["prev"] = prev
        prev = entry_hash(body)
        out.append(json.dumps({**body, "hash": prev}, sort_keys=True, separators=(",", ":")) + "\n")
    path.write_text("".join(out))


def test_a_rewritten_and_rehashed_ledger_is_caught(tmp_path, plan):
    path = tmp_path / "run.jsonl"
    write_run(path, plan)

    def lower_losses(body):
        if body["kind"] == "receipt":
            body["payload"]["receipt"]["data"]["loss"] = 0.001

    _rewrite(path, lower_losses)
    assert verify_ledger(path, head=False).faults  # the seal no longer covers the chain
    text = _messages(verify_ledger(path))
    assert "run_end seal covers 13 entries ending" in text and "the ledger was rewritten" in text
    head_path(path).unlink()
    assert "no signed head" in _messages(verify_ledger(path))


def test_a_seal_from_an_untrusted_key_is_refused(tmp_path, plan, monkeypatch):
    path = tmp_path / "run.jsonl"
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "attacker"))
    write_run(path, plan)  # sealed, but by the attacker's own key
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "auditor"))
    text = _messages(verify_ledger(path))
    assert "run_end seal does not verify" in text and "does not trust" in text


def test_since_proves_extension_and_catches_rollback(tmp_path, plan):
    path = tmp_path / "run.jsonl"
    write_run(path, plan)
    recorded = tmp_path / "auditor-copy.head"
    shutil.copy(head_path(path), recorded)
    old_ledger, old_head = path.read_text(), head_path(path).read_text()
    write_run(path, plan)
    assert verify_ledger(path, since=recorded).ok
    assert main_audit([str(path), "--since", str(recorded)]) == 0
    newer = tmp_path / "newer.head"
    shutil.copy(head_path(path), newer)
    path.write_text(old_ledger)  # roll back ledger and head together: both validly signed
    head_path(path).write_text(old_head)
    assert verify_ledger(path).ok  # consistent with itself...
    report = verify_ledger(path, since=newer)  # ...but not with what the auditor saw
    assert "--since the ledger has 14 entries but its signed head" in report.first_bad.message
    assert main_audit([str(path), "--since", str(newer)]) == 1


@pytest.mark.parametrize("mutate", [
    lambda e: e.update(hash=5),
    lambda e: e.update(certificate=None),
    lambda e: e.update(seq=True),
    lambda e: e.update(payload=[1]),
])
def test_malformed_entries_name_the_first_bad_line(tmp_path, plan, mutate, capsys):
    path = tmp_path / "run.jsonl"
    write_run(path, plan)
    rows = lines(path)
    entry = json.loads(rows[3])
    mutate(entry)
    rows[3] = json.dumps(entry) + "\n"
    path.write_text("".join(rows))
    report = verify_ledger(path)
    assert report.first_bad.line == 4 and "not a ledger entry" in report.first_bad.message
    assert main_audit([str(path)]) == 1
    assert "line 4" in capsys.readouterr().out


@pytest.mark.parametrize("line", ["[" * 100_000 + "]" * 100_000, '{"seq": NaN}', '{"hash": Infinity}'])
def test_deep_nesting_and_nan_do_not_crash_the_verifier(tmp_path, plan, line):
    path = tmp_path / "run.jsonl"
    write_run(path, plan)
    rows = lines(path)
    rows.insert(2, line + "\n")
    path.write_text("".join(rows))
    report = verify_ledger(path)
    assert report.first_bad.line == 3 and "not a ledger entry" in report.first_bad.message
    assert main_audit([str(path)]) == 1


def test_a_ledger_reopened_for_append_keeps_sealing(tmp_path, plan):
    path = tmp_path / "run.jsonl"
    write_run(path, plan)
    ledger = Ledger(path)
    ledger.run_start(plan=plan, certificate="unverified", executor="toy")
    ledger.run_end(steps=0)
    assert verify_ledger(path).ok
