"""The audit's fast walk over clean receipts finds exactly what the strict walk finds (issue 24 item 4: audit speed).

``_walk`` takes a complete receipt line from ``scan_receipt`` (no record, no entry built) when
``_LedgerWalk.clean_receipt`` proves ``check`` would find no fault in it; anything else is read and checked
as before. The differential tests audit the same ledgers with the fast walk and with ``scan_receipt``
switched off (every line strict, as on the old main) and require the same report, fault for fault; the
others check that the fast walk is really taken and declines each fault it must leave to ``check``.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.ledger_audit import build_ledger
from mixle_parallel.contracts import ParallelPlan, StepReceipt, to_dict
from mixle_parallel.verification.keys import TrustStore
from mixle_parallel.verification.ledger import entries, verify
from mixle_parallel.verification.ledger.entries import GENESIS, entry_hash
from mixle_parallel.verification.ledger.receipt_line import match_receipt, scan_receipt
from mixle_parallel.verification.ledger.seal import SEAL_ROLE, sign_head, write_head
from mixle_parallel.verification.ledger.verify import LedgerReport, verify_ledger

_CERT = "sha256:" + "ab" * 32
_OTHER = "sha256:" + "cd" * 32
_RUN = "<the run's certificate>"
_EXTRAS: list[dict[str, Any]] = [
    {}, {"certificate": _RUN}, {"certificate": _OTHER}, {"admission": "unverified"}, {"admission": "certified"},
    {"admission": "local", "certificate": _RUN}, {"admission": "certified", "certificate": _RUN}, {"note": 1},
]
_KEY = b"k" * 32


@pytest.fixture(autouse=True)
def home(monkeypatch, tmp_path):
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "home"))


def _receipt(rank: int, step: int, skipped: bool, extra: dict[str, Any], delta: int) -> dict[str, Any]:
    receipt = StepReceipt(step=step, loss=1.0 / (step + 3), local_examples=8, local_tokens=64, microbatches=1,
                          accumulation_steps=1, data_parallel_size=2, optimizer="sgd", precision="fp32",
                          skipped=skipped, extra=extra)
    return {"rank": rank, "step": step + delta, "receipt": to_dict(receipt), "extra": {}}


def _write_lines(path: Path, runs: list[Any], key: bytes | None) -> list[str]:
    """The lines of a ledger of ``runs`` (certificate, receipts, ended); its signed head is written beside it."""
    signer = TrustStore().ensure_signer()
    lines: list[str] = []
    prev = GENESIS

    def append(kind: str, payload: dict[str, Any], certificate: str) -> None:
        nonlocal prev
        body = {"seq": len(lines), "kind": kind, "time": "2026-01-01T00:00:00+00:00", "certificate": certificate,
                "payload": payload, "prev": prev}
        prev = entry_hash(body, key)
        lines.append(json.dumps({**body, "hash": prev}, sort_keys=True, separators=(",", ":")))

    for certificate, receipts, ended in runs:
        append("run_start", {"plan": to_dict(ParallelPlan(dp_shard=2)), "executor": "t", "certificate_document": None,
                             "versions": {}, "host": "h", "pid": 1, "extra": {}}, certificate)
        for rank, step, skipped, extra, delta in receipts:
            linked = {name: certificate if value == _RUN else value for name, value in _EXTRAS[extra].items()}
            append("receipt", _receipt(rank, step, skipped, linked, delta), certificate)
        if ended:
            seal = sign_head(signer, path, len(lines), prev, role=SEAL_ROLE)
            append("run_end", {"status": "ok", "steps": len(receipts), "extra": {}, "seal": seal}, certificate)
    write_head(path, sign_head(signer, path, len(lines), prev))
    return lines


def _rehash_from(lines: list[str], index: int, key: bytes | None) -> None:
    """Renumber and recompute prev and hash from line ``index`` on: an edit there leaves a chain that holds."""
    prev = json.loads(lines[index - 1])["hash"] if index else GENESIS
    for at in range(index, len(lines)):
        record = json.loads(lines[at])
        record["prev"], record["seq"] = prev, at
        body = {name: value for name, value in record.items() if name != "hash"}
        prev = record["hash"] = entry_hash(body, key)
        lines[at] = json.dumps(record, sort_keys=True, separators=(",", ":"))


def _mutate(lines: list[str], mutation: str, first: int, second: int, key: bytes | None) -> None:
    """One change an attacker (or a crash) makes to a ledger's lines."""
    i, j = first % len(lines), second % len(lines)
    if mutation == "delete":
        del lines[i]
    elif mutation in ("swap", "swap and rehash"):
        lines[i], lines[j] = lines[j], lines[i]
        if mutation == "swap and rehash":
            _rehash_from(lines, min(i, j), key)
    elif mutation == "duplicate":
        lines.insert(j, lines[i])
    elif mutation == "tamper":  # an edit without a new hash
        lines[i] = lines[i].replace('"local_tokens":64', '"local_tokens":65').replace('"pid":1', '"pid":2')
    elif mutation in ("certificate", "step", "rank"):  # an edit with the chain recomputed after it
        record = json.loads(lines[i])
        if record["kind"] == "receipt":
            if mutation == "certificate":
                record["certificate"] = _OTHER
            elif mutation == "step":
                record["payload"]["receipt"]["data"]["step"] += 1
            else:
                record["payload"]["rank"] += 1
        lines[i] = json.dumps(record, sort_keys=True, separators=(",", ":"))
        _rehash_from(lines, i, key)
    elif mutation == "torn":
        lines[-1] = lines[-1][: len(lines[-1]) // 2]


def _audit_both(path: Path, **options: Any) -> tuple[LedgerReport, LedgerReport, int]:
    """The report with the fast walk, the report with every line strict, and how many receipts took the fast walk."""
    taken = 0
    clean = verify._LedgerWalk.clean_receipt

    def counting(self: Any, index: int, scan: Any) -> bool:
        nonlocal taken
        result = clean(self, index, scan)
        taken += result
        return result

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(verify._LedgerWalk, "clean_receipt", counting)
        fast = verify_ledger(path, **options)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(verify, "scan_receipt", lambda line: None)
        strict = verify_ledger(path, **options)
    return fast, strict, taken


_RECEIPTS = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 5), st.booleans(),
                               st.integers(0, len(_EXTRAS) - 1), st.sampled_from([0, 0, 0, 0, 1])), max_size=8)
_RUNS = st.lists(st.tuples(st.sampled_from(["unverified", _CERT]), _RECEIPTS, st.booleans()), min_size=1, max_size=3)
_MUTATIONS = st.sampled_from(["none", "none", "delete", "swap", "swap and rehash", "duplicate", "tamper", "certificate",
                              "step", "rank", "torn"])


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_RUNS, _MUTATIONS, st.integers(0, 10**6), st.integers(0, 10**6), st.sampled_from([None, _KEY]),
       st.sampled_from(["same", "none", "other", "empty"]), st.booleans(), st.booleans())
def test_the_fast_walk_reports_exactly_what_the_strict_walk_reports(runs, mutation, first, second, key, audit_key,
                                                                    require_end, head):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "ledger.jsonl"
        lines = _write_lines(path, runs, key)
        _mutate(lines, mutation, first, second, key)
        path.write_text("\n".join(lines) + ("" if mutation == "torn" else "\n"))
        given_key = {"same": key, "none": None, "other": b"x" * 32, "empty": b""}[audit_key]
        fast, strict, _ = _audit_both(path, key=given_key, require_end=require_end, head=head)
        assert fast == strict


@pytest.mark.parametrize("key", [None, _KEY])
def test_every_clean_receipt_takes_the_fast_walk_and_the_report_is_the_strict_one(tmp_path, key):
    path = tmp_path / "ledger.jsonl"
    fitting = (0, 1, 4, 5, 6, 7)  # the extras a certified run's receipts may carry
    receipts = [(rank, step, step % 3 == 0, fitting[(step + rank) % len(fitting)], 0) for step in range(6)
                for rank in (0, 1)]
    runs = [(_CERT, receipts, True), ("unverified", [(0, s, False, 0, 0) for s in range(4)], True)]
    path.write_text("\n".join(_write_lines(path, runs, key)) + "\n")
    fast, strict, taken = _audit_both(path, key=key)
    assert fast.ok and fast == strict
    assert taken == fast.receipts == len(receipts) + 4


@pytest.mark.parametrize("mutation,expected", [
    ("certificate", "certificate link"), ("step", "differs from the receipt's step"),
    ("tamper", "do not match the entry's hash"), ("delete", "sequence number"), ("duplicate", "sequence number"),
])
def test_each_fault_on_a_receipt_is_left_to_the_strict_check_which_names_it(tmp_path, mutation, expected):
    path = tmp_path / "ledger.jsonl"
    lines = _write_lines(path, [(_CERT, [(0, s, False, 0, 0) for s in range(6)], True)], None)
    _mutate(lines, mutation, 3, 3, None)
    path.write_text("\n".join(lines) + "\n")
    fast, strict, _ = _audit_both(path)
    assert fast == strict and not fast.ok
    assert expected in " | ".join(fault.message for fault in fast.faults)


@pytest.mark.parametrize("receipts,expected", [
    ([(0, 2, False, 0, 0), (0, 1, False, 0, 0)], "step went backwards"),
    ([(0, 2, False, 0, 0), (0, 2, False, 0, 0)], "committed step 2 twice"),
    ([(1, 0, False, 2, 0)], "receipt says certificate"),
    ([(1, 0, False, 3, 0)], "receipt says the run is unverified"),
])
def test_each_order_and_link_rule_still_fires_with_the_fast_walk(tmp_path, receipts, expected):
    path = tmp_path / "ledger.jsonl"
    path.write_text("\n".join(_write_lines(path, [(_CERT, receipts, True)], None)) + "\n")
    fast, strict, _ = _audit_both(path)
    assert fast == strict and expected in " | ".join(fault.message for fault in fast.faults)


def test_a_receipt_after_run_end_or_before_run_start_is_left_to_the_strict_check(tmp_path):
    path = tmp_path / "ledger.jsonl"
    lines = _write_lines(path, [(_CERT, [(0, 0, False, 0, 0), (0, 1, False, 0, 0)], True)], None)
    lines.append(lines.pop(2))  # the second receipt after the run_end
    _rehash_from(lines, 2, None)
    path.write_text("\n".join(lines) + "\n")
    fast, strict, _ = _audit_both(path, head=False)
    assert fast == strict and "receipt entry after run_end" in str(fast.faults)
    rest = lines[1:]  # no run_start
    _rehash_from(rest, 0, None)
    path.write_text("\n".join(rest) + "\n")
    fast, strict, _ = _audit_both(path, head=False)
    assert fast == strict and "receipt entry before any run_start" in str(fast.faults)


def test_a_signed_head_ending_at_a_receipt_is_checked_the_same_on_the_fast_walk(tmp_path):
    """An open run's head ends at a receipt the fast walk took: its hash and kind are what the head is checked on."""
    path = tmp_path / "ledger.jsonl"
    path.write_text("\n".join(_write_lines(path, [(_CERT, [(0, s, False, 0, 0) for s in range(3)], False)], None))
                    + "\n")
    fast, strict, taken = _audit_both(path, require_end=False)
    assert taken == 3 and fast == strict and fast.ok and fast.signed_head
    fast, strict, _ = _audit_both(path, since=path.with_name("ledger.jsonl.head"), require_end=False)
    assert fast == strict and fast.ok


def test_a_clean_receipt_is_checked_without_building_its_record_or_entry(tmp_path, monkeypatch):
    """The cost the issue names: on the old main every line was decoded into a record and an entry."""
    path = tmp_path / "ledger.jsonl"
    build_ledger(path, 60, runs=2)
    read = []
    strict_entry = entries._entry

    def counting(line: bytes, number: int, raw: bool) -> Any:
        read.append(number)
        return strict_entry(line, number, raw)

    monkeypatch.setattr(entries, "_entry", counting)
    report = verify_ledger(path)
    assert report.ok and report.entries == 60
    assert len(read) == 4  # two run_starts and two run_ends; the 56 receipts took the scan


def test_scan_receipt_reads_what_match_receipt_reads(tmp_path):
    path = tmp_path / "ledger.jsonl"
    lines = _write_lines(path, [(_CERT, [(r, s, s == 2, e, 0) for s in range(4) for r in (0, 3)
                                         for e in range(len(_EXTRAS))], True)], None)
    for line in (text.encode() + b"\n" for text in lines):
        scan, match = scan_receipt(line), match_receipt(line)
        assert (scan is None) == (match is None)
        if match is not None:
            record, payload = match.record, match.record["payload"]
            assert scan == (record["certificate"], record["hash"], record["prev"], record["seq"], payload["rank"],
                            payload["step"], *match.facts, match.canonical)


@pytest.mark.parametrize("written,given", [(None, b""), (None, _KEY), (_KEY, None), (_KEY, b"x" * 32)])
def test_a_receipt_hashed_without_the_given_key_is_left_to_the_strict_check(tmp_path, written, given):
    """An empty key is a key: an unkeyed receipt under it is a fault, though its plain sha256 holds."""
    path = tmp_path / "ledger.jsonl"
    path.write_text("\n".join(_write_lines(path, [(_CERT, [(0, 0, False, 0, 0)], True)], written)) + "\n")
    fast, strict, taken = _audit_both(path, key=given)
    assert fast == strict and not fast.ok and taken == 0
    assert any(fault.line == 2 for fault in fast.faults)
