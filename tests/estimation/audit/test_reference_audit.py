"""Production EM audits against an independent reference: a backend that behaves only under the harness is caught.

The cheating backend below is registered like any third-party one (``register_encoded_data_backend``). While
the verification harness is active it computes honestly, so it would certify; outside the harness it
computes every chunk on half-overwritten rows, the same way on every worker and on every replay, so
replays through the backend agree with it. Only a recomputation outside the backend (the handle's own E-step of the
chunk's rows) sees it, and the same-worker replay classifies it as a deterministic backend defect.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest

from mixle_parallel.executors.estimation import fit
from mixle_parallel.executors.estimation.em_pass.chunks import ChunkResult, EncodedChunk, apply_chunk_fn
from mixle_parallel.verification import Ledger, read_ledger, verify_ledger
from mixle_parallel.verification.capability import (
    active_harness_capability,
    claim_harness_capability,
    harness_admitted,
)
from mixle_parallel.verification.sdc import BackendDefectError, EMAuditor, SDCDetectedError
from tests.estimation.audit.audit_cases import start_model, third_party_backend
from tests.estimation.audit.conftest import ROWS_PER_CHUNK, estimator

NAME = "harness_aware_em"


def overwrite_half(chunk: EncodedChunk) -> EncodedChunk:
    """``chunk`` with the first half of its rows overwritten by its first row (the issue's edited backend)."""
    data = np.array(chunk.data, copy=True)
    data[: len(data) // 2] = data[0]
    return chunk._replace(data=data)


class HarnessAwareRunner:
    """A chunk runner (two in-process workers, no placement) that is honest only while the harness is active:
    otherwise it computes every chunk on half-overwritten rows, consistently (own results, digests, folds)."""

    name = NAME

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers
        self._chunks: list[Any] = []

    def scatter(self, chunks: Sequence[Any]) -> None:
        self._chunks = list(chunks)

    def _chunk(self, i: int) -> Any:
        return self._chunks[i] if active_harness_capability() is not None else overwrite_half(self._chunks[i])

    def map_chunks(self, fn: Callable[[Any, Any], Any], payload: Any,
                   chunk_ids: Sequence[int] | None = None) -> list[Any]:
        ids = list(range(len(self._chunks))) if chunk_ids is None else sorted(chunk_ids)
        half = (len(ids) + 1) // 2
        return [*apply_chunk_fn(fn, payload, ids[:half], self._chunk), *apply_chunk_fn(fn, payload, ids[half:],
                                                                                        self._chunk)]

    def close(self) -> None:
        self._chunks = []


@pytest.fixture()
def harness_aware_backend() -> Iterator[str]:
    with third_party_backend(NAME, HarnessAwareRunner) as name:
        yield name


@pytest.fixture(scope="module")
def start(rows: np.ndarray) -> Any:
    return start_model(rows)


def _fit(rows: np.ndarray, start: Any, **controls: Any) -> Any:
    return fit(rows, estimator(), max_its=3, delta=None, prev_estimate=start, chunk_size=ROWS_PER_CHUNK,
               backend=NAME, num_workers=2, **controls)


def test_backend_that_cheats_outside_the_harness_is_a_backend_defect_in_the_ledger_and_raises(
        harness_aware_backend, rows, start, tmp_path):
    ledger = Ledger(tmp_path / "cheat.jsonl")
    with pytest.raises(BackendDefectError, match="backend defect: chunk:") as caught:
        _fit(rows, start, audit_policy="raise", ledger=ledger)
    assert isinstance(caught.value, SDCDetectedError)  # callers catching SDC still catch it
    bad = [r for r in caught.value.records if not r.matched]
    assert [(r.replay, r.cause, r.action) for r in bad] == [("reference", "backend_defect", "raise")]
    entries = read_ledger(ledger.path).entries
    audits = [e.payload["record"]["data"] for e in entries if e.kind == "audit"]
    # the reference is the one recomputation (no same-runner replay besides the one that classified it)
    assert {a["replay"] for a in audits} == {"reference"}
    assert audits[-1]["replay"] == "reference" and audits[-1]["cause"] == "backend_defect"
    assert audits[-1]["matched"] is False and audits[-1]["maximum_absolute_difference"] > audits[-1]["bound"]
    assert entries[-1].kind == "run_end" and entries[-1].payload["status"] == "failed"
    assert verify_ledger(ledger.path).ok


def test_quarantine_cannot_mend_software_so_the_default_policy_raises_too(harness_aware_backend, rows, start):
    with pytest.raises(BackendDefectError):
        _fit(rows, start)


def test_warn_records_the_defect_and_goes_on(harness_aware_backend, rows, start):
    result = _fit(rows, start, audit_policy="warn")
    bad = [r for r in result.audit_records if not r.matched]
    assert bad and all((r.replay, r.cause, r.action) == ("reference", "backend_defect", "warn") for r in bad)


def test_under_the_harness_the_same_backend_matches_its_reference(harness_aware_backend, rows, start):
    capability = claim_harness_capability("test_reference_audit")
    with harness_admitted(capability):
        result = _fit(rows, start, audit_policy="raise")
    refs = [r for r in result.audit_records if r.replay == "reference"]
    assert refs and all(r.matched for r in result.audit_records)


def _auditor_case(replayed: Any) -> Any:
    auditor = EMAuditor(policy="warn")
    good = ChunkResult(60.0, -10.0, (np.array([1.0, 2.0]), 3.0))
    bad = ChunkResult(60.0, -10.0, (np.array([1.0, 2.5]), 3.0))
    return auditor.audit_reference(iteration=4, chunk=7, worker=1, statistic=bad, reference=good,
                                   replay=lambda: replayed, atol=1e-9, rtol=1e-9).records[0]


def test_a_mismatch_that_reproduces_is_software_one_that_does_not_is_the_device():
    reproduced = _auditor_case(ChunkResult(60.0, -10.0, (np.array([1.0, 2.5]), 3.0)))
    transient = _auditor_case(ChunkResult(60.0, -10.0, (np.array([1.0, 2.0]), 3.0)))
    assert (reproduced.cause, reproduced.attributed_rank, reproduced.action) == ("backend_defect", 1, "warn")
    assert (transient.cause, transient.attributed_rank) == ("device", 1)
    assert reproduced.maximum_absolute_difference == 0.5


def test_reference_comparison_allows_rounding_within_the_harness_bound_and_nothing_more():
    auditor = EMAuditor()
    ref = ChunkResult(60.0, -10.0, (np.array([1.0, 2.0]),))
    rounded = ChunkResult(60.0, -10.0, (np.array([1.0, np.nextafter(2.0, 3.0)]),))
    ok = auditor.audit_reference(iteration=0, chunk=0, worker=0, statistic=rounded, reference=ref,
                                 replay=lambda: rounded, atol=1e-9, rtol=1e-9)
    assert ok.records[0].matched and 0.0 < ok.records[0].maximum_absolute_difference <= ok.records[0].bound
    assert auditor.audit_reference(iteration=0, chunk=0, worker=0, statistic=ref, reference=ref,
                                   replay=lambda: pytest.fail("equal bits are not replayed"), atol=0.0,
                                   rtol=0.0).records[0].matched
    off = ChunkResult(60.0, -10.0, (np.array([1.0, 2.0 + 1e-6]),))
    with pytest.raises(SDCDetectedError):
        auditor.audit_reference(iteration=0, chunk=0, worker=0, statistic=off, reference=ref,
                                replay=lambda: off, atol=1e-9, rtol=1e-9)


def test_a_difference_within_the_bound_that_does_not_reproduce_is_a_device_fault():
    """A flipped low mantissa bit stays within the rounding bound; only a deterministic difference is rounding."""
    ref = ChunkResult(60.0, -10.0, (np.array([1.0, 2.0]),))
    flipped = ChunkResult(60.0, -10.0, (np.array([1.0, np.nextafter(2.0, 3.0)]),))
    with pytest.raises(SDCDetectedError) as caught:
        EMAuditor().audit_reference(iteration=3, chunk=5, worker=2, statistic=flipped, reference=ref,
                                    replay=lambda: ref, atol=1e-9, rtol=1e-9)
    record = caught.value.records[0]
    assert (record.matched, record.cause, record.attributed_rank) == (False, "device", 2)
    assert record.maximum_absolute_difference <= record.bound  # within the bound, still refused
