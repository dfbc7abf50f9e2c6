"""One logical source for every engine: the rows of ``em_case`` in files, and the fit's bits.

``write_files`` writes the rows as one ``.npy`` file (cut exactly as the rows in memory, so the bits are
``em_case.reference()``), as three ``.npy`` files, or as two Parquet files of several row groups. A
source of several parts is cut within each part, so its reference is the ``local`` one-worker fit of
the same source (:func:`source_reference`), and every engine and worker count must give those bits.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from mixle_parallel import files, fit
from tests.estimation.backends import em_case

SPLITS = (1300, 2900)
"""Where the three-part sources are cut (parts of 1,300, 1,600 and 1,100 rows)."""


def write_files(folder: str, layout: str) -> Any:
    """Write ``em_case.data()`` under ``folder`` as ``layout`` ("one_npy", "npy", "parquet"); the source."""
    rows = em_case.data()
    if layout == "one_npy":
        np.save(os.path.join(folder, "rows.npy"), rows)
        return files(os.path.join(folder, "rows.npy"))
    if layout == "npy":
        for i, part in enumerate(np.split(rows, SPLITS)):
            np.save(os.path.join(folder, f"part-{i}.npy"), part)
        return files(os.path.join(folder, "part-*.npy"))
    import pyarrow as pa
    import pyarrow.parquet as pq

    for i, part in enumerate(np.split(rows, SPLITS[:1])):
        pq.write_table(pa.table({"x": part}), os.path.join(folder, f"part-{i}.parquet"), row_group_size=600)
    return files(folder, columns=["x"])


def run(source: Any, backend: str, num_workers: int | None, **kwargs: Any) -> tuple[str, tuple[str, ...]]:
    """The signature (model digest, log-likelihood hex trajectory) of fitting ``source`` on ``backend``."""
    options = {"admission": "unverified", **em_case.FIT_KWARGS, **kwargs}
    return em_case.signature(fit(source, em_case.estimator(), backend=backend, num_workers=num_workers, **options))


def source_reference(source: Any) -> tuple[str, tuple[str, ...]]:
    """The bits of ``source`` fitted in-process by one worker (what every engine must give)."""
    return run(source, "local", 1)


class PlacingRunnerStandIn:
    """What a collection source's ``open`` asks of its runner: a placing runner (named ``name``; on ``client`` for
    dask). A test of a source's own fetches needs no actors, so none are started."""

    supports_worker_placement = True

    def __init__(self, name: str, client: Any = None, timeout: float | None = None) -> None:
        self.name, self.client, self.timeout = name, client, timeout

    def worker_ids(self) -> list[int]:
        return [0]

    def run_on_workers(self, tasks: Any) -> Any:
        raise AssertionError("a source's fetch never runs work on the runner")

    def chunk_owners(self) -> list[int]:
        return []

    def wait_for_tasks(self, futures: Any, what: str) -> None:
        """A dask runner's wait for a source's tasks, up to ``timeout`` (no actors, so no straggler to give up)."""
        from mixle_parallel.executors.estimation.backends.dask_straggler import settle_tasks

        settle_tasks(self.client, futures, what, self.timeout)
