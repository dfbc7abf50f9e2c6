"""Run under mpiexec: fit the shared EM case with mixle 0.8.2's MixtureEstimator on backend="mpi".

Started from the repository root as ``python -m tests.estimation.backends.mpi_scripts.mixle_fit_check``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mpi4py import MPI

from mixle_parallel.executors.estimation import fit
from mixle_parallel.mpi import MPIEncodedData
from tests.estimation.backends import em_case


def main() -> None:
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    # admission="unverified": an mpiexec test mesh compared bitwise with the reference fit
    result = fit(em_case.data(), em_case.mixle_estimator(), backend="mpi", comm=comm, admission="unverified",
                 **em_case.FIT_KWARGS)
    digest, history = em_case.mixle_signature(result)
    # mixle's constructor shape: MPIEncodedData(data, estimator, ..., comm=...), fitted with our estimator
    fit_kwargs = {k: v for k, v in em_case.FIT_KWARGS.items() if k != "chunk_size"}
    with MPIEncodedData(em_case.data(), em_case.estimator(), comm=comm, chunk_size=250,
                        admission="unverified") as handle:
        ours = em_case.signature(fit(handle, em_case.estimator(), **fit_kwargs))
        kind = type(handle).__name__
    out = {"rank": rank, "size": comm.Get_size(), "digest": digest, "history": list(history),
           "handle": kind, "ours": [ours[0], list(ours[1])]}
    Path(os.environ["MPI_TEST_OUT"], f"rank{rank}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main()
