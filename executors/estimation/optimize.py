"""``optimize`` / ``fit``: the EM loop, one data pass per iteration on every backend."""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import attrs
import numpy as np

from ...contracts.estimation import EncodedDataHandle
from .api import handle_for, is_encoded_data_handle, options_from_keywords
from .compat.mixle_interop import (
    as_estimator,
    unwrap_mixle,
    wrap_mixle_model,
)
from .em_pass.chunks import seed_from
from .em_pass.runner_protocols import AdmittedHandle, AuditedHandle, FitLifecycle, SizedHandle
from .fitting.em_loop import EMRun, EMStep, em_loop
from .fitting.initialization import initial_model, resolve_init

__all__ = ["ConvergenceWarning", "EMStep", "FitOptions", "FitResult", "as_estimator", "fit", "optimize"]

PROGRESS_DELAY_S = 3.0
"""``progress='auto'`` shows a bar on a terminal (stderr) once a fit has run this long; never on a pipe or file."""


class ConvergenceWarning(UserWarning):
    """An EM fit stopped at ``max_its`` before its gain fell below ``delta``/``tol`` (scikit-learn's name).

    A ``UserWarning`` subclass, so a filter on either catches it, e.g.
    ``warnings.simplefilter("ignore", ConvergenceWarning)``; ``delta=None`` (a fixed count) never warns.
    """


class _DefaultDelta(float):
    """mixle's default ``delta`` (1e-9) as an object of its own, so a ``delta=`` the caller gave is told apart."""

    def __repr__(self) -> str:
        return repr(float(self))


DEFAULT_DELTA = _DefaultDelta(1e-9)
"""The default of ``delta=`` (mixle 0.8.2's): an absolute gain of the total log-likelihood."""


class FitResult(NamedTuple):
    """What ``fit`` returns: the model, its last measured log-likelihood, the trajectory and the evidence."""

    model: Any
    log_likelihood: float
    iterations: int
    converged: bool
    history: tuple[float, ...]
    audit_records: tuple[Any, ...] = ()
    """Every ``SDCAuditRecord`` of the fit's audited passes."""
    admission: str | None = None
    """How the run was admitted: 'certified', 'unverified', 'local' or 'verifying' (None: unknown handle)."""
    certificate: str | None = None
    """The admitting certificate's id, or 'unverified'."""
    quarantined: tuple[int, ...] = ()
    """Workers the audit quarantined during the fit."""
    stop_reason: str = ""
    """Why the fit stopped: 'converged' (gain below delta), 'max_its', 'decreased' (a step lowered the
    log-likelihood; the last model before it is kept) or 'not_finite' (a step's log-likelihood was not finite)."""
    init: str = ""
    """The start used: 'kmeans++', 'dirichlet', 'random' or 'prev_estimate'."""


def _stderr_is_terminal() -> bool:
    isatty = getattr(sys.stderr, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except ValueError:  # a closed stream
        return False


def _progress_bar(progress: Any, total: int) -> Any:
    """A tqdm bar on stderr: always for ``True``; for ``'auto'`` only on a terminal, once the fit has run
    :data:`PROGRESS_DELAY_S` (a quick fit, a log file or a pipe get nothing)."""
    if progress is False or (progress == "auto" and not _stderr_is_terminal()):
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    delay = 0.0 if progress is True else PROGRESS_DELAY_S
    return tqdm(total=total, desc="EM", unit="it", leave=False, delay=delay, file=sys.stderr)


def _restart_seed(seed: Any, restart: int) -> Any:
    """The seed of restart ``restart`` (the caller's own seed for the first)."""
    if restart == 0:
        return seed
    return int(np.random.SeedSequence([seed_from(seed), restart]).generate_state(1)[0])


def _exact_int(minimum: int, meaning: str = "") -> Any:
    def check(_: Any, attribute: attrs.Attribute, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{attribute.name} must be an int >= {minimum}{meaning}, got {value!r}")

    return check


def _delta(_: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not math.isfinite(value) or not value > 0.0):
        raise ValueError(f"delta must be a finite number > 0 (the smallest log-likelihood gain that keeps EM "
                         f"going) or None for a fixed max_its, got {value!r}")


def _tol(_: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not math.isfinite(value) or not value > 0.0):
        raise ValueError(f"tol must be a finite number > 0 (the smallest gain of the mean log-likelihood per row "
                         f"that keeps EM going, as scikit-learn's) or None, got {value!r}")


def _progress(_: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, bool) and value != "auto":
        raise ValueError(f"progress must be True, False or 'auto', got {value!r}")


def _callback(_: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and not callable(value):
        raise TypeError(f"on_step must be a callable taking an EMStep, got {type(value).__name__}")


@attrs.frozen(kw_only=True, eq=False)
class FitOptions:
    """The options of the EM loop itself (``fit``/``optimize``), apart from where the data lives.

    ``max_its``, ``delta``, ``init_p`` and ``seed`` are ``optimize``'s positional parameters; ``tol``
    is scikit-learn's stopping rule (the gain of the mean log-likelihood per row) instead of ``delta``;
    the start is ``prev_estimate`` or ``init`` (``init_estimator`` draws it, ``n_init`` starts are tried),
    ``rng`` instead of ``seed``, ``on_step`` after each pass, ``progress`` a tqdm bar.
    """

    max_its: int = attrs.field(default=10, validator=_exact_int(0))
    delta: float | None = attrs.field(default=DEFAULT_DELTA, validator=_delta)
    tol: float | None = attrs.field(default=None, validator=_tol)
    init_p: float = 0.1
    seed: int | None = None
    prev_estimate: Any = None
    init_estimator: Any = None
    init: str | None = None
    n_init: int = attrs.field(default=1, validator=_exact_int(1, " (starts tried, the best log-likelihood kept)"))
    on_step: Callable[[EMStep], Any] | None = attrs.field(default=None, validator=_callback)
    progress: bool | str = attrs.field(default="auto", validator=_progress)
    rng: Any = None

    def __attrs_post_init__(self) -> None:
        if self.seed is not None and self.rng is not None:
            raise ValueError("pass seed= or rng=, not both")
        if self.tol is not None and self.delta is not DEFAULT_DELTA:
            raise ValueError(f"tol={self.tol!r} and delta={self.delta!r} are two stopping rules (tol: the gain of "
                             f"the mean log-likelihood per row, as scikit-learn's; delta: the gain of the total, "
                             f"as mixle's); give one of them")

    def threshold(self, rows: int) -> float | None:
        """The gain of the total log-likelihood below which EM stops: ``delta``, or ``tol`` times ``rows``."""
        if self.tol is None:
            return self.delta
        if rows <= 0:
            raise ValueError("tol= is a gain per row, but this handle does not say how many rows it holds; "
                             "pass delta= (a gain of the total log-likelihood) instead")
        return self.tol * rows


FIT_OPTIONS = tuple(a.name for a in attrs.fields(FitOptions))
"""The keywords of :class:`FitOptions`."""


def fit(data: Any, estimator: Any, max_its: int = 10, delta: float | None = DEFAULT_DELTA, init_p: float = 0.1,
        seed: int | None = None, backend: str | None = None, num_workers: int | None = None,
        **keywords: Any) -> FitResult:
    """Fit ``estimator`` to ``data`` by EM and report the trajectory and why it stopped (see :func:`optimize`).

    ``keywords`` are made into the options objects at once: the :class:`FitOptions` fields
    (``tol``, ``prev_estimate``, ``init``, ``n_init``, ``on_step``, ``progress``, ``rng``,
    ``init_estimator``) and ``encoded_data``'s options and verification controls (which a handle passed
    as ``data`` refuses, as it refuses ``backend`` and ``num_workers``: its data is already placed).
    A fit that stops at ``max_its`` unconverged warns (:class:`ConvergenceWarning`).
    """
    result, run = _fit(data, estimator, max_its, delta, init_p, seed, backend, num_workers, keywords)
    _warn_if_unconverged(result, run)
    return result


def _fit(data: Any, estimator: Any, max_its: int, delta: float | None, init_p: float, seed: int | None,
         backend: str | None, num_workers: int | None, keywords: dict[str, Any]) -> tuple[FitResult, FitOptions]:
    """:func:`fit` without its warning (``optimize`` warns at its own caller)."""
    ours = {k: keywords.pop(k) for k in FIT_OPTIONS if k in keywords}
    run = FitOptions(max_its=max_its, delta=delta, init_p=init_p, seed=seed, **ours)
    options, verification = options_from_keywords({"num_workers": num_workers, **keywords})
    if not is_encoded_data_handle(data):
        if options.estimator is not None or options.model is not None:
            raise ValueError("fit takes the estimator as its second argument and a start as prev_estimate=; "
                             "drop estimator=/model=")
        options = options.replace(estimator=estimator, model=run.prev_estimate)  # the caller's objects, as given
    estimator = as_estimator(estimator)
    prev_estimate = wrap_mixle_model(run.prev_estimate)  # a mixle distribution is adapted (ours unchanged)
    handle, own = handle_for(data, backend, options, verification)
    try:
        return _fit_on(handle, estimator, prev_estimate, run), run
    except BaseException as exc:
        if own and isinstance(handle, FitLifecycle):
            handle.record_failure(exc)
        raise
    finally:
        if own:
            handle.close()


def _fit_on(handle: EncodedDataHandle, estimator: Any, prev_estimate: Any, run: FitOptions) -> FitResult:
    """EM on ``handle`` from each start (``n_init``, or ``prev_estimate``); the best final log-likelihood kept."""
    init_est = estimator if run.init_estimator is None else as_estimator(run.init_estimator)
    chosen = "prev_estimate" if prev_estimate is not None else resolve_init(init_est, run.init)
    if isinstance(handle, FitLifecycle):
        handle.begin_fit()
    rows = (handle.num_rows if isinstance(handle, SizedHandle) else 0) or 0
    threshold = run.threshold(rows)
    starts = 1 if prev_estimate is not None else run.n_init
    bar = _progress_bar(run.progress, run.max_its * starts)
    best: EMRun | None = None
    audits: list[Any] = []
    try:
        for r in range(starts):
            start = prev_estimate
            if start is None:
                start, chosen = initial_model(handle, init_est, init=chosen if chosen != "auto" else None,
                                              seed=_restart_seed(run.seed if run.rng is None else run.rng, r),
                                              p=run.init_p)
                start = wrap_mixle_model(start)
            found = em_loop(handle, estimator, start, run.max_its, threshold, run.on_step, bar)
            audits.extend(found.audits)
            if best is None or (found.history and (not best.history or found.history[-1] > best.history[-1])):
                best = found
    finally:
        if bar is not None:
            bar.close()
    assert best is not None
    decision = handle.admission if isinstance(handle, AdmittedHandle) else None  # an AdmissionDecision
    mode, link = (None, None) if decision is None else (decision.mode, decision.ledger_link)
    quarantined = tuple(sorted(handle.quarantined)) if isinstance(handle, AuditedHandle) else ()
    return FitResult(unwrap_mixle(best.model), best.history[-1] if best.history else math.nan, len(best.history),
                     best.reason == "converged", best.history, tuple(audits), mode, link, quarantined, best.reason,
                     chosen)


def _warn_if_unconverged(result: FitResult, run: FitOptions) -> None:
    """A :class:`ConvergenceWarning` at the caller of ``fit``/``optimize`` when the fit ran out of ``max_its``."""
    if result.stop_reason != "max_its" or run.max_its == 0 or (run.delta is None and run.tol is None):
        return
    history = result.history
    rule = f"tol={run.tol:g} per row" if run.tol is not None else f"delta={run.delta:g}"
    if len(history) > 1:
        gain = history[-1] - history[-2]
        last = f"the last gain of the log-likelihood was {gain:.4g}"
    else:
        last = "one pass scores no gain"
    warnings.warn(f"EM stopped at max_its={run.max_its} after {result.iterations} iterations without converging: "
                  f"{last}, not below {rule}. Raise max_its (or loosen delta=/tol=); delta=None runs a fixed "
                  f"count without this warning", ConvergenceWarning, stacklevel=3)


def optimize(
    data: Any,
    estimator: Any,
    max_its: int = 10,
    delta: float | None = DEFAULT_DELTA,
    init_p: float = 0.1,
    seed: int | None = None,
    backend: str | None = None,
    num_workers: int | None = None,
    **kwargs: Any,
) -> Any:
    """Fit ``estimator`` to ``data`` by EM and return the fitted model.

    Each iteration is one pass over the data: the E-step yields the statistics for the next model
    and the log-likelihood of the model it scored. The loop stops after ``max_its`` passes or when
    the log-likelihood changes by less than ``delta`` (an absolute gain of the total, as in mixle;
    ``None``: run all ``max_its``) or, with ``tol=`` instead, its mean per row changes by less than
    ``tol`` (scikit-learn's rule; giving both is refused); a step that lowers it by more ends the fit
    on the model before it, and a fit that runs out of ``max_its`` warns (:class:`ConvergenceWarning`).
    The start is ``prev_estimate=`` or ``init=``: ``"kmeans++"`` (the default for our mixtures:
    k-means++ and Lloyd on a seeded sample, each row to its nearest center, one M-step, as
    scikit-learn's ``GaussianMixture``), ``"dirichlet"`` or ``"random"``, on the rows kept with
    probability ``init_p``; ``n_init=`` starts are tried and the best final log-likelihood kept.
    Every draw depends on ``seed`` and the chunk id only (the same bits on every backend and worker
    count); :func:`fit` says why the fit stopped (``stop_reason``). ``data`` may be raw rows (put on
    ``backend``, default ``local``, with ``num_workers``) or a handle from :func:`encoded_data`. Other
    keywords: the :class:`FitOptions` fields (``tol``, ``on_step``, ``progress``, ``prev_estimate``,
    ``init_estimator``, ``init``, ``n_init``, ``rng``) and ``encoded_data``'s options (``num_chunks``,
    ``chunk_size``, ``timeout``...) and verification controls (``admission=``, ``audit=``,
    ``audit_rate=``, ``audit_policy=``, ``ledger=``, ``fault_injector=``); an unknown one is refused.
    :func:`fit` returns the audit records, admission mode and quarantined workers as well.
    """
    result, run = _fit(data, estimator, max_its, delta, init_p, seed, backend, num_workers, kwargs)
    _warn_if_unconverged(result, run)
    return result.model
