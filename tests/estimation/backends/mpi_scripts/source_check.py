"""Run under mpiexec: fit the shared EM case from a source with backend="mpi"; each rank writes its signature.

``python -m tests.estimation.backends.mpi_scripts.source_check KIND FOLDER``: KIND ``files`` (every rank passes
``files(FOLDER/part-*.npy)``) or ``rank_local`` (rank r passes only the rows of ``FOLDER/part-<r>.npy``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

from mixle_parallel import files, fit, rank_local
from tests.estimation.backends import em_case


def main() -> None:
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    kind, folder = sys.argv[1], sys.argv[2]
    if kind == "files":
        data = files(os.path.join(folder, "part-*.npy"))
    else:
        data = rank_local(np.load(os.path.join(folder, f"part-{rank}.npy")))
    # admission="unverified": an mpiexec test mesh compared bitwise with the reference fit
    result = fit(data, em_case.estimator(), backend="mpi", comm=comm, admission="unverified", **em_case.FIT_KWARGS)
    digest, history = em_case.signature(result)
    out = {"rank": rank, "size": comm.Get_size(), "digest": digest, "history": list(history)}
    Path(os.environ["MPI_TEST_OUT"], f"rank{rank}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main()
