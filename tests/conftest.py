"""Engine fixtures shared by the test folders: local dask, Ray and Spark, each started on first use.

The engines are imported inside the fixtures, so collecting tests/ imports none of dask, ray or
pyspark; a test asking for an engine that is not installed is skipped. Shared clusters live for
the whole session (one start each, on a 2-core machine that is most of their cost); a test module
that kills workers gets a cluster of its own (``own_dask_client``) instead of leaving a shared one
with replaced workers behind.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

# No per-example deadline: on a loaded 2-core machine one example can take seconds; correctness, not speed,
# is what the property tests check (timing never is).
settings.register_profile("mixle_parallel", deadline=None)
settings.load_profile("mixle_parallel")

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = REPO_ROOT / "examples" / "launchers"


@pytest.fixture(scope="session", autouse=True)
def _private_trust_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Point MIXLE_PARALLEL_HOME at a session temp dir: no test reads or writes the user's keys or certificates.

    Child processes (gloo ranks, mp workers, CLI runs) inherit it. Tests that need a store of their
    own (a second machine, a revoked key) set MIXLE_PARALLEL_HOME themselves with monkeypatch.
    """
    home = tmp_path_factory.mktemp("mixle-parallel-home")
    previous = os.environ.get("MIXLE_PARALLEL_HOME")
    os.environ["MIXLE_PARALLEL_HOME"] = str(home)
    try:
        yield home
    finally:
        if previous is None:
            os.environ.pop("MIXLE_PARALLEL_HOME", None)
        else:
            os.environ["MIXLE_PARALLEL_HOME"] = previous


@contextmanager
def _local_dask(n_workers: int) -> Iterator[Any]:
    """A client on a fresh LocalCluster of ``n_workers`` single-threaded worker processes, closed on exit."""
    distributed = pytest.importorskip("distributed", reason="dask.distributed is the optional [dask] extra")
    cluster = distributed.LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                                       dashboard_address=":0", silence_logs=logging.ERROR)
    try:
        client = distributed.Client(cluster)
        try:
            client.wait_for_workers(n_workers, timeout=120)
            yield client
        finally:
            client.close()
    finally:
        cluster.close()


@pytest.fixture(scope="session")
def dask_client() -> Iterator[Any]:
    """A dask LocalCluster of 3 worker processes, shared by the session.

    Three workers: the audit needs a primary, a peer and a witness on distinct workers, and the
    same-bits fits ask for 1, 2 or 3 of them. Tests using it must leave its workers alive.
    """
    with _local_dask(3) as client:
        yield client


@pytest.fixture(scope="module")
def own_dask_client() -> Iterator[Any]:
    """A dask LocalCluster of 2 worker processes for one module alone.

    Separate from ``dask_client`` because its settings must differ: the DaskRunner tests count on
    exactly 2 workers (contiguous chunk blocks 0-2/3-6, "the dask client has 2 worker(s)"), and they
    SIGKILL workers, leaving nanny replacements and re-placed actors behind, which no other module
    should inherit.
    """
    with _local_dask(2) as client:
        yield client


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    """One local Ray (2 CPUs, no dashboard, worker logs kept off the driver) for the whole session.

    Ray is started once per process and shut down at the end of the session. Its workers get the
    repository root and examples/launchers on PYTHONPATH: the launcher tests' Ray Train workers
    import ``tests.launchers._jobs`` and the example module ``tiny_ddp`` by name (functions travel
    by reference); the EM engine tests pickle their probes by value and need neither. Tests that
    kill actors (tests/estimation/backends/test_ray_backend.py) leave the cluster usable: Ray frees
    a dead actor's resources, and every runner kills its actors on close.
    """
    ray = pytest.importorskip("ray")
    path = os.pathsep.join(p for p in (str(REPO_ROOT), str(EXAMPLES), os.environ.get("PYTHONPATH")) if p)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture(scope="session")
def spark_context() -> Iterator[Any]:
    """One SparkContext on ``local[2,4]`` for the whole session (a process holds one context at a time).

    2 threads: two partitions, what the same-bits fits and the SparkRunner layout tests expect.
    ``,4``: up to 4 attempts per task, which the killed-Python-worker test needs (plain ``local[2]``
    never retries a task); a passing fit never retries, so the same-bits fits see what ``local[2]`` gives.
    """
    pyspark = pytest.importorskip("pyspark")
    conf = (pyspark.SparkConf().setMaster("local[2,4]").setAppName("mixle-parallel-tests")
            .set("spark.ui.enabled", "false").set("spark.driver.host", "127.0.0.1")
            .set("spark.driver.bindAddress", "127.0.0.1").set("spark.pyspark.python", sys.executable))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need this package's venv
    sc = pyspark.SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    try:
        yield sc
    finally:
        sc.stop()
