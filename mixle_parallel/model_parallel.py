"""mixle's ``mixle.utils.parallel.model_parallel``: component-parallel EM of a mixture and its planner entry.

Thin re-exports of ``executors.estimation.component_parallel`` and ``executors.estimation.planner``.
"""

from mixle_parallel.executors.estimation.planning.component_parallel import (
    ComponentParallelAccumulator,
    ComponentParallelAccumulatorFactory,
    ComponentParallelEncodedData,
    ComponentParallelEstimator,
    ModelParallelAccumulator,
    ModelParallelAccumulatorFactory,
    ModelParallelEncodedData,
    ModelParallelEstimator,
    component_parallel_fold,
    model_parallel_fold,
)
from mixle_parallel.executors.estimation.planning.planner import UnrealizedModelPlacementError, auto_parallel_estimator

__all__ = [
    "ComponentParallelAccumulator", "ComponentParallelAccumulatorFactory", "ComponentParallelEncodedData",
    "ComponentParallelEstimator", "ModelParallelAccumulator", "ModelParallelAccumulatorFactory",
    "ModelParallelEncodedData", "ModelParallelEstimator", "UnrealizedModelPlacementError",
    "auto_parallel_estimator", "component_parallel_fold", "model_parallel_fold",
]
