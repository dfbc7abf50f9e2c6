"""``encoded_data``: create a resident encoded-data handle through the backend registry."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from ...contracts.estimation import EncodedDataHandle
from ..registry import available_encoded_data_backends, get_encoded_data_backend
from .builtin_backends import (
    BUILTIN_ENCODED_DATA_BACKENDS,
    register_builtin_encoded_data_backends,
)
from .data_checks import check_rows
from .em_admission import admit_encoded_data, canonical_backend, planned_world
from .engine_choice import resolve_engine
from .minibatch import minibatch_spec
from .mixle_interop import adapt_mixle_objects
from .options import (
    EncodedDataOptions,
    check_backend_options,
    sub_chunked,
)
from .options import backend_options as backend_options_of

__all__ = ["EncodedDataControlConflictError", "EncodedDataOptions", "encoded_data", "is_encoded_data_handle"]


class EncodedDataControlConflictError(ValueError):
    """Controls were given together with an already encoded handle, which cannot change."""


def is_encoded_data_handle(obj: Any) -> bool:
    """True when ``obj`` exposes the encoded-data handle contract (the ``pysp_seq_*`` methods)."""
    return isinstance(obj, EncodedDataHandle)


_CONTROL_DEFAULTS: dict[str, Any] = {"sub_chunks": 1, "root": 0, "audit_policy": "quarantine", "audit_seed": 0}
"""Controls of ``encoded_data`` whose default is not None (the others are set when not None)."""

_FLAG_CONTROLS = ("root_only", "parallel_chunks")
"""Boolean controls: set when true."""


def _refuse_controls(handle: Any, controls: dict[str, Any], backend_options: dict[str, Any]) -> None:
    """Raise ``EncodedDataControlConflictError`` when any control is set for an existing handle."""
    conflicts = []
    for name, value in controls.items():
        if name in _FLAG_CONTROLS:
            active = bool(value)
        elif name in _CONTROL_DEFAULTS:
            active = value != _CONTROL_DEFAULTS[name]
        else:
            active = value is not None
        if active:
            conflicts.append(name)
    conflicts.extend(sorted(backend_options))
    if conflicts:
        raise EncodedDataControlConflictError(
            f"an existing encoded handle ({handle!r}) cannot apply control(s): {', '.join(conflicts)}; "
            "omit them to reuse the handle unchanged, or build a new handle from the raw data"
        )


def encoded_data(
    data: Any,
    estimator: Any | None = None,
    model: Any | None = None,
    encoder: Any | None = None,
    placement: Any | None = None,
    resources: Any | None = None,
    engine: Any | None = None,
    precision: Any | None = None,
    num_chunks: int | None = None,
    sub_chunks: int = 1,
    backend: str | None = None,
    num_workers: int | None = None,
    client: Any | None = None,
    comm: Any | None = None,
    root: int = 0,
    root_only: bool = False,
    parallel_chunks: bool = False,
    chunk_workers: int | None = None,
    batch_size: int | None = None,
    shuffle: bool | None = None,
    seed: int | None = None,
    chunk_size: int | None = None,
    *,
    admission: Any = None,
    audit: bool | None = None,
    audit_rate: float | None = None,
    audit_policy: str = "quarantine",
    audit_seed: int = 0,
    ledger: Any = None,
    fault_injector: Any = None,
    options: EncodedDataOptions | None = None,
    **backend_options: Any,
) -> Any:
    """Create an encoded-data handle on ``backend`` (default ``local``), or reuse a handle unchanged.

    Passing an existing handle with any control set raises ``EncodedDataControlConflictError``: a
    handle's data is already placed, so controls cannot apply; omit them to reuse it.
    The options (these keywords, or ``options=`` an :class:`EncodedDataOptions`; ``backend_options``
    are engine keywords such as ``timeout=`` for ``mp``) are checked against what the backend
    declares it honours: one it does not raises ``ValueError`` naming it and the backends that do,
    before any worker starts. ``sub_chunks`` cuts every chunk into that many (``sub_chunks=8``
    alone gives 8 chunks on small data). mixle 0.8.2 estimators, distributions and encoders are
    adapted (``seq_*`` protocol). Rows are checked first: empty data, NaN/inf (first bad row and
    column), complex, object or string values raise ``ValueError``.

    Verification (see docs/verification.md):

    * ``admission``: on a real device mesh (more than one worker process) the run needs a signed
      certificate for ``em_<backend>`` that passes the gate: with ``admission=None`` one from the
      local store, or (mp, dask, ray, spark) one made on the spot once and stored; or the signed
      certificate / its path passed here. Else ``NotAdmittedError`` is raised before any worker
      starts; ``admission="unverified"`` runs anyway and says so in the handle and every ledger entry.
    * ``audit`` / ``audit_rate`` / ``audit_policy`` / ``audit_seed``: the SDC audit of E-steps
      (default on with two workers or more, rate 0.05 and at least one chunk per fit; policy
      ``quarantine``, ``raise`` or ``warn``). Findings: ``handle.audit_records``.
    * ``ledger``: a ``verification.Ledger`` (or a path): run_start, one receipt per E-step, audit
      records, run_end on ``close``.
    * ``fault_injector``: a ``verification.FaultInjector`` of ``BitFlip("statistic", "chunk:<c>",
      rank=<worker>, step=<iteration>, index, bit)`` to prove the audit (tests, drills).
    """
    if is_encoded_data_handle(data):
        # the first statement: locals() holds exactly the parameters, in their order
        controls = {k: v for k, v in locals().items() if k not in ("data", "backend_options")}
        _refuse_controls(data, controls, backend_options)
        return data
    backend = _checked_call(backend, sub_chunks, root_only, num_chunks, chunk_size)
    estimator, model, encoder = adapt_mixle_objects(estimator, model, encoder)
    check_rows(data, estimator=estimator, model=model, encoder=encoder)
    num_chunks, chunk_size = sub_chunked(_rows_or_none(data), num_chunks, chunk_size, sub_chunks)
    given = EncodedDataOptions(
        estimator=estimator, model=model, encoder=encoder, placement=placement, resources=resources, engine=engine,
        precision=precision, num_chunks=num_chunks, sub_chunks=sub_chunks, num_workers=num_workers, client=client,
        comm=comm, root=root, root_only=root_only, parallel_chunks=parallel_chunks, chunk_workers=chunk_workers,
        batch_size=batch_size, shuffle=shuffle, seed=seed, chunk_size=chunk_size, extra=dict(backend_options))
    opts = _with_engine(_merge_options(given, options))
    register_builtin_encoded_data_backends()
    try:
        factory = get_encoded_data_backend(backend)
    except KeyError as exc:
        raise ValueError(str(exc.args[0])) from None
    name = canonical_backend(backend, BUILTIN_ENCODED_DATA_BACKENDS)
    check_backend_options(name, opts, backend_options_of(name, factory), _declared_options())
    opts = _checked_engine(opts)
    opts = _minibatch_chunking(opts, _rows_or_none(data))
    workers, world = planned_world(factory, opts)
    opts = _cap_workers(name, opts, workers)
    decision, certificate = admit_encoded_data(name, admission=admission, workers=workers, world_size=world)
    kwargs = opts.as_kwargs()
    kwargs["sub_chunks"] = 1  # already applied to num_chunks / chunk_size
    handle = factory(data, **kwargs)
    verification = {"audit": audit, "audit_rate": audit_rate, "audit_policy": audit_policy, "audit_seed": audit_seed,
                    "ledger": ledger, "fault_injector": fault_injector}
    return _attach_verification(handle, backend, decision, certificate, verification)


def _checked_call(backend: Any, sub_chunks: Any, root_only: bool, num_chunks: Any, chunk_size: Any) -> str:
    """The backend name (``local`` for None) once the call's own arguments are checked."""
    if backend is None:
        backend = "local"
    if not isinstance(backend, str) or not backend.strip():
        raise ValueError(
            f"encoded-data backend must be a non-empty name (or None for 'local'), got {backend!r}; "
            f"registered: {', '.join(available_encoded_data_backends())}"
        )
    if isinstance(sub_chunks, bool) or not isinstance(sub_chunks, int) or sub_chunks < 1:
        raise ValueError(f"sub_chunks must be an int >= 1, got {sub_chunks!r}")
    if root_only and sub_chunks > 1 and num_chunks is None and chunk_size is None:
        raise ValueError("with root_only=True, sub_chunks needs num_chunks= or chunk_size= (only the root "
                         "knows the rows, and every rank must cut the same chunks)")
    return backend


def _rows_or_none(data: Any) -> int | None:
    try:
        return len(data)
    except TypeError:
        return None


def _minibatch_chunking(opts: EncodedDataOptions, num_rows: int | None) -> EncodedDataOptions:
    """With ``batch_size``, ``shuffle`` or ``seed`` set: them checked (``batch_size`` None is a tenth of the
    rows, ``shuffle`` None True, ``seed`` None 0) and, with no chunking given, ``chunk_size=batch_size``."""
    if opts.batch_size is None and opts.shuffle is None and opts.seed is None:
        return opts
    if num_rows is None and opts.batch_size is None:
        raise ValueError("batch_size= is needed when this process does not hold the rows (root_only=True): every "
                         "rank must cut the same mini-batches, so give the rows per batch")
    spec = minibatch_spec(num_rows or 0, opts.batch_size, opts.shuffle, opts.seed)
    chunk_size = spec.batch_size if opts.num_chunks is None and opts.chunk_size is None else opts.chunk_size
    return dataclasses.replace(opts, batch_size=spec.batch_size, shuffle=spec.shuffle, seed=spec.seed,
                               chunk_size=chunk_size)


def _merge_options(given: EncodedDataOptions, options: EncodedDataOptions | None) -> EncodedDataOptions:
    """The keyword options and an ``options=`` object together; one option set in both is refused."""
    if options is None:
        return given
    if not isinstance(options, EncodedDataOptions):
        raise TypeError(f"options= must be an EncodedDataOptions, got {type(options).__name__}")
    mine, theirs = given.set_options(), options.set_options()
    both = sorted(set(mine) & set(theirs))
    if both:
        raise ValueError(f"option(s) {', '.join(both)} given both as keywords and in options=; give each once")
    merged = {**options.as_kwargs(), **{k: v for k, v in mine.items() if k not in given.extra}}
    extra = {**options.extra, **given.extra}
    return EncodedDataOptions(**{k: v for k, v in merged.items() if k not in extra}, extra=extra)


def _with_engine(opts: EncodedDataOptions) -> EncodedDataOptions:
    """``engine=`` parsed (unknown names and precisions the engine lacks raise here): None for the numpy
    engine, whose ``precision=`` the backend check judges; an ``EngineChoice`` carrying the precision else."""
    choice = resolve_engine(opts.engine, opts.precision)
    if choice is None:
        return dataclasses.replace(opts, engine=None)
    return dataclasses.replace(opts, engine=choice, precision=None)


def _checked_engine(opts: EncodedDataOptions) -> EncodedDataOptions:
    """The torch engine's device resolved and the model checked for kernels, before any worker starts."""
    if opts.engine is None:
        return opts
    from .engines.torch_engine import check_engine  # torch: only when asked

    return dataclasses.replace(opts, engine=check_engine(opts.engine, opts.estimator, opts.model))


def _declared_options() -> dict[str, frozenset[str] | None]:
    """Every registered built-in backend's declared options (for 'backends honouring it')."""
    out: dict[str, frozenset[str] | None] = {}
    for name in BUILTIN_ENCODED_DATA_BACKENDS:
        out[name] = backend_options_of(name, get_encoded_data_backend(name))
    return out


def _cap_workers(name: str, opts: EncodedDataOptions, planned: int) -> EncodedDataOptions:
    """``num_workers`` above what the backend can use becomes the planned count, with a warning."""
    asked = opts.num_workers
    if isinstance(asked, int) and not isinstance(asked, bool) and asked > planned:
        warnings.warn(f"backend {name!r} cannot use num_workers={asked} here; running {planned} worker(s)",
                      UserWarning, stacklevel=3)
        return dataclasses.replace(opts, num_workers=planned)
    return opts


def _attach_verification(handle: Any, backend: str, decision: Any, certificate: Any,
                         verification: dict[str, Any]) -> Any:
    """Bind the admission decision, SDC audit and ledger to a new handle; close it if that fails."""
    attach = getattr(handle, "attach_verification", None)
    if attach is None:
        asked = [k for k in ("audit", "audit_rate", "ledger", "fault_injector") if verification[k] is not None]
        if asked:
            handle.close()
            raise ValueError(f"backend {backend!r} returned a {type(handle).__name__}, which has no SDC audit or "
                             f"ledger; drop {', '.join(asked)} or build the backend on ChunkedEncodedData")
        return handle
    try:
        attach(admission=decision, certificate=certificate, **verification)
    except BaseException:
        handle.close()
        raise
    return handle
