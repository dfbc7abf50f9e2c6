"""Spark sources: an RDD of rows (as mixle 0.8.2 takes), a DataFrame, ``files(...)``; chunks built on the executors."""

from __future__ import annotations

import numpy as np
import pytest

from tests.estimation.backends import em_case
from tests.estimation.sources import source_case

pytestmark = pytest.mark.slow


def test_an_rdd_of_rows_fits_the_bits_of_the_same_parts_as_files(spark_context, tmp_path):
    rows = em_case.data()
    parts = np.split(rows, source_case.SPLITS)
    rdd = spark_context.parallelize([float(v) for v in rows], 1)
    assert source_case.run(rdd, "spark", None, client=spark_context) == em_case.reference()  # one partition
    source = source_case.write_files(str(tmp_path), "npy")  # the same three parts as files
    by_parts = spark_context.parallelize(list(range(3)), 3).flatMap(lambda i: [float(v) for v in parts[i]])
    assert by_parts.glom().map(len).collect() == [len(p) for p in parts]
    assert source_case.run(by_parts, "spark", None, client=spark_context) == source_case.source_reference(source)


def test_a_dataframe_of_numeric_columns_or_one_vector_column(spark_context):
    from pyspark.sql import SparkSession

    spark = SparkSession(spark_context)
    rows = em_case.data()
    frame = spark.createDataFrame([(float(v),) for v in rows], ["x"]).coalesce(1)
    assert source_case.run(frame, "spark", None, client=spark_context) == em_case.reference()
    labelled = spark.createDataFrame([(float(v), "a") for v in rows[:10]], ["x", "label"])
    with pytest.raises(ValueError, match="label"):
        source_case.run(labelled, "spark", None, client=spark_context)


def _assert_fits_the_rows_in_memory(spark_context, frame, rows):
    """A 2-component, 2-D fit of ``frame`` on spark has the bits of the same fit of ``rows`` in memory."""
    from mixle_parallel import MixtureEstimator, MultivariateGaussianEstimator, fit

    kwargs = dict(max_its=5, delta=None, seed=3, chunk_size=100, progress=False, admission="unverified")

    def est():
        return MixtureEstimator([MultivariateGaussianEstimator(dim=2) for _ in range(2)])

    on_spark = fit(frame, est(), backend="spark", client=spark_context, **kwargs)
    in_memory = fit(rows, est(), backend="local", num_workers=1, **kwargs)
    assert em_case.signature(on_spark) == em_case.signature(in_memory)


def test_vector_rows_from_an_array_column_equal_the_rows_in_memory(spark_context):
    from pyspark.sql import SparkSession

    spark = SparkSession(spark_context)
    rng = np.random.default_rng(5)
    rows = np.concatenate([rng.normal(-3, 1, (300, 2)), rng.normal(3, 1, (300, 2))])
    frame = spark.createDataFrame([([float(a), float(b)],) for a, b in rows], ["v"]).coalesce(1)
    _assert_fits_the_rows_in_memory(spark_context, frame, rows)


def _rows_as_held(rows, ask):
    """What a serving task holds as its partition's rows (a read of them whole)."""
    return rows


@pytest.mark.parametrize("kinds", [("double",), ("double", "float", "int", "long"), ("int", "short")],
                         ids=["one-double", "mixed", "integers"])
def test_numeric_columns_read_through_arrow_are_the_rows_the_row_path_reads(spark_context, tmp_path, kinds):
    """Plain numeric columns are read with ``mapInArrow`` (no ``Row`` per record): each partition's array has the
    Row path's dtype, shape and bits, so a fit of a Parquet table is the fit of the same rows in memory. That holds
    for the blocks a job reads and for the rows the serving tasks read from the Arrow batches themselves (a barrier
    ``mapInArrow``, ``spark_rows._arrow_stage``), partition by partition."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import SparkSession

    from mixle_parallel.executors.estimation.backends.spark import SparkRunner
    from mixle_parallel.executors.estimation.sources.spark_rows import (
        _arrow_columns,
        _arrow_rows,
        _arrow_stage,
        _row_reader,
    )

    spark = SparkSession(spark_context)
    rng = np.random.default_rng(7)
    n = 1000
    types = {"double": (pa.float64(), lambda: rng.normal(0, 3, n)),
             "float": (pa.float32(), lambda: rng.normal(0, 3, n).astype(np.float32)),
             "int": (pa.int32(), lambda: rng.integers(-50, 50, n).astype(np.int32)),
             "short": (pa.int16(), lambda: rng.integers(-50, 50, n).astype(np.int16)),
             "long": (pa.int64(), lambda: rng.integers(-50, 50, n))}
    table = pa.table({f"c{j}": pa.array(types[k][1](), types[k][0]) for j, k in enumerate(kinds)})
    pq.write_table(table, str(tmp_path / "rows.parquet"), row_group_size=300)
    frame = spark.read.parquet(str(tmp_path / "rows.parquet")).repartition(2)  # served: as many as task slots
    frame = frame.cache()
    columns = _arrow_columns(frame)
    assert columns is not None
    via_arrow = _arrow_rows(frame, columns).glom().collect()
    via_rows = frame.rdd.glom().collect()
    read = _row_reader(frame.schema)
    stage = _arrow_stage(frame, columns)
    assert stage is not None  # pyspark >= 3.5 has a barrier mapInArrow
    runner = SparkRunner(spark_context, timeout=120.0)
    try:
        counts = runner.open_rows(frame.rdd, stage)
        held = runner.read_held(_rows_as_held, {p: None for p in range(2)})
    finally:
        runner.close()  # releases the stage (the context is the session's)
    assert counts == [len(r) for r in via_rows], runner.serving_stopped
    assert held is not None
    assert len(via_arrow) == len(via_rows) == 2
    for p, (blocks, records) in enumerate(zip(via_arrow, via_rows)):
        got, want = (np.concatenate(blocks) if blocks else np.empty((0,))), read(records)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()
        assert held[p].dtype == want.dtype and held[p].shape == want.shape and held[p].tobytes() == want.tobytes()


def test_a_null_in_a_numeric_column_is_refused_naming_the_column(spark_context, tmp_path):
    from pyspark.sql import SparkSession

    spark = SparkSession(spark_context)
    frame = spark.createDataFrame([(1.0, 2.0), (None, 3.0), (4.0, 5.0)], "a double, b double")
    with pytest.raises(Exception, match=r"column 'a' holds 1 null\(s\)"):
        source_case.run(frame, "spark", None, client=spark_context)


def test_a_parquet_table_read_as_a_dataframe_fits_the_bits_of_its_rows_in_memory(spark_context, tmp_path,
                                                                                   monkeypatch):
    """The table's rows are read by the serving tasks from its Arrow batches (``_arrow_stage``), and the fit has the
    bits of the same rows in memory."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import SparkSession

    from mixle_parallel.executors.estimation.sources import spark_rows

    stages = []
    real = spark_rows._arrow_stage

    def counted(frame, columns):
        job = real(frame, columns)
        assert job is not None
        return lambda body: stages.append(body) or job(body)

    monkeypatch.setattr(spark_rows, "_arrow_stage", counted)

    spark = SparkSession(spark_context)
    rng = np.random.default_rng(11)
    rows = np.concatenate([rng.normal(-3, 1, (400, 2)), rng.normal(3, 1, (400, 2))])
    pq.write_table(pa.table({"x": rows[:, 0], "y": rows[:, 1]}), str(tmp_path / "t.parquet"))
    frame = spark.read.parquet(str(tmp_path / "t.parquet")).coalesce(1)
    _assert_fits_the_rows_in_memory(spark_context, frame, rows)
    assert len(stages) == 1  # one serving stage read the table, in its tasks


@pytest.mark.parametrize("layout", ["one_npy", "parquet"])
@pytest.mark.parametrize("n", [1, 2])
def test_files_are_read_by_the_executors(spark_context, tmp_path, layout, n):
    source = source_case.write_files(str(tmp_path), layout)
    reference = em_case.reference() if layout == "one_npy" else source_case.source_reference(source)
    assert source_case.run(source, "spark", n, client=spark_context) == reference


def test_an_rdd_on_another_backend_is_refused_naming_spark(spark_context):
    rdd = spark_context.parallelize([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="backends that take it: spark"):
        source_case.run(rdd, "mp", 2)


def test_mixles_spark_handle_takes_the_rdd_itself(spark_context):
    from mixle_parallel.planner import SparkEncodedData

    rdd = spark_context.parallelize([float(v) for v in em_case.data()], 1)
    with SparkEncodedData(rdd, em_case.estimator(), admission="unverified") as handle:
        assert handle.source is not None and handle.num_rows == 4000


def test_a_reference_read_from_a_hung_executor_ends_at_the_runners_timeout(spark_context, monkeypatch):
    """The audit's read of a source's rows is a Spark job run under the runner's deadline: a task that never ends
    has its job cancelled at ``timeout`` and the fit gets a ``WorkerTimeoutError`` naming the read."""
    from mixle_parallel.executors.estimation.backends.spark import SparkRunner
    from mixle_parallel.executors.estimation.em_pass.chunks import WorkerTimeoutError
    from mixle_parallel.executors.estimation.sources import source_places, spark_rows
    from mixle_parallel.executors.estimation.sources.spark_rows import SparkRows

    runner = SparkRunner(spark_context, timeout=3.0, direct_channel=False)  # a job reads (served: test_spark_channel)
    opened = SparkRows(spark_context.parallelize([float(v) for v in range(120)], 2)).open(runner)
    places = source_places([(a, a + 10) for a in range(0, 120, 10)], opened.part_rows)
    assert [list(r) for r in opened.chunks_rows(places[:2])] == [list(map(float, range(10))),
                                                                  list(map(float, range(10, 20)))]

    def hung(wanted, part_rows):
        def slices(index, held):
            import time

            time.sleep(120.0)  # an executor that stops answering (without the deadline the read ends after it)
            yield from ()

        return slices

    monkeypatch.setattr(spark_rows, "_slices_job", hung)
    with pytest.raises(WorkerTimeoutError, match="reading the audited chunks' rows.*within 3.0 s.*timeout="):
        opened.chunks_rows(places)
    opened.close()
