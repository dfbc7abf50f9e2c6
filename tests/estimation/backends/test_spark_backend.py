"""SparkRunner against a real SparkContext on local[2]: partitions, ordering, hung executor."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from mixle_parallel.contracts.resources import Resources  # noqa: E402
from mixle_parallel.executors.estimation.backends.spark import SparkRunner  # noqa: E402
from mixle_parallel.executors.estimation.em_pass.chunks import WorkerTimeoutError  # noqa: E402
from tests.estimation.backends import chunk_probes as probes  # noqa: E402
from tests.estimation.backends.engine_helpers import by_value  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def spark_context(spark_context):
    """The session's SparkContext on local[2,4] (tests/conftest.py), the chunk probes pickled by value."""
    by_value(probes)
    return spark_context


def test_partitions_hold_contiguous_chunks_results_in_order(spark_context):
    chunks = probes.make_chunks(7)
    runner = SparkRunner(spark_context, timeout=300)
    try:
        assert runner.num_workers == 2
        runner.scatter(chunks)
        layout = runner._rdd.glom().map(lambda part: [cid for cid, _ in part]).collect()
        assert layout == [[0, 1, 2], [3, 4, 5, 6]]
        assert runner.map_chunks(probes.probe, {"scale": 2.0}) == probes.expected(chunks, 2.0)
        assert runner.map_chunks(probes.probe, {}, chunk_ids=[4, 1]) == [
            probes.expected(chunks)[1],
            probes.expected(chunks)[4],
        ]
        with pytest.raises(Exception, match="bad on purpose"):
            runner.map_chunks(probes.probe, {"fail_chunk": 5})
    finally:
        runner.close()
    assert spark_context._jsc is not None  # a context the runner did not start stays up


def test_hung_executor_is_cancelled_by_timeout(spark_context, tmp_path):
    chunks = probes.make_chunks(4)
    runner = SparkRunner(spark_context, timeout=4.0, direct_channel=False)  # a job per pass; served: test_spark_channel
    release = tmp_path / "release"
    try:
        runner.scatter(chunks)
        with pytest.raises(WorkerTimeoutError, match="did not finish within 4.0 s"):
            runner.map_chunks(probes.probe, {"hang_chunk": 0, "release": str(release)})
    finally:
        release.touch()
        runner.close()
    runner = SparkRunner(spark_context, timeout=300)
    try:  # the context is usable after a cancelled job
        runner.scatter(chunks)
        assert runner.map_chunks(probes.probe, {}) == probes.expected(chunks)
    finally:
        runner.close()


def test_python_worker_killed_mid_pass_is_retried(spark_context, tmp_path):
    chunks = probes.make_chunks(6)
    runner = SparkRunner(spark_context, timeout=300, direct_channel=False)  # Spark's retry of a job's task
    try:
        runner.scatter(chunks)
        payload = {"kill_chunk": 4, "marker": str(tmp_path / "killed")}
        assert runner.map_chunks(probes.probe, payload) == probes.expected(chunks)
        assert (tmp_path / "killed").exists()  # the Python worker really died mid-pass
    finally:
        runner.close()


def test_resources_from_spark(spark_context):
    res = Resources.from_spark(spark_context)
    assert [d.name for d in res] == ["spark:0", "spark:1"]
