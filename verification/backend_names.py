"""Backend names the harness, ``verify``, ``certify`` and conformance accept, and how a fresh process finds them.

A backend is given as an executor object, as ``"package.module:attribute"``, or by a registered name:
a training backend (``register_training_backend``, measured through its ``register_verification_target``
or, when the backend object itself implements ``contracts.VerifiableExecutor``, as it is) or an EM
(encoded-data) backend (``register_encoded_data_backend``, built-in or third-party). The names live in
the executors' registry, which this layer never imports: the registry installs a ``BackendDirectory``
here when it loads (``use_backend_directory``).

A name registered by a third party's package is found by a fresh process in two ways:

* ``--import MODULE`` on ``mixle-parallel verify|certify|conformance`` (``import_modules``) imports the
  module that registers it before the name is looked up;
* an entry point in the group ``mixle_parallel.backends`` (``ENTRY_POINT_GROUP``) of the package's
  metadata: its value is a module whose import registers the backend, or a zero-argument function
  that registers it. A name not yet registered loads the entry points named like it first, then the
  rest of the group, and is looked up again (``load_registrations``).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from ..contracts.errors import UnknownBackendError

__all__ = ["ENTRY_POINT_GROUP", "BackendDirectory", "add_backend_arguments", "harness_target", "import_modules",
           "load_registrations", "use_backend_directory"]

ENTRY_POINT_GROUP = "mixle_parallel.backends"
"""Package metadata group whose entry points register backends (module, or zero-argument function)."""


@attrs.frozen
class BackendDirectory:
    """What the executors' registry tells the harness about names (installed by ``executors.registry``)."""

    target: Callable[[str], Any]
    """``verification_target(name)``: the harness target of a name; ``KeyError`` when it has none."""
    training: Callable[[], Sequence[str]]
    """``available_training_backends()``."""
    encoded_data: Callable[[], Sequence[str]]
    """``available_encoded_data_backends()``."""
    training_backend: Callable[[str], Any]
    """``get_training_backend(name)``."""


_DIRECTORY: list[BackendDirectory] = []
_MISSING = object()


def use_backend_directory(directory: BackendDirectory) -> None:
    """Install the registry's directory (the executors' registry calls this once when it loads)."""
    if not isinstance(directory, BackendDirectory):
        raise TypeError(f"directory must be a BackendDirectory, got {type(directory).__name__}")
    _DIRECTORY[:] = [directory]


def _key(name: str) -> str:
    """The registry's canonical form of a name (stripped, lower case, '-' as '_')."""
    return name.strip().lower().replace("-", "_")


def import_modules(modules: Sequence[str]) -> None:
    """Import each module (the ``--import`` option): importing a third party's module registers its backends."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ValueError(f"--import {module}: cannot import it ({exc}); it must be importable in this "
                             "environment (installed, or on PYTHONPATH)") from exc


def load_registrations(name: str | None = None) -> tuple[str, ...]:
    """Load the ``mixle_parallel.backends`` entry points (those named ``name`` when given); their values.

    An entry point's value is a module (imported) or ``module:function`` (imported and called with no
    arguments); either registers backends with the executors' registry.
    """
    from importlib.metadata import entry_points

    loaded = []
    for point in entry_points(group=ENTRY_POINT_GROUP):
        if name is not None and _key(point.name) != _key(name):
            continue
        try:
            found = point.load()
            if point.attr and callable(found):
                found()
        except Exception as exc:  # noqa: BLE001 - a broken plug-in is named, with what it raised
            raise ValueError(f"entry point {point.name} = {point.value} (group {ENTRY_POINT_GROUP}) failed to "
                             f"register its backend: {type(exc).__name__}: {exc}") from exc
        loaded.append(point.value)
    return tuple(loaded)


def _directory() -> BackendDirectory:
    if not _DIRECTORY:
        raise ValueError("backend names need the executors' registry: import mixle_parallel (or pass the backend "
                         "as 'package.module:attribute')")
    return _DIRECTORY[0]


def _lookup(directory: BackendDirectory, name: str) -> Any:
    """The harness target of ``name``, ``_MISSING`` when no registry knows it; ``KeyError`` when one does
    but cannot verify it (a wrapper over another backend, a training backend with no target)."""
    try:
        return directory.target(name)
    except KeyError as exc:
        why = str(exc.args[0]) if exc.args else str(exc)
    key = _key(name)
    if key in directory.training():
        backend = directory.training_backend(key)
        if callable(getattr(backend, "open_trial", None)):
            return backend
        raise UnknownBackendError(f"training backend {name!r} is registered but cannot be verified: it has no "
                                  f"open_trial and {why}")
    if key in directory.encoded_data():
        raise UnknownBackendError(f"EM backend {name!r} is registered but cannot be verified by itself: {why}")
    return _MISSING


def _unknown(name: str, directory: BackendDirectory) -> UnknownBackendError:
    training = ", ".join(sorted(directory.training())) or "(none)"
    em = ", ".join(sorted(directory.encoded_data())) or "(none)"
    return UnknownBackendError(
        f"unknown backend {name!r}: registered training backends: {training}; registered EM (encoded-data) "
        f"backends: {em}. Pass an executor as 'package.module:attribute', import the module that registers "
        f"the name first (--import MODULE on the command line), or declare it in the entry-point group "
        f"'{ENTRY_POINT_GROUP}' of its package")


def harness_target(spec: Any) -> Any:
    """What the harness measures for ``spec``: a registered name becomes its target (a ``module:attr`` spec
    or an executor object); an object or a ``module:attr`` string is returned as it is.

    A name no registry knows loads the ``mixle_parallel.backends`` entry points (named like it, then all)
    and is looked up again; still unknown, it is an ``UnknownBackendError`` listing what is registered.
    """
    if not isinstance(spec, str) or ":" in spec:
        return spec
    directory = _directory()
    found = _lookup(directory, spec)
    if found is _MISSING and (load_registrations(spec) or load_registrations()):
        found = _lookup(directory, spec)
    if found is _MISSING:
        raise _unknown(spec, directory)
    return found


def add_backend_arguments(parser: argparse.ArgumentParser) -> None:
    """``--backend NAME|module:attr`` and ``--import MODULE`` (verify, certify and conformance share them)."""
    parser.add_argument("--backend", required=True,
                        help="a registered training or EM (encoded-data) backend name, or 'package.module:attribute'")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="import MODULE first (repeatable): a third party's module that registers the backend; "
                             f"its package may instead declare it in the entry-point group '{ENTRY_POINT_GROUP}'")
