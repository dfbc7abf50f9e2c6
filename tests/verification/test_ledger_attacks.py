"""Attacks on a ledger by someone who can edit its files but holds no trusted key (issue 24 item 4).

The attacker rewrites entries and recomputes every hash, deletes entries, and copies signed seals
from inside the ledger into its head file. ``MIXLE_PARALLEL_HOME`` is a fresh store per test.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import attrs
import pytest

from benchmarks.ledger_audit import build_ledger
from mixle_parallel.contracts import StepReceipt, from_dict, to_dict
from mixle_parallel.verification.ledger.chain import Ledger, LedgerError, entry_hash, read_ledger
from mixle_parallel.verification.ledger.seal import head_path
from mixle_parallel.verification.ledger.verify import main_audit, verify_ledger
from tests.verification.test_ledger import write_run
from tests.verification.vhelpers import make_receipt


@pytest.fixture(autouse=True)
def home(monkeypatch, tmp_path):
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "home"))


def _rechain(records: list[dict]) -> list[str]:
    """What an attacker without a key can do: renumber and rehash every entry."""
    prev, out = "sha256:" + "0" * 64, []
    for seq, record in enumerate(records):
        body = {k: v for k, v in record.items() if k != "hash"}
        body["seq"], body["prev"] = seq, prev
        prev = entry_hash(body)
        out.append(json.dumps({**body, "hash": prev}, sort_keys=True, separators=(",", ":")))
    return out


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _run_end_seals(path: Path) -> list[dict]:
    return [r["payload"]["seal"] for r in _records(path) if r["kind"] == "run_end"]


def _forge_latest_run(path: Path) -> None:
    """Rewrite the last run's receipts, drop its run_end, and pin the head with the previous run's seal."""
    records = _records(path)
    last_start = max(i for i, r in enumerate(records) if r["kind"] == "run_start")
    forged = records[:last_start + 1]
    for record in records[last_start + 1:]:
        if record["kind"] == "receipt":
            record["payload"]["receipt"]["data"]["loss"] = 0.001  # a much better run than the real one
            forged.append(record)
    path.write_text("\n".join(_rechain(forged)) + "\n")
    head_path(path).write_text(json.dumps(_run_end_seals(path)[0]))


def test_a_rewritten_tail_is_refused_before_a_new_run_can_seal_it(tmp_path, plan):
    path = tmp_path / "run.jsonl"
    write_run(path, plan)
    write_run(path, plan)
    _forge_latest_run(path)
    with pytest.raises(LedgerError, match="refusing to append"):
        Ledger(path)
    assert not verify_ledger(path, require_end=False).ok  # and audit --allow-open does not pass it either


def test_a_tail_rewritten_with_the_head_deleted_is_refused(tmp_path, plan):
    path = tmp_path / "run.jsonl"
    write_run(path, plan)
    records = _records(path)[:-1]  # drop run_end, rewrite a receipt
    records[1]["payload"]["receipt"]["data"]["loss"] = 0.001
    path.write_text("\n".join(_rechain(records)) + "\n")
    head_path(path).unlink()
    with pytest.raises(LedgerError, match="refusing to append"):
        Ledger(path)


def test_allow_open_is_not_satisfied_by_a_seal_from_inside_the_ledger(tmp_path, plan, capsys):
    path = tmp_path / "run.jsonl"
    write_run(path, plan)
    write_run(path, plan)
    # delete the last run_end and pin the head with that run_end's own seal (it covers every entry left)
    lines = path.read_text().splitlines()
    seal = json.loads(lines[-1])["payload"]["seal"]
    path.write_text("\n".join(lines[:-1]) + "\n")
    head_path(path).write_text(json.dumps(seal))
    assert main_audit([str(path), "--allow-open"]) == 1
    assert "seal" in capsys.readouterr().out
    # delete the whole last run and pin the head with the first run's seal
    first_end = next(i for i, line in enumerate(lines) if json.loads(line)["kind"] == "run_end")
    path.write_text("\n".join(lines[:first_end]) + "\n")
    head_path(path).write_text(json.dumps(json.loads(lines[first_end])["payload"]["seal"]))
    assert main_audit([str(path), "--allow-open"]) == 1


def test_an_honest_open_run_passes_allow_open_and_can_be_continued(tmp_path, plan):
    path = tmp_path / "run.jsonl"
    write_run(path, plan)
    write_run(path, plan, end=False)  # a run still going (or crashed): no run_end
    assert verify_ledger(path, require_end=False).ok
    write_run(path, plan)  # the next run may append after it
    report = verify_ledger(path)
    assert report.ok, report.summary()


def test_a_nonfinite_loss_is_written_as_null_with_its_reason():
    for value, text in ((math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf")):
        receipt = attrs.evolve(make_receipt(0, skipped=True), loss=value)
        document = to_dict(receipt)
        json.dumps(document, allow_nan=False)  # strict JSON
        assert document["data"]["loss"] is None and document["data"]["extra"]["nonfinite_loss"] == text
        back = from_dict(json.loads(json.dumps(document)), StepReceipt)
        assert (math.isnan(back.loss) if text == "nan" else back.loss == value) and "nonfinite_loss" not in back.extra
    bad = to_dict(attrs.evolve(make_receipt(0, skipped=True), loss=math.nan))
    del bad["data"]["extra"]["nonfinite_loss"]
    with pytest.raises(Exception, match="nonfinite_loss"):
        from_dict(bad, StepReceipt)


def test_a_nonfinite_step_goes_into_the_ledger_and_audits(tmp_path, plan):
    path = tmp_path / "run.jsonl"
    ledger = Ledger(path)
    ledger.run_start(plan=plan, certificate="unverified")
    ledger.receipt(attrs.evolve(make_receipt(1, skipped=True), loss=math.nan))
    ledger.receipt(make_receipt(1))
    ledger.run_end(steps=1)
    assert verify_ledger(path).ok
    assert read_ledger(path).entries[1].payload["receipt"]["data"]["loss"] is None


_AUDIT_PEAKS = """
import sys, tracemalloc
from mixle_parallel.verification.ledger.verify import verify_ledger

def peak(path):
    tracemalloc.start()
    try:
        assert verify_ledger(path).ok
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

peak(sys.argv[1])  # once first: what the audit imports and caches lazily is not what grows with the ledger
print(peak(sys.argv[1]), peak(sys.argv[2]))
"""


def test_audit_memory_does_not_grow_with_the_ledger(tmp_path):
    """Measured in a fresh interpreter: tracemalloc counts every thread's allocations, and threads other tests
    leave running in this process (a Spark gateway, a dask client) would count in the audit's peak."""
    import subprocess
    import sys

    small, large = tmp_path / "small.jsonl", tmp_path / "large.jsonl"
    build_ledger(small, 500, runs=2)
    build_ledger(large, 5000, runs=2)
    done = subprocess.run([sys.executable, "-c", _AUDIT_PEAKS, str(small), str(large)], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    small_peak, large_peak = (int(v) for v in done.stdout.split())
    assert large_peak < 2 * small_peak  # 10x the entries, not 10x the memory


def test_a_session_skips_a_nonfinite_step_records_it_and_trains_on(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is the optional [torch] extra")
    from mixle_parallel.contracts import ParallelPlan
    from mixle_parallel.executors.torch.backend import TorchDistributedBackend
    from tests.torch._models import global_batches, make_model

    path = tmp_path / "run.jsonl"
    session = TorchDistributedBackend().prepare(make_model(), plan=ParallelPlan(), optimizer="SGD", lr=0.1,
                                                ledger=str(path), health=False, nonfinite="skip")
    x, y = global_batches(1, [4])[0][0]
    real = session.loss_fn

    def poisoned(module, inputs, targets):  # this step's loss is NaN
        out = real(module, inputs, targets)
        return (out[0] * torch.nan, *out[1:])

    session.loss_fn = poisoned
    skipped = session.train_batch(x, y)
    session.loss_fn = real
    committed = session.train_batch(x, y)
    session.close()
    assert skipped.skipped and math.isnan(skipped.loss) and not committed.skipped
    receipts = [e.payload["receipt"]["data"] for e in read_ledger(path).entries if e.kind == "receipt"]
    assert receipts[0]["loss"] is None and receipts[0]["extra"]["nonfinite_loss"] == "nan"
    assert receipts[0]["extra"]["reason"] == "nonfinite" and receipts[1]["loss"] is not None
    assert verify_ledger(path).ok
