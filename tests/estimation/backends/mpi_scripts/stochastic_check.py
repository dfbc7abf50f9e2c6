"""Run under mpiexec: the shared stochastic-EM case with backend="mpi"; each rank writes its signature.

Started from the repository root as ``python -m tests.estimation.backends.mpi_scripts.stochastic_check MODE``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from mpi4py import MPI

from mixle_parallel import encoded_data
from tests.estimation.backends import stochastic_case as case


def main() -> None:
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    root_only = sys.argv[1] == "root_only"
    rows = case.data() if (rank == 0 or not root_only) else None
    # admission="unverified": an mpiexec test mesh compared bitwise with the local reference
    with encoded_data(rows, estimator=case.EST, backend="mpi", comm=comm, root_only=root_only,
                      admission="unverified", **case.MINIBATCH) as h:
        plans, model, fit = case.signature(h)
    out = {"rank": rank, "size": comm.Get_size(), "plans": plans, "model": model, "fit": list(fit)}
    Path(os.environ["MPI_TEST_OUT"], f"rank{rank}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main()
