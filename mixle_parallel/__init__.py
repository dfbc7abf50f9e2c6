"""mixle-parallel: typed contracts, pluggable executors and verification for distributed runs.

The public names are those of the subpackages' ``__all__`` (contracts, executors, estimation,
verification). Importing this package imports no heavy engine (torch, mpi4py, pyspark, dask, ray,
lightning, megatron); executors load them when they are used.
"""

from typing import Any

from mixle_parallel import contracts, executors, verification
from mixle_parallel._version import __version__
from mixle_parallel.contracts import *  # noqa: F403 - the facade re-exports the public API
from mixle_parallel.executors import *  # noqa: F403
from mixle_parallel.executors import estimation
from mixle_parallel.executors.estimation import *  # noqa: F403 - the EM engine names load on first use (below)
from mixle_parallel.verification import *  # noqa: F403

# Both contracts and the EM models name an AccumulatorFactory; the facade's is the contract (protocol).
AccumulatorFactory = contracts.AccumulatorFactory

__all__ = sorted({
    "__version__", *contracts.__all__, *executors.__all__, *estimation.__all__, *estimation.LAZY_NAMES,
    *verification.__all__,
})


def __getattr__(name: str) -> Any:
    """Heavy executors (TorchDistributedBackend, MegatronBackend, ...) and the EM engine names load on first access."""
    if name in executors.LAZY_EXECUTORS:
        return getattr(executors, name)
    if name in estimation.LAZY_NAMES:
        return getattr(estimation, name)
    raise AttributeError(f"module 'mixle_parallel' has no attribute {name!r}")
