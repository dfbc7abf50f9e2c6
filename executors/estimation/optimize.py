"""``optimize`` / ``fit``: the EM loop, one data pass per iteration on every backend."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from mixle_parallel.executors.estimation.api import encoded_data, is_encoded_data_handle
from mixle_parallel.executors.estimation.mixle_interop import (
    MixleEstimator,
    is_mixle_estimator,
    unwrap_mixle,
    wrap_mixle_model,
)

__all__ = ["EMStep", "FitResult", "as_estimator", "fit", "optimize"]

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


def as_estimator(estimator: Any) -> Any:
    """Our estimator as is; a mixle estimator or a distribution prototype wrapped/converted."""
    if estimator is None:
        raise ValueError("optimize needs an estimator (e.g. MixtureEstimator([GaussianEstimator()] * 3))")
    if hasattr(estimator, "accumulator_factory") and hasattr(estimator, "estimate"):
        if hasattr(estimator, "encoder") or hasattr(estimator, "make_accumulator"):
            return estimator
        if is_mixle_estimator(estimator):
            return MixleEstimator(estimator)
        return estimator
    if hasattr(estimator, "estimator") and hasattr(estimator, "log_density"):
        return estimator.estimator()
    raise TypeError(
        f"{type(estimator).__name__} is not an estimator: it needs accumulator_factory() and "
        "estimate(nobs, stats) (see docs/estimation.md)"
    )


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


def fit(
    data: Any,
    estimator: Any,
    max_its: int = 10,
    delta: float | None = 1e-9,
    init_p: float = 0.1,
    seed: int | None = None,
    backend: str = "local",
    num_workers: int | None = None,
    *,
    prev_estimate: Any = None,
    init_estimator: Any = None,
    on_step: Callable[[EMStep], Any] | None = None,
    progress: bool | str = "auto",
    rng: Any = None,
    **encoded_data_options: Any,
) -> FitResult:
    """Fit ``estimator`` to ``data`` by EM and report the trajectory (see :func:`optimize`)."""
    if isinstance(max_its, bool) or not isinstance(max_its, int) or max_its < 0:
        raise ValueError(f"max_its must be an int >= 0, got {max_its!r}")
    if delta is not None and not delta >= 0.0:
        raise ValueError(f"delta must be >= 0 or None, got {delta!r}")
    if seed is not None and rng is not None:
        raise ValueError("pass seed= or rng=, not both")
    estimator = as_estimator(estimator)
    is_mixle = type(estimator).__name__ == "MixleEstimator"
    if is_mixle:
        prev_estimate = wrap_mixle_model(prev_estimate)
    init_est = estimator if init_estimator is None else as_estimator(init_estimator)
    own = not is_encoded_data_handle(data)
    handle = (
        encoded_data(data, estimator=estimator, model=prev_estimate, backend=backend,
                     num_workers=num_workers, **encoded_data_options)
        if own else encoded_data(data, **encoded_data_options)
    )
    bar = None
    audits: list[Any] = []
    try:
        if hasattr(handle, "begin_fit"):
            handle.begin_fit()
        model = prev_estimate
        if model is None:
            model = handle.pysp_seq_initialize(init_est, seed if rng is None else rng, init_p)
        rows = getattr(handle, "num_rows", 0) or 0
        bar = _progress_bar(progress, max_its, rows * max_its)
        history: list[float] = []
        converged = False
        for it in range(max_its):
            t0 = time.perf_counter()
            ll, new_model = _one_pass(handle, estimator, model)
            improvement = math.inf if not history else ll - history[-1]
            history.append(ll)
            found = tuple(getattr(handle, "last_audit_records", ()))
            audits.extend(found)
            if on_step is not None:
                on_step(EMStep(it, ll, improvement, model, time.perf_counter() - t0, found))
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loglik=f"{ll:.6g}")
            if delta is not None and len(history) > 1 and abs(improvement) < delta:
                converged = True
                break
            model = new_model
        last = history[-1] if history else math.nan
        if is_mixle:
            model = unwrap_mixle(model)
        decision = getattr(handle, "admission", None)
        return FitResult(model, last, len(history), converged, tuple(history), tuple(audits),
                         getattr(decision, "mode", None), getattr(decision, "ledger_link", None),
                         tuple(sorted(getattr(handle, "quarantined", ()))))
    except BaseException as exc:
        if own and hasattr(handle, "record_failure"):
            handle.record_failure(exc)
        raise
    finally:
        if bar is not None:
            bar.close()
        if own:
            handle.close()


def optimize(
    data: Any,
    estimator: Any,
    max_its: int = 10,
    delta: float | None = 1e-9,
    init_p: float = 0.1,
    seed: int | None = None,
    backend: str = "local",
    num_workers: int | None = None,
    **kwargs: Any,
) -> Any:
    """Fit ``estimator`` to ``data`` by EM and return the fitted model.

    Each iteration is one pass over the data: the E-step yields the statistics for the next model
    and the log-likelihood of the model it scored. The loop stops after ``max_its`` passes or when
    the log-likelihood changes by less than ``delta`` (``None``: run all ``max_its``). The start
    is ``prev_estimate=`` or a random initialization keeping rows with probability ``init_p``,
    drawn from ``seed`` per chunk (the same on every backend and worker count). ``data`` may be
    raw rows or a handle from :func:`encoded_data`; other keywords (``on_step``, ``progress``,
    ``prev_estimate``, ``init_estimator``, ``num_chunks``, ``chunk_size``, ``timeout``...) are
    passed on, among them the verification controls of :func:`encoded_data`: ``admission=`` (a
    certificate, its path, or ``"unverified"``; required with more than one worker process),
    ``audit=``, ``audit_rate=``, ``audit_policy=``, ``ledger=`` and ``fault_injector=``.
    :func:`fit` returns the audit records, admission mode and quarantined workers as well.
    """
    return fit(data, estimator, max_its, delta, init_p, seed, backend, num_workers, **kwargs).model
