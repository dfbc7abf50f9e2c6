"""mp fault recovery: a worker killed mid-iteration is recomputed on survivors (same bits); a hung
worker is detected by timeout."""

from __future__ import annotations

import pytest

from mixle_parallel.contracts.estimation import canonical_statistic_bytes
from mixle_parallel.executors.estimation import (
    GaussianEstimator,
    MixtureEstimator,
    WorkerTimeoutError,
    encoded_data,
    fit,
)
from tests.estimation.core.faulty_models import FaultyEstimator


def test_killed_worker_is_recomputed_on_survivors_with_the_same_bits(gmm_1d, tmp_path):
    inner = MixtureEstimator([GaussianEstimator()] * 3)
    marker = str(tmp_path / "kill-now")
    est = FaultyEstimator(inner, marker, "kill")
    reference = fit(gmm_1d, inner, max_its=4, delta=None, seed=21, chunk_size=600)  # the wrapper starts as its inner

    def arm(step):
        if step.iteration == 1:
            open(marker, "w").close()  # the next pass kills whichever worker claims it

    # admission="unverified": a test mesh whose point is the recovery, compared bitwise below
    with encoded_data(gmm_1d, estimator=est, backend="mp", num_workers=3, chunk_size=600,
                      admission="unverified") as h:
        pids = h.runner.worker_pids()
        got = fit(h, est, max_its=4, delta=None, seed=21, on_step=arm)
        assert h.runner.recovered_chunks, "no chunk was recomputed: the kill did not happen"
        assert len(h.runner.worker_pids()) == 2 and set(h.runner.worker_pids()) < set(pids)
    assert canonical_statistic_bytes(got.model.params()) == canonical_statistic_bytes(reference.model.params())
    assert got.history == reference.history


@pytest.mark.timeout(240)
def test_hung_worker_is_detected_by_timeout(gmm_1d, tmp_path):
    # one worker: no other answers, so no straggler deadline applies (a straggler among healthy workers is
    # recomputed by them: tests/estimation/perf_free/test_stragglers.py)
    marker = tmp_path / "hang-now"
    est = FaultyEstimator(MixtureEstimator([GaussianEstimator()] * 2), str(marker), "hang")
    with encoded_data(gmm_1d, estimator=est, backend="mp", num_workers=1, timeout=4.0,
                      admission="unverified") as h:  # a test mesh, no certificate needed to test a hang
        start = h.pysp_seq_initialize(est, 0, 0.5)
        marker.touch()
        with pytest.raises(WorkerTimeoutError, match="no answer within 4.0 s.*timeout="):
            h.pysp_seq_estimate(est, start)
        assert len(h.runner.worker_pids()) == 0  # the hung worker was terminated
