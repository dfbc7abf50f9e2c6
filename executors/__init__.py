"""Executors: registries and the pluggable backends that register themselves in them."""

from typing import Any

from .registry import (
    available_encoded_data_backends,
    available_training_backends,
    get_encoded_data_backend,
    get_training_backend,
    normalize_backend_name,
    register_encoded_data_backend,
    register_training_backend,
    unregister_encoded_data_backend,
    unregister_training_backend,
)

def _torch_native_factory() -> object:
    """Lazy factory: imports torch only when the torch_native backend is first resolved."""
    from .torch_native import TorchDistributedBackend

    return TorchDistributedBackend()


register_training_backend("torch_native", _torch_native_factory)

# Heavy executors load on first attribute access, so importing this package stays torch-free.
_LAZY = {
    "MegatronBackend": ".megatron_backend",
    "MegatronSession": ".megatron_session",
    "cpu_compat": ".megatron_cpu_compat",
    "TorchDistributedBackend": ".torch_native",
    "TorchDistributedSession": ".torch_session",
    "describe_parameter_layouts": ".torch_layouts",
    "CollectiveMeter": ".torch_comm",
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
    estimation = import_module(".estimation", __name__)
    if name in estimation.__all__:
        return getattr(estimation, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "available_encoded_data_backends", "available_training_backends", "get_encoded_data_backend",
    "get_training_backend", "normalize_backend_name", "register_encoded_data_backend",
    "register_training_backend", "unregister_encoded_data_backend", "unregister_training_backend",
]  # the lazy names stay out of __all__: a star-import would load torch and megatron
