"""``WorkerLostError`` names the real cause of a worker lost at start-up (issue 25 item 5): the worker's own
error when it could report one, not a guess about importability or the main guard."""

from __future__ import annotations

import pytest

from mixle_parallel.executors.estimation import WorkerLostError
from mixle_parallel.executors.estimation.backends.mp import MPChunkRunner
from mixle_parallel.executors.estimation.em_pass.chunks import EncodedChunk
from tests.estimation.perf_free.unloadable import OnlyOnTheDriver


def test_a_worker_that_cannot_load_the_chunks_names_the_error():
    runner = MPChunkRunner(1, start_timeout=120.0)
    try:
        with pytest.raises(WorkerLostError, match=r"failed to load the encoded chunks: ImportError: No module "
                                                  r"named 'site_only_codec' \(installed on the driver only\)"):
            runner.scatter([EncodedChunk(0, 0, 1, OnlyOnTheDriver())])
    finally:
        runner.close()
