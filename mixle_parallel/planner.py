"""mixle's ``mixle.utils.parallel.planner``: resources, placement, ``encoded_data`` and its backend registry.

Thin re-exports of ``contracts`` (resources, placement), ``executors.registry`` and
``executors.estimation`` (``encoded_data``, the reference handle classes, the planner).
"""

from mixle_parallel.contracts import DeviceSpec, Placement, Resources
from mixle_parallel.contracts.estimation import EncodedDataHandle
from mixle_parallel.executors.estimation.api import (
    EncodedDataControlConflictError,
    EncodedDataOptions,
    encoded_data,
    is_encoded_data_handle,
)
from mixle_parallel.executors.estimation.planner import model_sharding_plan, plan
from mixle_parallel.executors.estimation.reference_handles import DaskEncodedData, LocalEncodedData, SparkEncodedData
from mixle_parallel.executors.registry import available_encoded_data_backends, register_encoded_data_backend

__all__ = [
    "DaskEncodedData", "DeviceSpec", "EncodedDataControlConflictError", "EncodedDataHandle", "EncodedDataOptions",
    "LocalEncodedData", "Placement", "Resources", "SparkEncodedData", "available_encoded_data_backends",
    "encoded_data", "is_encoded_data_handle", "model_sharding_plan", "plan", "register_encoded_data_backend",
]
