"""The reference audit over an engine's own collection (issue 23 item 5): a dask Array, an RDD, a Ray Dataset.

The driver cannot hold such data, so before, the audit recomputed an audited chunk through the engine itself
(on a peer worker on dask and Ray, on the same runner on Spark): an E-step computed wrong the same way on every
worker and every replay agreed with itself and fitted. Now the driver fetches the audited chunk's rows alone
through the engine's plain data API (dask computing that partition slice from the collection's graph, one
Spark job on that partition, a Ray task slicing that block), encodes and E-steps them itself, and compares.

The cheat: the E-step computes on half-overwritten rows in every engine worker process (never in the driver),
identically on every call, as a backend corrupting its workers' E-step outside the harness would. It is
caught as a ``backend_defect``. An honest audited fit keeps the bits of the same fit unaudited.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np
import pytest

from mixle_parallel.executors.estimation import GaussianEstimator, MixtureEstimator, encoded_data, fit
from mixle_parallel.executors.estimation.models.combinators import MixtureAccumulator
from mixle_parallel.verification.sdc import BackendDefectError
from tests.estimation.backends import em_case
from tests.estimation.backends.engine_helpers import by_value

pytestmark = pytest.mark.slow

FIT = {"max_its": 3, "delta": None, "seed": 11, "init_p": 0.2, "progress": False}
CHUNK = 250


class WorkerSideCheat(MixtureAccumulator):
    """A mixture accumulator whose ``update`` sees the first half of the rows overwritten by the first row in any
    process but the driver's (``driver`` pid): the engine's workers compute wrong, the same way every time."""

    driver = 0

    def update(self, x: Any, weights: Any, model: Any) -> Any:
        if os.getpid() != self.driver:
            x = np.array(x, copy=True)
            x[: len(x) // 2] = x[0]
        return super().update(x, weights, model)


class CheatingMixture(MixtureEstimator):
    """The case's mixture estimator, its accumulators :class:`WorkerSideCheat` bound to this driver's pid."""

    def __init__(self) -> None:
        super().__init__([GaussianEstimator() for _ in range(3)])
        self.driver = os.getpid()

    def make_accumulator(self) -> MixtureAccumulator:
        acc = super().make_accumulator()
        acc.__class__ = WorkerSideCheat
        acc.driver = self.driver  # type: ignore[attr-defined]  # the instance's own pid to compare with
        return acc


def _audited(data: Any, backend: str, estimator: Any, **engine: Any) -> Any:
    """An audited fit of ``data`` on ``backend`` (policy raise); the fit result and the handle's records."""
    # admission="unverified": a test cluster; the audit is what is checked
    with encoded_data(data, estimator=estimator, backend=backend, chunk_size=CHUNK, admission="unverified",
                      audit_rate=0.3, audit_policy="raise", **engine) as handle:
        return fit(handle, estimator, **FIT)


def _plain(data: Any, backend: str, **engine: Any) -> Any:
    with encoded_data(data, estimator=em_case.estimator(), backend=backend, chunk_size=CHUNK,
                      admission="unverified", audit=False, **engine) as handle:
        return fit(handle, em_case.estimator(), **FIT)


def _dask(client: Any) -> tuple[Any, dict[str, Any]]:
    da = pytest.importorskip("dask.array")
    return da.from_array(em_case.data(), chunks=((1300, 1600, 1100),)), {"client": client, "num_workers": 3}


def _spark(context: Any) -> tuple[Any, dict[str, Any]]:
    return context.parallelize([float(v) for v in em_case.data()], 3), {"client": context}


def _ray(ray: Any) -> tuple[Any, dict[str, Any]]:
    import pandas as pd

    parts = np.split(em_case.data(), (1300, 2900))
    return ray.data.from_pandas([pd.DataFrame({"x": p}) for p in parts]), {"num_workers": 2}


CASES = {"dask": ("dask_client", _dask), "spark": ("spark_context", _spark), "ray": ("ray_session", _ray)}


@pytest.mark.parametrize("backend", sorted(CASES))
def test_an_honest_fit_over_a_collection_is_audited_against_chunks_the_driver_fetched(backend, request):
    fixture, make = CASES[backend]
    data, engine = make(request.getfixturevalue(fixture))
    by_value(sys.modules[__name__])
    result = _audited(data, backend, em_case.estimator(), **engine)
    records = result.audit_records
    assert records and {r.replay for r in records} == {"reference"} and all(r.matched for r in records), records
    assert em_case.signature(result) == em_case.signature(_plain(data, backend, **engine))


@pytest.mark.parametrize("backend", sorted(CASES))
def test_an_engine_side_estep_corrupted_on_every_replay_is_a_backend_defect(backend, request):
    fixture, make = CASES[backend]
    data, engine = make(request.getfixturevalue(fixture))
    by_value(sys.modules[__name__])
    with pytest.raises(BackendDefectError) as caught:
        _audited(data, backend, CheatingMixture(), **engine)
    bad = [r for r in caught.value.records if not r.matched]
    assert bad and {(r.replay, r.cause) for r in bad} == {("reference", "backend_defect")}, bad


@pytest.mark.parametrize("backend", ["dask", "ray"])
def test_a_flipped_bit_on_a_worker_holding_a_collection_is_a_device_fault_quarantined_and_mended(backend, request):
    """The same-worker replay does not reproduce a flip, so against the driver's reference it is a device fault:
    the worker is quarantined, its chunks recomputed on the others, and the fit ends on the unaudited bits."""
    from mixle_parallel.verification import BitFlip, FaultInjector

    fixture, make = CASES[backend]
    data, engine = make(request.getfixturevalue(fixture))
    clean = _plain(data, backend, **engine)
    injector = FaultInjector()
    with encoded_data(data, estimator=em_case.estimator(), backend=backend, chunk_size=CHUNK, admission="unverified",
                      audit_rate=1.0, fault_injector=injector, **engine) as handle:
        chunk = 1  # every chunk is audited at rate 1.0: no pass's sample is known ahead
        worker = handle.audit.chunk_owners(handle.num_chunks)[chunk]
        injector.add(BitFlip("statistic", f"chunk:{chunk}", rank=worker, step=1, index=2, bit=50))
        result = fit(handle, em_case.estimator(), **FIT)
    bad = [r for r in result.audit_records if not r.matched]
    assert [(r.replay, r.unit, r.cause, r.action, r.attributed_rank) for r in bad] == [
        ("reference", f"chunk:{chunk}", "device", "quarantine", worker)]
    assert result.quarantined == (worker,) and em_case.signature(result) == em_case.signature(clean)


def test_a_spark_source_the_serving_tasks_read_is_audited_and_a_corrupted_estep_caught(spark_context):
    """Two partitions on two task slots: the tasks serving the passes read the rows, hold them beside the chunks
    and slice the audited ones (backends.spark_served); the honest fit matches the driver's reference and an
    E-step corrupted on the executors is still a backend defect."""
    data = spark_context.parallelize([float(v) for v in em_case.data()], 2)
    by_value(sys.modules[__name__])
    records = _audited(data, "spark", em_case.estimator(), client=spark_context).audit_records
    assert records and all(r.matched and r.replay == "reference" for r in records), records
    with pytest.raises(BackendDefectError) as caught:
        _audited(data, "spark", CheatingMixture(), client=spark_context)
    bad = [r for r in caught.value.records if not r.matched]
    assert bad and {(r.replay, r.cause) for r in bad} == {("reference", "backend_defect")}, bad
