"""A ledger line is never held past the line limit (issue 24 items 4-5: streaming audit, bounded memory).

Iterating the file read a whole line before its size was checked: one 64 MB line without a newline was
held whole by ``audit``, ``verify_for_append`` and ``read_ledger``. ``bounded_lines`` reads at most the
limit per line and skips the rest, reporting its size.
"""

from __future__ import annotations

import io
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.ledger_audit import build_ledger
from mixle_parallel.contracts.bounded_json import LEDGER_LINE_LIMITS
from mixle_parallel.verification.keys import TrustStore
from mixle_parallel.verification.ledger.entries import read_ledger
from mixle_parallel.verification.ledger.lines import OverlongLine, bounded_lines
from mixle_parallel.verification.ledger.verify import verify_ledger

_HUGE = 64 << 20


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "home"))


def _ledger_with_a_huge_line(tmp_path: Path, newline: bool) -> Path:
    path = tmp_path / "ledger.jsonl"
    build_ledger(path, 20)
    with open(path, "ab") as handle:
        handle.write(b"{" + b"7" * _HUGE + (b"\n" if newline else b""))
    return path


def _peak_bytes(call) -> int:
    tracemalloc.start()
    try:
        call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("newline", [True, False], ids=["complete", "unfinished"])
def test_audit_and_read_never_hold_an_over_long_line(tmp_path, newline):
    path = _ledger_with_a_huge_line(tmp_path, newline)
    reports = []
    peak_audit = _peak_bytes(lambda: reports.append(verify_ledger(path, head=False, trust_store=TrustStore())))
    peak_read = _peak_bytes(lambda: reports.append(read_ledger(path)))
    assert peak_audit < _HUGE // 4 and peak_read < _HUGE // 4, (peak_audit, peak_read)
    report, read = reports
    assert not report.ok
    assert any("over the ledger line limit" in f.message for f in report.faults)
    if newline:
        assert any("over the ledger line limit" in problem for _, problem in read.problems)
    else:
        assert "over the ledger line limit" in (read.torn or "")


@given(st.lists(st.binary(max_size=12).filter(lambda b: b"\n" not in b), max_size=8), st.booleans(),
       st.integers(1, 8))
def test_bounded_lines_yields_what_splitting_yields_or_the_size_of_what_it_skipped(pieces, final_newline, limit):
    raw = b"\n".join(pieces) + (b"\n" if final_newline and pieces else b"")
    parts = raw.split(b"\n")
    expected = [p + b"\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])
    got = list(bounded_lines(io.BytesIO(raw), limit))
    assert [n for n, _ in got] == list(range(1, len(expected) + 1))
    for (_, line), want in zip(got, expected):
        content = want[:-1] if want.endswith(b"\n") else want
        if len(content) > limit + (not want.endswith(b"\n")):
            assert line == OverlongLine(len(content), want.endswith(b"\n"))
        else:
            assert line == want


def test_the_line_limit_is_the_ledger_line_limit():
    data = b"x" * LEDGER_LINE_LIMITS.max_bytes + b"\n" + b"y" * (LEDGER_LINE_LIMITS.max_bytes + 1) + b"\n"
    (_, first), (_, second) = bounded_lines(io.BytesIO(data), LEDGER_LINE_LIMITS.max_bytes)
    assert first == b"x" * LEDGER_LINE_LIMITS.max_bytes + b"\n"
    assert second == OverlongLine(LEDGER_LINE_LIMITS.max_bytes + 1, True)
