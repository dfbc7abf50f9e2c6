"""The built-in encoded-data backends: a table of lazy factories registered like a third party's.

Each engine module is imported on the first ``encoded_data(..., backend=name)``, so importing the
package starts no engine.
"""

from __future__ import annotations

import importlib
from typing import Any

from ...registry import is_encoded_data_backend, register_encoded_data_backend

__all__ = [
    "BUILTIN_ENCODED_DATA_BACKENDS", "builtin_backend_name", "builtin_keys", "register_builtin_encoded_data_backends",
]

BUILTIN_ENCODED_DATA_BACKENDS: dict[str, tuple[str, tuple[str, ...]]] = {
    # name: ("module (relative to the estimation package):factory", aliases). Engines add a line here.
    "local": (".backends.local:local_backend", ("thread", "threads")),
    "mp": (".backends.mp:mp_backend", ("multiprocessing", "processes")),
    "model_parallel": (".planning.component_parallel:model_parallel_backend", ("component_parallel",)),
    "mpi": (".backends.mpi:mpi_encoded_data", ("mpi4py",)),
    "spark": (".backends.spark:spark_encoded_data", ("pyspark",)),
    "dask": (".backends.dask:dask_encoded_data", ("distributed",)),
    "ray": (".backends.ray:ray_encoded_data", ()),
    "torchrun": (".backends.torchrun:torchrun_encoded_data", ("torch_distributed",)),
    "lightning": (".backends.lightning:lightning_encoded_data", ("pl",)),
}

_PACKAGE = "mixle_parallel.executors.estimation"
_LAZY_FACTORIES: dict[str, _LazyFactory] = {}


class _LazyFactory:
    """A backend factory that imports its engine module on first use (keeps imports light).

    The module declares ``ENCODED_DATA_OPTIONS`` (options it honours), ``WORKER_PROCESSES`` (whether
    its workers are processes) and ``planned_workers(options)``; this factory shows them as the
    registry's declaration attributes. Importing the module starts no worker.
    """

    def __init__(self, name: str, target: str) -> None:
        self.name, self.target = name, target
        self.__name__ = self.__qualname__ = f"{name}_backend_lazy"
        self.__doc__ = f"Lazy factory of the {name!r} encoded-data backend ({target})."

    def _module(self) -> Any:
        return importlib.import_module(self.target.split(":")[0], _PACKAGE)

    def __call__(self, data: Any, **params: Any) -> Any:
        return getattr(self._module(), self.target.split(":")[1])(data, **params)

    @property
    def encoded_data_options(self) -> frozenset[str]:
        """The options the backend honours (its engine module's ``ENCODED_DATA_OPTIONS``)."""
        return frozenset(self._module().ENCODED_DATA_OPTIONS)

    @property
    def worker_processes(self) -> bool:
        """Whether the backend's workers are processes (a world of that many) or threads here."""
        return bool(self._module().WORKER_PROCESSES)

    def planned_workers(self, options: Any) -> int:
        """Workers the backend will run with these options, known before any starts."""
        return int(self._module().planned_workers(options))


def _lazy_factory(name: str, target: str) -> _LazyFactory:
    """The one lazy factory of a built-in backend."""
    if name not in _LAZY_FACTORIES:
        _LAZY_FACTORIES[name] = _LazyFactory(name, target)
    return _LAZY_FACTORIES[name]


def register_builtin_encoded_data_backends() -> None:
    """Register every built-in encoded-data backend the same way a third party would (idempotent).

    A name or alias already bound (a third party's ``override=True`` over a built-in) is left as it
    is, so replacing one built-in never disturbs the others. Their verification targets are
    registered by ``harness_adapter`` when the package loads.
    """
    for name, (target, aliases) in BUILTIN_ENCODED_DATA_BACKENDS.items():
        for key in (name, *aliases):
            if not is_encoded_data_backend(key):
                register_encoded_data_backend(key, _lazy_factory(name, target))


def builtin_backend_name(factory: object) -> str | None:
    """The built-in backend ``factory`` is (``"mp"`` for the factory behind ``mp`` and ``processes``), else None."""
    for name, lazy in _LAZY_FACTORIES.items():
        if factory is lazy:
            return name
    return None


def builtin_keys() -> frozenset[str]:
    """Every built-in backend name and alias (what a third party's ``override=True`` can shadow)."""
    return frozenset(key for name, (_, aliases) in BUILTIN_ENCODED_DATA_BACKENDS.items() for key in (name, *aliases))
