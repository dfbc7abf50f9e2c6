"""Executors: registries and the pluggable backends that register themselves in them."""

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

from typing import Any


def _torch_native_factory() -> object:
    """Lazy factory: imports torch only when the torch_native backend is first resolved."""
    from .torch_native import TorchDistributedBackend

    return TorchDistributedBackend()


register_training_backend("torch_native", _torch_native_factory)

_LAZY = {
    "TorchDistributedBackend": "torch_native",
    "TorchDistributedSession": "torch_session",
    "describe_parameter_layouts": "torch_layouts",
    "CollectiveMeter": "torch_comm",
    "VerifiableTorchNative": "torch_verification",
    "VerifiableEncodedData": "em_verification",
    "em_capabilities": "em_verification",
}


def __getattr__(name: str) -> Any:
    """Torch-backed names and EM names (``optimize``, ``encoded_data``, models, planner) load on first use,
    so importing this package never imports torch."""
    from importlib import import_module

    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    estimation = import_module(".estimation", __name__)
    if name in estimation.__all__:
        return getattr(estimation, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The lazy names stay out of __all__: ``from mixle_parallel.executors import *`` (the facade) must
# not import torch. Reach them as attributes: ``mixle_parallel.executors.TorchDistributedBackend``.
__all__ = [
    "available_encoded_data_backends", "available_training_backends", "get_encoded_data_backend",
    "get_training_backend", "normalize_backend_name", "register_encoded_data_backend",
    "register_training_backend", "unregister_encoded_data_backend", "unregister_training_backend",
]
