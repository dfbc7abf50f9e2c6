"""Spark sources: an RDD of rows (as mixle 0.8.2 takes), a DataFrame, ``files(...)``; chunks built on the executors."""

from __future__ import annotations

import numpy as np
import pytest

from tests.estimation.engines import em_case
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


def test_vector_rows_from_an_array_column_equal_the_rows_in_memory(spark_context):
    from pyspark.sql import SparkSession

    from mixle_parallel import MixtureEstimator, MultivariateGaussianEstimator, fit

    spark = SparkSession(spark_context)
    rng = np.random.default_rng(5)
    rows = np.concatenate([rng.normal(-3, 1, (300, 2)), rng.normal(3, 1, (300, 2))])
    frame = spark.createDataFrame([([float(a), float(b)],) for a, b in rows], ["v"]).coalesce(1)
    kwargs = dict(max_its=5, delta=None, seed=3, chunk_size=100, progress=False, admission="unverified")

    def est():
        return MixtureEstimator([MultivariateGaussianEstimator(dim=2) for _ in range(2)])

    on_spark = fit(frame, est(), backend="spark", client=spark_context, **kwargs)
    in_memory = fit(rows, est(), backend="local", num_workers=1, **kwargs)
    assert em_case.signature(on_spark) == em_case.signature(in_memory)


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
