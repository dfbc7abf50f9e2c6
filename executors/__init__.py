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

_LAZY = {
    "save_checkpoint": "torch_checkpoint", "load_checkpoint": "torch_checkpoint",
    "CheckpointHandle": "torch_checkpoint", "CheckpointError": "checkpoint_manifest",
    "CorruptCheckpointError": "checkpoint_manifest", "WorldSizeChangeError": "checkpoint_manifest",
}


def __getattr__(name: str):
    """Load torch-backed names on first use so importing executors imports no torch."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The lazy names stay out of __all__: the facade's star import would otherwise load torch.
__all__ = [
    "available_encoded_data_backends", "available_training_backends", "get_encoded_data_backend",
    "get_training_backend", "normalize_backend_name", "register_encoded_data_backend",
    "register_training_backend", "unregister_encoded_data_backend", "unregister_training_backend",
]
