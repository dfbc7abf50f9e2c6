"""One chunk's rows fetched into this process (``OpenedSource.chunk_rows`` / ``read_chunk``): the audit's reference.

What each source hands the SDC audit's reference: exactly the chunk's rows (a file's row range, a rank's own
rows), encoded as a worker encodes them; rows of fields stay rows; a partition whose row count changed since it
was counted is refused naming the fix; a rank asked for another rank's chunk refuses. The engines' own fetches
(dask, Spark, Ray) run on real clusters in tests/estimation/audit/test_collection_reference_audit.py.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from mixle_parallel.contracts.safe_read import UnsafeFileError
from mixle_parallel.executors.estimation import GaussianEstimator
from mixle_parallel.executors.estimation.sources import ChunkPlace, files, materialize, open_source, source_places
from mixle_parallel.executors.estimation.sources.dask_collections import _slice_rows
from mixle_parallel.executors.estimation.sources.rank_local import OpenedRankLocal
from mixle_parallel.executors.estimation.sources.spark_rows import PartitionChunk, _encoder_job, _raw_job, _slices_job

# the module, not the package's files() function of the same name
file_source = importlib.import_module("mixle_parallel.executors.estimation.sources.files")


def test_a_file_chunk_read_here_is_the_chunk_a_worker_builds(tmp_path):
    rows = np.random.default_rng(1).normal(size=90)
    np.save(tmp_path / "a.npy", rows[:40])
    np.save(tmp_path / "b.npy", rows[40:])
    opened = open_source(files(str(tmp_path / "*.npy")), runner=None)
    places = source_places([(0, 20), (20, 40), (40, 70), (70, 90)], opened.part_rows)
    encoder = GaussianEstimator().encoder()
    for place, recipe in zip(places, opened.recipes(places, encoder)):
        here = opened.read_chunk(place, encoder)
        assert (here.chunk_id, here.start, here.stop) == (place.chunk_id, place.start, place.stop)
        assert np.array_equal(here.data, materialize(recipe).data)
        assert np.array_equal(opened.chunk_rows(place), rows[place.start:place.stop])


def test_a_batch_of_file_chunks_maps_each_npy_file_once_and_builds_what_workers_build(tmp_path, monkeypatch):
    """The audit's batch reads dozens of ranges of one file: each ``.npy`` file is mapped once for them all."""
    rows = np.random.default_rng(2).normal(size=(90, 2))
    np.save(tmp_path / "a.npy", rows[:40])
    np.save(tmp_path / "b.npy", rows[40:])
    opened = open_source(files(str(tmp_path / "*.npy"), columns=[1]), runner=None)
    places = source_places([(a, a + 10) for a in range(0, 90, 10)], opened.part_rows)
    encoder = GaussianEstimator().encoder()
    loads = []
    load = file_source._map_npy
    monkeypatch.setattr(file_source, "_map_npy", lambda path: loads.append(path) or load(path))
    built = opened.read_chunks(places, encoder)
    assert sorted(loads) == [str(tmp_path / "a.npy"), str(tmp_path / "b.npy")]
    monkeypatch.setattr(file_source, "_map_npy", load)
    for chunk, recipe in zip(built, opened.recipes(places, encoder), strict=True):
        alone = materialize(recipe)  # as a worker builds it
        assert (chunk.chunk_id, chunk.start, chunk.stop) == (alone.chunk_id, alone.start, alone.stop)
        assert np.array_equal(chunk.data, alone.data)
        assert np.array_equal(chunk.data, rows[chunk.start:chunk.stop, 1])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", ["npy", "parquet"])
def test_a_fifo_planted_as_a_data_file_is_refused_unread(tmp_path, fmt):
    """A FIFO under a data file's name would block its reader forever: ``files()`` refuses one, and a worker or the
    audit's reference refuses one swapped in after ``files()`` returned (before, ``np.load`` / pyarrow blocked)."""
    import os

    rows = np.arange(40.0)
    path = str(tmp_path / f"rows.{fmt}")
    if fmt == "npy":
        np.save(path, rows)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"x": rows}), path)
    planted = str(tmp_path / f"planted.{fmt}")
    os.mkfifo(planted)
    with pytest.raises(UnsafeFileError, match=r"planted\.(npy|parquet) is a FIFO"):
        files(planted)
    source = files(path) if fmt == "npy" else files(path, columns=["x"])
    opened = open_source(source, runner=None)
    places = source_places([(0, 20), (20, 40)], opened.part_rows)
    encoder = GaussianEstimator().encoder()
    recipes = opened.recipes(places, encoder)
    file_source.forget_reads()  # no Parquet footer or row group kept from open: the next read opens the file
    os.replace(planted, path)  # the data file is a FIFO now
    with pytest.raises(UnsafeFileError, match=r"rows\.(npy|parquet) is a FIFO"):
        materialize(recipes[0])  # what a worker builds
    with pytest.raises(UnsafeFileError, match="is a FIFO"):
        opened.read_chunks(places, encoder)  # the audit's references


def test_a_file_that_is_not_npy_or_parquet_is_named_in_the_refusal(tmp_path):
    for name in ("bad.npy", "bad.parquet"):
        (tmp_path / name).write_bytes(b"not rows at all " * 8)
        with pytest.raises(ValueError, match=rf"files\(\): .*{name} is not a"):
            files(str(tmp_path / name))


def test_a_rank_reads_its_own_chunks_from_the_rows_it_passed_and_no_other():
    rows = np.arange(10.0)
    opened = OpenedRankLocal(rows, rank=1, counts=(5, 10))
    mine = ChunkPlace(chunk_id=2, part=1, offset=3, stop_offset=7, start=8, stop=12)
    assert np.array_equal(opened.chunk_rows(mine), rows[3:7])
    assert np.array_equal(opened.read_chunk(mine, GaussianEstimator().encoder()).data, rows[3:7])
    theirs = ChunkPlace(chunk_id=0, part=0, offset=0, stop_offset=5, start=0, stop=5)
    with pytest.raises(RuntimeError, match="rank 0's; rank 1 holds only its own rows"):
        opened.chunk_rows(theirs)


def test_a_partition_slice_keeps_rows_of_fields_and_refuses_a_changed_partition():
    fields = [(1.0, "a"), (2.0, "b"), (3.0, "c")]
    assert _slice_rows(fields, 1, 3, 3, "dask partition 0") == fields[1:3]  # rows of fields stay rows
    assert np.array_equal(_slice_rows(np.arange(6.0), 2, 4, 6, "dask partition 0"), [2.0, 3.0])
    with pytest.raises(ValueError, match=r"dask partition 4 held 5 rows when counted and 6 now.*persist"):
        _slice_rows(np.arange(6.0), 0, 2, 5, "dask partition 4")
    read = _raw_job(lambda records: np.asarray(records))  # a partition's rows, read once (and counted)
    held = list(read(2, iter([1.0, 2.0, 3.0, 4.0])))
    assert [(k, list(v)) for k, v in _slices_job({2: [(7, 1, 3)]}, [0, 0, 4])(2, iter(held))] == [(7, [2.0, 3.0])]
    again = list(read(2, iter([1.0, 2.0, 3.0])))  # Spark read the partition again (its cache lost): a row fewer
    with pytest.raises(ValueError, match=r"RDD partition 2 held 4 rows when counted and 3 now.*cache"):
        list(_slices_job({2: [(7, 1, 3)]}, [0, 0, 4])(2, iter(again)))
    recipe = PartitionChunk(chunk_id=0, start=0, stop=2, part=2, offset=0, stop_offset=2, encoder=None)
    with pytest.raises(ValueError, match=r"RDD partition 2 held 4 rows when counted and 3 now.*cache"):
        list(_encoder_job({2: [recipe]}, [0, 0, 4])(2, iter(again)))


def test_a_spark_reference_fetch_reads_each_partition_to_its_end():
    """A PySpark Python worker that leaves its input unread is not reused: the next pass then starts a cold worker
    (about 0.6 s on each audited pass, measured). The slicing job reads every record, even where it asks nothing."""
    read_to_end = []

    def partition(rows):
        yield rows
        read_to_end.append(True)

    slices = _slices_job({0: [(5, 2, 4)]}, [6, 3])
    assert [(k, list(v)) for k, v in slices(0, partition(np.arange(6.0)))] == [(5, [2.0, 3.0])]
    assert list(slices(1, partition(np.arange(3.0)))) == []
    assert read_to_end == [True, True]
