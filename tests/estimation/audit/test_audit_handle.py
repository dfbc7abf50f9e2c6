"""Audit logic inside the handle, on the in-process thread backend (cheap), and the non-placement path."""

from __future__ import annotations

import numpy as np
import pytest

from mixle_parallel.executors.estimation import ChunkedEncodedData, encoded_data, fit
from mixle_parallel.executors.estimation.audit.audit_injection import flip_statistic
from mixle_parallel.executors.estimation.backends.local import LocalChunkRunner
from mixle_parallel.verification import BitFlip, FaultInjector, Ledger, SDCDetectedError, read_ledger, verify_ledger
from tests.estimation.audit.audit_cases import clean_fit, flip_trial, same_bits, start_model
from tests.estimation.audit.conftest import ROWS_PER_CHUNK, estimator


@pytest.fixture(scope="module")
def start(rows):
    return start_model(rows)


def test_flips_on_worker_threads_are_attributed_and_the_fit_ends_clean(rows, start):
    clean = clean_fit(rows, start, 3)
    injector = FaultInjector()
    rng = np.random.default_rng(1)
    with encoded_data(rows, estimator=estimator(), chunk_size=ROWS_PER_CHUNK, backend="local", num_workers=4,
                      audit_rate=1.0, fault_injector=injector) as handle:
        for _ in range(6):
            flip_trial(handle, injector, rng, start, clean, its=3)


def test_every_fit_audits_at_least_one_chunk_even_with_four_chunks(rows, start):
    few = rows[:240]  # 4 chunks: the reference's round(0.1 x 4) = 0 audits nothing
    with encoded_data(few, estimator=estimator(), chunk_size=ROWS_PER_CHUNK, backend="local", num_workers=2) as handle:
        assert handle.audit.rate == 0.05  # on by default with two workers or more
        for _ in range(3):
            result = fit(handle, estimator(), max_its=2, delta=None, prev_estimate=start)
            assert len(result.audit_records) >= 1 and all(r.matched for r in result.audit_records)


def test_audit_is_off_for_one_worker_or_on_request(rows, start):
    one = fit(rows, estimator(), max_its=2, delta=None, prev_estimate=start, chunk_size=ROWS_PER_CHUNK)
    off = fit(rows, estimator(), max_its=2, delta=None, prev_estimate=start, chunk_size=ROWS_PER_CHUNK,
              backend="local", num_workers=2, audit=False)
    assert one.audit_records == off.audit_records == ()
    with pytest.raises(ValueError, match="audit=False contradicts audit_rate"):
        encoded_data(rows, estimator=estimator(), backend="local", num_workers=2, audit=False, audit_rate=0.2)


def test_two_workers_attribute_by_the_reference_then_the_last_one_cannot_be_quarantined(rows, start, tmp_path):
    """The reference is the witness two workers lack: a flip on worker 0 that a replay there does not reproduce
    quarantines worker 0; a flip on worker 1 then leaves no worker to recompute on, so the fit raises."""
    ledger = Ledger(tmp_path / "two.jsonl")
    injector = FaultInjector([BitFlip("statistic", "chunk:5", rank=0, step=0, index=1, bit=40),
                              BitFlip("statistic", "chunk:9", rank=1, step=1, index=1, bit=40)])
    with pytest.raises(SDCDetectedError, match="chunk:9"):
        fit(rows, estimator(), max_its=3, delta=None, prev_estimate=start, chunk_size=ROWS_PER_CHUNK, backend="local",
            num_workers=2, audit_rate=1.0, fault_injector=injector, ledger=ledger)
    entries = read_ledger(ledger.path).entries
    audits = [e.payload["record"]["data"] for e in entries if e.kind == "audit"]
    bad = [a for a in audits if not a["matched"]]
    assert [(b["unit"], b["attributed_rank"], b["cause"], b["action"]) for b in bad] == [
        ("chunk:5", 0, "device", "quarantine"), ("chunk:9", 1, "device", "raise")]
    assert any(e.kind == "note" and "worker 0 quarantined" in e.payload["message"] for e in entries)
    assert entries[-1].kind == "run_end" and entries[-1].payload["status"] == "failed"
    assert verify_ledger(ledger.path).ok


def test_two_workers_with_one_flip_end_on_the_bits_of_a_clean_run(rows, start):
    injector = FaultInjector([BitFlip("statistic", "chunk:5", rank=0, step=0, index=1, bit=40)])
    result = fit(rows, estimator(), max_its=3, delta=None, prev_estimate=start, chunk_size=ROWS_PER_CHUNK,
                 backend="local", num_workers=2, audit_rate=1.0, fault_injector=injector)
    assert result.quarantined == (0,) and same_bits(result, clean_fit(rows, start, 3))


class NoPlacementRunner(LocalChunkRunner):
    """A runner that, like mpi and spark, cannot aim a chunk at a chosen worker."""

    supports_worker_placement = False


def test_runners_without_placement_audit_by_same_runner_replays(rows, start):
    handle = ChunkedEncodedData(NoPlacementRunner(2), rows, estimator=estimator(), chunk_size=ROWS_PER_CHUNK)
    with handle:
        handle.attach_verification(audit=True, audit_rate=0.5)
        result = fit(handle, estimator(), max_its=2, delta=None, prev_estimate=start)
        assert {r.replay for r in result.audit_records} == {"reference"}  # the reference replaces the replay
        assert all(r.matched for r in result.audit_records)
        assert same_bits(result, clean_fit(rows, start, 2))
    with pytest.raises(ValueError, match="supports_worker_placement=False"):
        ChunkedEncodedData(NoPlacementRunner(2), rows, estimator=estimator(), chunk_size=ROWS_PER_CHUNK
                           ).attach_verification(audit=True, fault_injector=FaultInjector())
    with pytest.raises(NotImplementedError, match="supports_worker_placement"):
        from mixle_parallel.executors.estimation.backends.spark import SparkRunner

        SparkRunner.compute_on(object.__new__(SparkRunner), 0, None, None, [0])


def test_flip_statistic_flips_exactly_one_bit_of_the_indexed_element():
    stats = (np.array([1.0, 2.0]), ((3.0, 4.0), {"b": 6.0, "a": 5.0}))
    flipped = flip_statistic(stats, 4, 0)  # elements in order: 1, 2, 3, 4, a=5, b=6
    assert flipped[1][1]["a"] == np.nextafter(5.0, 6.0) and flipped[1][1]["b"] == 6.0
    assert flip_statistic(stats, 1, 63)[0][1] == -2.0 and stats[0][1] == 2.0  # a copy; the input is kept
    with pytest.raises(ValueError, match="no float"):
        flip_statistic(("x", 3), 0, 0)


def test_two_flips_on_one_worker_in_one_pass_quarantine_it_once(rows, start, tmp_path):
    """A device that corrupts two audited chunks of one pass: one quarantine covers both (the worker's chunks are
    recomputed on the other), not a failed fit because no third worker is left to quarantine onto."""
    clean = clean_fit(rows, start, 3)
    ledger = Ledger(tmp_path / "twice.jsonl")
    with encoded_data(rows, estimator=estimator(), chunk_size=ROWS_PER_CHUNK, backend="local", num_workers=2,
                      audit_rate=1.0, fault_injector=FaultInjector(), ledger=ledger) as handle:
        first, second = [c for c, w in enumerate(handle.runner.chunk_owners()) if w == 1][2:4]
        for chunk in (first, second):
            handle.audit.injector.add(BitFlip("statistic", f"chunk:{chunk}", rank=1, step=0, index=1, bit=40))
        result = fit(handle, estimator(), max_its=3, delta=None, prev_estimate=start)
    bad = [r for r in result.audit_records if not r.matched]
    assert [(r.step, r.unit, r.cause, r.action, r.attributed_rank) for r in bad] == [
        (0, f"chunk:{first}", "device", "quarantine", 1), (0, f"chunk:{second}", "device", "quarantine", 1)]
    assert result.quarantined == (1,)
    assert same_bits(result, clean)
    notes = [e.payload for e in read_ledger(ledger.path).entries if e.kind == "note"]
    assert sum("worker 1 quarantined" in str(n) for n in notes) == 1, notes
    assert verify_ledger(ledger.path).ok
