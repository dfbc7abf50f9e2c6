"""Run under mpiexec: mixle 0.8.2's own ``optimize`` drives ``MPIEncodedData`` (audit on), then a forced divergence.

``python -m tests.estimation.backends.mpi_scripts.mixle_optimize_check {plain|model_parallel}`` from the
repository root; each rank writes ``$MPI_TEST_OUT/rank<r>.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from mpi4py import MPI

from mixle_parallel.mpi import MPIEncodedData
from tests.estimation.backends import em_case, spmd_mixle_loop


def main(kind: str) -> None:
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    est, start = spmd_mixle_loop.mixle_objects(kind == "model_parallel")
    # mixle's constructor shape; admission="unverified": a test mesh compared bitwise with the local loop
    with MPIEncodedData(em_case.data(), estimator=est, comm=comm, chunk_size=spmd_mixle_loop.CHUNK_SIZE,
                        admission="unverified") as handle:
        out = spmd_mixle_loop.drive(handle, est, start)
    with MPIEncodedData(em_case.data(), estimator=est, comm=comm, chunk_size=spmd_mixle_loop.CHUNK_SIZE,
                        admission="unverified") as handle:
        out["diverged"] = spmd_mixle_loop.diverge(handle, est, start, rank)
    out.update(rank=rank, size=comm.Get_size(), local=spmd_mixle_loop.local_params(est, start))
    Path(os.environ["MPI_TEST_OUT"], f"rank{rank}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
