"""``optimize`` / ``fit``: the EM loop, one data pass per iteration on every backend."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import attrs
import numpy as np

from .api import handle_for, is_encoded_data_handle, options_from_keywords
from .compat.mixle_interop import (
    as_estimator,
    unwrap_mixle,
    wrap_mixle_model,
)
from .em_pass.chunks import seed_from
from .fitting.initialization import initial_model, resolve_init

__all__ = ["EMStep", "FitOptions", "FitResult", "as_estimator", "fit", "optimize"]

PROGRESS_AUTO_WORK = 20_000_000
"""``progress='auto'`` shows a bar when rows x max_its reaches this and stderr is a terminal."""


class EMStep(NamedTuple):
    """What ``on_step`` receives after each data pass."""

    iteration: int
    log_likelihood: float
    improvement: float
    model: Any
    seconds: float
    audit_records: tuple[Any, ...] = ()
    """The ``SDCAuditRecord``s of this pass (empty when no chunk was audited)."""


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


def _progress_bar(progress: Any, total: int, work: int) -> Any:
    show = progress is True or (progress == "auto" and work >= PROGRESS_AUTO_WORK and sys.stderr.isatty())
    if not show:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm ships with the test extras
        return None
    return tqdm(total=total, desc="EM", unit="it", leave=False)


def _one_pass(handle: Any, estimator: Any, model: Any) -> tuple[float, Any]:
    if hasattr(handle, "estep"):
        result = handle.estep(estimator, model)
        return result.log_likelihood, result.model
    # A third-party handle without ``estep`` costs two passes: score, then update.
    _, ll = handle.pysp_seq_log_density_sum(model)
    return ll, handle.pysp_seq_estimate(estimator, model)


class _Run(NamedTuple):
    """One EM run from one start: the model kept, its trajectory and why it stopped."""

    model: Any
    history: tuple[float, ...]
    reason: str
    audits: tuple[Any, ...]


def _decrease_floor(delta: float | None, ll: float) -> float:
    """A fall larger than this ends the fit as 'decreased' (float noise below it does not)."""
    return float(delta) if delta is not None else 1e-12 * max(1.0, abs(ll))


def _em_loop(handle: Any, estimator: Any, model: Any, max_its: int, delta: float | None,
             on_step: Callable[[EMStep], Any] | None, bar: Any) -> _Run:
    """EM passes from ``model`` until the gain is below ``delta``, a step falls, or ``max_its``."""
    history: list[float] = []
    audits: list[Any] = []
    reason = "max_its"
    previous = model
    for it in range(max_its):
        t0 = time.perf_counter()
        ll, new_model = _one_pass(handle, estimator, model)
        gain = math.inf if not history else ll - history[-1]
        found = tuple(getattr(handle, "last_audit_records", ()))
        audits.extend(found)
        if on_step is not None:
            on_step(EMStep(it, ll, gain, model, time.perf_counter() - t0, found))
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loglik=f"{ll:.6g}")
        if history and not math.isfinite(ll) and math.isfinite(history[-1]):
            return _Run(previous, tuple(history), "not_finite", tuple(audits))
        if history and gain < -_decrease_floor(delta, ll):
            return _Run(previous, tuple(history), "decreased", tuple(audits))
        history.append(ll)
        if delta is not None and len(history) > 1 and abs(gain) < delta:
            return _Run(model, tuple(history), "converged", tuple(audits))
        previous, model = model, new_model
    # max_its passes: the model of the last M-step, as mixle returns it (its log-likelihood is unscored)
    return _Run(model, tuple(history), reason, tuple(audits))


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


def _progress(_: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, bool) and value != "auto":
        raise ValueError(f"progress must be True, False or 'auto', got {value!r}")


def _callback(_: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and not callable(value):
        raise TypeError(f"on_step must be a callable taking an EMStep, got {type(value).__name__}")


@attrs.frozen(kw_only=True, eq=False)
class FitOptions:
    """The options of the EM loop itself (``fit``/``optimize``), apart from where the data lives.

    ``max_its``, ``delta``, ``init_p`` and ``seed`` are ``optimize``'s positional parameters; the
    start is ``prev_estimate`` or ``init`` (``init_estimator`` draws it, ``n_init`` starts are tried),
    ``rng`` instead of ``seed``, ``on_step`` after each pass, ``progress`` a tqdm bar.
    """

    max_its: int = attrs.field(default=10, validator=_exact_int(0))
    delta: float | None = attrs.field(default=1e-9, validator=_delta)
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


FIT_OPTIONS = tuple(a.name for a in attrs.fields(FitOptions))
"""The keywords of :class:`FitOptions`."""


def fit(data: Any, estimator: Any, max_its: int = 10, delta: float | None = 1e-9, init_p: float = 0.1,
        seed: int | None = None, backend: str | None = None, num_workers: int | None = None,
        **keywords: Any) -> FitResult:
    """Fit ``estimator`` to ``data`` by EM and report the trajectory and why it stopped (see :func:`optimize`).

    ``keywords`` are made into the options objects at once: the :class:`FitOptions` fields
    (``prev_estimate``, ``init``, ``n_init``, ``on_step``, ``progress``, ``rng``, ``init_estimator``) and
    ``encoded_data``'s options and verification controls (which a handle passed as ``data`` refuses, as
    it refuses ``backend`` and ``num_workers``: its data is already placed).
    """
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
        return _fit_on(handle, estimator, prev_estimate, run)
    except BaseException as exc:
        if own and hasattr(handle, "record_failure"):
            handle.record_failure(exc)
        raise
    finally:
        if own:
            handle.close()


def _fit_on(handle: Any, estimator: Any, prev_estimate: Any, run: FitOptions) -> FitResult:
    """EM on ``handle`` from each start (``n_init``, or ``prev_estimate``); the best final log-likelihood kept."""
    init_est = estimator if run.init_estimator is None else as_estimator(run.init_estimator)
    chosen = "prev_estimate" if prev_estimate is not None else resolve_init(init_est, run.init)
    if hasattr(handle, "begin_fit"):
        handle.begin_fit()
    rows = getattr(handle, "num_rows", 0) or 0
    starts = 1 if prev_estimate is not None else run.n_init
    bar = _progress_bar(run.progress, run.max_its * starts, rows * run.max_its * starts)
    best: _Run | None = None
    audits: list[Any] = []
    try:
        for r in range(starts):
            start = prev_estimate
            if start is None:
                start, chosen = initial_model(handle, init_est, init=chosen if chosen != "auto" else None,
                                              seed=_restart_seed(run.seed if run.rng is None else run.rng, r),
                                              p=run.init_p)
                start = wrap_mixle_model(start)
            found = _em_loop(handle, estimator, start, run.max_its, run.delta, run.on_step, bar)
            audits.extend(found.audits)
            if best is None or (found.history and (not best.history or found.history[-1] > best.history[-1])):
                best = found
    finally:
        if bar is not None:
            bar.close()
    assert best is not None
    decision = getattr(handle, "admission", None)
    return FitResult(unwrap_mixle(best.model), best.history[-1] if best.history else math.nan, len(best.history),
                     best.reason == "converged", best.history, tuple(audits), getattr(decision, "mode", None),
                     getattr(decision, "ledger_link", None), tuple(sorted(getattr(handle, "quarantined", ()))),
                     best.reason, chosen)


def optimize(
    data: Any,
    estimator: Any,
    max_its: int = 10,
    delta: float | None = 1e-9,
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
    ``None``: run all ``max_its``); a step that lowers it by more ends the fit on the model before
    it. The start is ``prev_estimate=`` or ``init=``: ``"kmeans++"`` (the default for our mixtures:
    k-means++ and Lloyd on a seeded sample, each row to its nearest center, one M-step, as
    scikit-learn's ``GaussianMixture``), ``"dirichlet"`` or ``"random"``, on the rows kept with
    probability ``init_p``; ``n_init=`` starts are tried and the best final log-likelihood kept.
    Every draw depends on ``seed`` and the chunk id only (the same bits on every backend and worker
    count); :func:`fit` says why the fit stopped (``stop_reason``). ``data`` may be raw rows (put on
    ``backend``, default ``local``, with ``num_workers``) or a handle from :func:`encoded_data`. Other
    keywords: the :class:`FitOptions` fields (``on_step``, ``progress``, ``prev_estimate``,
    ``init_estimator``, ``init``, ``n_init``, ``rng``) and ``encoded_data``'s options (``num_chunks``,
    ``chunk_size``, ``timeout``...) and verification controls (``admission=``, ``audit=``,
    ``audit_rate=``, ``audit_policy=``, ``ledger=``, ``fault_injector=``); an unknown one is refused.
    :func:`fit` returns the audit records, admission mode and quarantined workers as well.
    """
    return fit(data, estimator, max_its, delta, init_p, seed, backend, num_workers, **kwargs).model
