"""What an encoded-data backend declares, and the checks that hold a call to it.

A backend declares, at registration (``register_encoded_data_backend(..., options=,
worker_processes=, planned_workers=)``) or as attributes of its factory, the options it honours
besides every handle's own (:data:`~.options.HANDLE_OPTIONS`), whether its workers are processes,
and the workers it will run for given options. Built-in backends declare in their backend module
(``ENCODED_DATA_OPTIONS``, ``WORKER_PROCESSES``, ``planned_workers``). From that, before any
worker starts: an option set that the backend does not honour raises ``ValueError`` naming the
option, the backend and the backends that honour it; the admission gate gets the world size.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from ...registry import (
    encoded_data_declaration,
    encoded_data_registered_name,
    get_encoded_data_backend,
    is_encoded_data_backend,
    normalize_backend_name,
)
from ..options import HANDLE_OPTIONS, EncodedDataOptions, declared_options, option_names
from .builtin_backends import builtin_backend_name

__all__ = [
    "EM_PRECISIONS",
    "BackendDeclaration",
    "backend_declaration",
    "builtin_declarations",
    "capped_workers",
    "check_backend_options",
    "honouring_backends",
    "refuse_for_runner",
]

EM_PRECISIONS = (None, "fp64", "float64", "double")
"""``precision=`` values of the numpy engine (every backend's default): it computes in float64 only.
The torch engine (``engine="torch"``) also computes in fp32 (``engine_choice.ENGINE_PRECISIONS``)."""

@attrs.frozen
class BackendDeclaration:
    """A backend's declaration, completed with the safe defaults.

    ``options``: every option it honours (handle options included), or None when it declares none
    (it then receives every option, mixle 0.8.2's contract). ``worker_processes``: True unless it
    says its workers are threads here. ``planned``: its ``planned_workers(options)``, or None.
    ``name``: the backend's name (the built-in's for a built-in under any alias, else the name it was
    registered under); ``key``: the registry key the call resolves, which runs and is admitted.
    """

    name: str
    options: frozenset[str] | None
    worker_processes: bool
    planned: Any = None
    key: str = attrs.field(default=attrs.Factory(lambda self: self.name, takes_self=True))
    processes_declared: bool = False

    def planned_world(self, options: EncodedDataOptions) -> tuple[int, int]:
        """``(workers, world size)`` this backend runs with ``options``, known before any worker starts.

        Workers come from ``planned_workers(options)``, else from ``num_workers``, else 1; worker
        processes make a world of that many, threads a world of one process. A backend that declares
        worker processes but neither plans them nor gets ``num_workers`` is refused (``ValueError``).
        """
        if self.planned is not None:
            workers = max(1, int(self.planned(options)))
        elif self.processes_declared and self.worker_processes and options.num_workers is None:
            raise ValueError(
                f"backend {self.name!r} declares worker_processes=True but no planned_workers, and no num_workers= "
                "was given: its world is unknown before its workers start, so it cannot be admitted. Pass "
                f"num_workers=, or register it with planned_workers=fn(options) -> worker count")
        else:
            workers = max(1, options.num_workers or 1)
        return workers, workers if self.worker_processes else 1


def backend_declaration(key: str) -> BackendDeclaration:
    """The declaration of the backend bound to ``key`` (a name or alias), with the safe defaults.

    Everything comes from what ``key`` is bound to, so an alias of a built-in that a third party has
    replaced under its main name (``override=True``) still declares the built-in.
    """
    key = normalize_backend_name(key)
    found = encoded_data_declaration(key)
    builtin = builtin_backend_name(get_encoded_data_backend(key))
    name = builtin if builtin is not None else encoded_data_registered_name(key)
    options = found.options
    added = declared_options(name)
    if options is not None or added is not None:
        options = HANDLE_OPTIONS | (options or frozenset()) | (added or frozenset())
    processes = True if found.worker_processes is None else found.worker_processes
    return BackendDeclaration(name, options, processes, found.planned_workers, key,
                              processes_declared=found.worker_processes is not None)


def builtin_declarations(names: Iterable[str]) -> dict[str, frozenset[str] | None]:
    """The options each registered backend of ``names`` honours (for 'backends honouring it')."""
    return {name: backend_declaration(name).options for name in names if is_encoded_data_backend(name)}


def honouring_backends(option: str, declared: Mapping[str, frozenset[str] | None]) -> list[str]:
    """The backends of ``declared`` that honour ``option``."""
    return sorted(name for name, opts in declared.items() if opts is not None and option in opts)


def _check_precision(precision: Any, backend: str) -> None:
    text = getattr(precision, "__name__", None) or str(precision)
    if precision is not None and text.lower() not in EM_PRECISIONS[1:]:
        raise ValueError(f"precision={precision!r} is not honoured by backend {backend!r}: its engine 'numpy' "
                         f"computes in float64 only (honoured: {', '.join(map(str, EM_PRECISIONS[1:]))}); "
                         "drop precision= or pass 'fp64' (engine='torch' also computes in 'fp32')")


def check_backend_options(declaration: BackendDeclaration, options: EncodedDataOptions, numpy_engine: bool,
                          declared: Mapping[str, frozenset[str] | None]) -> None:
    """Raise ``ValueError`` for an option set in ``options`` that the backend does not honour.

    ``numpy_engine``: the E-step runs on the numpy engine, whose precision is float64 only.
    """
    backend, honoured = declaration.name, declaration.options
    if numpy_engine:
        _check_precision(options.precision, backend)
    if honoured is None:
        return
    known = set(option_names())
    for name in sorted(options.set_options()):
        if name in honoured:
            continue
        others = honouring_backends(name, declared)
        where = (f"backends honouring it: {', '.join(others)}" if others
                 else "no backend honours it" if name in known else "no backend takes such a keyword")
        raise ValueError(f"encoded_data option {name}= is not honoured by backend {backend!r}; {where}. "
                         f"Drop it or choose such a backend; {backend!r} honours: {', '.join(sorted(honoured))}")


def capped_workers(declaration: BackendDeclaration, options: EncodedDataOptions, planned: int) -> EncodedDataOptions:
    """``num_workers`` above what the backend plans to run becomes that count, with a warning.

    Only a backend that declares ``planned_workers`` is capped: without it, ``num_workers`` is its world.
    """
    asked = options.num_workers
    if declaration.planned is None or asked is None or asked <= planned:
        return options
    warnings.warn(f"backend {declaration.name!r} cannot use num_workers={asked} here; running {planned} worker(s)",
                  UserWarning, stacklevel=4)
    return options.replace(num_workers=planned)


def refuse_for_runner(backend: str, given: Mapping[str, Any], which: str, needed: str) -> None:
    """Refuse the backend keywords in ``given``, which ``backend`` honours only with ``needed`` (not ``which``)."""
    if given:
        names = ", ".join(f"{k}=" for k in sorted(given))
        raise ValueError(f"option(s) {names} are not honoured by backend {backend!r} over {which}: its task runner "
                         f"sends one task per chunk and pass; they are honoured with {needed}, or drop them")
