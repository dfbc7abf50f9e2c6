"""Stragglers do not fail a fit on ray, dask and spark (issue 25 item 7): a worker process SIGSTOPped mid-fit
(alive, silent: nothing reports it dead) while the others answer is given up at the straggler deadline,
well below the fit's timeout; its chunks are recomputed by the others and the fit ends on the bits of an
undisturbed fit. Before, each of these engines waited for the timeout and raised ``WorkerTimeoutError``."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from mixle_parallel.executors.estimation import encoded_data, fit
from tests.estimation.engines import em_case

pytestmark = pytest.mark.slow

TIMEOUT_S = 240.0
"""The fit's timeout: a fit that ends well before it was not ended by it (it would have raised)."""


def _fit_with_a_stopped_worker(backend: str, pick: Callable[[Any], int], **options: Any) -> tuple[Any, Any, float]:
    """Fit em_case on ``backend`` with two workers; after pass 2 SIGSTOP the process ``pick(runner)`` names,
    SIGCONT it after the fit. Returns (signature, runner, seconds the fit took)."""
    est = em_case.estimator()
    kwargs = {k: v for k, v in em_case.FIT_KWARGS.items() if k != "chunk_size"}
    stopped: list[int] = []
    with encoded_data(em_case.data(), estimator=est, backend=backend, num_workers=2, timeout=TIMEOUT_S,
                      chunk_size=em_case.FIT_KWARGS["chunk_size"], admission="unverified", **options) as h:

        def stop_one(step: Any) -> None:
            if step.iteration == 2:
                stopped.append(pick(h.runner))
                os.kill(stopped[0], signal.SIGSTOP)  # alive and silent: no death for the engine to see

        began = time.monotonic()
        try:
            got = fit(h, est, on_step=stop_one, **kwargs)
        finally:
            for pid in stopped:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        took = time.monotonic() - began
        assert stopped, "the fit never reached pass 2"
        return em_case.signature(got), h.runner, took


@pytest.mark.timeout(600)
def test_ray_a_sigstopped_actor_is_outrun_and_the_fit_ends_on_the_same_bits(ray_session):
    got, runner, took = _fit_with_a_stopped_worker("ray", lambda r: r.worker_pids()[1])
    assert runner.stragglers == [1], "the stopped actor was not given up on"
    assert runner.recovered_chunks, "no chunk was recomputed"
    assert runner.worker_ids() == [0]
    assert took < TIMEOUT_S
    assert got == em_case.reference()
