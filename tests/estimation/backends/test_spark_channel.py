"""Spark passes served by a barrier stage kept alive (backends.spark_channel), on the session's local[2,4] context.

Served passes must give the bits of job passes, give the task slots back when idle and before the runner's own
jobs, and hand the passes back to jobs when a serving task dies, hangs or cannot start.
"""

from __future__ import annotations

import os
import threading

import pytest

pytest.importorskip("pyspark", reason="pyspark is the optional [spark] extra")

from mixle_parallel.executors.estimation import encoded_data, fit  # noqa: E402
from mixle_parallel.executors.estimation.backends import spark_channel  # noqa: E402
from mixle_parallel.executors.estimation.backends.spark import SparkRunner  # noqa: E402
from mixle_parallel.executors.estimation.em_pass.chunks import WorkerTimeoutError  # noqa: E402
from tests.estimation.backends import chunk_probes as probes  # noqa: E402
from tests.estimation.backends import em_case  # noqa: E402
from tests.estimation.backends.engine_helpers import by_value  # noqa: E402

pytestmark = pytest.mark.slow
by_value(probes)  # Spark's Python workers get the probes pickled by value (the session's context: two task slots)


def _fit(spark_context, direct_channel: bool):
    kwargs = {k: v for k, v in em_case.FIT_KWARGS.items() if k != "chunk_size"}
    with encoded_data(em_case.data(), estimator=em_case.estimator(), backend="spark", client=spark_context,
                      chunk_size=em_case.FIT_KWARGS["chunk_size"], admission="unverified", timeout=300,
                      direct_channel=direct_channel) as handle:
        got = fit(handle, em_case.estimator(), **kwargs)
        return em_case.signature(got), handle.runner.served_passes, handle.runner.serving_stopped


def test_served_passes_give_the_bits_of_job_passes_and_of_the_reference(spark_context):
    served, passes, stopped = _fit(spark_context, direct_channel=True)
    jobs, no_passes, _ = _fit(spark_context, direct_channel=False)
    assert stopped is None
    assert passes >= em_case.FIT_KWARGS["max_its"]  # every E-step of the fit was served
    assert no_passes == 0  # direct_channel=False is honoured: a job per pass
    assert served == jobs == em_case.reference()


def test_the_stage_gives_its_slots_back_when_idle_and_before_the_runners_own_jobs(spark_context):
    chunks = probes.make_chunks(6)
    runner = SparkRunner(spark_context, timeout=300)
    try:
        runner.scatter(chunks)
        assert runner.map_chunks(probes.probe, {}) == probes.expected(chunks)
        stage = runner._stage
        assert stage is not None and not stage.ended.is_set()
        counted: list[int] = []  # another job on the context: it needs the slots the stage holds
        other = threading.Thread(target=lambda: counted.append(spark_context.parallelize(range(4), 2).count()))
        other.start()
        other.join(120.0)
        assert counted == [4] and stage.ended.is_set()  # released when idle (IDLE_RELEASE_S)
        assert runner.map_chunks(probes.probe, {"scale": 3.0}) == probes.expected(chunks, 3.0)  # a new stage
        assert runner._stage is not stage and runner.served_passes == 2
        second = runner._stage
        runner.scatter(chunks[:4])  # the runner's own job: the stage is released first, not waited out
        assert second is not None and second.ended.is_set()
        assert runner.map_chunks(probes.probe, {}) == probes.expected(chunks[:4])
    finally:
        runner.close()
    assert runner._stage is None


def test_an_exception_in_a_served_pass_is_the_chunk_functions_own(spark_context):
    chunks = probes.make_chunks(5)
    runner = SparkRunner(spark_context, timeout=300)
    try:
        runner.scatter(chunks)
        with pytest.raises(ValueError, match="chunk 3 is bad on purpose") as raised:
            runner.map_chunks(probes.probe, {"fail_chunk": 3})
        assert raised.value.chunk_id == 3  # type: ignore[attr-defined]
        assert runner.serving_stopped is None  # the function failed, not the stage: the next pass is served
        assert runner.map_chunks(probes.probe, {}) == probes.expected(chunks)
        assert runner.served_passes == 1
    finally:
        runner.close()


def test_a_serving_task_killed_mid_pass_hands_the_pass_to_a_job(spark_context, tmp_path):
    chunks = probes.make_chunks(6)
    runner = SparkRunner(spark_context, timeout=300)
    try:
        runner.scatter(chunks)
        assert runner.map_chunks(probes.probe, {}) == probes.expected(chunks)
        payload = {"kill_chunk": 4, "marker": str(tmp_path / "killed")}
        assert runner.map_chunks(probes.probe, payload) == probes.expected(chunks)
        assert (tmp_path / "killed").exists()  # the serving task's Python worker really died
        assert runner.serving_stopped is not None and "lost" in runner.serving_stopped
        assert runner.served_passes == 1
        assert runner.map_chunks(probes.probe, {}) == probes.expected(chunks)  # later passes are jobs
        assert runner.served_passes == 1
    finally:
        runner.close()


def test_a_hung_serving_task_ends_the_pass_at_the_timeout(spark_context, tmp_path):
    chunks = probes.make_chunks(4)
    runner = SparkRunner(spark_context, num_workers=1, timeout=4.0)  # one task: no straggler rule, the timeout
    release = tmp_path / "release"
    try:
        runner.scatter(chunks)
        with pytest.raises(WorkerTimeoutError, match="did not finish within 4.0 s"):
            runner.map_chunks(probes.probe, {"hang_chunk": 2, "release": str(release)})
        assert runner.served_passes == 0 and runner.serving_stopped == "a pass hung"
    finally:
        release.touch()
        runner.close()


def test_more_partitions_than_task_slots_run_as_jobs(spark_context):
    chunks = probes.make_chunks(6)
    runner = SparkRunner(spark_context, num_workers=3, timeout=300)  # three partitions, two slots
    try:
        runner.scatter(chunks)
        assert runner.map_chunks(probes.probe, {}) == probes.expected(chunks)
        assert runner.served_passes == 0 and runner._stage is None
    finally:
        runner.close()


def test_a_stage_that_cannot_start_hands_the_passes_to_jobs(spark_context, monkeypatch):
    monkeypatch.setattr(spark_channel, "START_TIMEOUT_S", 3.0)
    monkeypatch.setattr(spark_channel, "serving_task",  # never dials
                        lambda address, key, hold=None: lambda records: iter(()))
    chunks = probes.make_chunks(4)
    runner = SparkRunner(spark_context, timeout=300)
    try:
        runner.scatter(chunks)
        assert runner.map_chunks(probes.probe, {}) == probes.expected(chunks)
        assert runner.serving_stopped is not None and "did not start" in runner.serving_stopped
        assert runner.served_passes == 0
    finally:
        runner.close()


_RUNNER_READS = (SparkRunner._run_job, SparkRunner.read_held)


def _recorded_jobs(monkeypatch) -> list[str]:
    """What every Spark job the runner starts from now on does, in words (its own and its source's), in order."""
    jobs: list[str] = []
    run_job = _RUNNER_READS[0]  # the runner's own, not a wrapper an earlier call left

    def recorded(self, job, what, *args, **kwargs):
        jobs.append(what)
        return run_job(self, job, what, *args, **kwargs)

    monkeypatch.setattr(SparkRunner, "_run_job", recorded)
    return jobs


def _fit_a_source(spark_context, direct_channel: bool, monkeypatch) -> tuple[object, list[str], int]:
    """An audited fit of an RDD source of two partitions: its signature, the runner's Spark jobs (by what they do:
    the source's and its own) and the audit's reads the serving tasks answered."""
    jobs = _recorded_jobs(monkeypatch)
    served_reads: list[int] = []
    read_held = _RUNNER_READS[1]  # the runner's own, not a wrapper an earlier call left

    def counted_read(self, fn, asks):
        found = read_held(self, fn, asks)
        served_reads.extend([] if found is None else list(found))
        return found

    monkeypatch.setattr(SparkRunner, "read_held", counted_read)
    rdd = spark_context.parallelize([float(v) for v in em_case.data()], 2)
    kwargs = {k: v for k, v in em_case.FIT_KWARGS.items() if k != "chunk_size"}
    with encoded_data(rdd, estimator=em_case.estimator(), backend="spark", client=spark_context, timeout=300,
                      chunk_size=em_case.FIT_KWARGS["chunk_size"], admission="unverified",
                      direct_channel=direct_channel) as handle:
        got = fit(handle, em_case.estimator(), **kwargs)
        assert handle.runner.serving_stopped is None
    return em_case.signature(got), jobs, len(served_reads)


def test_the_audits_reads_of_a_spark_sources_rows_are_served_by_the_stage(spark_context, monkeypatch):
    served, served_jobs, served_reads = _fit_a_source(spark_context, True, monkeypatch)
    jobs, job_jobs, job_reads = _fit_a_source(spark_context, False, monkeypatch)
    read = "reading the audited chunks' rows"
    assert served == jobs
    assert job_jobs.count(read) >= 1 and job_reads == 0  # a job per pass: the reads are jobs
    assert served_reads >= 1 and read not in served_jobs  # served: the serving tasks slice their rows


def test_a_serving_task_lost_in_the_audits_read_hands_the_read_to_a_job(spark_context, monkeypatch, tmp_path):
    from mixle_parallel.executors.estimation.sources import spark_rows

    reference, _, _ = _fit_a_source(spark_context, False, monkeypatch)
    marker = tmp_path / "killed"
    monkeypatch.setattr(spark_rows, "_held_slices", probes.dying_once(str(marker), spark_rows._held_slices))
    jobs = _recorded_jobs(monkeypatch)
    rdd = spark_context.parallelize([float(v) for v in em_case.data()], 2)
    kwargs = {k: v for k, v in em_case.FIT_KWARGS.items() if k != "chunk_size"}
    with encoded_data(rdd, estimator=em_case.estimator(), backend="spark", client=spark_context, timeout=300,
                      chunk_size=em_case.FIT_KWARGS["chunk_size"], admission="unverified") as handle:
        got = fit(handle, em_case.estimator(), **kwargs)
        stopped = handle.runner.serving_stopped
    assert marker.exists()  # the Python worker of a serving task died slicing the audited rows
    assert stopped is not None and "read" in stopped
    assert "reading the audited chunks' rows" in jobs  # the read ran again as a job
    assert em_case.signature(got) == reference


def test_a_runner_starting_a_stage_releases_another_runners_stage_on_the_context(spark_context, monkeypatch):
    """Two handles fitted in turn on one context: each start takes the slots from the other's idle stage at once
    (the idle release is set far off here, so only that can free them)."""
    monkeypatch.setattr(spark_channel, "IDLE_RELEASE_S", 600.0)
    chunks = probes.make_chunks(4)
    first, second = SparkRunner(spark_context, timeout=300), SparkRunner(spark_context, timeout=300)
    try:
        first.scatter(chunks)
        second.scatter(chunks)
        for _ in range(2):
            assert first.map_chunks(probes.probe, {}) == probes.expected(chunks)
            assert second.map_chunks(probes.probe, {"scale": 2.0}) == probes.expected(chunks, 2.0)
            assert first._stage is not None and first._stage.ended.is_set()  # released by the second's start
        assert (first.served_passes, second.served_passes) == (2, 2)
        assert first.serving_stopped is None and second.serving_stopped is None
    finally:
        first.close()
        second.close()



def test_the_task_slots_count_the_cores_each_task_takes():
    """A stage needs a slot per partition at once: with spark.task.cpus=2 on 8 cores, 4 partitions fit, 5 do not."""
    class Conf:
        def get(self, key, default=None):
            return {"spark.task.cpus": "2"}.get(key, default)

    class Context:
        defaultParallelism = 8

        def getConf(self):
            return Conf()

    runner = SparkRunner.__new__(SparkRunner)
    runner.sc = Context()
    assert runner._task_slots() == 4


def test_a_spark_source_is_read_and_encoded_by_the_serving_tasks_with_no_job(spark_context, monkeypatch):
    """Served, an RDD source of two partitions is read, counted, encoded, fitted and audited without one Spark job
    of the runner's own; a job per pass reads and counts, encodes and reads the audited rows with jobs."""
    served, served_jobs, _ = _fit_a_source(spark_context, True, monkeypatch)
    jobs, job_jobs, _ = _fit_a_source(spark_context, False, monkeypatch)
    assert served == jobs
    assert served_jobs == []
    assert {"reading and counting the source's rows", "encoding the source's partitions"} <= set(job_jobs)


def test_a_source_served_from_its_reading_is_cached_once_the_stage_is_released(spark_context, monkeypatch):
    """The second fit on a handle whose stage was released (idle, or a job of the runner's own) builds the cached
    chunks from the source with one job, serves again from them, and ends on the first fit's bits."""
    jobs = _recorded_jobs(monkeypatch)
    rdd = spark_context.parallelize([float(v) for v in em_case.data()], 2)
    kwargs = {k: v for k, v in em_case.FIT_KWARGS.items() if k != "chunk_size"}
    with encoded_data(rdd, estimator=em_case.estimator(), backend="spark", client=spark_context, timeout=300,
                      chunk_size=em_case.FIT_KWARGS["chunk_size"], admission="unverified") as handle:
        first = em_case.signature(fit(handle, em_case.estimator(), **kwargs))
        assert jobs == [] and handle.runner._rdd is None  # read and encoded by the serving tasks: nothing cached
        handle.runner._release_stage()  # what the idle release does
        second = em_case.signature(fit(handle, em_case.estimator(), **kwargs))
        assert handle.runner._rdd is not None and handle.runner.serving_stopped is None
        served = handle.runner.served_passes
    assert jobs == ["encoding the source's partitions"]  # built once, from the source, for the next stage
    assert served >= 2 * em_case.FIT_KWARGS["max_its"]
    assert second == first


def test_a_serving_task_killed_after_reading_the_source_hands_the_fit_to_jobs(spark_context, tmp_path):
    """The tasks that read and encoded the source serve passes 1-2; in pass 3 one dies: the runner builds the cached
    chunks from the source and the fit goes on with a job per pass, on the bits of the fit nothing struck."""
    est = probes.SabotageEstimator(em_case.estimator(), str(tmp_path), action="kill")
    rdd = spark_context.parallelize([float(v) for v in em_case.data()], 2)
    kwargs = {k: v for k, v in em_case.FIT_KWARGS.items() if k != "chunk_size"}
    options = dict(backend="spark", client=spark_context, timeout=300, chunk_size=em_case.FIT_KWARGS["chunk_size"],
                   admission="unverified")
    with encoded_data(rdd, estimator=est, **options) as handle:
        got = em_case.signature(fit(handle, est, on_step=est.arm_at(2), **kwargs))
        stopped, rdd_built = handle.runner.serving_stopped, handle.runner._rdd is not None
    assert os.path.exists(est.marker)  # a serving task's Python worker really died
    assert stopped is not None and "lost" in stopped and rdd_built
    with encoded_data(rdd, estimator=em_case.estimator(), direct_channel=False, **options) as handle:
        assert got == em_case.signature(fit(handle, em_case.estimator(), **kwargs))


def test_a_stage_that_cannot_read_the_source_leaves_it_to_jobs_and_still_serves_the_passes(spark_context,
                                                                                          monkeypatch):
    from mixle_parallel.executors.estimation.backends import spark_served

    def unreadable(records):
        raise RuntimeError("this task cannot hold the source's rows")

    monkeypatch.setattr(spark_served, "held_rows", unreadable)
    served, jobs, served_reads = _fit_a_source(spark_context, True, monkeypatch)  # serving_stopped stays None
    assert {"reading and counting the source's rows", "encoding the source's partitions"} <= set(jobs)
    assert served_reads >= 1  # the passes and reads served from the cached rows and chunks
    assert served == _fit_a_source(spark_context, False, monkeypatch)[0]
