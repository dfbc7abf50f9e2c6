"""Run under mpiexec: MPIRunner placement, ordering, root_only scatter, error fan-out, Resources.

Started from the repository root as ``python -m tests.estimation.backends.mpi_scripts.runner_check MODE``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from mpi4py import MPI

from mixle_parallel.contracts.resources import Resources
from mixle_parallel.executors.estimation.backends.mpi import MPIChunkError, MPIRunner
from tests.estimation.backends import chunk_probes as probes


def main() -> None:
    comm = MPI.COMM_WORLD
    root_only = sys.argv[1] == "root_only"
    chunks = probes.make_chunks(7)
    runner = MPIRunner(comm, root=comm.Get_size() - 1 if root_only else 0, root_only=root_only)
    given = chunks if (not root_only or runner.is_root) else None
    runner.scatter(given)
    results = runner.map_chunks(probes.probe, {"scale": 2.0})
    subset = runner.map_chunks(probes.probe, {}, chunk_ids=[6, 0])
    # The root's payload wins: a rank passing another payload still scores the root's.
    scale = 5.0 if runner.is_root else 99.0
    root_payload = runner.map_chunks(probes.probe, {"scale": scale})
    try:
        runner.map_chunks(probes.probe, {"fail_chunk": 6})
        failed = None
    except MPIChunkError as exc:
        failed = str(exc)
    out = {
        "rank": runner.rank,
        "held": sorted(runner._local),
        "ok": results == probes.expected(chunks, 2.0),
        "subset_ok": subset == [probes.expected(chunks)[0], probes.expected(chunks)[6]],
        "root_payload_ok": root_payload == probes.expected(chunks, 5.0),
        "failed": failed,
        "resources_comm": [d.name for d in Resources.from_mpi(comm)],
        "resources_env": [d.name for d in Resources.from_mpi()],
    }
    runner.close()
    Path(os.environ["MPI_TEST_OUT"], f"rank{runner.rank}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main()
