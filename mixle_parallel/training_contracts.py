"""mixle's ``mixle.utils.parallel.training_contracts``: plans, capabilities, updates, receipts, the registry."""

from mixle_parallel.contracts import (
    BackendCapabilities,
    CollectiveKind,
    DistributedTrainingBackend,
    DistributedTrainingSession,
    DistributedUpdate,
    ParallelAxis,
    ParallelPlan,
    ParameterLayout,
    PayloadKind,
    StateLayout,
    StepReceipt,
)
from mixle_parallel.executors.registry import (
    available_training_backends,
    get_training_backend,
    register_training_backend,
)

__all__ = [
    "BackendCapabilities", "CollectiveKind", "DistributedTrainingBackend", "DistributedTrainingSession",
    "DistributedUpdate", "ParallelAxis", "ParallelPlan", "ParameterLayout", "PayloadKind", "StateLayout",
    "StepReceipt", "available_training_backends", "get_training_backend", "register_training_backend",
]
