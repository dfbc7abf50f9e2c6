"""mixle-parallel: typed contracts, pluggable executors and verification for distributed runs.

Importing this package imports no heavy engine (torch, mpi4py, pyspark, dask, ray, lightning,
megatron); executors load them when they are used.
"""

from mixle_parallel._version import __version__
from mixle_parallel.contracts import *  # noqa: F403 - the facade re-exports the public API
from mixle_parallel.contracts import __all__ as _contract_names
from mixle_parallel.executors import *  # noqa: F403
from mixle_parallel.executors import __all__ as _executor_names

__all__ = ["__version__", *_contract_names, *_executor_names]
