"""DaskRunner against a real LocalCluster: placement, ordering, worker death, hung worker."""

from __future__ import annotations

import os
import signal
import time

import pytest

pytest.importorskip("distributed", reason="dask.distributed is the optional [dask] extra")

from mixle_parallel.contracts.resources import Resources  # noqa: E402
from mixle_parallel.executors.estimation.backends.dask import DaskRunner  # noqa: E402
from mixle_parallel.executors.estimation.em_pass.chunks import (  # noqa: E402
    WorkerTask,
    WorkerTimeoutError,
    WorkerUnavailableError,
)
from tests.estimation.backends import chunk_probes as probes  # noqa: E402
from tests.estimation.backends import em_case  # noqa: E402
from tests.estimation.backends.engine_helpers import by_value  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(own_dask_client):
    """This module's own 2-worker cluster (tests/conftest.py), the chunk probes pickled by value."""
    by_value(probes)
    return own_dask_client


def _worker_pids(client) -> dict[str, int]:
    return client.run(os.getpid)


@pytest.fixture(autouse=True)
def settled_cluster(request):
    """Each test starts on two live workers: a worker killed by an earlier test can still be listed by
    the scheduler after its nanny's replacement registered, so wait_for_workers(2) alone is not enough."""
    if "client" not in request.fixturenames:
        yield
        return
    client = request.getfixturevalue("client")
    deadline = time.monotonic() + 120
    while True:
        listed = set(client.scheduler_info(n_workers=-1)["workers"])
        try:
            answered = set(client.run(os.getpid, on_error="return"))
        except Exception:  # noqa: BLE001 - a worker going away mid-call: look again
            answered = set()
        if len(listed) == 2 and listed == answered:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"the dask test cluster did not settle on 2 live workers: {sorted(listed)}")
        time.sleep(0.2)
    yield


@pytest.mark.parametrize("direct", [True, False], ids=["direct-channel", "dask-rpc"])
def test_results_in_chunk_order_and_chunks_pinned(client, direct):
    chunks = probes.make_chunks(7)
    runner = DaskRunner(client, timeout=120, direct_channel=direct)
    try:
        assert runner.num_workers == 2
        runner.scatter(chunks)
        # Passes run on each holder's own socket, or through dask's actor RPC when asked.
        # A placed run (the SDC audit's; in an audited fit it may come before any plain pass), a borrowed
        # chunk first: one call over the worker's channel
        names = runner.run_on_workers({0: WorkerTask(probes.thread_name, None, (5, 0, 1))})[0]
        assert [n == "mixle-em-channel" for n in names] == [direct] * 3
        assert len(set(runner.run_on_workers({0: WorkerTask(probes.worker_pid, None, (5, 0, 1))})[0])) == 1
        names = set(runner.map_chunks(probes.thread_name, None))
        assert (names == {"mixle-em-channel"}) if direct else ("mixle-em-channel" not in names)
        # Contiguous blocks: chunks 0-2 held by the first worker's actor, 3-6 by the second's.
        assert runner.chunk_owners() == [0, 0, 0, 1, 1, 1, 1]
        pids = runner.map_chunks(probes.worker_pid, None)
        assert len(set(pids[:3])) == 1 and len(set(pids[3:])) == 1 and pids[0] != pids[3]
        assert set(pids) == set(_worker_pids(client).values()) == set(runner.worker_pids().values())
        assert runner.map_chunks(probes.probe, {"scale": 2.0}) == probes.expected(chunks, 2.0)
        assert runner.map_chunks(probes.probe, {}, chunk_ids=[5, 1]) == [
            probes.expected(chunks)[1],
            probes.expected(chunks)[5],
        ]
        with pytest.raises(IndexError, match="out of range"):
            runner.map_chunks(probes.probe, {}, chunk_ids=[7])
        with pytest.raises(ValueError, match="bad on purpose"):
            runner.map_chunks(probes.probe, {"fail_chunk": 4})
    finally:
        runner.close()
    assert client.status == "running"  # a given client is not closed by the runner


def test_worker_killed_mid_pass_is_recomputed_on_survivors(client, tmp_path):
    chunks = probes.make_chunks(6)
    runner = DaskRunner(client, timeout=180)
    try:
        runner.scatter(chunks)
        before = set(_worker_pids(client).values())
        payload = {"kill_chunk": 4, "marker": str(tmp_path / "killed")}
        assert runner.map_chunks(probes.probe, payload) == probes.expected(chunks)
        assert (tmp_path / "killed").exists()  # the worker really died mid-pass
        assert runner.recoveries >= 1
        # the dead worker's chunks (3-5) are resident in a live actor now: the survivor's (0) or a replacement's (-1)
        assert runner.chunk_owners()[:3] == [0, 0, 0] and all(o in (0, -1) for o in runner.chunk_owners()[3:])
        client.wait_for_workers(2, timeout=120)  # the nanny restarts the dead worker
        assert set(_worker_pids(client).values()) != before
        recoveries = runner.recoveries
        assert runner.map_chunks(probes.probe, {}) == probes.expected(chunks)
        assert runner.recoveries == recoveries  # nothing left to re-place
    finally:
        runner.close()


def _actor_keys(client) -> list[str]:
    """Keys of the actors the scheduler holds (the runner's chunk holders)."""
    return client.run_on_scheduler(
        lambda dask_scheduler: sorted(k for k, ts in dask_scheduler.tasks.items() if ts.actor)
    )


def _kill_and_wait(client, pid: int) -> str:
    """SIGKILL the worker process ``pid``; return its address once the scheduler has dropped it."""
    (victim,) = [address for address, p in _worker_pids(client).items() if p == pid]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while victim in client.scheduler_info(n_workers=-1)["workers"] and time.monotonic() < deadline:
        time.sleep(0.1)
    return victim


def test_a_given_client_gets_one_actor_per_worker_released_on_close(client):
    chunks = probes.make_chunks(4)
    before = _actor_keys(client)
    runner = DaskRunner(client, timeout=120)
    try:
        runner.scatter(chunks)
        assert len(_actor_keys(client)) == len(before) + 2  # one chunk holder per worker
        assert runner.map_chunks(probes.probe, {"scale": 0.5}) == probes.expected(chunks, 0.5)
        with pytest.raises(ValueError, match="bad on purpose") as err:
            runner.map_chunks(probes.probe, {"fail_chunk": 2})
        assert any("dask worker" in note for note in getattr(err.value, "__notes__", []))
        assert runner.recoveries == 0  # fn's own error is raised, not taken for a lost worker
    finally:
        runner.close()
    deadline = time.monotonic() + 30
    while _actor_keys(client) != before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _actor_keys(client) == before
    assert client.status == "running"


def test_placed_runs_borrow_chunks_held_elsewhere_and_refuse_a_dead_worker(client):
    chunks = probes.make_chunks(6)
    runner = DaskRunner(client, timeout=120)
    try:
        runner.scatter(chunks)
        pids = runner.worker_pids()
        assert runner.worker_ids() == [0, 1] and runner.chunk_owners() == [0, 0, 0, 1, 1, 1]
        # chunk 4 lives on worker 1: worker 0 computes it from the driver's copy, in the order asked
        out = runner.run_on_workers(
            {0: WorkerTask(probes.probe, {"scale": 2.0}, (4, 0)), 1: WorkerTask(probes.worker_pid, None, (0, 5))}
        )
        assert out[0] == [probes.expected(chunks, 2.0)[4], probes.expected(chunks, 2.0)[0]]
        assert out[1] == [pids[1], pids[1]]
        assert runner.compute_on(0, probes.worker_pid, None, [5]) == [pids[0]]
        assert runner.chunk_owners() == [0, 0, 0, 1, 1, 1]  # a borrowed chunk is not kept
        _kill_and_wait(client, pids[0])
        with pytest.raises(WorkerUnavailableError) as err:
            runner.compute_on(0, probes.probe, {}, [1])
        assert err.value.workers == (0,)
        assert runner.worker_ids() == [1]
        # the dead worker's chunks 0-2 come from the driver's copy and stay on the worker computing them
        assert runner.run_on_workers({1: WorkerTask(probes.worker_pid, None, (2, 0, 4))}) == {1: [pids[1]] * 3}
        assert runner.chunk_owners() == [1, 0, 1, 1, 1, 1] and runner.recoveries == 2
        assert runner.map_chunks(probes.probe, {}) == probes.expected(chunks)  # chunk 1 re-placed, recomputed
        owners = runner.chunk_owners()  # chunk 1: on worker 1, or on a fresh actor if the replacement is up (-1)
        assert owners[:1] + owners[2:] == [1] * 5 and owners[1] in (1, -1) and runner.recoveries == 3
        where = runner.map_chunks(probes.worker_pid, None)
        assert where[:1] + where[2:] == [pids[1]] * 5 and where[1] in _worker_pids(client).values()
    finally:
        runner.close()
    client.wait_for_workers(2, timeout=120)


def test_lost_chunks_go_to_a_fresh_actor_on_the_replacement_worker(client):
    chunks = probes.make_chunks(6)
    runner = DaskRunner(client, timeout=180)
    try:
        runner.scatter(chunks)
        pids = runner.worker_pids()
        _kill_and_wait(client, pids[1])
        client.wait_for_workers(2, timeout=120)  # the nanny's replacement registered
        assert runner.map_chunks(probes.probe, {}) == probes.expected(chunks)
        # the replacement held nothing, so it got all of worker 1's chunks (it has no id of its own: -1)
        assert runner.chunk_owners() == [0, 0, 0, -1, -1, -1]
        where = runner.map_chunks(probes.worker_pid, None)
        assert where[:3] == [pids[0]] * 3
        assert len(set(where[3:])) == 1 and where[3] not in pids.values()
        assert where[3] in _worker_pids(client).values()
    finally:
        runner.close()


def test_worker_killed_between_passes(client):
    chunks = probes.make_chunks(5)
    runner = DaskRunner(client, timeout=180)
    try:
        runner.scatter(chunks)
        assert runner.map_chunks(probes.probe, {}) == probes.expected(chunks)
        pid = runner.map_chunks(probes.worker_pid, None, chunk_ids=[0])[0]
        (victim,) = [address for address, p in _worker_pids(client).items() if p == pid]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while victim in client.scheduler_info(n_workers=-1)["workers"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert runner.map_chunks(probes.probe, {"scale": 3.0}) == probes.expected(chunks, 3.0)
        assert runner.recoveries >= 1
        client.wait_for_workers(2, timeout=120)
    finally:
        runner.close()


def test_hung_worker_raises_timeout(client, tmp_path):
    chunks = probes.make_chunks(4)
    runner = DaskRunner(client, timeout=3.0)
    release = tmp_path / "release"
    try:
        runner.scatter(chunks)
        with pytest.raises(WorkerTimeoutError, match=r"chunk\(s\) \[0, 1\]"):
            runner.map_chunks(probes.probe, {"hang_chunk": 1, "release": str(release)})
    finally:
        release.touch()
        runner.close()


def test_owned_local_cluster_starts_and_closes():
    runner = DaskRunner(None, num_workers=1, timeout=120, cluster_kwargs={"threads_per_worker": 2})
    cluster = runner._cluster
    try:
        assert runner.num_workers == 1
        # Resources.from_dask: one slot per worker thread, the worker's memory limit split between them.
        ((address, worker),) = runner.client.scheduler_info(n_workers=-1)["workers"].items()
        res = Resources.from_dask(runner.client)
        assert [d.name for d in res] == [f"dask:{address}/0", f"dask:{address}/1"]
        assert [d.memory_bytes for d in res] == [worker["memory_limit"] // 2] * 2
        chunks = probes.make_chunks(3)
        runner.scatter(chunks)
        assert runner.map_chunks(probes.probe, {}) == probes.expected(chunks)
        # dask_config_for_em's quiet housekeeping reached the worker process, its nanny and the scheduler
        periods = runner.client.run(
            lambda dask_worker: {k: v.callback_time for k, v in dask_worker.periodic_callbacks.items()}
        )
        assert {k: periods[address][k] for k in ("tick", "memory_monitor", "monitor")} == {
            "tick": 1000,
            "memory_monitor": 1000,
            "monitor": 5000,
        }
        (nanny,) = cluster.workers.values()
        assert nanny.periodic_callbacks["memory_monitor"].callback_time == 1000
        assert runner.client.run_on_scheduler(lambda dask_scheduler: "stealing" in dask_scheduler.extensions) is False
    finally:
        runner.close()
    assert cluster.status.name == "closed"


def test_resources_from_dask_client(client):
    res = Resources.from_dask(client)
    info = client.scheduler_info(n_workers=-1)["workers"]
    assert len(res) == 2 == len(info)
    for device, (address, worker) in zip(res, sorted(info.items())):
        assert device.kind == "cpu" and device.name == f"dask:{address}/0"
        assert device.memory_bytes == worker["memory_limit"]
        assert device.host == "127.0.0.1"
    assert Resources.from_json(res.to_json()) == res


# ---- a whole fit: a worker killed mid-iteration, a hung worker -------------------------------------
def test_fit_survives_a_worker_killed_mid_iteration(client, tmp_path):
    est = probes.SabotageEstimator(em_case.estimator(), str(tmp_path), action="kill")
    pids_before = set(_worker_pids(client).values())
    got = em_case.run("dask", None, est=est, client=client, on_step=est.arm_at(3), timeout=300)
    assert (tmp_path / "fired").exists()  # a worker process really died during pass 4
    assert got == em_case.reference()  # ... and the fit still ends on the uninterrupted bits
    client.wait_for_workers(2, timeout=120)
    assert set(_worker_pids(client).values()) != pids_before


def test_fit_with_a_hung_lone_worker_raises_timeout(client, tmp_path):
    # one worker: no other answers, so no straggler deadline applies (a hung worker among healthy ones is
    # outrun by them: tests/estimation/backends/test_engine_stragglers.py)
    est = probes.SabotageEstimator(em_case.estimator(), str(tmp_path), action="hang")
    try:
        with pytest.raises(WorkerTimeoutError, match="did not return chunk"):
            em_case.run("dask", 1, est=est, client=client, on_step=est.arm_at(1), timeout=5.0)
    finally:
        (tmp_path / "release").touch()


def test_more_workers_than_the_client_has_is_an_error(client):
    with pytest.raises(ValueError, match="the dask client has 2 worker"):
        DaskRunner(client, num_workers=3)
