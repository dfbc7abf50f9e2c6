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


def test_a_reference_fetch_runs_one_slicing_task_per_block_a_few_at_once(ray_session, monkeypatch):
    """A slicing task reserves no CPU, so Ray starts a worker process for every one running: a fit's batch of
    passes (many chunks) must not start one per chunk (before: 48 at once, the machine's load at 35)."""
    import pandas as pd

    from mixle_parallel.executors.estimation.sources import ray_dataset, source_places
    from mixle_parallel.executors.estimation.sources.ray_dataset import RayDataset

    rows = np.arange(120.0)
    dataset = ray_session.data.from_pandas([pd.DataFrame({"x": p}) for p in np.split(rows, 3)])
    opened = RayDataset(dataset).open(source_case.PlacingRunnerStandIn("ray"))
    places = source_places([(a, a + 10) for a in range(0, 120, 10)], opened.part_rows)
    slicer, submitted = ray_dataset._slicer(), []

    class Counted:
        @staticmethod
        def remote(block, ranges, where):
            submitted.append(len(ranges))
            return slicer.remote(block, ranges, where)

    monkeypatch.setattr(ray_dataset, "_slicer", lambda: Counted)
    fetched = opened.chunks_rows(places)
    assert [list(f) for f in fetched] == [list(rows[p.start:p.stop]) for p in places]
    assert submitted == [4, 4, 4]  # one task per block, each slicing its four chunks
    assert opened.chunk_rows(places[5]).tolist() == rows[50:60].tolist()
    opened.close()


def test_a_reference_fetch_from_a_hung_task_ends_at_the_runners_timeout(ray_session, monkeypatch):
    """The audit's read waits no longer than the runner does: a slicing task that never ends is cancelled at the
    runner's ``timeout`` and the fit gets a ``WorkerTimeoutError`` naming the block."""
    import pandas as pd

    from mixle_parallel.executors.estimation.em_pass.chunks import WorkerTimeoutError
    from mixle_parallel.executors.estimation.sources import ray_dataset, source_places
    from mixle_parallel.executors.estimation.sources.ray_dataset import RayDataset

    rows = np.arange(120.0)
    dataset = ray_session.data.from_pandas([pd.DataFrame({"x": p}) for p in np.split(rows, 3)])
    opened = RayDataset(dataset).open(source_case.PlacingRunnerStandIn("ray", timeout=1.0))
    places = source_places([(a, a + 10) for a in range(0, 120, 10)], opened.part_rows)

    @ray_session.remote(num_cpus=0)
    def hung(block, ranges, where):
        import time

        time.sleep(60.0)  # a worker that stops answering (without the deadline the read ends after it, unraised)

    monkeypatch.setattr(ray_dataset, "_slicer", lambda: hung)
    with pytest.raises(WorkerTimeoutError, match=r"ray dataset block 0, ray dataset block 1 did not come back "
                                                 r"within 1.0 s.*timeout="):
        opened.chunks_rows(places)
    opened.close()
