"""mixle's ``mixle.utils.parallel.mpi``: the SPMD handle over MPI ranks and root-only output.

Thin re-exports of ``executors.estimation.backends.mpi`` (mpi4py is imported only when used).
"""

from mixle_parallel.executors.estimation.backends.mpi import MPIEncodedData, mpi_out

__all__ = ["MPIEncodedData", "mpi_out"]
