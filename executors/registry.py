"""Name -> executor registries: built-ins register the same way a third party does."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from typing import Any

import attrs

from ..contracts.errors import UnknownBackendError
from ..verification.backend_names import BackendDirectory, use_backend_directory

__all__ = [
    "EncodedDataDeclaration",
    "available_encoded_data_backends",
    "available_training_backends",
    "encoded_data_declaration",
    "encoded_data_registered_name",
    "get_encoded_data_backend",
    "is_encoded_data_backend",
    "get_training_backend",
    "normalize_backend_name",
    "register_encoded_data_backend",
    "register_training_backend",
    "register_encoded_data_verification",
    "register_verification_target",
    "unregister_encoded_data_backend",
    "unregister_training_backend",
    "verification_target",
]

_lock = threading.RLock()
_training_backends: dict[str, Any] = {}
_training_is_factory: dict[str, bool] = {}
_encoded_data_backends: dict[str, Callable[..., Any]] = {}
_encoded_data_declarations: dict[str, EncodedDataDeclaration] = {}
_encoded_data_names: dict[str, str] = {}  # key -> the name it was registered under (aliases -> their name)


def normalize_backend_name(name: str) -> str:
    """Canonical registry key: stripped, lower-case, '-' replaced by '_'."""
    if not isinstance(name, str):
        raise TypeError(f"backend name must be a str, got {type(name).__name__} ({name!r})")
    key = name.strip().lower().replace("-", "_")
    if not key:
        raise ValueError("backend name must be a non-empty string, got an empty or blank name")
    return key


def _is_lazy_factory(backend: Any) -> bool:
    """A class or a plain callable without ``prepare`` is a factory, an object with it is an instance."""
    return inspect.isclass(backend) or (callable(backend) and not hasattr(backend, "prepare"))


def register_training_backend(name: str, backend: Any, *, override: bool = False) -> None:
    """Register a backend instance or a lazy zero-argument factory under ``name``.

    Re-registering the identical object is a no-op; a different object under a taken name is a
    ``ValueError`` unless ``override=True``.
    """
    key = normalize_backend_name(name)
    with _lock:
        current = _training_backends.get(key)
        if current is not None and current is not backend and not override:
            raise ValueError(
                f"training backend {key!r} is already registered to {current!r}; "
                "pass override=True to replace it deliberately"
            )
        _training_backends[key] = backend
        _training_is_factory[key] = _is_lazy_factory(backend)


def get_training_backend(name: str) -> Any:
    """Resolve a registered backend, calling a lazy zero-argument factory once."""
    key = normalize_backend_name(name)
    with _lock:
        if key not in _training_backends:
            raise UnknownBackendError(
                f"unknown training backend {name!r}; available: {', '.join(available_training_backends()) or '(none)'}"
            )
        if _training_is_factory[key]:
            _training_backends[key] = _training_backends[key]()
            _training_is_factory[key] = False
        return _training_backends[key]


def available_training_backends() -> tuple[str, ...]:
    """Names of every registered training backend, sorted."""
    with _lock:
        return tuple(sorted(_training_backends))


@attrs.frozen
class EncodedDataDeclaration:
    """What an encoded-data backend declares at registration (None: not declared).

    ``options``: the ``encoded_data`` options it honours besides every handle's own (an option set
    that it does not honour is refused before any worker starts; undeclared: it receives every
    option, mixle 0.8.2's contract). ``worker_processes``: whether its workers are processes
    (undeclared counts as yes, so a backend that starts processes is never admitted as one local
    process). ``planned_workers(options)``: the workers it will run, known before any starts
    (undeclared: ``num_workers``, else 1).
    """

    options: frozenset[str] | None = None
    worker_processes: bool | None = None
    planned_workers: Callable[[Any], int] | None = None


def _declaration(name: str, options: Any, worker_processes: Any, planned_workers: Any) -> EncodedDataDeclaration:
    if options is not None:
        if isinstance(options, str) or not all(isinstance(o, str) and o.isidentifier() for o in options):
            raise TypeError(f"options= of encoded-data backend {name!r} must be a collection of option names "
                            f"(identifiers), got {options!r}")
        options = frozenset(options)
    if worker_processes is not None and not isinstance(worker_processes, bool):
        raise TypeError(f"worker_processes= of encoded-data backend {name!r} must be True or False, "
                        f"got {worker_processes!r}")
    if planned_workers is not None and not callable(planned_workers):
        raise TypeError(f"planned_workers= of encoded-data backend {name!r} must be a function of the options "
                        f"returning the worker count, got {planned_workers!r}")
    return EncodedDataDeclaration(options, worker_processes, planned_workers)


def register_encoded_data_backend(
    name: str,
    factory: Callable[..., Any],
    aliases: tuple[str, ...] | list[str] = (),
    *,
    override: bool = False,
    options: Any = None,
    worker_processes: bool | None = None,
    planned_workers: Callable[[Any], int] | None = None,
) -> None:
    """Register ``factory(data, **params) -> handle`` under ``name`` and every alias (mixle's call).

    ``params`` are ``encoded_data``'s keywords, with the caller's estimator, model and encoder
    objects as given. A name or alias bound to a different factory is a ``ValueError`` unless
    ``override=True``; re-registering the identical factory is a no-op. Nothing is bound when any
    key collides. The declarations (see :class:`EncodedDataDeclaration`) may also be attributes of
    the factory (``encoded_data_options``, ``worker_processes``, ``planned_workers``); the keywords
    here win.
    """
    if not callable(factory):
        raise TypeError(f"encoded-data backend factory for {name!r} must be callable, got {factory!r}")
    if isinstance(aliases, str):
        raise TypeError(f"aliases must be a sequence of names, got the string {aliases!r}")
    declaration = _declaration(name, options, worker_processes, planned_workers)
    keys = [normalize_backend_name(name)] + [normalize_backend_name(a) for a in aliases]
    with _lock:
        if not override:
            for key in keys:
                current = _encoded_data_backends.get(key)
                if current is not None and current is not factory:
                    raise ValueError(
                        f"encoded-data backend {key!r} is already registered to {current!r}; "
                        "pass override=True to replace it deliberately"
                    )
        for key in keys:
            _encoded_data_backends[key] = factory
            _encoded_data_declarations[key] = declaration
            _encoded_data_names[key] = keys[0]


def encoded_data_declaration(name: str) -> EncodedDataDeclaration:
    """The declaration of the backend registered under ``name``: the registration's keywords, completed by
    the factory's attributes (``encoded_data_options``, ``worker_processes``, ``planned_workers``)."""
    key = normalize_backend_name(name)
    factory = get_encoded_data_backend(key)
    with _lock:
        declared = _encoded_data_declarations.get(key, EncodedDataDeclaration())
    options = declared.options
    if options is None and getattr(factory, "encoded_data_options", None) is not None:
        options = frozenset(factory.encoded_data_options)  # type: ignore[attr-defined]  # checked just above
    processes = declared.worker_processes
    if processes is None and isinstance(getattr(factory, "worker_processes", None), bool):
        processes = factory.worker_processes  # type: ignore[attr-defined]  # checked just above
    planned = declared.planned_workers or getattr(factory, "planned_workers", None)
    return EncodedDataDeclaration(options, processes, planned if callable(planned) else None)


def encoded_data_registered_name(name: str) -> str:
    """The name the backend bound to ``name`` was registered under (an alias gives its backend's name)."""
    key = normalize_backend_name(name)
    with _lock:
        return _encoded_data_names.get(key, key)


def get_encoded_data_backend(name: str) -> Callable[..., Any]:
    """The factory registered under ``name`` (or one of its aliases)."""
    key = normalize_backend_name(name)
    with _lock:
        try:
            return _encoded_data_backends[key]
        except KeyError:
            raise UnknownBackendError(
                f"unknown encoded-data backend {name!r}; available: "
                f"{', '.join(available_encoded_data_backends()) or '(none)'}"
            ) from None


def is_encoded_data_backend(name: str) -> bool:
    """Whether ``name`` (or an alias) is registered."""
    with _lock:
        return normalize_backend_name(name) in _encoded_data_backends


def available_encoded_data_backends() -> tuple[str, ...]:
    """Every registered encoded-data backend name and alias, sorted."""
    with _lock:
        return tuple(sorted(_encoded_data_backends))


def unregister_training_backend(name: str) -> None:
    """Remove a training backend (for tests and hot-swapping); unknown names are ignored."""
    key = normalize_backend_name(name)
    with _lock:
        _training_backends.pop(key, None)
        _training_is_factory.pop(key, None)


def unregister_encoded_data_backend(name: str) -> None:
    """Remove one encoded-data backend key (for tests); unknown names are ignored."""
    with _lock:
        _encoded_data_backends.pop(normalize_backend_name(name), None)
        _encoded_data_declarations.pop(normalize_backend_name(name), None)
        _encoded_data_names.pop(normalize_backend_name(name), None)


_verification_targets: dict[str, Any] = {}
_encoded_data_verification: list[Callable[[str], Any]] = []


def register_encoded_data_verification(adapter: Callable[[str], Any]) -> None:
    """Set the adapter that verifies any registered encoded-data backend by name (``adapter(name)``).

    ``estimation.verifiable`` sets it, so a third party's ``register_encoded_data_backend`` name is
    certifiable the same way as the built-in ones, with no second registration.
    """
    with _lock:
        _encoded_data_verification[:] = [adapter]


def register_verification_target(name: str, target: Any, *, override: bool = False) -> None:
    """Bind a backend name to what the verification harness measures for it.

    ``target`` is a ``"module:attr"`` spec (resolved inside each harness rank) or a zero-argument
    factory returning an executor object that implements ``contracts.VerifiableExecutor``.
    """
    key = normalize_backend_name(name)
    with _lock:
        current = _verification_targets.get(key)
        if current is not None and current != target and not override:
            raise ValueError(
                f"verification target for {key!r} is already {current!r}; pass override=True to replace it"
            )
        _verification_targets[key] = target


def verification_target(name: str) -> Any:
    """The harness target of a registered backend name: a ``module:attr`` spec or an executor object.

    A value containing ``:`` is already a spec and is returned unchanged.
    """
    if ":" in name:
        return name
    key = normalize_backend_name(name)
    with _lock:
        target = _verification_targets.get(key)
        if target is None and key in _encoded_data_backends and _encoded_data_verification:
            adapter = _encoded_data_verification[0]
            return adapter(key)
    if target is None:
        known = ", ".join(sorted(_verification_targets)) or "(none)"
        raise KeyError(
            f"backend {name!r} has no verification target; certifiable backends: {known}. "
            "Pass an executor as 'package.module:attribute' or register one with register_verification_target"
        )
    return target if isinstance(target, str) else target()


# ---- built-in training backends: lazy factories, nothing heavy is imported here ----------------
def _megatron_factory() -> Any:
    """Import the megatron backend (torch, megatron-core) on first use."""
    from .megatron.backend import create_megatron_backend

    return create_megatron_backend()


def _megatron_bridge_factory() -> Any:
    """The Megatron Bridge adapter (imports megatron.bridge only when a method needs it)."""
    from .megatron.bridge import MegatronBridgeBackend

    return MegatronBridgeBackend()


def _torch_native_factory() -> Any:
    """Import the torch_native backend (torch) on first use."""
    from .torch.backend import TorchDistributedBackend

    return TorchDistributedBackend()


register_training_backend("megatron", _megatron_factory)
register_training_backend("megatron_bridge", _megatron_bridge_factory)
register_training_backend("torch_native", _torch_native_factory)
register_verification_target("torch_native", "mixle_parallel.executors.torch.harness_adapter:VerifiableTorchNative")
register_verification_target("megatron", "mixle_parallel.executors.megatron.harness_adapter:VerifiableMegatron")
# verify/certify/conformance take these names: the harness asks the registry through this directory
use_backend_directory(BackendDirectory(target=verification_target, training=available_training_backends,
                                       encoded_data=available_encoded_data_backends,
                                       training_backend=get_training_backend))
