"""``encoded_data``: create a resident encoded-data handle through the backend registry, or reuse one.

Every EM entry point (``encoded_data``, ``fit``/``optimize``, ``stochastic_em``, the reference
handle classes) comes here with its options made into :class:`EncodedDataOptions` and
:class:`VerificationOptions` at once: :func:`handle_for` either refuses controls for an existing
handle or checks the options against the backend's declaration, admits the run, calls the
backend's factory and binds the verification, in that order, before any worker starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...contracts import AdmissionMode, NotAdmittedError
from ...contracts.estimation import EncodedDataHandle
from ...verification.admission import AdmissionDecision
from ..registry import available_encoded_data_backends, get_encoded_data_backend
from .admission.em_admission import admit_encoded_data, refuse_unbound_code
from .backends.backend_declaration import (
    BackendDeclaration,
    backend_declaration,
    builtin_declarations,
    capped_workers,
    check_backend_options,
)
from .backends.builtin_backends import (
    BUILTIN_ENCODED_DATA_BACKENDS,
    builtin_backend_name,
    register_builtin_encoded_data_backends,
)
from .backends.process_watch import started_by
from .compat.mixle_interop import adapt_mixle_objects
from .em_pass.data_checks import check_rows
from .em_pass.engine_choice import engine_hint, resolve_engine
from .em_pass.runner_protocols import BindsVerification, CountsWorkers
from .options import EncodedDataOptions, VerificationOptions, split_keywords
from .sources import check_source

__all__ = ["EncodedDataControlConflictError", "EncodedDataOptions", "VerificationOptions", "encoded_data",
           "is_encoded_data_handle"]


class EncodedDataControlConflictError(ValueError):
    """Controls were given together with an already encoded handle, which cannot change."""


def is_encoded_data_handle(obj: Any) -> bool:
    """True when ``obj`` exposes the encoded-data handle contract (the ``pysp_seq_*`` methods)."""
    return isinstance(obj, EncodedDataHandle)


def encoded_data(data: Any, estimator: Any | None = None, model: Any | None = None, encoder: Any | None = None,
                 placement: Any | None = None, resources: Any | None = None, engine: Any | None = None,
                 precision: Any | None = None, num_chunks: int | None = None, sub_chunks: int = 1,
                 backend: str | None = None, num_workers: int | None = None, client: Any | None = None,
                 comm: Any | None = None, root: int = 0, root_only: bool = False, parallel_chunks: bool = False,
                 chunk_workers: int | None = None, batch_size: int | None = None, shuffle: bool | None = None,
                 seed: int | None = None, **keywords: Any) -> Any:
    """Create an encoded-data handle on ``backend`` (default ``local``), or reuse a handle unchanged.

    The parameters are mixle 0.8.2's. ``keywords`` are ours, made into the options objects at once:
    ``chunk_size=``; the verification controls of :class:`VerificationOptions` (``admission``,
    ``audit``, ``audit_rate``, ``audit_policy``, ``audit_seed``, ``ledger``, ``fault_injector``);
    ``options=`` an :class:`EncodedDataOptions` and ``verification=`` a :class:`VerificationOptions`
    (an option given twice is refused); anything else is a backend keyword (``timeout=`` for
    ``mp``...). Each option must be honoured by the backend, which declares what it honours: one set
    that it does not raises ``ValueError`` naming the option, the backend and the backends that do,
    before any worker starts. Passing an existing handle with any control set raises
    ``EncodedDataControlConflictError``: a handle's data is already placed; omit the controls to
    reuse it. Rows are checked first (empty data, NaN/inf, complex, object or string values raise
    ``ValueError``); mixle 0.8.2 estimators, distributions and encoders work (the backend's factory
    receives them as given). On more than one worker process the run is admitted first (automatic
    certification on the spot where it can, see docs/verification.md); ``admission="unverified"``
    runs anyway and says so in every receipt and ledger entry.
    """
    mixle = {k: v for k, v in locals().items() if k not in ("data", "backend", "keywords")}
    options, verification = options_from_keywords({**mixle, **keywords})
    return handle_for(data, backend, options, verification)[0]


def options_from_keywords(keywords: Mapping[str, Any]) -> tuple[EncodedDataOptions, VerificationOptions]:
    """The options objects of a call's keywords (``options=`` / ``verification=`` objects merged in)."""
    rest = dict(keywords)
    return split_keywords(rest, options=rest.pop("options", None), verification=rest.pop("verification", None))


def handle_for(data: Any, backend: str | None, options: EncodedDataOptions,
               verification: VerificationOptions) -> tuple[EncodedDataHandle, bool]:
    """``(handle, created)``: ``data`` itself when it is a handle (any control set is refused), else a new handle
    on ``backend`` built under ``options`` and ``verification``."""
    if is_encoded_data_handle(data):
        _refuse_controls(data, backend, options, verification)
        return data, False
    return _create(data, _backend_name(backend), options, verification), True


def _refuse_controls(handle: EncodedDataHandle, backend: str | None, options: EncodedDataOptions,
                     verification: VerificationOptions) -> None:
    """Raise ``EncodedDataControlConflictError`` when any control is set for an existing handle."""
    given = options.set_options()
    conflicts = [name for name in given if name not in options.extra]
    conflicts += ["backend"] if backend is not None else []
    conflicts += list(verification.set_options()) + sorted(options.extra)
    if conflicts:
        raise EncodedDataControlConflictError(
            f"an existing encoded handle ({handle!r}) cannot apply control(s): {', '.join(conflicts)}; "
            "omit them to reuse the handle unchanged, or build a new handle from the raw data"
        )


def _backend_name(backend: Any) -> str:
    """The backend name (``local`` for None), checked."""
    if backend is None:
        return "local"
    if not isinstance(backend, str) or not backend.strip():
        raise ValueError(
            f"encoded-data backend must be a non-empty name (or None for 'local'), got {backend!r}; "
            f"registered: {', '.join(available_encoded_data_backends())}"
        )
    return backend


def _create(data: Any, backend: str, options: EncodedDataOptions, verification: VerificationOptions) -> Any:
    """Check, admit, build and bind a new handle; nothing starts before every check has passed."""
    register_builtin_encoded_data_backends()
    try:
        factory = get_encoded_data_backend(backend)
    except KeyError as exc:
        raise ValueError(str(exc.args[0]) + engine_hint(backend)) from None
    declaration = backend_declaration(backend)
    _check_call(data, declaration, options)
    workers, world = declaration.planned_world(options)
    options = capped_workers(declaration, options, workers)
    decision, certificate = admit_encoded_data(declaration.key, admission=verification.admission, workers=workers,
                                               world_size=world, options=options)
    if builtin_backend_name(factory) is not None:  # a built-in declares its world in its engine module
        handle, started = factory(data, **options.as_kwargs()), frozenset[int]()
    else:
        handle, started = started_by(lambda: factory(data, **options.as_kwargs()))
    try:
        _refuse_unplanned_world(handle, declaration, decision, world, started)
        refuse_unbound_code(handle, declaration.key, decision)
    except BaseException:
        handle.close()
        raise
    return _attach_verification(handle, declaration.name, decision, certificate, verification)


def _check_call(data: Any, declaration: BackendDeclaration, options: EncodedDataOptions) -> None:
    """Every check that needs no worker: rows, engine, the options against the declaration, mini-batches."""
    estimator, model, encoder = adapt_mixle_objects(options.estimator, options.model, options.encoder)
    if not check_source(data, declaration.name):  # a source is checked where its rows are read
        check_rows(data, estimator=estimator, model=model, encoder=encoder)
    choice = resolve_engine(options.engine, options.precision)
    check_backend_options(declaration, options, choice is None, builtin_declarations(BUILTIN_ENCODED_DATA_BACKENDS))
    if choice is not None:
        from .em_pass.torch_engine import check_engine  # torch: only when asked

        check_engine(choice, estimator, model)
    stochastic = options.batch_size is not None or options.shuffle is not None or options.seed is not None
    if stochastic and options.batch_size is None and not hasattr(data, "__len__"):
        raise ValueError("batch_size= is needed when this process does not hold the rows (root_only=True): every "
                         "rank must cut the same mini-batches, so give the rows per batch")


def _refuse_unplanned_world(handle: EncodedDataHandle, declaration: BackendDeclaration, decision: AdmissionDecision,
                            world: int, started: frozenset[int]) -> None:
    """A handle admitted as one local process that runs worker processes is refused: more workers than
    planned reported by the handle, or any child process the factory started (``started``)."""
    if decision.mode != AdmissionMode.LOCAL:
        return
    if started:
        raise NotAdmittedError(
            f"backend {declaration.name!r} started {len(started)} process(es) "
            f"(pids {', '.join(map(str, sorted(started)))}) while it was admitted as one local process: it "
            "declared no world of worker processes. Register it with planned_workers= (or pass num_workers=) so "
            "its world is admitted, certified, before it starts")
    workers = handle.num_workers if isinstance(handle, CountsWorkers) else None
    if not declaration.worker_processes or not isinstance(workers, int) or workers <= world:
        return
    raise NotAdmittedError(
        f"backend {declaration.name!r} started {workers} worker processes but planned a world of {world}, "
        "which was admitted as one local process; register it with planned_workers= (or "
        "worker_processes=False if its workers are threads), or pass num_workers=")


def _attach_verification(handle: EncodedDataHandle, backend: str, decision: AdmissionDecision, certificate: Any,
                         verification: VerificationOptions) -> EncodedDataHandle:
    """Bind the admission decision, SDC audit and ledger to a new handle; close it if that fails."""
    if not isinstance(handle, BindsVerification):
        asked = [k for k in verification.set_options()  # audit=False on a handle with no audit is honoured as is
                 if k != "admission" and not (k == "audit" and verification.audit is False)]
        if asked:
            handle.close()
            raise ValueError(f"backend {backend!r} returned a {type(handle).__name__}, which has no SDC audit or "
                             f"ledger; drop {', '.join(asked)} or build the backend on ChunkedEncodedData")
        return handle
    try:
        handle.attach_verification(verification, admission=decision, certificate=certificate)
    except BaseException:
        handle.close()
        raise
    return handle
