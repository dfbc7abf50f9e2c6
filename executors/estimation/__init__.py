"""Distributed EM: models, chunk runners, ``encoded_data`` backends, ``optimize``, planner."""

from .encoded import (
    BUILTIN_ENCODED_DATA_BACKENDS,
    EncodedDataControlConflictError,
    encoded_data,
    is_encoded_data_handle,
    register_builtin_encoded_data_backends,
)
from .models import *  # noqa: F403 - the models' __all__
from .models import __all__ as _models_all
from .runner import (
    DEFAULT_CHUNK_SIZE,
    ChunkedEncodedData,
    ChunkResult,
    ChunkRunner,
    EncodedChunk,
    EStepResult,
    WorkerLostError,
    WorkerTimeoutError,
    chunk_bounds,
    chunk_estep,
    chunk_initialize,
    chunk_log_density,
    chunk_rng,
    combine_in_chunk_order,
    encode_chunks,
    handle_from_runner,
    resolve_encoder,
    seed_from,
)

register_builtin_encoded_data_backends()

__all__ = [
    *_models_all,
    "BUILTIN_ENCODED_DATA_BACKENDS", "ChunkResult", "ChunkRunner", "ChunkedEncodedData", "DEFAULT_CHUNK_SIZE",
    "EStepResult", "EncodedChunk", "EncodedDataControlConflictError", "WorkerLostError", "WorkerTimeoutError",
    "chunk_bounds", "chunk_estep", "chunk_initialize", "chunk_log_density", "chunk_rng",
    "combine_in_chunk_order", "encode_chunks", "encoded_data", "handle_from_runner",
    "is_encoded_data_handle", "register_builtin_encoded_data_backends", "resolve_encoder", "seed_from",
]
