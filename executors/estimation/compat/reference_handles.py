"""mixle 0.8.2's handle classes by name and shape: ``LocalEncodedData(data, ...)`` and its siblings.

Each is :func:`~mixle_parallel.executors.estimation.api.encoded_data` on its backend (the same
option check, admission gate, audit and same-bits chunking), returned as an instance of the named
class so ``isinstance`` works; ``MPIEncodedData``, ``TorchRunEncodedData``, ``RayEncodedData`` and
``LightningEncodedData`` are in their engine modules. Where the reference takes a keyword we do not
honour the call raises ``ValueError`` naming it (see docs/compat.md).
"""

from __future__ import annotations

from typing import Any

from ..api import encoded_data
from ..handle import ChunkedEncodedData
from ..sources import is_source

__all__ = ["BuiltByEncodedData", "DaskEncodedData", "LocalEncodedData", "MPEncodedData", "SparkEncodedData"]


class _ByBackend(type):
    """Metaclass: a handle ``encoded_data`` made on a class's backend is an instance of that class."""

    def __instancecheck__(cls, obj: Any) -> bool:
        if type.__instancecheck__(cls, obj):
            return True
        name = cls.__dict__.get("backend_name")
        # getattr: a handle still being built (or failed half-way) has no runner to name its backend yet
        return name is not None and isinstance(obj, ChunkedEncodedData) and getattr(obj, "backend", None) == name


class BuiltByEncodedData(metaclass=_ByBackend):
    """Mixin: ``Cls(*args, **kwargs)`` is ``Cls._build(*args, **kwargs)`` (an ``encoded_data`` handle) as a ``Cls``;
    ``isinstance(encoded_data(..., backend=b), Cls)`` holds for the class whose ``backend_name`` is ``b``."""

    backend_name: str | None = None

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        handle = cls._build(*args, **kwargs)
        if not isinstance(handle, cls):
            handle.__class__ = cls
        return handle

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Built in ``__new__``; nothing is left to do."""

    @classmethod
    def _build(cls, *args: Any, **kwargs: Any) -> Any:
        """The handle to return; each class names its backend here."""
        raise TypeError(f"{cls.__name__} is the mixin of the reference handle classes; construct one of them "
                        "(LocalEncodedData, MPEncodedData, DaskEncodedData, SparkEncodedData, MPIEncodedData)")


class LocalEncodedData(BuiltByEncodedData, ChunkedEncodedData):
    """mixle's ``LocalEncodedData(data, estimator, model, encoder, ...)``: the ``local`` backend."""

    backend_name = "local"

    @classmethod
    def _build(cls, data: Any, estimator: Any = None, model: Any = None, encoder: Any = None, placement: Any = None,
               resources: Any = None, engine: Any = None, precision: Any = None, num_chunks: int | None = None,
               sub_chunks: int = 1, parallel_chunks: bool = False, chunk_workers: int | None = None,
               **options: Any) -> Any:
        return encoded_data(data, estimator=estimator, model=model, encoder=encoder, placement=placement,
                            resources=resources, engine=engine, precision=precision, num_chunks=num_chunks,
                            sub_chunks=sub_chunks, parallel_chunks=parallel_chunks, chunk_workers=chunk_workers,
                            backend="local", **options)


class MPEncodedData(BuiltByEncodedData, ChunkedEncodedData):
    """mixle's ``MPEncodedData(data, estimator, encoder, num_workers, sub_chunks)``: the ``mp`` backend.

    ``response_timeout`` is our ``timeout`` (seconds a worker may take per pass); ``shutdown_timeout``
    the seconds ``close`` waits for each worker to exit before killing it.
    """

    backend_name = "mp"

    @classmethod
    def _build(cls, data: Any, estimator: Any = None, encoder: Any = None, num_workers: int | None = None,
               sub_chunks: int = 1, response_timeout: float | None = None, shutdown_timeout: float | None = None,
               **options: Any) -> Any:
        if response_timeout is not None:
            options["timeout"] = response_timeout
        if shutdown_timeout is not None:
            options["shutdown_timeout"] = shutdown_timeout
        return encoded_data(data, estimator=estimator, encoder=encoder, num_workers=num_workers,
                            sub_chunks=sub_chunks, backend="mp", **options)


def _rows(data: Any, name: str) -> Any:
    """The rows of ``data``, or a source read where it lives (an RDD, a dask collection, ``files(...)``: the
    backend refuses one it cannot read); anything else is refused with what to pass instead."""
    if hasattr(data, "__len__") or is_source(data):
        return data
    raise TypeError(f"{name} takes the rows in memory (a list or array) or a source its engine reads where it lives "
                    f"(an RDD, a dask collection, files(...)), got a {type(data).__name__}")


class DaskEncodedData(BuiltByEncodedData, ChunkedEncodedData):
    """mixle's ``DaskEncodedData(data, estimator, model, encoder, client, num_partitions, sub_chunks)``."""

    backend_name = "dask"

    @classmethod
    def _build(cls, data: Any, estimator: Any = None, model: Any = None, encoder: Any = None, client: Any = None,
               num_partitions: int | None = None, sub_chunks: int = 1, materialize: bool = True,
               **options: Any) -> Any:
        if not materialize:
            raise ValueError("DaskEncodedData(materialize=False) is not honoured: chunks are always encoded once "
                             "and kept resident on the workers; drop materialize=")
        return encoded_data(_rows(data, cls.__name__), estimator=estimator, model=model, encoder=encoder,
                            client=client, num_chunks=num_partitions, sub_chunks=sub_chunks, backend="dask",
                            **options)


class SparkEncodedData(BuiltByEncodedData, ChunkedEncodedData):
    """mixle's ``SparkEncodedData(data, estimator, model, encoder)``: the ``spark`` backend over in-memory rows."""

    backend_name = "spark"

    @classmethod
    def _build(cls, data: Any, estimator: Any = None, model: Any = None, encoder: Any = None,
               materialize: bool = True, **options: Any) -> Any:
        if not materialize:
            raise ValueError("SparkEncodedData(materialize=False) is not honoured: chunks are always encoded once "
                             "and cached on the executors; drop materialize=")
        return encoded_data(_rows(data, cls.__name__), estimator=estimator, model=model, encoder=encoder,
                            backend="spark", **options)
