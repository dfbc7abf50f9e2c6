"""Ray sources: a ``ray.data.Dataset`` and ``files(...)``, read by the actors from the object store / the files."""

from __future__ import annotations

import numpy as np
import pytest

from tests.estimation.backends import em_case
from tests.estimation.sources import source_case

pytestmark = pytest.mark.slow


def test_a_dataset_of_one_block_fits_the_bits_of_the_rows_in_memory(ray_session):
    rows = em_case.data()
    dataset = ray_session.data.from_numpy(rows)
    for n in (1, 2):
        assert source_case.run(dataset, "ray", n) == em_case.reference()


def test_a_dataset_of_several_blocks_fits_the_bits_of_the_same_parts_as_files(ray_session, tmp_path):
    import pandas as pd

    parts = np.split(em_case.data(), source_case.SPLITS)
    dataset = ray_session.data.from_pandas([pd.DataFrame({"x": p}) for p in parts])
    reference = source_case.source_reference(source_case.write_files(str(tmp_path), "npy"))
    assert source_case.run(dataset, "ray", 2) == reference


@pytest.mark.parametrize("layout", ["one_npy", "parquet"])
def test_files_are_read_by_the_actors(ray_session, tmp_path, layout):
    source = source_case.write_files(str(tmp_path), layout)
    reference = em_case.reference() if layout == "one_npy" else source_case.source_reference(source)
    for n in (1, 2):
        assert source_case.run(source, "ray", n) == reference


def test_a_dataset_on_another_backend_is_refused_naming_ray(ray_session):
    with pytest.raises(ValueError, match="backends that take it: ray"):
        source_case.run(ray_session.data.from_numpy(np.zeros(4)), "local", 1)


def test_a_reference_fetch_slices_each_block_once_on_a_reader_kept_warm(ray_session, monkeypatch):
    """The audit's read sends one call per block to a reader actor beside it (``ray_blocks``), which reserves no CPU
    and stays for the source's life: a fit's batch of passes starts no worker process per chunk (before the
    readers: 48 tasks at once, the machine's load at 35), and the next read finds the same reader warm (a task's
    process was reaped a second after it idled, and a new one cost 1.5-2 s)."""
    import pandas as pd

    from mixle_parallel.executors.estimation.sources import source_places
    from mixle_parallel.executors.estimation.sources.ray_dataset import RayDataset

    rows = np.arange(120.0)
    dataset = ray_session.data.from_pandas([pd.DataFrame({"x": p}) for p in np.split(rows, 3)])
    opened = RayDataset(dataset).open(source_case.PlacingRunnerStandIn("ray"))
    places = source_places([(a, a + 10) for a in range(0, 120, 10)], opened.part_rows)
    opened.prepare_reads()  # what the handle's audit does: the reader starts while the fit runs
    readers = list(opened.readers._by_node.values())
    assert len(readers) == 1  # one node here, so one reader
    submitted: list[int] = []
    slices = readers[0].slices

    class Counted:
        @staticmethod
        def remote(block, ranges, where):
            submitted.append(len(ranges))
            return slices.remote(block, ranges, where)

    monkeypatch.setattr(readers[0], "slices", Counted)
    fetched = opened.chunks_rows(places)
    assert [list(f) for f in fetched] == [list(rows[p.start:p.stop]) for p in places]
    assert submitted == [4, 4, 4]  # one call per block, each slicing its four chunks
    pid = ray_session.get(readers[0].__ray_call__.remote(lambda self: __import__("os").getpid()))
    assert opened.chunk_rows(places[5]).tolist() == rows[50:60].tolist()
    assert list(opened.readers._by_node.values()) == readers  # the same reader, its process kept
    assert ray_session.get(readers[0].__ray_call__.remote(lambda self: __import__("os").getpid())) == pid
    opened.close()
    assert not opened.readers._by_node


def test_a_reader_that_died_is_replaced_and_the_read_goes_on(ray_session):
    """A reader killed between two reads (a node lost, Ray's memory monitor) is replaced once: the read ends with
    the rows, on a new reader."""
    import pandas as pd

    from mixle_parallel.executors.estimation.sources import source_places
    from mixle_parallel.executors.estimation.sources.ray_dataset import RayDataset

    rows = np.arange(60.0)
    dataset = ray_session.data.from_pandas([pd.DataFrame({"x": p}) for p in np.split(rows, 2)])
    opened = RayDataset(dataset).open(source_case.PlacingRunnerStandIn("ray"))
    places = source_places([(a, a + 10) for a in range(0, 60, 10)], opened.part_rows)
    assert [list(f) for f in opened.chunks_rows(places)] == [list(rows[p.start:p.stop]) for p in places]
    (first,) = opened.readers._by_node.values()
    ray_session.kill(first)
    assert [list(f) for f in opened.chunks_rows(places)] == [list(rows[p.start:p.stop]) for p in places]
    (second,) = opened.readers._by_node.values()
    assert second is not first
    opened.close()


def test_a_reference_fetch_from_a_hung_task_ends_at_the_runners_timeout(ray_session, monkeypatch):
    """The audit's read waits no longer than the runner does: a reader that never answers is killed at the runner's
    ``timeout`` and the fit gets a ``WorkerTimeoutError`` naming the blocks."""
    import pandas as pd

    from mixle_parallel.executors.estimation.em_pass.chunks import WorkerTimeoutError
    from mixle_parallel.executors.estimation.sources import ray_blocks, source_places
    from mixle_parallel.executors.estimation.sources.ray_dataset import RayDataset

    rows = np.arange(120.0)
    dataset = ray_session.data.from_pandas([pd.DataFrame({"x": p}) for p in np.split(rows, 3)])
    opened = RayDataset(dataset).open(source_case.PlacingRunnerStandIn("ray", timeout=1.0))
    places = source_places([(a, a + 10) for a in range(0, 120, 10)], opened.part_rows)

    class Hung:
        def slices(self, block, ranges, where):
            import time

            time.sleep(60.0)  # a reader that stops answering (without the deadline the read ends after it, unraised)

    monkeypatch.setattr(ray_blocks, "reader_class", lambda: ray_session.remote(num_cpus=0)(Hung))
    with pytest.raises(WorkerTimeoutError, match=r"ray dataset block 0, ray dataset block 1, ray dataset block 2 "
                                                 r"did not come back within 1.0 s.*timeout="):
        opened.chunks_rows(places)
    assert not opened.readers._by_node  # the hung reader was killed; the next read starts another
    opened.close()
