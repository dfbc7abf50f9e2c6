"""The built-in encoded-data backends: a table of lazy factories registered like a third party's.

Each engine module is imported on the first ``encoded_data(..., backend=name)``, so importing the
package starts no engine.
"""

from __future__ import annotations

import importlib
from typing import Any

from mixle_parallel.executors.registry import register_encoded_data_backend

__all__ = ["BUILTIN_ENCODED_DATA_BACKENDS", "register_builtin_encoded_data_backends"]

BUILTIN_ENCODED_DATA_BACKENDS: dict[str, tuple[str, tuple[str, ...]]] = {
    # name: ("module (relative to the estimation package):factory", aliases). Engines add a line here.
    "local": (".engines.local:local_backend", ("thread", "threads")),
    "mp": (".engines.mp:mp_backend", ("multiprocessing", "processes")),
    "model_parallel": (".component_parallel:model_parallel_backend", ("component_parallel",)),
    "mpi": (".engines.mpi:mpi_encoded_data", ("mpi4py",)),
    "spark": (".engines.spark:spark_encoded_data", ("pyspark",)),
    "dask": (".engines.dask:dask_encoded_data", ("distributed",)),
    "ray": (".engines.ray:ray_encoded_data", ()),
    "torchrun": (".engines.torchrun:torchrun_encoded_data", ("torch_distributed",)),
}

_PACKAGE = "mixle_parallel.executors.estimation"
_LAZY_FACTORIES: dict[str, Any] = {}


def _lazy_factory(name: str, target: str) -> Any:
    """A factory that imports its backend module on first use (keeps imports light)."""
    if name in _LAZY_FACTORIES:
        return _LAZY_FACTORIES[name]
    module_name, attr = target.split(":")

    def factory(data: Any, **params: Any) -> Any:
        module = importlib.import_module(module_name, _PACKAGE)
        return getattr(module, attr)(data, **params)

    factory.__name__ = factory.__qualname__ = f"{name}_backend_lazy"
    factory.__doc__ = f"Lazy factory of the {name!r} encoded-data backend ({target})."
    _LAZY_FACTORIES[name] = factory
    return factory


def register_builtin_encoded_data_backends() -> None:
    """Register every built-in encoded-data backend the same way a third party would (idempotent).

    Their verification targets are registered by ``estimation.verifiable`` when the package loads.
    """
    for name, (target, aliases) in BUILTIN_ENCODED_DATA_BACKENDS.items():
        register_encoded_data_backend(name, _lazy_factory(name, target), aliases)
