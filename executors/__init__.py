"""Executors: registries and the pluggable backends that register themselves in them."""

from typing import Any

from . import estimation  # numpy only; registers the built-in encoded-data backends (lazy factories)
from .registry import (
    available_encoded_data_backends,
    available_training_backends,
    get_encoded_data_backend,
    get_training_backend,
    normalize_backend_name,
    register_encoded_data_backend,
    register_training_backend,
    register_verification_target,
    unregister_encoded_data_backend,
    unregister_training_backend,
    verification_target,
)

# Heavy executors load on first attribute access, so importing this package stays torch-free.
# They stay out of __all__: ``from mixle_parallel.executors import *`` (the facade) must not import
# torch. Reach them as attributes, e.g. ``mixle_parallel.executors.TorchDistributedBackend``.
_LAZY = {
    "TorchDistributedBackend": ".torch_native",
    "TorchDistributedSession": ".torch_session",
    "describe_parameter_layouts": ".torch_layouts",
    "CollectiveMeter": ".torch_comm",
    "save_checkpoint": ".torch_checkpoint",
    "load_checkpoint": ".torch_checkpoint",
    "CheckpointHandle": ".torch_checkpoint",
    "CheckpointError": ".checkpoint_manifest",
    "CorruptCheckpointError": ".checkpoint_manifest",
    "WorldSizeChangeError": ".checkpoint_manifest",
    "MegatronBackend": ".megatron_backend",
    "MegatronSession": ".megatron_session",
    "cpu_compat": ".megatron_cpu_compat",
    "VerifiableTorchNative": ".torch_verification",
    "VerifiableEncodedData": ".em_verification",
    "em_capabilities": ".em_verification",
    "LaunchContext": ".launchers",
    "bind_launched_rank": ".launchers",
    "TorchrunLauncher": ".launchers_torchrun",
    "LightningFabricLauncher": ".launchers_fabric",
    "RayTrainLauncher": ".launchers_ray",
}


def __getattr__(name: str) -> Any:
    """Load an executor on first use: heavy ones (torch, megatron) and the numpy EM names alike."""
    from importlib import import_module

    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    if name in estimation.__all__:
        return getattr(estimation, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "available_encoded_data_backends", "available_training_backends", "get_encoded_data_backend",
    "get_training_backend", "normalize_backend_name", "register_encoded_data_backend",
    "register_training_backend", "register_verification_target", "unregister_encoded_data_backend",
    "unregister_training_backend", "verification_target",
]  # the lazy names stay out of __all__: a star-import would load torch and megatron
