"""Distributed EM: models, chunk runners, ``encoded_data`` backends, ``optimize``, planner."""

from .encoded import (
    BUILTIN_ENCODED_DATA_BACKENDS,
    EncodedDataControlConflictError,
    encoded_data,
    is_encoded_data_handle,
    register_builtin_encoded_data_backends,
)
from .component_parallel import (
    ComponentParallelEncodedData,
    ComponentParallelEstimator,
    ModelParallelAccumulator,
    ModelParallelAccumulatorFactory,
    ModelParallelEncodedData,
    ModelParallelEstimator,
    component_parallel_fold,
    component_thread_pool,
    model_parallel_fold,
)
from .models import *  # noqa: F403 - the models' __all__
from .models import __all__ as _models_all
from .optimize import EMStep, FitResult, as_estimator, fit, optimize
from .planner import UnrealizedModelPlacementError, auto_parallel_estimator, model_sharding_plan, plan
from .runner import (
    DEFAULT_CHUNK_MULTIPLE,
    DEFAULT_CHUNK_SIZE,
    ChunkedEncodedData,
    ChunkResult,
    ChunkRunner,
    EncodedChunk,
    EStepResult,
    GroupFold,
    GroupStats,
    WorkerLostError,
    WorkerTask,
    WorkerTimeoutError,
    WorkerUnavailableError,
    apply_chunk_fn,
    chunk_bounds,
    chunk_estep,
    chunk_initialize,
    chunk_log_density,
    chunk_rng,
    combine_groups,
    combine_in_chunk_order,
    encode_chunks,
    fold_pass,
    handle_from_runner,
    resolve_encoder,
    seed_from,
    supports_worker_placement,
)

register_builtin_encoded_data_backends()

__all__ = [
    *_models_all,
    "ComponentParallelEncodedData", "ComponentParallelEstimator", "EMStep", "FitResult",
    "ModelParallelAccumulator", "ModelParallelAccumulatorFactory", "ModelParallelEncodedData",
    "ModelParallelEstimator", "UnrealizedModelPlacementError", "as_estimator", "auto_parallel_estimator",
    "component_parallel_fold", "component_thread_pool", "fit", "model_parallel_fold", "model_sharding_plan",
    "optimize", "plan",
    "BUILTIN_ENCODED_DATA_BACKENDS", "ChunkResult", "ChunkRunner", "ChunkedEncodedData", "DEFAULT_CHUNK_MULTIPLE", "DEFAULT_CHUNK_SIZE",
    "EStepResult", "EncodedChunk", "EncodedDataControlConflictError", "WorkerLostError", "WorkerTimeoutError",
    "chunk_bounds", "chunk_estep", "chunk_initialize", "chunk_log_density", "chunk_rng",
    "combine_in_chunk_order", "encode_chunks", "encoded_data", "handle_from_runner",
    "is_encoded_data_handle", "register_builtin_encoded_data_backends", "resolve_encoder", "seed_from",
    "WorkerTask", "WorkerUnavailableError", "supports_worker_placement",
    "GroupFold", "GroupStats", "apply_chunk_fn", "combine_groups", "fold_pass",
]

# Engine runners (mpi, spark, dask, ray): these modules import their engine only when a runner is
# constructed, so importing them here keeps this package light.
from .dask_backend import DaskRunner
from .mpi_backend import MPIChunkError, MPIEncodedData, MPIRunner
from .ray_backend import RayRunner
from .spark_backend import SparkRunner

__all__ += ["DaskRunner", "MPIChunkError", "MPIEncodedData", "MPIRunner", "RayRunner", "SparkRunner"]
