"""Shared checks of the pass bytes runners measure (``backends.wire_bytes``): one EM fit's receipts, and a
probe pass whose payload and results the test sizes itself."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from mixle_parallel.executors.estimation import (
    GaussianDistribution,
    GaussianEstimator,
    MixtureDistribution,
    MixtureEstimator,
    encoded_data,
)
from tests.estimation.backends import chunk_probes as probes

SLACK_PER_MESSAGE = 4096
"""Bytes a request or reply may add around its pickled payload or results (chunk ids, framing tuples,
the chunk function pickled by value); the payload is ~32 KiB and each result 4 KiB, so a count that
missed the payload, double-counted a worker, or reported a formula would fall outside it."""


def mixture(k: int = 2) -> tuple[MixtureEstimator, MixtureDistribution]:
    """A k-component Gaussian mixture estimator and a starting model."""
    est = MixtureEstimator([GaussianEstimator() for _ in range(k)])
    model = MixtureDistribution([GaussianDistribution(float(m), 1.0) for m in np.linspace(-1, 1, k)],
                                np.full(k, 1 / k))
    return est, model


def em_receipt_bytes(backend: str, passes: int = 2, **options: Any) -> dict[str, Any]:
    """``passes`` E-steps on a 2-worker handle: each receipt's ``collective_bytes``, the runner's count, the
    model's pickle size."""
    data = np.random.default_rng(0).normal(size=400)
    est, model = mixture()
    handle = encoded_data(data, estimator=est, backend=backend, num_chunks=4, admission="unverified", audit=False,
                          **options)
    try:
        receipts = []
        for _ in range(passes):
            model = handle.estep(est, model).model
            receipts.append(handle.last_receipt)
        moved = int(handle.runner.transport_bytes)
    finally:
        handle.close()
    return {"bytes": [r.collective_bytes for r in receipts], "observed": [r.extra["bytes_observed"] for r in receipts],
            "runner_total": moved, "model_pickle": len(pickle.dumps((est, model), protocol=pickle.HIGHEST_PROTOCOL))}


def payload_nbytes() -> int:
    """Raw bytes of the probe payload's array (its pickle holds them plus a small header)."""
    return int(probes.WIRE_PAYLOAD["pad"].nbytes)


def results_nbytes(chunks: list[tuple[int, np.ndarray]], ids: list[int]) -> int:
    """Raw bytes of ``wide``'s result arrays for ``ids``, computed here."""
    return sum(int(probes.wide(chunks[i], probes.WIRE_PAYLOAD).nbytes) for i in ids)


def assert_driver_pass(runner: Any, workers: int, num_chunks: int = 6) -> None:
    """A ``wide`` pass through a driver/worker runner: sent is the payload once per worker, received the
    results, each within ``SLACK_PER_MESSAGE`` per message; a second pass adds the same again."""
    chunks = probes.make_chunks(num_chunks)
    runner.scatter(chunks)
    before = (runner.wire.sent, runner.wire.received)
    out = runner.map_chunks(probes.wide, probes.WIRE_PAYLOAD)
    assert [float(o[0]) for o in out] == [float(np.sum(c[1])) * 2.0 for c in chunks]
    sent, received = runner.wire.sent - before[0], runner.wire.received - before[1]
    low_sent, low_received = workers * payload_nbytes(), results_nbytes(chunks, list(range(num_chunks)))
    assert low_sent <= sent <= low_sent + workers * SLACK_PER_MESSAGE, (sent, low_sent)
    assert low_received <= received <= low_received + workers * SLACK_PER_MESSAGE, (received, low_received)
    runner.map_chunks(probes.wide, probes.WIRE_PAYLOAD)
    assert (runner.wire.sent - before[0], runner.wire.received - before[1]) == (2 * sent, 2 * received)
    assert runner.transport_bytes == runner.wire.sent + runner.wire.received


def assert_em_receipts(found: dict[str, Any]) -> None:
    """Each E-step's receipt reports the bytes its pass moved: observed, > the model's pickle (the model
    went out to two workers), the same for equal-sized passes, and together the runner's whole count."""
    assert all(found["observed"])
    assert all(b > 2 * found["model_pickle"] for b in found["bytes"]), found
    assert len(set(found["bytes"])) == 1, found  # same model and statistic sizes every pass
    assert sum(found["bytes"]) == found["runner_total"], found
