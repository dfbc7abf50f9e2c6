"""A fit judges its audited passes in batches (``em_pass.deferred_judging``): one read of the references per batch.

Where the driver reads the audited chunks again from their source, each pass's read is an engine job (a Spark job
costs about 0.1 s whatever it reads). A fit goes on from each pass's committed sum and judges the passes
together: their samples read in one request, every pass judged as ``estep`` judges one, its receipt written once
judged, in order, and no model returned before its passes are judged. A pass judged to another sum (a worker's
transient fault, quarantined and mended) makes the fit take up from it, dropping the passes after it, so the fit
ends on the bits, receipts and draws of a fit judged pass by pass.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from mixle_parallel.executors.estimation import encoded_data, fit
from mixle_parallel.executors.estimation.audit import sdc_audit
from mixle_parallel.executors.estimation.audit.audit_draw import Draw, SystematicDraw, recheck_draws
from mixle_parallel.executors.estimation.em_pass.chunks import ChunkResult
from mixle_parallel.executors.estimation.em_pass.deferred_judging import DeferredJudging
from mixle_parallel.executors.estimation.sources.opened import OpenedFiles
from mixle_parallel.verification import Ledger, read_ledger, verify_ledger
from mixle_parallel.verification.sdc import BackendDefectError
from tests.estimation.backends import em_case
from tests.estimation.sources import source_case

FIT = {**em_case.FIT_KWARGS, "max_its": 6}


def _receipts(path: Any) -> list[dict[str, Any]]:
    """Each receipt of the ledger at ``path`` as its step and its ``extra`` (the audit's fields)."""
    return [{"step": e.payload["step"], **e.payload["receipt"]["data"]["extra"]}
            for e in read_ledger(path).entries if e.kind == "receipt"]


def _counted_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many chunks each ``read_chunks`` call of a file source read (one entry per call)."""
    calls: list[int] = []
    original = OpenedFiles.read_chunks

    def counted(self: OpenedFiles, places: Any, encoder: Any) -> Any:
        calls.append(len(places))
        return original(self, places, encoder)

    monkeypatch.setattr(OpenedFiles, "read_chunks", counted)
    return calls


def test_a_fit_reads_its_references_once_per_batch_and_ends_on_the_bits_of_a_plain_fit(monkeypatch, tmp_path):
    source = source_case.write_files(str(tmp_path), "npy")
    clean = fit(source, em_case.estimator(), backend="local", num_workers=1, admission="unverified", **FIT)
    reads = _counted_reads(monkeypatch)
    ledger = Ledger(tmp_path / "fit.jsonl")
    judged = _count_batches(monkeypatch)
    result = fit(source, em_case.estimator(), backend="local", num_workers=2, admission="unverified",
                 audit_rate=0.1, ledger=ledger, **FIT)
    assert em_case.signature(result) == em_case.signature(clean)
    # six passes within one cycle of the draw (10 passes at rate 0.1): their samples read in one request
    assert len(reads) == 1 and reads[0] >= 2, reads
    assert judged == [(6, 6, False)]
    assert result.audit_records and all(r.matched and r.replay == "reference" for r in result.audit_records)
    assert {r.step for r in result.audit_records} <= set(range(6))
    # every pass judged once, in order: its receipt with its audited chunks and its draw (re-derivable)
    receipts = _receipts(ledger.path)
    assert [r["step"] for r in receipts] == list(range(6))
    recheck_draws(0.1, _chunks(ledger.path), [Draw.from_fields(r["audit_draw"]) for r in receipts])
    assert sorted((r.step, int(r.unit.split(":")[1])) for r in result.audit_records if r.unit.startswith("chunk:")) \
        == sorted((r["step"], c) for r in receipts for c in r["audit_draw"]["chunks"])
    assert verify_ledger(ledger.path).ok


def test_a_fit_with_on_step_judges_each_pass_before_the_call(monkeypatch, tmp_path):
    source = source_case.write_files(str(tmp_path), "npy")
    reads = _counted_reads(monkeypatch)
    steps: list[Any] = []
    result = fit(source, em_case.estimator(), backend="local", num_workers=2, admission="unverified",
                 audit_rate=0.1, on_step=steps.append, **FIT)
    assert len(reads) == 6  # one read per pass: each judged before on_step saw it
    assert [s.iteration for s in steps] == list(range(6))
    assert sum(len(s.audit_records) for s in steps) == len(result.audit_records) > 0
    assert all(r.step == s.iteration for s in steps for r in s.audit_records)


def _chunks(path: Any) -> int:
    start = [e.payload for e in read_ledger(path).entries if e.kind == "run_start"][0]
    return int(start["extra"]["chunks"])


def test_estep_called_by_hand_is_judged_at_once(tmp_path, monkeypatch):
    source = source_case.write_files(str(tmp_path), "npy")
    reads = _counted_reads(monkeypatch)
    with encoded_data(source, estimator=em_case.estimator(), backend="local", num_workers=2,
                      admission="unverified", chunk_size=FIT["chunk_size"], audit_rate=0.1) as handle:
        model = handle.pysp_seq_initialize(em_case.estimator(), 11, 0.2)
        for i in range(3):
            model = handle.estep(em_case.estimator(), model).model
            assert handle.last_receipt is not None and handle.last_receipt.step == i  # written with its pass
            assert handle.passes_held == 0
    assert len(reads) == 3  # mixle's loop and any caller of estep: each pass judged before it returns


class _TransientFault:
    """The chunk E-step of the runner's passes, wrong the first time it computes each of ``chunks`` (a device
    that fails once); the driver's reference and the replays on a worker compute correctly."""

    def __init__(self, chunks: set[int]) -> None:
        self.chunks = chunks
        self.struck: set[int] = set()
        self._estep = sdc_audit.chunk_estep

    def __call__(self, chunk: Any, payload: Any) -> ChunkResult:
        out = self._estep(chunk, payload)
        if chunk.chunk_id in self.chunks and chunk.chunk_id not in self.struck:
            self.struck.add(chunk.chunk_id)
            return ChunkResult(out.count, out.log_likelihood + 0.5, out.stats)
        return out


def test_a_pass_judged_to_another_sum_makes_the_fit_take_up_from_it(monkeypatch, tmp_path):
    rows = em_case.data()
    clean = fit(rows, em_case.estimator(), backend="local", num_workers=2, audit=False, admission="unverified",
                **FIT)
    ledger = Ledger(tmp_path / "fault.jsonl")
    entropy = bytes(range(32))  # every draw the same, so the test knows a chunk of worker 1 the first pass audits
    monkeypatch.setattr(sdc_audit, "fresh_entropy", lambda: entropy)
    with encoded_data(rows, estimator=em_case.estimator(), backend="local", num_workers=2, admission="unverified",
                      chunk_size=FIT["chunk_size"], audit_rate=0.25, ledger=ledger) as handle:
        owners = handle.runner.chunk_owners()
        first = SystematicDraw(0.25).draw(entropy, len(owners), owners, first_of_fit=True).chunks
        fault = _TransientFault({next(c for c in first if owners[c] == 1)})
        monkeypatch.setattr(sdc_audit, "chunk_estep", fault)
        options = {k: v for k, v in FIT.items() if k != "chunk_size"}
        judged = _count_batches(monkeypatch)
        result = fit(handle, em_case.estimator(), **options)
    assert judged[0] == (4, 1, True)  # four passes held (a cycle at rate 0.25), the first judged to another sum
    assert fault.struck  # the first pass computed worker 1's chunks wrong; its draw audits one chunk per worker
    bad = [r for r in result.audit_records if not r.matched]
    assert {(r.step, r.cause, r.action, r.attributed_rank) for r in bad} == {(0, "device", "quarantine", 1)}
    assert result.quarantined == (1,)
    assert em_case.signature(result) == em_case.signature(clean)  # mended, and the passes after it run again
    receipts = _receipts(ledger.path)
    assert [r["step"] for r in receipts] == list(range(FIT["max_its"]))  # the dropped passes left no receipt
    recheck_draws(0.25, len(owners), [Draw.from_fields(r["audit_draw"]) for r in receipts])
    assert verify_ledger(ledger.path).ok


def _count_batches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, bool]]:
    """Each batch judged: passes held, passes judged, whether the fit took up from the last judged."""
    found: list[tuple[int, int, bool]] = []
    original = DeferredJudging.judge

    def judge(self: DeferredJudging, *args: Any) -> Any:
        held = len(self.pending)
        batch = original(self, *args)
        found.append((held, len(batch.passes), batch.resumed))
        return batch

    monkeypatch.setattr(DeferredJudging, "judge", judge)
    return found


def test_a_cheat_found_when_the_batch_is_judged_fails_the_fit(monkeypatch, tmp_path):
    rows = em_case.data()
    ledger = Ledger(tmp_path / "cheat.jsonl")

    def cheat(chunk: Any, payload: Any) -> ChunkResult:  # every chunk wrong, on every worker and replay
        out = original(chunk, payload)
        return ChunkResult(out.count, out.log_likelihood + 0.5, out.stats)

    original = sdc_audit.chunk_estep
    monkeypatch.setattr(sdc_audit, "chunk_estep", cheat)
    from mixle_parallel.executors.estimation.audit import placed_rounds
    monkeypatch.setattr(placed_rounds, "chunk_estep", cheat)
    with pytest.raises(BackendDefectError):
        fit(rows, em_case.estimator(), backend="local", num_workers=2, admission="unverified", audit_rate=0.25,
            ledger=ledger, **FIT)
    entries = read_ledger(ledger.path).entries
    assert [e.payload["status"] for e in entries if e.kind == "run_end"] == ["failed"]
    assert not [e for e in entries if e.kind == "receipt"]  # the first pass was not judged clean: no receipt
    notes = [e.payload["message"] for e in entries if e.kind == "note"]
    assert any("3 E-step(s) of the fit were not judged" in n for n in notes), notes  # the batch's other three
    assert verify_ledger(ledger.path).ok


def test_the_batch_is_judged_before_a_pass_a_planned_fault_strikes(tmp_path):
    from mixle_parallel.verification import BitFlip, FaultInjector

    rows = em_case.data()
    clean = fit(rows, em_case.estimator(), backend="local", num_workers=1, admission="unverified", **FIT)
    injector = FaultInjector()
    with encoded_data(rows, estimator=em_case.estimator(), backend="local", num_workers=2, admission="unverified",
                      chunk_size=FIT["chunk_size"], audit_rate=1.0, fault_injector=injector) as handle:
        worker = handle.runner.chunk_owners()[1]
        injector.add(BitFlip("statistic", "chunk:1", rank=worker, step=3, index=2, bit=50))
        options = {k: v for k, v in FIT.items() if k != "chunk_size"}
        result = fit(handle, em_case.estimator(), **options)
    assert not injector.pending
    bad = [r for r in result.audit_records if not r.matched]
    assert [(r.step, r.unit, r.cause, r.action) for r in bad] == [(3, "chunk:1", "device", "quarantine")]
    assert em_case.signature(result) == em_case.signature(clean)
    assert np.isfinite(result.log_likelihood)
