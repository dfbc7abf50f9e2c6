"""mixle's ``mixle.utils.parallel.planner``: resources, placement, calibration, memory sizing, ``encoded_data``.

Thin re-exports of ``contracts`` (resources, placement and model shards, calibration records, the fold
and size protocols), ``executors.registry`` and ``executors.estimation`` (``encoded_data``, the reference
handle classes, the planner, ``calibrate_resources``, the memory estimates).
"""

from mixle_parallel.contracts import (
    CalibrationCatalog,
    CalibrationRecord,
    DeviceCalibration,
    DeviceSpec,
    ModelShard,
    Placement,
    PlacementShard,
    ResourceCalibrationError,
    Resources,
    UnknownMemoryFootprintError,
)
from mixle_parallel.contracts.estimation import EncodedDataHandle, EncodedFold, MemorySized
from mixle_parallel.executors.estimation.api import (
    EncodedDataControlConflictError,
    EncodedDataOptions,
    encoded_data,
    is_encoded_data_handle,
)
from mixle_parallel.executors.estimation.compat.reference_handles import (
    DaskEncodedData,
    LocalEncodedData,
    SparkEncodedData,
)
from mixle_parallel.executors.estimation.planning.memory import estimate_estimator_stat_nbytes, estimate_model_nbytes
from mixle_parallel.executors.estimation.planning.planner import model_sharding_plan, plan
from mixle_parallel.executors.estimation.planning.resource_calibration import calibrate_resources
from mixle_parallel.executors.registry import available_encoded_data_backends, register_encoded_data_backend

__all__ = [
    "CalibrationCatalog", "CalibrationRecord", "DaskEncodedData", "DeviceCalibration", "DeviceSpec",
    "EncodedDataControlConflictError", "EncodedDataHandle", "EncodedDataOptions", "EncodedFold", "LocalEncodedData",
    "MemorySized", "ModelShard", "Placement", "PlacementShard", "ResourceCalibrationError", "Resources",
    "SparkEncodedData", "UnknownMemoryFootprintError", "available_encoded_data_backends", "calibrate_resources",
    "encoded_data", "estimate_estimator_stat_nbytes", "estimate_model_nbytes", "is_encoded_data_handle",
    "model_sharding_plan", "plan", "register_encoded_data_backend",
]
