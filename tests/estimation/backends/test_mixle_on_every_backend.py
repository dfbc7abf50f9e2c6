"""A mixle 0.8.2 MixtureEstimator fits the same bits on all six backends and component-parallel.

The reference is the in-process fit (``local``, one worker); mixle's own ``optimize`` on one of
our handles ends on the bits of ours started from the same model.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from tests.estimation.backends import em_case
from tests.estimation.backends.engine_helpers import run_mpi

pytest.importorskip("mixle.stats", reason="the mixle extra (mixle==0.8.2) is not installed")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference():
    return em_case.run_mixle("local", 1)


def test_reference_is_a_real_fit(reference):
    lls = [float.fromhex(h) for h in reference[1]]
    assert len(lls) == em_case.FIT_KWARGS["max_its"] and lls[-1] > lls[0]


@pytest.mark.parametrize("backend", ["local", "mp"])
def test_in_process_backends(reference, backend):
    assert em_case.run_mixle(backend, 2) == reference


def test_dask(reference, dask_client):
    assert em_case.run_mixle("dask", 2, client=dask_client) == reference


def test_ray(reference, ray_session):
    assert em_case.run_mixle("ray", 2) == reference


def test_spark(reference, spark_context):
    assert em_case.run_mixle("spark", 2, client=spark_context) == reference


@pytest.mark.mpi
def test_mpi(reference):
    pytest.importorskip("mpi4py", reason="mpi4py is the optional [mpi] extra")
    ours = em_case.reference()
    for row in run_mpi("mixle_fit_check.py", 2):
        assert (row["digest"], tuple(row["history"])) == reference, f"rank {row['rank']} differs"
        assert row["handle"] == "MPIEncodedData" and (row["ours"][0], tuple(row["ours"][1])) == ours


def test_model_parallel_estimator_of_a_mixle_mixture(reference):
    from mixle_parallel.executors.estimation import ModelParallelEstimator

    got = em_case.mixle_signature(em_case.fit(em_case.data(), ModelParallelEstimator(em_case.mixle_estimator(), 2),
                                              **em_case.FIT_KWARGS))
    assert got == reference


def test_mixles_own_optimize_runs_on_our_handle():
    from mixle.inference.estimation import optimize as mixle_optimize

    from mixle_parallel.executors.estimation import encoded_data, fit

    est = em_case.mixle_estimator()
    x = em_case.data()
    with encoded_data(x, estimator=est, backend="mp", num_workers=2, chunk_size=250, admission="unverified") as h:
        start = h.pysp_seq_initialize(est, np.random.RandomState(3), 0.2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = mixle_optimize(None, est, max_its=5, delta=None, enc_data=h, prev_estimate=start)
        ours = fit(h, est, max_its=5, delta=None, prev_estimate=start).model
    assert em_case.mixle_signature(type("R", (), {"model": theirs, "history": ()})) == \
        em_case.mixle_signature(type("R", (), {"model": ours, "history": ()}))
