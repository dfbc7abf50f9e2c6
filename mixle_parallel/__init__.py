"""mixle-parallel: typed contracts, pluggable executors and verification for distributed runs.

Importing this package imports no heavy engine (torch, mpi4py, pyspark, dask, ray, lightning,
megatron); executors load them when they are used.
"""

from mixle_parallel._version import __version__
from mixle_parallel.contracts import *  # noqa: F403 - the facade re-exports the public API
from mixle_parallel.contracts import __all__ as _contract_names
from mixle_parallel.executors import *  # noqa: F403
from mixle_parallel.executors import __all__ as _executor_names

from mixle_parallel.executors.estimation import (
    CategoricalDistribution,
    CategoricalEstimator,
    ComponentParallelEncodedData,
    ComponentParallelEstimator,
    CompositeDistribution,
    CompositeEstimator,
    DiagonalGaussianDistribution,
    DiagonalGaussianEstimator,
    EncodedDataControlConflictError,
    ExponentialDistribution,
    ExponentialEstimator,
    FitResult,
    GaussianDistribution,
    GaussianEstimator,
    MixtureDistribution,
    MixtureEstimator,
    ModelParallelEncodedData,
    ModelParallelEstimator,
    MultivariateGaussianDistribution,
    MultivariateGaussianEstimator,
    PoissonDistribution,
    PoissonEstimator,
    UnrealizedModelPlacementError,
    auto_parallel_estimator,
    component_parallel_fold,
    encoded_data,
    fit,
    is_encoded_data_handle,
    model_parallel_fold,
    model_sharding_plan,
    optimize,
    plan,
)

_estimation_names = [
    "CategoricalDistribution", "CategoricalEstimator", "ComponentParallelEncodedData", "ComponentParallelEstimator",
    "CompositeDistribution", "CompositeEstimator", "DiagonalGaussianDistribution", "DiagonalGaussianEstimator",
    "EncodedDataControlConflictError", "ExponentialDistribution", "ExponentialEstimator", "FitResult",
    "GaussianDistribution", "GaussianEstimator", "MixtureDistribution", "MixtureEstimator",
    "ModelParallelEncodedData", "ModelParallelEstimator", "MultivariateGaussianDistribution",
    "MultivariateGaussianEstimator", "PoissonDistribution", "PoissonEstimator", "UnrealizedModelPlacementError",
    "auto_parallel_estimator", "component_parallel_fold", "encoded_data", "fit", "is_encoded_data_handle",
    "model_parallel_fold", "model_sharding_plan", "optimize", "plan",
]

__all__ = ["__version__", *_contract_names, *_executor_names, *_estimation_names]


def __getattr__(name: str) -> object:
    """Heavy executors (TorchDistributedBackend, MegatronBackend, ...) load on first access."""
    from mixle_parallel import executors

    if name in executors._LAZY:
        return getattr(executors, name)
    raise AttributeError(f"module 'mixle_parallel' has no attribute {name!r}")
