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

__all__ = [
    "available_encoded_data_backends", "available_training_backends", "get_encoded_data_backend",
    "get_training_backend", "normalize_backend_name", "register_encoded_data_backend",
    "register_training_backend", "unregister_encoded_data_backend", "unregister_training_backend",
]
