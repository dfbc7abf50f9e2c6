"""The EM loop of one start (``fit``'s core): passes until the gain is below ``delta``, a step falls, or ``max_its``.

The stopping rule reads only each pass's log-likelihood, which a pass gives before it is judged. A handle that
judges a fit's audited passes in batches (:class:`~..em_pass.runner_protocols.DefersJudging`,
``em_pass.deferred_judging``) is asked to judge them whenever a batch is due and before the loop returns, so no
model of a pass not judged comes back. A loop with ``on_step`` has each pass judged before the call (a callback
may checkpoint or act on a model at once), as before batches.
Where judging changed a pass's sum (a quarantined worker's chunks recomputed), the loop takes up again from that
pass with its judged result, and the passes run after it are dropped.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import attrs

from ....contracts.estimation import EncodedDataHandle
from ..em_pass.runner_protocols import AuditedHandle, DefersJudging, EStepHandle

__all__ = ["EMRun", "EMStep", "em_loop"]


class EMStep(NamedTuple):
    """What ``on_step`` receives after each data pass (once the pass is judged, where it is audited)."""

    iteration: int
    log_likelihood: float
    improvement: float
    model: Any
    seconds: float
    audit_records: tuple[Any, ...] = ()
    """The ``SDCAuditRecord``s of this pass (empty when no chunk was audited)."""


class EMRun(NamedTuple):
    """One EM run from one start: the model kept, its trajectory, why it stopped and its audit records."""

    model: Any
    history: tuple[float, ...]
    reason: str
    audits: tuple[Any, ...]


def _one_pass(handle: EncodedDataHandle, estimator: Any, model: Any) -> tuple[float, Any]:
    if isinstance(handle, EStepHandle):
        result = handle.estep(estimator, model)
        return result.log_likelihood, result.model
    # A third-party handle without ``estep`` costs two passes: score, then update.
    _, ll = handle.pysp_seq_log_density_sum(model)
    return ll, handle.pysp_seq_estimate(estimator, model)


def _decrease_floor(delta: float | None, ll: float) -> float:
    """A fall larger than this ends the fit as 'decreased' (float noise below it does not)."""
    return float(delta) if delta is not None else 1e-12 * max(1.0, abs(ll))


@attrs.define
class _Loop:
    """The loop's state between passes: the pass number, the model to score next, the one before it, the
    log-likelihoods so far, and once it stops why and which model it keeps."""

    model: Any
    previous: Any
    delta: float | None
    it: int = 0
    history: list[float] = attrs.field(factory=list)
    reason: str | None = None
    kept: Any = None

    def gain(self, ll: float) -> float:
        return math.inf if not self.history else ll - self.history[-1]

    def take(self, ll: float, new_model: Any) -> None:
        """One pass's log-likelihood (of ``model``) and its M-step: stop, or go on from ``new_model``."""
        gain, self.it = self.gain(ll), self.it + 1
        if self.history and not math.isfinite(ll) and math.isfinite(self.history[-1]):
            self.reason, self.kept = "not_finite", self.previous
        elif self.history and gain < -_decrease_floor(self.delta, ll):
            self.reason, self.kept = "decreased", self.previous
        else:
            self.history.append(ll)
            if self.delta is not None and len(self.history) > 1 and abs(gain) < self.delta:
                self.reason, self.kept = "converged", self.model
            else:
                self.previous, self.model = self.model, new_model

    def mark(self) -> tuple[Any, ...]:
        return self.it, self.model, self.previous, len(self.history), self.reason, self.kept

    def restore(self, mark: tuple[Any, ...]) -> None:
        self.it, self.model, self.previous, length, self.reason, self.kept = mark
        del self.history[length:]


def em_loop(handle: EncodedDataHandle, estimator: Any, model: Any, max_its: int, delta: float | None,
            on_step: Callable[[EMStep], Any] | None, bar: Any) -> EMRun:
    """EM passes from ``model`` until the gain is below ``delta``, a step falls, or ``max_its`` (module doc)."""
    # with on_step each pass is judged before it is reported: a callback may keep or act on a model at once
    judging = handle if on_step is None and isinstance(handle, DefersJudging) and handle.defer_judging(True) else None
    try:
        return _passes(handle, estimator, model, max_its, _Loop(model, model, delta), on_step, bar, judging)
    finally:
        if judging is not None:
            judging.defer_judging(False)


def _passes(handle: EncodedDataHandle, estimator: Any, model: Any, max_its: int, loop: _Loop,
            on_step: Callable[[EMStep], Any] | None, bar: Any, judging: DefersJudging | None) -> EMRun:
    """The passes; ``judging``: the handle when it holds passes to be judged in batches."""
    audits: list[Any] = []
    waiting: list[tuple[tuple[Any, ...], EMStep]] = []  # passes held to be judged: the loop before each, its step

    def report(step: EMStep) -> None:
        audits.extend(step.audit_records)
        if on_step is not None:
            on_step(step)

    while True:
        due = judging is not None and bool(waiting) and judging.judging_due()
        if loop.reason is None and loop.it < max_its and not due:
            mark, t0 = loop.mark(), time.perf_counter()
            ll, new_model = _one_pass(handle, estimator, loop.model)
            step = EMStep(loop.it, ll, loop.gain(ll), loop.model, time.perf_counter() - t0)
            loop.take(ll, new_model)
            if bar is not None:
                bar.set_postfix(loglik=f"{ll:.6g}", refresh=False)  # drawn by update, once the delay has passed
                bar.update(1)
            if judging is not None and judging.passes_held > len(waiting):
                waiting.append((mark, step))
            else:
                found = tuple(handle.last_audit_records) if isinstance(handle, AuditedHandle) else ()
                report(step._replace(audit_records=found))
            continue
        if waiting and judging is not None:
            batch = judging.judge_deferred()
            for k, judged in enumerate(batch.passes):
                mark, step = waiting[k]
                if batch.resumed and k == len(batch.passes) - 1:  # judged to another sum: go on from it
                    loop.restore(mark)
                    ll = judged.result.log_likelihood
                    step = EMStep(step.iteration, ll, loop.gain(ll), step.model, step.seconds)
                    loop.take(ll, judged.result.model)
                    if bar is not None:
                        bar.update(-(len(waiting) - k - 1))
                report(step._replace(audit_records=judged.records))
            waiting.clear()
            continue
        break
    # max_its passes: the model of the last M-step, as mixle returns it (its log-likelihood is unscored)
    kept = loop.model if loop.reason is None else loop.kept
    return EMRun(kept, tuple(loop.history), loop.reason or "max_its", tuple(audits))
