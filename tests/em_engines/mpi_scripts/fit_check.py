"""Run under mpiexec: fit the shared EM case with backend="mpi"; each rank writes its signature."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import em_case  # noqa: E402
from mpi4py import MPI  # noqa: E402

from mixle_parallel.executors.estimation import fit  # noqa: E402


def main() -> None:
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    root_only = sys.argv[1] == "root_only"
    rows = em_case.data() if (rank == 0 or not root_only) else None
    # admission="unverified": an mpiexec test mesh compared bitwise with the reference fit
    result = fit(rows, em_case.estimator(), backend="mpi", comm=comm, root_only=root_only,
                 admission="unverified", **em_case.FIT_KWARGS)
    digest, history = em_case.signature(result)
    out = {"rank": rank, "size": comm.Get_size(), "digest": digest, "history": list(history)}
    Path(os.environ["MPI_TEST_OUT"], f"rank{rank}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main()
