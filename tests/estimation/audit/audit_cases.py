"""Shared bodies of the audit tests, run against a real handle of any placement-capable backend."""

from __future__ import annotations

from typing import Any

import numpy as np

from mixle_parallel.contracts.estimation import canonical_statistic_bytes
from mixle_parallel.executors.estimation import encoded_data, fit
from mixle_parallel.verification import BitFlip
from tests.estimation.audit.conftest import ROWS_PER_CHUNK, estimator


def start_model(rows: np.ndarray) -> Any:
    """A fixed random start (the initialization pass is not part of what is audited)."""
    with encoded_data(rows, estimator=estimator(), chunk_size=ROWS_PER_CHUNK) as h:
        return h.pysp_seq_initialize(estimator(), 3, 0.3)


def clean_fit(rows: np.ndarray, start: Any, its: int) -> Any:
    """The reference: one thread, no audit."""
    return fit(rows, estimator(), max_its=its, delta=None, prev_estimate=start, chunk_size=ROWS_PER_CHUNK)


def same_bits(a: Any, b: Any) -> bool:
    """Bitwise equality of two fits: model parameters and log-likelihood trajectory."""
    return (canonical_statistic_bytes(a.model.params()) == canonical_statistic_bytes(b.model.params())
            and a.history == b.history)


def ring_next(healthy: list[int], worker: int) -> int:
    """The auditor the handle picks for a chunk whose primary is ``worker``."""
    i = healthy.index(worker)
    return (healthy[i + 1:] + healthy[:i])[0]


def flip_trial(handle: Any, injector: Any, rng: np.random.Generator, start: Any, clean: Any, *,
               its: int, strike: str) -> tuple[int, int, int]:
    """One fit with one flip in an audited chunk (on its primary or its auditor); checks everything."""
    handle.readmit()
    audit = handle.audit
    base = handle.iteration
    choices = [(base + i, c) for i in range(its)
               for c in audit.audited_chunks(base + i, handle.num_chunks, first_of_fit=i == 0)]
    step, chunk = choices[int(rng.integers(len(choices)))]
    healthy = audit.healthy()
    primary = handle.runner.chunk_owners()[chunk]
    worker = primary if strike == "primary" else ring_next(healthy, primary)
    injector.add(BitFlip("statistic", f"chunk:{chunk}", rank=worker, step=step, index=int(rng.integers(12)),
                         bit=int(rng.integers(64))))
    result = fit(handle, estimator(), max_its=its, delta=None, prev_estimate=start)
    assert not injector.pending, "the planned flip never struck"
    bad = [r for r in result.audit_records if not r.matched]
    mine = [r for r in result.audit_records if (r.step, r.unit) == (step, f"chunk:{chunk}")]
    found = [r for r in mine if r.replay != "reference"]
    # the statistic the audit kept agrees with the independent reference computed outside the backend
    assert [(r.replay, r.matched) for r in mine if r.replay == "reference"] == [("reference", True)]
    assert [r.replay for r in found] == ["peer", "witness"] and bad[0] is found[0], (strike, bad)
    # the peer replay disagrees with the primary; the witness agrees with the primary when the auditor was struck
    assert [r.matched for r in found] == [False, strike == "auditor"]
    assert all((r.attributed_rank, r.action, r.injected) == (worker, "quarantine", True) for r in bad)
    assert set(bad) <= set(found)  # no other mismatch: no false positive anywhere in the fit
    assert len({found[0].rank, found[0].auditor_rank, found[1].auditor_rank}) == 3  # three distinct workers
    assert {found[0].rank, found[0].auditor_rank, found[1].auditor_rank} <= set(healthy)
    assert result.quarantined == (worker,)
    assert same_bits(result, clean), "the fit did not end on the bits of a clean run"
    return step, chunk, worker
