"""Run under mpiexec: fit the shared EM case with backend="mpi"; each rank writes its signature.

Started from the repository root as ``python -m tests.estimation.backends.mpi_scripts.fit_check MODE``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from mpi4py import MPI

from mixle_parallel.executors.estimation import fit
from tests.estimation.backends import em_case


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
