"""Run under `mpiexec -n 2 python -m mpi4py`: the last rank hangs in its chunk; the others time out.

Started from the repository root as ``python -m mpi4py -m tests.estimation.backends.mpi_scripts.hang_check``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mpi4py import MPI

from mixle_parallel.executors.estimation.backends.mpi import MPIRunner
from mixle_parallel.executors.estimation.em_pass.chunks import WorkerTimeoutError
from tests.estimation.backends import chunk_probes as probes


def main() -> None:
    comm = MPI.COMM_WORLD
    runner = MPIRunner(comm, timeout=3.0)
    runner.scatter(probes.make_chunks(4))
    out = Path(os.environ["MPI_TEST_OUT"], f"rank{runner.rank}.json")
    hang = {"hang_chunk": 3, "release": "/nonexistent/never", "hang_s": 120.0}  # chunk 3: last rank
    try:
        runner.map_chunks(probes.probe, hang)
    except WorkerTimeoutError as exc:
        out.write_text(json.dumps({"rank": runner.rank, "timeout": str(exc)}))
        raise  # under `python -m mpi4py` this aborts the job, the hung rank included


if __name__ == "__main__":
    main()
