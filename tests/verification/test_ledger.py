"""Ledger: append/read round trip, and every kind of tampering is caught at the first bad entry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mixle_parallel.verification.ledger.chain import Ledger, LedgerError, read_ledger, truncate_torn_tail
from mixle_parallel.verification.ledger.verify import main_audit, verify_ledger
from tests.verification.vhelpers import make_audit, make_receipt

KEY = b"ledger-test-key"


def write_run(path: Path, plan, *, key: bytes | None = None, steps: int = 5, end: bool = True) -> None:
    ledger = Ledger(path, key=key)
    ledger.run_start(plan=plan, certificate="unverified", executor="toy")
    for step in range(steps):
        ledger.receipt(make_receipt(step), rank=0)
        ledger.receipt(make_receipt(step), rank=1)
        if step == 2:
            ledger.audit(make_audit(step))
            ledger.checkpoint(step=step, path="/tmp/ckpt")
    if end:
        ledger.run_end(steps=steps)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines(keepends=True)


def test_clean_ledger_verifies_and_cli_exits_zero(tmp_path, plan, capsys):
    path = tmp_path / "run.jsonl"
    write_run(path, plan)
    report = verify_ledger(path)
    assert report.ok, report.summary()
    assert (report.entries, report.runs, report.receipts, report.audits) == (14, 1, 10, 1)
    assert main_audit([str(path)]) == 0
    assert "OK" in capsys.readouterr().out


def test_entries_are_hash_chained_and_carry_contract_documents(tmp_path, plan):
    path = tmp_path / "run.jsonl"
    write_run(path, plan, steps=1)
    entries = read_ledger(path).entries
    assert entries[0].prev == "sha256:" + "0" * 64
    assert all(b.prev == a.hash for a, b in zip(entries, entries[1:]))
    assert entries[0].payload["plan"]["kind"] == "ParallelPlan"
    assert entries[1].payload["receipt"]["kind"] == "StepReceipt"
    assert {e.certificate for e in entries} == {"unverified"}


def test_edited_entry_is_named(tmp_path, plan):
    path = tmp_path / "run.jsonl"
    write_run(path, plan)
    rows = lines(path)
    record = json.loads(rows[4])
    record["payload"]["receipt"]["data"]["loss"] = 0.0
    rows[4] = json.dumps(record) + "\n"
    path.write_text("".join(rows))
    report = verify_ledger(path)
    assert not report.ok
    assert report.first_bad.line == 5 and report.first_bad.seq == 4
    assert "edited" in report.first_bad.message
    assert main_audit([str(path)]) == 1


def test_deleted_entry_is_named(tmp_path, plan):
    path = tmp_path / "run.jsonl"
    write_run(path, plan)
    rows = lines(path)
    del rows[3]
    path.write_text("".join(rows))
    report = verify_ledger(path)
    assert report.first_bad.line == 4 and report.first_bad.seq == 4
    assert "deleted" in report.first_bad.message


def test_reordered_entries_are_named(tmp_path, plan):
    path = tmp_path / "run.jsonl"
    write_run(path, plan)
    rows = lines(path)
    rows[5], rows[6] = rows[6], rows[5]
    path.write_text("".join(rows))
    report = verify_ledger(path)
    assert report.first_bad.line == 6
    assert "reordered" in report.first_bad.message


def test_truncated_ledger_lacks_run_end(tmp_path, plan):
    path = tmp_path / "run.jsonl"
    write_run(path, plan)
    path.write_text("".join(lines(path)[:-3]))
    report = verify_ledger(path)
    assert not report.ok and "without run_end" in report.first_bad.message
    assert "its signed head" in " ".join(f.message for f in verify_ledger(path, require_end=False).faults)
    assert verify_ledger(path, require_end=False, head=False).ok  # the chain alone cannot see truncation
    assert main_audit([str(path), "--allow-open"]) == 1
    assert main_audit([str(path), "--allow-open", "--no-head"]) == 0


def test_truncated_head_is_named(tmp_path, plan):
    path = tmp_path / "run.jsonl"
    write_run(path, plan)
    path.write_text("".join(lines(path)[1:]))
    report = verify_ledger(path)
    assert report.first_bad.line == 1


def test_torn_last_line_is_reported_and_blocks_appends_until_repaired(tmp_path, plan):
    path = tmp_path / "run.jsonl"
    write_run(path, plan, end=False)
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"seq": 12, "kind": "rec')
    report = verify_ledger(path, require_end=False)
    assert not report.ok and "torn" in report.first_bad.message and report.first_bad.line == 14
    with pytest.raises(LedgerError, match="torn"):
        Ledger(path)
    assert truncate_torn_tail(path) == len(b'{"seq": 12, "kind": "rec')
    ledger = Ledger(path)
    ledger.run_end(steps=5)
    assert verify_ledger(path).ok


def test_reopened_ledger_continues_the_chain(tmp_path, plan):
    path = tmp_path / "run.jsonl"
    write_run(path, plan, end=False, steps=2)
    again = Ledger(path)
    assert again.certificate == "unverified"
    again.receipt(make_receipt(2))
    again.run_end(steps=3)
    assert verify_ledger(path).ok


def test_step_monotonicity_per_rank(tmp_path, plan):
    path = tmp_path / "run.jsonl"
    ledger = Ledger(path)
    ledger.run_start(plan=plan, certificate="unverified")
    ledger.receipt(make_receipt(0, skipped=True))
    ledger.receipt(make_receipt(0))
    ledger.receipt(make_receipt(3), rank=1)
    ledger.receipt(make_receipt(2))
    ledger.receipt(make_receipt(2))
    ledger.run_end()
    report = verify_ledger(path)
    assert report.first_bad.seq == 5 and "committed step 2 twice" in report.first_bad.message


def test_certificate_links_must_match_run_start(tmp_path, plan):
    path = tmp_path / "run.jsonl"
    ledger = Ledger(path)
    ledger.run_start(plan=plan, certificate="sha256:" + "1" * 64)
    ledger.receipt(make_receipt(0))
    ledger.append("receipt", {"rank": 0, "step": 1, "receipt": {"kind": "x"}}, certificate="unverified")
    ledger.run_end()
    report = verify_ledger(path)
    assert report.first_bad.seq == 2
    assert "certificate link" in report.first_bad.message


def test_receipt_that_names_another_certificate_is_a_fault(tmp_path, plan):
    path = tmp_path / "run.jsonl"
    ledger = Ledger(path)
    ledger.run_start(plan=plan, certificate="unverified")
    ledger.receipt(make_receipt(0, extra={"certificate": "sha256:" + "2" * 64}))
    ledger.run_end()
    assert "receipt says certificate" in verify_ledger(path).first_bad.message


def test_keyed_ledger_needs_the_key(tmp_path, plan, monkeypatch):
    path = tmp_path / "run.jsonl"
    write_run(path, plan, key=KEY)
    assert verify_ledger(path, key=KEY).ok
    assert "no key was given" in verify_ledger(path).first_bad.message
    assert "wrong key" in verify_ledger(path, key=b"other").first_bad.message
    key_file = tmp_path / "key"
    key_file.write_bytes(KEY + b"\n")
    assert main_audit([str(path), "--key-file", str(key_file)]) == 0
    monkeypatch.setenv("MIXLE_PARALLEL_LEDGER_KEY", KEY.decode())
    assert main_audit([str(path)]) == 0


def test_unkeyed_entry_in_keyed_verification_is_a_fault(tmp_path, plan):
    path = tmp_path / "run.jsonl"
    write_run(path, plan)
    assert "not HMAC-keyed" in verify_ledger(path, key=KEY).first_bad.message


def test_append_before_run_start_is_refused(tmp_path):
    with pytest.raises(LedgerError, match="before run_start"):
        Ledger(tmp_path / "x.jsonl").receipt(make_receipt(0))


def test_garbage_line_in_the_middle_is_named(tmp_path, plan, capsys):
    path = tmp_path / "run.jsonl"
    write_run(path, plan)
    rows = lines(path)
    rows.insert(2, "not json\n")
    path.write_text("".join(rows))
    report = verify_ledger(path)
    assert report.first_bad.line == 3 and "not a ledger entry" in report.first_bad.message
    assert main_audit([str(path), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["ok"] is False
    assert main_audit([str(tmp_path / "missing.jsonl")]) == 2


def test_receipt_admission_mode_must_agree_with_the_run(tmp_path, plan):
    path = tmp_path / "run.jsonl"
    ledger = Ledger(path)
    ledger.run_start(plan=plan, certificate="sha256:" + "3" * 64)
    ledger.receipt(make_receipt(0, extra={"admission": "certified", "certificate": "sha256:" + "3" * 64}))
    ledger.receipt(make_receipt(1, extra={"admission": "unverified"}))
    ledger.run_end()
    report = verify_ledger(path)
    assert report.first_bad.seq == 2 and "unverified" in report.first_bad.message
