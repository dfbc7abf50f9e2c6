"""The reference audit over ``files(...)`` (issue 23 item 5): the driver reads the audited chunk again from its file.

A handle over a file source holds no rows; before, its audit only replayed chunks through the backend (a peer
on mp), so a backend computing wrong the same way everywhere fitted. Now the driver re-reads each audited
chunk from its file by its place in the source (file, row offset), E-steps it, and compares. An honest mp fit
over ``.npy`` and Parquet files passes with the bits of the source fitted by one local worker; a runner that
computes on half-overwritten rows outside the harness is caught as a backend defect; a flipped bit on an mp
worker is a device fault, quarantined and mended.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from mixle_parallel.executors.estimation import encoded_data, fit, handle_from_runner
from mixle_parallel.executors.estimation.em_pass.chunks import apply_chunk_fn
from mixle_parallel.executors.estimation.sources import materialize
from mixle_parallel.verification import BitFlip, FaultInjector
from mixle_parallel.verification.capability import active_harness_capability
from mixle_parallel.verification.sdc import BackendDefectError
from tests.estimation.audit.test_reference_audit import overwrite_half
from tests.estimation.backends import em_case
from tests.estimation.sources import source_case

FIT = {**em_case.FIT_KWARGS, "max_its": 4}


@pytest.mark.parametrize("layout", ["npy", "parquet"])
def test_an_honest_mp_fit_over_files_is_audited_against_chunks_read_again_by_the_driver(layout, tmp_path):
    source = source_case.write_files(str(tmp_path), layout)
    clean = fit(source, em_case.estimator(), backend="local", num_workers=1, admission="unverified", **FIT)
    # admission="unverified": a test mesh; the audit is what is checked
    result = fit(source, em_case.estimator(), backend="mp", num_workers=2, admission="unverified", audit_rate=0.5,
                 **FIT)
    assert result.audit_records and {r.replay for r in result.audit_records} == {"reference"}
    assert all(r.matched for r in result.audit_records)
    assert em_case.signature(result) == em_case.signature(clean)


def test_a_flipped_bit_on_an_mp_worker_reading_files_is_quarantined_and_mended(tmp_path):
    source = source_case.write_files(str(tmp_path), "npy")
    clean = fit(source, em_case.estimator(), backend="local", num_workers=1, admission="unverified", **FIT)
    injector = FaultInjector()
    with encoded_data(source, estimator=em_case.estimator(), backend="mp", num_workers=3, admission="unverified",
                      chunk_size=FIT["chunk_size"], audit_rate=1.0, fault_injector=injector) as handle:
        chunk = 1  # every chunk is audited at rate 1.0: no pass's sample is known ahead
        worker = handle.runner.chunk_owners()[chunk]
        injector.add(BitFlip("statistic", f"chunk:{chunk}", rank=worker, step=1, index=2, bit=50))
        options = {k: v for k, v in FIT.items() if k != "chunk_size"}
        result = fit(handle, em_case.estimator(), **options)
    bad = [r for r in result.audit_records if not r.matched]
    assert [(r.unit, r.cause, r.action, r.attributed_rank) for r in bad] == [
        (f"chunk:{chunk}", "device", "quarantine", worker)]
    assert result.quarantined == (worker,) and em_case.signature(result) == em_case.signature(clean)


class FileCheatRunner:
    """Two in-process workers that build their chunks from the files and, outside the harness, compute on
    half-overwritten rows (the same way on every replay)."""

    name = "file_cheat"

    def __init__(self) -> None:
        self.num_workers = 2
        self._chunks: list[Any] = []

    def scatter(self, chunks: Sequence[Any]) -> None:
        self._chunks = [materialize(c) for c in chunks]

    def _chunk(self, i: int) -> Any:
        return self._chunks[i] if active_harness_capability() is not None else overwrite_half(self._chunks[i])

    def map_chunks(self, fn: Callable[[Any, Any], Any], payload: Any,
                   chunk_ids: Sequence[int] | None = None) -> list[Any]:
        ids = list(range(len(self._chunks))) if chunk_ids is None else sorted(chunk_ids)
        return apply_chunk_fn(fn, payload, ids, self._chunk)

    def close(self) -> None:
        self._chunks = []


def test_a_backend_that_cheats_on_chunks_read_from_files_is_a_backend_defect(tmp_path):
    source = source_case.write_files(str(tmp_path), "npy")
    with handle_from_runner(FileCheatRunner(), source, estimator=em_case.estimator(),
                            chunk_size=FIT["chunk_size"]) as handle:
        handle.attach_verification(audit=True, audit_rate=0.3, audit_policy="raise")
        options = {k: v for k, v in FIT.items() if k != "chunk_size"}
        with pytest.raises(BackendDefectError) as caught:
            fit(handle, em_case.estimator(), **options)
    bad = [r for r in caught.value.records if not r.matched]
    assert [(r.replay, r.cause) for r in bad] == [("reference", "backend_defect")]
