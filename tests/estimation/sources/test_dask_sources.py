"""Dask sources: an Array chunked along rows, a DataFrame, a Bag, ``files(...)``; chunks built on the workers."""

from __future__ import annotations

import numpy as np
import pytest

from tests.estimation.backends import em_case
from tests.estimation.sources import source_case

pytestmark = pytest.mark.slow


def _parts() -> list[np.ndarray]:
    return np.split(em_case.data(), source_case.SPLITS)


def test_an_array_chunked_along_rows_fits_the_bits_of_the_same_parts_as_files(dask_client, tmp_path):
    da = pytest.importorskip("dask.array")
    rows = em_case.data()
    one = da.from_array(rows, chunks=len(rows))
    assert source_case.run(one, "dask", 2, client=dask_client) == em_case.reference()
    three = da.from_array(rows, chunks=(tuple(len(p) for p in _parts()),))
    reference = source_case.source_reference(source_case.write_files(str(tmp_path), "npy"))
    assert source_case.run(three, "dask", 2, client=dask_client) == reference
    assert source_case.run(three, "dask", 3, client=dask_client) == reference


def test_a_dataframe_and_a_bag(dask_client, tmp_path):
    pd = pytest.importorskip("pandas")
    dd = pytest.importorskip("dask.dataframe")
    db = pytest.importorskip("dask.bag")
    reference = source_case.source_reference(source_case.write_files(str(tmp_path), "npy"))
    frame = dd.from_map(lambda p: pd.DataFrame({"x": p}), _parts())
    assert source_case.run(frame, "dask", 2, client=dask_client) == reference
    bag = db.from_sequence([float(v) for v in em_case.data()], partition_size=4000)
    assert bag.npartitions == 1
    assert source_case.run(bag, "dask", 2, client=dask_client) == em_case.reference()
    labelled = dd.from_pandas(pd.DataFrame({"x": [1.0, 2.0], "label": ["a", "b"]}), npartitions=1)
    with pytest.raises(ValueError, match="label"):
        source_case.run(labelled, "dask", 2, client=dask_client)


@pytest.mark.parametrize("layout", ["one_npy", "parquet"])
def test_files_are_read_by_the_workers(dask_client, tmp_path, layout):
    source = source_case.write_files(str(tmp_path), layout)
    reference = em_case.reference() if layout == "one_npy" else source_case.source_reference(source)
    for n in (1, 3):
        assert source_case.run(source, "dask", n, client=dask_client) == reference


def test_a_dask_collection_on_another_backend_is_refused_naming_dask():
    da = pytest.importorskip("dask.array")
    with pytest.raises(ValueError, match="backends that take it: dask"):
        source_case.run(da.zeros(10, chunks=5), "local", 1)


def test_a_reference_fetch_slices_each_partition_in_one_task(dask_client):
    """A fit's batch of passes fetches many chunks at once: one dask task per partition slices them all (each
    task costs the scheduler a few ms; before, one per chunk)."""
    from types import SimpleNamespace

    import dask.array as da  # the dask_client fixture has skipped already where the [dask] extra is missing

    from mixle_parallel.executors.estimation.sources import source_places
    from mixle_parallel.executors.estimation.sources.dask_collections import DaskCollection

    rows = np.arange(120.0)
    opened = DaskCollection(da.from_array(rows, chunks=40)).open(source_case.PlacingRunnerStandIn("dask", dask_client))
    places = source_places([(a, a + 10) for a in range(0, 120, 10)], opened.part_rows)
    submitted = []
    submit = dask_client.submit

    def counted(fn, *args, **kwargs):
        submitted.append(len(args[1]))
        return submit(fn, *args, **kwargs)

    opened.client = SimpleNamespace(submit=counted, gather=dask_client.gather)
    fetched = opened.chunks_rows(places)
    assert [list(f) for f in fetched] == [list(rows[p.start:p.stop]) for p in places]
    assert submitted == [4, 4, 4]
    opened.client = dask_client
    opened.close()


def test_a_reference_fetch_from_a_hung_worker_ends_at_the_runners_timeout(dask_client, monkeypatch):
    """The audit's read waits for the workers no longer than the runner does: a slicing task that never ends is
    cancelled at the runner's ``timeout`` and the fit gets a ``WorkerTimeoutError`` naming the partition."""
    import time

    import dask.array as da

    from mixle_parallel.executors.estimation.em_pass.chunks import WorkerTimeoutError
    from mixle_parallel.executors.estimation.sources import dask_collections, source_places
    from mixle_parallel.executors.estimation.sources.dask_collections import DaskCollection

    rows = np.arange(120.0)
    stand_in = source_case.PlacingRunnerStandIn("dask", dask_client, timeout=1.0)
    opened = DaskCollection(da.from_array(rows, chunks=40)).open(stand_in)
    places = source_places([(a, a + 10) for a in range(0, 120, 10)], opened.part_rows)

    def hung(part, ranges, count, where):
        if where.endswith(" 1"):
            time.sleep(8.0)  # a worker that stops answering (without the deadline the read ends after it, unraised)
        return [part[lo:hi] for lo, hi in ranges]

    monkeypatch.setattr(dask_collections, "_slices_of", hung)
    with pytest.raises(WorkerTimeoutError, match=r"dask partition 1 did not come back within 1.0 s.*timeout="):
        opened.chunks_rows(places)
    opened.close()
