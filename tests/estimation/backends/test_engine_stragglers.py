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

import numpy as np
import pytest

from mixle_parallel.executors.estimation import encoded_data, fit
from tests.estimation.backends import chunk_probes as probes
from tests.estimation.backends import em_case
from tests.estimation.backends.engine_helpers import by_value
from tests.estimation.sources import source_case

pytestmark = pytest.mark.slow

TIMEOUT_S = 240.0
"""The fit's timeout: a fit that ends well before it was not ended by it (it would have raised)."""


def _fit_with_a_stopped_worker(backend: str, pick: Callable[[Any], int], data: Any = None,
                               **options: Any) -> dict[str, Any]:
    """Fit em_case on ``backend`` with two workers; after pass 2 SIGSTOP the process ``pick(runner)`` names,
    SIGCONT it after the fit. Returns the fit's signature, the seconds it took, and what the runner reports:
    its stragglers, the chunks it recomputed and the workers live at the end."""
    est = em_case.estimator()
    kwargs = {k: v for k, v in em_case.FIT_KWARGS.items() if k != "chunk_size"}
    stopped: list[int] = []
    with encoded_data(em_case.data() if data is None else data, estimator=est, backend=backend, num_workers=2,
                      timeout=TIMEOUT_S,
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
        return {"signature": em_case.signature(got), "took": took, "stragglers": list(h.runner.stragglers),
                "recovered": list(h.runner.recovered_chunks), "live": list(h.runner.worker_ids())}


def _check_outrun(got: dict[str, Any], reference: Any = None) -> None:
    """Worker 1 was given up at the straggler deadline, its chunks recomputed, and the bits are the clean fit's."""
    assert got["stragglers"] == [1], "the stopped worker was not given up on"
    assert got["recovered"], "no chunk was recomputed"
    assert got["live"] == [0]
    assert got["took"] < TIMEOUT_S  # ended by the straggler deadline, not the timeout (which would have raised)
    assert got["signature"] == (em_case.reference() if reference is None else reference)


@pytest.mark.timeout(600)
def test_ray_a_sigstopped_actor_is_outrun_and_the_fit_ends_on_the_same_bits(ray_session):
    # straggler_timeout=: a fixed straggler deadline instead of the rule's (honoured, like the rule)
    _check_outrun(_fit_with_a_stopped_worker("ray", lambda r: r.worker_pids()[1], straggler_timeout=3.0))


def _dask_pid(runner: Any, worker: int) -> int:
    return int(runner.worker_pids()[worker])


@pytest.mark.timeout(600)
@pytest.mark.parametrize("direct", [True, False], ids=["direct-channel", "dask-rpc"])
def test_dask_a_sigstopped_worker_is_outrun_and_the_fit_ends_on_the_same_bits(direct):
    pytest.importorskip("distributed", reason="dask.distributed is the optional [dask] extra")
    # the runner's own LocalCluster: the straggler is dropped from it, which no other test should inherit
    _check_outrun(_fit_with_a_stopped_worker("dask", lambda r: _dask_pid(r, 1), direct_channel=direct))


def _spark_fit_with_a_stopped_python_worker(spark_context: Any, workdir: str, data: Any,
                                            direct_channel: bool = True) -> tuple[Any, tuple[int, str | None]]:
    """Fit em_case on spark; the Python worker that takes the first chunk of pass 3 SIGSTOPs itself (which
    pooled worker takes a task is Spark's choice, so the test cannot stop one from outside beforehand). Checks
    that one task was given up at the straggler deadline and its chunks recomputed; returns the fit and the
    runner's served passes and why it stopped serving."""
    by_value(probes)
    est = probes.SabotageEstimator(em_case.estimator(), workdir, action="stop")
    kwargs = {k: v for k, v in em_case.FIT_KWARGS.items() if k != "chunk_size"}
    with encoded_data(data, estimator=est, backend="spark", client=spark_context, timeout=TIMEOUT_S,
                      chunk_size=em_case.FIT_KWARGS["chunk_size"], admission="unverified",
                      direct_channel=direct_channel) as h:
        began = time.monotonic()
        try:
            got = fit(h, est, on_step=est.arm_at(2), **kwargs)
        finally:
            marker = os.path.join(workdir, "fired")
            pid = open(marker).read() if os.path.exists(marker) else ""
            if pid:
                try:
                    os.kill(int(pid), signal.SIGCONT)
                except ProcessLookupError:  # Spark killed it: the expected end of a straggler
                    pass
        took = time.monotonic() - began
        assert pid, "no Python worker stopped itself"
        assert len(h.runner.stragglers) == 1 and h.runner.recovered_chunks, "the stopped task was not given up on"
        served = h.runner.served_passes, h.runner.serving_stopped
    assert took < TIMEOUT_S
    return got, served


@pytest.mark.timeout(600)
@pytest.mark.parametrize("direct", [True, False], ids=["served", "job-per-pass"])
def test_spark_a_sigstopped_python_worker_is_outrun_and_the_fit_ends_on_the_same_bits(spark_context, tmp_path,
                                                                                      direct):
    """Served: the stopped task of the serving stage is outrun, the stage cancelled and the pass run as a job;
    a job per pass: the job is cancelled and run again."""
    got, (served, stopped) = _spark_fit_with_a_stopped_python_worker(spark_context, str(tmp_path), em_case.data(),
                                                                     direct)
    assert em_case.signature(got) == em_case.reference()
    if direct:  # passes 1-2 served; the stopped serving task was outrun, the later passes run as jobs
        assert served >= 2 and "outrun" in (stopped or ""), (served, stopped)
    else:
        assert served == 0


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["rdd", "dataframe"])
def test_a_spark_source_survives_a_stopped_python_worker(spark_context, tmp_path, kind):
    """The rows are an RDD / DataFrame of three partitions read by Spark (encoded chunks cached on the
    executors): the task stopped in pass 3 is cancelled at the straggler deadline and the pass runs again
    from the cached partitions (a lost one from its lineage), on the bits of the same parts fitted locally."""
    parts = np.split(em_case.data(), source_case.SPLITS)
    rdd = spark_context.parallelize(list(range(3)), 3).flatMap(lambda i: [float(v) for v in parts[i]])
    if kind == "dataframe":
        from pyspark.sql import SparkSession

        rdd = SparkSession(spark_context).createDataFrame(rdd.map(lambda v: (v,)), ["x"])
    reference = source_case.source_reference(source_case.write_files(str(tmp_path), "npy"))
    work = tmp_path / "sabotage"
    work.mkdir()
    got, _ = _spark_fit_with_a_stopped_python_worker(spark_context, str(work), rdd)  # 3 partitions > 2 slots: jobs
    assert em_case.signature(got) == reference


def _evaluated(marks: str) -> Callable[[int], list[float]]:
    """The rows of source partition ``part``, leaving one marker file in ``marks`` per evaluation (on the executor)."""
    parts = np.split(em_case.data(), source_case.SPLITS)

    def rows(i: int) -> list[float]:
        import uuid

        open(os.path.join(marks, f"{i}-{uuid.uuid4().hex}"), "w").close()
        return [float(v) for v in parts[i]]

    return rows


@pytest.mark.timeout(600)
def test_spark_chunks_lost_mid_fit_are_recomputed_from_their_lineage(spark_context, tmp_path):
    """Spark's own recovery on a source that lives with the workers: after pass 2 the cached encoded chunks and the
    partitions' cached rows are dropped (``unpersist``: what losing the executors that held them does to the
    cache); every later pass reads
    the partitions again through their lineage (the user's RDD, then the encoder) and the fit ends on the bits of
    the same parts fitted locally. The markers count each partition's evaluations: once to encode, then once
    per pass after the loss, the same for every partition."""
    marks = tmp_path / "marks"
    marks.mkdir()
    rdd = spark_context.parallelize(list(range(3)), 3).flatMap(_evaluated(str(marks)))
    reference = source_case.source_reference(source_case.write_files(str(tmp_path), "npy"))
    est = em_case.estimator()
    kwargs = {k: v for k, v in em_case.FIT_KWARGS.items() if k != "chunk_size"}
    lost: list[int] = []
    with encoded_data(rdd, estimator=est, backend="spark", client=spark_context, timeout=TIMEOUT_S,
                      chunk_size=em_case.FIT_KWARGS["chunk_size"], admission="unverified", audit=False) as h:

        def lose_the_cache(step: Any) -> None:
            if step.iteration == 2:
                before = len(os.listdir(marks))
                h.runner._rdd.unpersist(blocking=True)
                h.source._raw.unpersist(blocking=True)  # the rows the chunks were encoded from (spark_rows)
                lost.append(before)

        got = fit(h, est, on_step=lose_the_cache, **kwargs)
    evaluations = [name.split("-")[0] for name in os.listdir(marks)]
    counts = {p: evaluations.count(p) for p in "012"}
    assert lost and len(evaluations) > lost[0], "no partition was read again after the cache was lost"
    assert len(set(counts.values())) == 1 and counts["0"] > 1, counts
    assert em_case.signature(got) == reference


@pytest.mark.timeout(600)
@pytest.mark.parametrize("backend", ["dask", "ray"])
def test_a_file_source_read_by_the_workers_survives_a_stopped_worker(backend, tmp_path, request):
    """The rows live in files the workers read (never on the driver): the straggler's files are read again by
    the others, and the bits are those of the same source fitted by one local worker."""
    if backend == "dask":
        pytest.importorskip("distributed", reason="dask.distributed is the optional [dask] extra")
        pick: Callable[[Any], int] = lambda r: _dask_pid(r, 1)  # noqa: E731
    else:
        request.getfixturevalue("ray_session")
        pick = lambda r: r.worker_pids()[1]  # noqa: E731
    source = source_case.write_files(str(tmp_path), "npy")
    _check_outrun(_fit_with_a_stopped_worker(backend, pick, data=source), source_case.source_reference(source))




def _dask_collection(kind: str) -> Any:
    """em_case's rows as a dask Array or DataFrame of three partitions (cut at ``source_case.SPLITS``)."""
    parts = np.split(em_case.data(), source_case.SPLITS)
    if kind == "array":
        da = pytest.importorskip("dask.array", reason="dask.array is part of the optional [dask] extra")
        return da.from_array(em_case.data(), chunks=(tuple(len(p) for p in parts),))
    pd = pytest.importorskip("pandas", reason="pandas comes with the optional [dask] extra")
    dd = pytest.importorskip("dask.dataframe", reason="dask.dataframe is part of the optional [dask] extra")
    return dd.from_map(lambda p: pd.DataFrame({"x": p}), parts)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["array", "dataframe"])
def test_a_dask_collection_survives_a_stopped_worker_holding_its_partitions(kind, tmp_path):
    """The rows are a dask collection whose partitions the workers computed and encoded where they are: the
    stopped worker's chunks live only in its memory. Before, the SDC audit's placed pass waited forever for
    dask to copy one of them to the other worker (no straggler clock there). Now the silent holder is given up
    (killed through its nanny, dropped), dask recomputes its chunks from the collection's graph on the other
    worker, and the fit ends on the bits of the same three parts fitted locally."""
    pytest.importorskip("distributed", reason="dask.distributed is the optional [dask] extra")
    reference = source_case.source_reference(source_case.write_files(str(tmp_path), "npy"))
    _check_outrun(_fit_with_a_stopped_worker("dask", lambda r: _dask_pid(r, 1), data=_dask_collection(kind)),
                  reference)


@pytest.mark.timeout(600)
def test_a_straggler_on_a_cluster_the_caller_passed_is_not_killed_by_the_fit(tmp_path, monkeypatch):
    """On a ``client=`` the caller owns, the fit does not SIGKILL the straggler's process (on its own cluster it
    does, through the nanny: the tests above); the scheduler drops the worker (``remove_worker(close=True)``, as
    dask does itself after missed heartbeats), dask recomputes its chunks, and the bits are the clean fit's."""
    distributed = pytest.importorskip("distributed", reason="dask.distributed is the optional [dask] extra")
    from mixle_parallel.executors.estimation.backends import dask_channel

    kills: list[str] = []
    real_kill = dask_channel.kill_worker_process

    def recorded(client: Any, address: str) -> None:
        kills.append(address)
        real_kill(client, address)

    monkeypatch.setattr(dask_channel, "kill_worker_process", recorded)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  host="127.0.0.1") as cluster, distributed.Client(cluster) as client:
        reference = source_case.source_reference(source_case.write_files(str(tmp_path), "npy"))
        _check_outrun(_fit_with_a_stopped_worker("dask", lambda r: _dask_pid(r, 1), data=_dask_collection("array"),
                                                 client=client), reference)
    assert kills == [], "the fit killed a straggler of the caller's cluster"


def _stops_itself_once(armed: Any, stopped: Any) -> Callable[..., Any]:
    """The audit's slicing task (``dask_collections._slices_of``), except that once ``armed`` exists, the first
    worker to run it writes its pid to ``stopped`` and SIGSTOPs itself: silent between a pass and its read."""
    from mixle_parallel.executors.estimation.sources import dask_collections

    real = dask_collections._slices_of

    def slices_of(part: Any, ranges: Any, rows: int, where: str) -> Any:
        if armed.exists():
            try:
                fd = os.open(stopped, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
                os.kill(os.getpid(), signal.SIGSTOP)
        return real(part, ranges, rows, where)

    return slices_of


def test_the_workers_a_read_waits_on_are_its_tasks_runners_and_their_inputs_holders():
    """What the scheduler is asked when the audit's read waits (``dask_straggler._waited_on``, run inside the
    scheduler; here on stand-ins of its task states): the worker running each task and the holders of its
    inputs, once each. An input held nowhere (lost, being recomputed) has ``who_has`` None in distributed."""
    from types import SimpleNamespace

    from mixle_parallel.executors.estimation.backends.dask_straggler import _waited_on

    a, b = SimpleNamespace(address="tcp://a"), SimpleNamespace(address="tcp://b")
    held, lost = SimpleNamespace(who_has=[b, a]), SimpleNamespace(who_has=None)
    scheduler = SimpleNamespace(tasks={
        "slice-1": SimpleNamespace(processing_on=a, dependencies=[held, lost]),
        "slice-2": SimpleNamespace(processing_on=None, dependencies=[lost]),  # waiting for its input
    })
    assert sorted(_waited_on(scheduler, ["slice-1", "slice-2", "released"])) == ["tcp://a", "tcp://b"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("cluster", ["own", "callers"])
def test_a_worker_silent_in_the_audits_read_is_given_up_at_the_straggler_deadline(cluster, tmp_path, monkeypatch):
    """A dask worker that falls silent between a pass and the audit's read of that pass's rows (here it stops
    itself while slicing them, after pass 2) is given up at the straggler deadline, as in a pass: the other
    worker reads the rows, the next pass recomputes the silent one's chunks, and the fit ends on the clean bits.
    Before, the read waited for the fit's timeout and the fit failed with ``WorkerTimeoutError`` (CI, 2026-12-06,
    when a SIGSTOP landed after the pass's answers)."""
    distributed = pytest.importorskip("distributed", reason="dask.distributed is the optional [dask] extra")
    from mixle_parallel.executors.estimation.sources import dask_collections

    armed, stopped = tmp_path / "armed", tmp_path / "stopped"
    monkeypatch.setattr(dask_collections, "_slices_of", _stops_itself_once(armed, stopped))
    reference = source_case.source_reference(source_case.write_files(str(tmp_path), "npy"))
    est = em_case.estimator()
    kwargs = {k: v for k, v in em_case.FIT_KWARGS.items() if k != "chunk_size"}

    def arm(step: Any) -> None:
        if step.iteration == 2:
            armed.touch()

    def run(client: Any = None) -> dict[str, Any]:
        with encoded_data(_dask_collection("array"), estimator=est, backend="dask", client=client, num_workers=2,
                          timeout=TIMEOUT_S, straggler_timeout=3.0, chunk_size=em_case.FIT_KWARGS["chunk_size"],
                          admission="unverified") as h:
            began = time.monotonic()
            try:
                got = fit(h, est, on_step=arm, **kwargs)
            finally:
                if stopped.exists():
                    try:
                        os.kill(int(stopped.read_text()), signal.SIGCONT)
                    except ProcessLookupError:  # on its own cluster the runner killed it
                        pass
            return {"signature": em_case.signature(got), "took": time.monotonic() - began,
                    "stragglers": list(h.runner.stragglers), "recovered": list(h.runner.recovered_chunks),
                    "live": list(h.runner.worker_ids())}

    if cluster == "own":
        got = run()
    else:
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                      host="127.0.0.1") as local, distributed.Client(local) as client:
            got = run(client)
    assert stopped.exists(), "no worker stopped in the audit's read"
    assert len(got["stragglers"]) == 1 and got["recovered"], got
    assert got["live"] == [w for w in (0, 1) if w not in got["stragglers"]]
    assert got["took"] < TIMEOUT_S  # given up at the straggler deadline, not waited for until the timeout
    assert got["signature"] == reference


@pytest.mark.timeout(600)
def test_a_ray_dataset_survives_a_stopped_actor(ray_session, tmp_path):
    """The rows are a ``ray.data`` dataset of three blocks in the object store, read by the actors: the
    stopped actor is killed at the straggler deadline and the other reads its blocks again from the store,
    on the bits of the same parts fitted locally."""
    import pandas as pd

    parts = np.split(em_case.data(), source_case.SPLITS)
    dataset = ray_session.data.from_pandas([pd.DataFrame({"x": p}) for p in parts])
    reference = source_case.source_reference(source_case.write_files(str(tmp_path), "npy"))
    _check_outrun(_fit_with_a_stopped_worker("ray", lambda r: r.worker_pids()[1], data=dataset), reference)


def _stalling_slices(marks: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """``spark_rows._slices_job`` whose tasks run as before, except that once ``marks``/armed exists the first
    task to start (on the executor) SIGSTOPs its own Python worker, once, writing its pid to ``marks``/fired."""

    def slices_job(wanted: Any, part_rows: Any) -> Callable[[int, Any], Any]:
        job = original(wanted, part_rows)

        def run(index: int, rows: Any) -> Any:
            if os.path.exists(os.path.join(marks, "armed")):
                try:
                    fd = os.open(os.path.join(marks, "fired"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                except FileExistsError:
                    pass
                else:
                    os.write(fd, str(os.getpid()).encode())
                    os.close(fd)
                    os.kill(os.getpid(), signal.SIGSTOP)  # alive and silent, holding its task slot
            return job(index, rows)

        return run

    return slices_job


@pytest.mark.timeout(600)
def test_a_python_worker_stopped_in_the_audits_read_is_given_up_at_the_straggler_deadline(spark_context, tmp_path,
                                                                                          monkeypatch):
    """The audit's read of a Spark source's rows (one job over the audited chunks' partitions, when the fit's batch
    is judged) stalls: the Python worker running one of its tasks SIGSTOPs itself, once. Its task is given up at
    the straggler deadline as in a pass (the job cancelled, Spark killing the worker, the read run again), and the
    fit ends well before its timeout on the bits of the same parts fitted locally. Before, the read waited for
    the timeout and the fit raised ``WorkerTimeoutError``."""
    from mixle_parallel.executors.estimation.sources import spark_rows

    parts = np.split(em_case.data(), source_case.SPLITS)
    rdd = spark_context.parallelize(list(range(3)), 3).flatMap(lambda i: [float(v) for v in parts[i]])
    reference = source_case.source_reference(source_case.write_files(str(tmp_path), "npy"))
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setattr(spark_rows, "_slices_job", _stalling_slices(str(marks), spark_rows._slices_job))
    est = em_case.estimator()
    kwargs = {k: v for k, v in em_case.FIT_KWARGS.items() if k != "chunk_size"}

    def arm(step: Any) -> None:
        if step.iteration == 2:
            (marks / "armed").touch()

    with encoded_data(rdd, estimator=est, backend="spark", client=spark_context, timeout=TIMEOUT_S,
                      chunk_size=em_case.FIT_KWARGS["chunk_size"], admission="unverified") as h:
        began = time.monotonic()
        try:
            got = fit(h, est, on_step=arm, **kwargs)
        finally:
            fired = marks / "fired"
            pid = fired.read_text() if fired.exists() else ""
            if pid:
                try:
                    os.kill(int(pid), signal.SIGCONT)
                except ProcessLookupError:  # Spark killed it when it cancelled the read: the expected end
                    pass
        took = time.monotonic() - began
        assert pid, "no task of the audit's read stopped its Python worker"
        assert h.runner.stragglers, "the stopped read task was not given up on"
        assert not h.runner.recovered_chunks  # a read ran again; no pass was recomputed
    assert took < TIMEOUT_S  # ended by the straggler deadline, not the timeout (which would have raised)
    assert em_case.signature(got) == reference


def _recompute_a_dead_workers_chunks_slowly(runner: Any, pid_of_second: Callable[[Any], int]) -> None:
    """One pass in which the second worker (``pid_of_second(runner)``, holding chunks 3-5) dies and the survivor
    recomputes its chunks, each taking longer than the runner's straggler deadline; the pass must end on every
    chunk's value."""
    runner.scatter([(i, np.full(8, float(i))) for i in range(6)])
    payload = {"victim": pid_of_second(runner), "slow": [3, 4, 5], "sleep": 1.5}
    got = runner.map_chunks(probes.dies_then_slow, payload)
    assert got == [8.0 * i for i in range(6)]
    assert runner.stragglers == [], "the survivor recomputing the lost chunks was given up as a straggler"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("direct", [True, False], ids=["channel", "rpc"])
def test_dask_a_survivor_recomputing_a_dead_workers_chunks_is_not_a_straggler(direct):
    # The survivor answered its own chunks first, which armed the straggler clock; the dead worker's chunks it
    # then takes must not be raced against that clock (CI once saw the last worker given up so, the fit ending
    # in "every dask worker is gone").
    pytest.importorskip("distributed", reason="dask.distributed is the optional [dask] extra")
    from mixle_parallel.executors.estimation.backends.dask import DaskRunner

    by_value(probes)
    runner = DaskRunner(num_workers=2, timeout=TIMEOUT_S, straggler_timeout=1.0, direct_channel=direct)
    try:
        _recompute_a_dead_workers_chunks_slowly(runner, lambda r: _dask_pid(r, 1))
    finally:
        runner.close()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("direct", [True, False], ids=["channel", "rpc"])
def test_ray_a_survivor_recomputing_a_dead_actors_chunks_is_not_a_straggler(ray_session, direct):
    from mixle_parallel.executors.estimation.backends.ray import RayRunner

    by_value(probes)
    runner = RayRunner(num_workers=2, timeout=TIMEOUT_S, straggler_timeout=1.0, direct_channel=direct)
    try:
        _recompute_a_dead_workers_chunks_slowly(runner, lambda r: r.worker_pids()[1])
    finally:
        runner.close()
