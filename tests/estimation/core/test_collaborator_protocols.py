"""The Protocols the EM pass and the fit loop meet their collaborators through (``em_pass.runner_protocols``).

Every check is an ``isinstance`` against a runtime-checkable Protocol, so a member renamed on our handle, runner
or ledger would make the check False and silently skip what it guards (a fit's first-pass audit, the receipts'
admission, the quarantine): these tests hold our real objects to every Protocol they are checked against, and
show each check refusing an object that lacks the members.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mixle_parallel.contracts.estimation import EncodedDataHandle
from mixle_parallel.executors.estimation import GaussianEstimator, MixtureEstimator, stochastic_em
from mixle_parallel.executors.estimation.backends.local import LocalChunkRunner
from mixle_parallel.executors.estimation.backends.mp import MPChunkRunner
from mixle_parallel.executors.estimation.em_pass.runner_protocols import (
    AdmittedHandle,
    AuditedHandle,
    BindsVerification,
    ChunkedHandle,
    ClientCluster,
    CountsTransport,
    CountsWorkers,
    EStepHandle,
    FitLifecycle,
    InitializableHandle,
    MeteredHandle,
    MinibatchHandle,
    PlacesPartitions,
    PoolProcesses,
    RankCollective,
    RunLedger,
    RunsOnRunner,
    SizedHandle,
    WorkerPlacement,
    places_work,
)
from mixle_parallel.executors.estimation.handle import handle_from_runner
from mixle_parallel.executors.estimation.observability.metering import MeteredRunner
from mixle_parallel.executors.estimation.sources.dask_collections import DaskCollection
from mixle_parallel.executors.estimation.sources.rank_local import rank_local
from mixle_parallel.executors.estimation.sources.ray_dataset import RayDataset
from mixle_parallel.executors.estimation.sources.spark_rows import SparkRows
from mixle_parallel.verification.ledger.chain import Ledger

HANDLE_PROTOCOLS = (EncodedDataHandle, EStepHandle, ChunkedHandle, InitializableHandle, MinibatchHandle,
                    FitLifecycle, AuditedHandle, AdmittedHandle, SizedHandle, CountsWorkers, MeteredHandle,
                    BindsVerification, RunsOnRunner)


class Bare:
    """mixle 0.8.2's handle shape (its four methods and ``close``), nothing of ours."""

    def pysp_seq_log_density_sum(self, estimate: Any) -> tuple[float, float]:
        return 0.0, 0.0

    def pysp_seq_estimate(self, estimator: Any, prev_estimate: Any) -> Any:
        return prev_estimate

    def pysp_seq_initialize(self, estimator: Any, rng: Any, p: float) -> Any:
        return None

    def close(self) -> None:
        pass


def _estimator() -> MixtureEstimator:
    return MixtureEstimator([GaussianEstimator() for _ in range(2)])


def _rows() -> np.ndarray:
    rng = np.random.default_rng(3)
    return np.concatenate([rng.normal(-3, 1.0, 200), rng.normal(3, 1.0, 200)])


def test_our_handle_meets_every_handle_protocol_the_fit_loop_checks() -> None:
    with handle_from_runner(LocalChunkRunner(2), _rows(), estimator=_estimator(), chunk_size=50) as handle:
        handle.attach_verification(audit=True)
        missing = [p.__name__ for p in HANDLE_PROTOCOLS if not isinstance(handle, p)]
        assert missing == []


def test_a_bare_mixle_shaped_handle_meets_none_of_ours() -> None:
    bare = Bare()
    assert isinstance(bare, EncodedDataHandle) and isinstance(bare, InitializableHandle)
    assert [p.__name__ for p in HANDLE_PROTOCOLS if isinstance(bare, p)] == ["EncodedDataHandle",
                                                                             "InitializableHandle"]


def test_our_runners_meet_the_runner_protocols_they_are_read_through(tmp_path: Path) -> None:
    local = LocalChunkRunner(2)
    try:
        assert isinstance(local, WorkerPlacement) and places_work(local) and isinstance(local, CountsTransport)
        assert not isinstance(local, (PoolProcesses, RankCollective, ClientCluster, PlacesPartitions))
        metered = MeteredRunner(local)
        assert isinstance(metered, WorkerPlacement) and places_work(metered)
    finally:
        local.close()
    pool = MPChunkRunner(2)
    try:
        assert isinstance(pool, PoolProcesses) and isinstance(pool, WorkerPlacement)
        assert not isinstance(pool, (RankCollective, ClientCluster, PlacesPartitions))
    finally:
        pool.close()
    ledger = Ledger(tmp_path / "run.jsonl")
    assert isinstance(ledger, RunLedger) and not isinstance(str(tmp_path / "run.jsonl"), RunLedger)


class _SparkLike:
    """A runner with Spark's capabilities only (its chunks placed as partitions; no placement, no pool)."""

    name, num_workers, supports_worker_placement = "spark", 2, False

    def chunk_owners(self) -> list[int]:
        return [0, 1]

    def place_partitions(self, encoded: Any, parts: Any) -> None:
        raise AssertionError("not called")

    def run_job(self, job: Any, what: str, partitions: Any = None) -> Any:
        raise AssertionError("not called")

    def read_held(self, fn: Any, asks: Any) -> Any:
        raise AssertionError("not called")

    def open_rows(self, rows: Any, job: Any = None) -> Any:
        raise AssertionError("not called")

    def place_held(self, encode: Any, asks: Any, parts: Any, build: Any) -> Any:
        raise AssertionError("not called")


def test_a_wrapper_shows_exactly_its_runners_capabilities_to_the_static_lookup_of_python_3_12() -> None:
    """From Python 3.12 a runtime-checkable Protocol looks members up with ``inspect.getattr_static``, which never
    reaches ``__getattr__``: the metering wrapper (and mixle's payload tap over it) must show each capability of
    the runner it wraps on its class, and none the runner lacks, or on 3.12 the audit's placement is silently off
    and a Spark DataFrame is refused."""
    import inspect

    from mixle_parallel.executors.estimation.em_pass.runner_wrapper import CAPABILITY_MEMBERS, ForwardingRunner

    local = LocalChunkRunner(2)
    try:
        for runner in (local, _SparkLike()):
            metered = MeteredRunner(runner)

            class Tap(ForwardingRunner):
                def __init__(self, inner: Any) -> None:
                    self.inner = inner

            for wrapper, own in ((metered, MeteredRunner), (Tap(metered), Tap)):
                for member in CAPABILITY_MEMBERS:
                    if hasattr(own, member):  # the wrapper's own member (metering's map_chunks, run_on_workers...)
                        continue
                    try:
                        inspect.getattr_static(wrapper, member)
                        shown = True
                    except AttributeError:
                        shown = False
                    assert shown == hasattr(wrapper.inner, member), (own.__name__, member)
                assert isinstance(wrapper, MeteredRunner | Tap)
        assert places_work(MeteredRunner(local)) and not places_work(MeteredRunner(_SparkLike()))
        assert isinstance(MeteredRunner(_SparkLike()), PlacesPartitions)
        assert not isinstance(MeteredRunner(local), PlacesPartitions)
    finally:
        local.close()


def test_each_source_refuses_a_runner_that_cannot_read_it_by_name() -> None:
    local = LocalChunkRunner(2)
    try:
        with pytest.raises(ValueError, match="the local runner has no ranks"):
            rank_local(np.zeros(4)).open(local)
        with pytest.raises(ValueError, match="LocalChunkRunner cannot read it"):
            SparkRows(object()).open(local)
        with pytest.raises(ValueError, match="read by the ray backend's actors"):
            RayDataset(object()).open(local)
        with pytest.raises(ValueError, match="pass a distributed.Client"):
            DaskCollection(object()).open(local)
    finally:
        local.close()


def test_stochastic_em_refuses_a_handle_without_mini_batches_by_name() -> None:
    with pytest.raises(TypeError, match="a Bare cannot compute .*pass the rows or a handle from encoded_data"):
        stochastic_em(Bare(), _estimator())
