"""``verify``: the harness's entry point, which runs an executor on a real small mesh beside an independent reference.

``verify(executor, plan, precision=..., workload=..., trials=..., seed=..., tolerance=...)`` takes an
executor object, a ``module:attr`` spec or a registered backend name (``backend_names``), runs every
trial twice in fresh process groups through the executor's launch strategy (``launch``: a gloo mesh
the harness spawns, or an executor that starts its own workers) and judges each declared
``DistributedUpdate`` (``judge``) on these checks, each named in failures:

* ``numerics``: max absolute / relative error of the update's observables against the
  workload's independent single-process reference (torch.testing's rule and the precision's
  default tolerance; EM within the stated fp64 bound of ``em_reference``);
* ``determinism``: the repeats' digests are equal on every rank, and, for executors that start
  their own workers, the run is bitwise the same executor on one worker;
* ``collectives``: the declared (collective, axes) was seen in the traced steps, in a phase where
  that update communicates and not taken by another update (``attribution``), and nothing
  undeclared was (counts from PyTorch's flight recorder);
* ``window``: a data-parallel training plan runs with an accumulation window of at least
  ``window.MEASURED_WINDOW`` calls of as many micro-batches (``window.measured_window``), so the
  non-commit calls and the micro-batch split are compared with the reference too; the report's
  ``plan`` (and the certificate's ``measured_plan``) is the plan that ran;
* ``collectives`` also holds an executor to the count it declares per step (``collectives_per_step``,
  ``counts``): what an executor that starts its own workers reports is counted at its transport;
* ``receipts``: for trials that expose ``receipts()``, every step's receipts report the counts and
  bytes the flight recorder saw (``receipt_check``).

The result (``report.VerificationReport``) holds ``NumericsEvidence`` per update and evidence-bearing
``DistributedUpdate``s; ``report.certify(executor)`` turns a passing report into a signed certificate.
"""

from __future__ import annotations

import time
from typing import Any

from ...contracts import ParallelPlan, Tolerance
from ..backend_names import harness_target
from .counts import declared_counts
from .judge import Measured, judge_update, judge_wire
from .launch import Launch, TrialPlan, launch_for
from .mesh import DEFAULT_TIMEOUT_S
from .report import VerificationReport
from .tolerance import default_tolerance
from .window import measured_window
from .worker import resolve_executor
from .workloads import resolve_workload

__all__ = ["VerificationReport", "verify"]


def _workload(workload: Any, plan: ParallelPlan, launch: Launch) -> Any:
    """The workload object (the launch's default for the plan when none is given); it must have a reference."""
    work = resolve_workload(workload if workload is not None else launch.default_workload(plan))
    if not callable(getattr(work, "reference", None)):
        raise ValueError(f"workload {getattr(work, 'name', work)!r} has no reference(seed, precision): the harness "
                         "compares every executor with an independent single-process reference, never with itself")
    return work


def verify(
    executor: Any,
    plan: ParallelPlan,
    *,
    precision: str = "fp32",
    workload: Any = None,
    trials: int = 1,
    seed: int = 0,
    tolerance: Tolerance | None = None,
    repeats: int = 2,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> VerificationReport:
    """Measure ``executor`` (object, ``module:attr`` or registered name) on ``plan`` against the
    single-process reference; see the module docstring."""
    if trials < 1 or repeats < 2:
        raise ValueError(f"need trials >= 1 and repeats >= 2 (determinism), got trials={trials} repeats={repeats}")
    started = time.perf_counter()
    target = harness_target(executor)  # ranks resolve the target: a name may be registered only here
    local = resolve_executor(target)
    local.capabilities.validate(plan, precision)
    launch = launch_for(local)
    plan, work = measured_window(plan, _workload(workload, plan, launch))
    updates = tuple(local.describe_updates(plan))
    if not updates:
        raise ValueError(f"{local.capabilities.name} declares no updates for {plan.describe()}; nothing to verify")
    family = "training" if hasattr(work, "build_module") else "em"
    tol = tolerance or default_tolerance(precision, family=family)
    run = TrialPlan(work, plan, precision, tuple(seed + t for t in range(trials)), repeats)
    by_rank = launch.run(target, local, run, timeout)
    reference = {s: work.reference(s, precision) for s in run.seeds}  # never the executor itself
    measured = Measured(by_rank, reference, tol, plan, precision, trials, local.capabilities.name,
                        launch.worker_invariance(local, run, by_rank))
    wire = judge_wire(updates, by_rank, plan, launch, first_step=1 if work.steps > 1 else 0,
                      counts=declared_counts(local, plan))
    verdicts = [judge_update(update, measured, wire, launch) for update in updates]
    return VerificationReport(
        local.capabilities.name,
        str(local.version),
        plan,
        precision,
        work.name,
        tuple(v.evidence for v in verdicts if v.evidence is not None),
        tuple(v.evidenced_update for v in verdicts),
        wire.failures + tuple(f for v in verdicts for f in v.failures),
        wire.observed,
        time.perf_counter() - started,
        wire.receipt_lines,
    )
