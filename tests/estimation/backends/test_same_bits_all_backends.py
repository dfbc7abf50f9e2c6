"""Every backend (local, mp, mpi, spark, dask, ray) with 1, 2 or 3 workers fits the same bits.

The reference is the plain in-process fit (``local``, one worker) of the case in ``em_case``;
each backend's model parameters and whole log-likelihood trajectory must equal it bit for bit.
"""

from __future__ import annotations

import pytest

from tests.estimation.backends import em_case
from tests.estimation.backends.engine_helpers import run_mpi

pytestmark = pytest.mark.slow

WORKERS = [1, 2, 3]


def test_reference_fit_is_a_real_fit():
    digest, history = em_case.reference()
    lls = [float.fromhex(h) for h in history]
    assert len(lls) == em_case.FIT_KWARGS["max_its"] and lls[-1] > lls[0]  # EM climbs


@pytest.mark.parametrize("n", WORKERS)
@pytest.mark.parametrize("backend", ["local", "mp"])
def test_in_process_backends(backend, n):
    assert em_case.run(backend, n) == em_case.reference()


@pytest.mark.parametrize("n", WORKERS)
def test_dask(dask_client, n):
    assert em_case.run("dask", n, client=dask_client) == em_case.reference()


@pytest.mark.parametrize("n", WORKERS)
def test_ray(ray_session, n):
    assert em_case.run("ray", n) == em_case.reference()


@pytest.mark.parametrize("n", WORKERS)
def test_spark(spark_context, n):
    assert em_case.run("spark", n, client=spark_context) == em_case.reference()


@pytest.mark.mpi
@pytest.mark.parametrize("n, mode", [(1, "all"), (2, "all"), (3, "all"), (2, "root_only"), (3, "root_only")])
def test_mpi(n, mode):
    pytest.importorskip("mpi4py", reason="mpi4py is the optional [mpi] extra")
    digest, history = em_case.reference()
    for row in run_mpi("fit_check.py", n, mode):
        assert row["size"] == n
        assert (row["digest"], tuple(row["history"])) == (digest, history), f"rank {row['rank']} differs"
