"""Shared bodies of the audit tests, run against a real handle of any placement-capable backend."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from mixle_parallel.contracts.estimation import canonical_statistic_bytes
from mixle_parallel.executors.estimation import encoded_data, fit, handle_from_runner
from mixle_parallel.executors.registry import register_encoded_data_backend, unregister_encoded_data_backend
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


def flip_trial(handle: Any, injector: Any, rng: np.random.Generator, start: Any, clean: Any, *,
               its: int) -> tuple[int, int, int]:
    """One fit with one flip in an audited chunk on its worker; checks everything.

    The chunk's statistic disagrees with the reference computed outside the backend, a replay on the same
    worker does not reproduce it (a device fault), so that worker is quarantined and its chunks recomputed."""
    handle.readmit()
    audit = handle.audit
    base = handle.iteration
    # No pass's sample is known ahead (it is drawn after the pass's commitments), so the handle audits every
    # chunk (audit_rate=1.0) and the flip may strike any chunk of any pass.
    assert audit.rate == 1.0, "flip_trial needs a handle with audit_rate=1.0"
    choices = [(base + i, c) for i in range(its) for c in range(handle.num_chunks)]
    step, chunk = choices[int(rng.integers(len(choices)))]
    healthy = audit.healthy()
    worker = handle.runner.chunk_owners()[chunk]
    injector.add(BitFlip("statistic", f"chunk:{chunk}", rank=worker, step=step, index=int(rng.integers(12)),
                         bit=int(rng.integers(64))))
    result = fit(handle, estimator(), max_its=its, delta=None, prev_estimate=start)
    assert not injector.pending, "the planned flip never struck"
    bad = [r for r in result.audit_records if not r.matched]
    mine = [r for r in result.audit_records if (r.step, r.unit) == (step, f"chunk:{chunk}")]
    # no chunk is computed twice by the backend: the reference is the one recomputation, and the only mismatch
    assert [r.replay for r in result.audit_records] == ["reference"] * len(result.audit_records)
    assert bad == mine and len(bad) == 1, bad
    assert (bad[0].cause, bad[0].attributed_rank, bad[0].action, bad[0].injected) == (
        "device", worker, "quarantine", True)
    assert worker in healthy and result.quarantined == (worker,)
    assert same_bits(result, clean), "the fit did not end on the bits of a clean run"
    return step, chunk, worker


@contextmanager
def third_party_backend(name: str, runner: Callable[[int], Any]) -> Iterator[str]:
    """``name`` registered as a third-party EM backend whose handle runs on ``runner(num_workers)`` (a test runner
    that cheats somehow; it starts no process), unregistered afterwards."""
    def factory(data: Any, *, num_workers: int | None = None, **params: Any) -> Any:
        return handle_from_runner(runner(num_workers or 2), data, **params)

    register_encoded_data_backend(name, factory, options={"num_workers"}, worker_processes=False)
    try:
        yield name
    finally:
        unregister_encoded_data_backend(name)
