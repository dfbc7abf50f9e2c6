"""The options of ``encoded_data`` as one object, and the check that the chosen backend honours them.

Each backend declares the options it honours in one place, its engine module's
``ENCODED_DATA_OPTIONS`` (third-party factories: an ``encoded_data_options`` attribute, or
:func:`declare_backend_options`). Options every handle honours (the data, the encoder, the
chunking) are :data:`HANDLE_OPTIONS`. An option that is set and that the backend does not honour
raises ``ValueError`` naming it and the backends that do, before any worker starts; a backend
that declares nothing receives every option (the registry's old contract).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from .chunks import chunk_bounds

__all__ = [
    "EM_PRECISIONS",
    "HANDLE_OPTIONS",
    "EncodedDataOptions",
    "backend_options",
    "check_backend_options",
    "declare_backend_options",
    "honouring_backends",
    "sub_chunked",
]

HANDLE_OPTIONS = frozenset({"estimator", "model", "encoder", "num_chunks", "sub_chunks", "chunk_size", "precision"})
"""Options every ``ChunkedEncodedData`` handle honours, whatever runs its chunks."""

EM_PRECISIONS = (None, "fp64", "float64", "double")
"""``precision=`` values of the numpy engine (every backend's default): it computes in float64 only.
The torch engine (``engine="torch"``) also computes in fp32 (``engine_choice.ENGINE_PRECISIONS``)."""

_DEFAULTS: dict[str, Any] = {"sub_chunks": 1, "root": 0, "root_only": False, "parallel_chunks": False}

_DECLARED: dict[str, frozenset[str]] = {}
"""Options declared with :func:`declare_backend_options` (name -> options)."""


@dataclass(frozen=True)
class EncodedDataOptions:
    """Every option of ``encoded_data`` but the data and the backend name; ``extra`` holds engine keywords."""

    estimator: Any = None
    model: Any = None
    encoder: Any = None
    placement: Any = None
    resources: Any = None
    engine: Any = None
    precision: Any = None
    num_chunks: int | None = None
    sub_chunks: int = 1
    num_workers: int | None = None
    client: Any = None
    comm: Any = None
    root: int = 0
    root_only: bool = False
    parallel_chunks: bool = False
    chunk_workers: int | None = None
    batch_size: int | None = None
    shuffle: bool | None = None
    seed: int | None = None
    chunk_size: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Engine keywords (``timeout=``, ``start_method=``, ``direct_channel=``...), checked like the rest."""

    def set_options(self) -> dict[str, Any]:
        """The options given a value other than their default (``extra`` keywords included)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)
               if f.name != "extra" and getattr(self, f.name) != _DEFAULTS.get(f.name)}
        out.update(self.extra)
        return out

    def as_kwargs(self) -> dict[str, Any]:
        """Every option as the keyword arguments of a backend factory."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        out.update(self.extra)
        return out


def declare_backend_options(backend: str, options: Iterable[str]) -> None:
    """Declare (add to) the options a backend honours, for a factory without ``encoded_data_options``."""
    _DECLARED[backend] = _DECLARED.get(backend, frozenset()) | frozenset(options)


def backend_options(backend: str, factory: Any) -> frozenset[str] | None:
    """The options ``backend`` honours (handle options included), or None when it declares none."""
    declared = getattr(factory, "encoded_data_options", None)
    if declared is None and backend not in _DECLARED:
        return None
    return HANDLE_OPTIONS | frozenset(declared or ()) | _DECLARED.get(backend, frozenset())


def honouring_backends(option: str, declared: Mapping[str, frozenset[str] | None]) -> list[str]:
    """The backends of ``declared`` that honour ``option``."""
    return sorted(name for name, opts in declared.items() if opts is not None and option in opts)


_NOT_YET = {
    "placement": "a model placement plan (use the planner's ModelParallelEstimator for component parallelism)",
}


def _check_precision(precision: Any, backend: str) -> None:
    text = getattr(precision, "__name__", None) or str(precision)
    if precision is not None and text.lower() not in EM_PRECISIONS[1:]:
        raise ValueError(f"precision={precision!r} is not honoured by backend {backend!r}: its engine 'numpy' "
                         f"computes in float64 only (honoured: {', '.join(map(str, EM_PRECISIONS[1:]))}); "
                         "drop precision= or pass 'fp64' (engine='torch' also computes in 'fp32')")


def check_backend_options(backend: str, options: EncodedDataOptions, honoured: frozenset[str] | None,
                          declared: Mapping[str, frozenset[str] | None]) -> None:
    """Raise ``ValueError`` for an option set in ``options`` that ``backend`` does not honour."""
    _check_precision(options.precision, backend)
    if honoured is None:
        return
    for name in sorted(options.set_options()):
        if name in honoured:
            continue
        others = honouring_backends(name, declared)
        known = name in {f.name for f in fields(EncodedDataOptions)}
        where = (f"backends honouring it: {', '.join(others)}" if others
                 else f"no backend honours it yet ({_NOT_YET[name]})" if name in _NOT_YET
                 else "no backend honours it" if known else "no backend takes such a keyword")
        raise ValueError(f"encoded_data option {name}= is not honoured by backend {backend!r}; {where}. "
                         f"Drop it or choose such a backend; {backend!r} honours: {', '.join(sorted(honoured))}")


def sub_chunked(num_rows: int | None, num_chunks: int | None, chunk_size: int | None,
                sub_chunks: int) -> tuple[int | None, int | None]:
    """``(num_chunks, chunk_size)`` with every chunk cut into ``sub_chunks`` pieces (mixle's meaning)."""
    if sub_chunks == 1:
        return num_chunks, chunk_size
    if num_chunks is not None:
        return num_chunks * sub_chunks, None
    if chunk_size is not None:
        return None, max(1, math.ceil(chunk_size / sub_chunks))
    if num_rows is None:
        return None, None
    return len(chunk_bounds(num_rows)) * sub_chunks, None
