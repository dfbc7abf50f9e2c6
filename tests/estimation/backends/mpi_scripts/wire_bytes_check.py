"""Run under mpiexec: the mpi runner's pass bytes (tests/estimation/backends/wire_spmd.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from mpi4py import MPI

from mixle_parallel.executors.estimation.backends.mpi import MPIRunner
from tests.estimation.backends import wire_spmd


def main() -> None:
    comm = MPI.COMM_WORLD
    out = {"rank": comm.Get_rank(), "probe": wire_spmd.probe_pass(MPIRunner(comm)), "em": wire_spmd.em_receipts("mpi")}
    Path(os.environ["MPI_TEST_OUT"], f"rank{comm.Get_rank()}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main()
