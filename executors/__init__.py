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


def __getattr__(name: str) -> Any:
    """EM names (``optimize``, ``encoded_data``, the models, the planner) load on first use."""
    from importlib import import_module

    estimation = import_module(".estimation", __name__)
    if name in estimation.__all__:
        return getattr(estimation, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "available_encoded_data_backends", "available_training_backends", "get_encoded_data_backend",
    "get_training_backend", "normalize_backend_name", "register_encoded_data_backend",
    "register_training_backend", "unregister_encoded_data_backend", "unregister_training_backend",
]
