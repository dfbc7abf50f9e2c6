"""``VerificationReport``: what ``verify`` measured, read as a table, and turned into a certificate when it passed."""

from __future__ import annotations

from typing import Any

import attrs

from ...contracts import DistributedUpdate, NumericsEvidence, ObservedCollective, ParallelPlan
from ..certification import CertificationError, certify
from .launch import launch_for
from .worker import resolve_executor


@attrs.frozen
class VerificationReport:
    """What the harness measured: evidence per update, evidence-bearing updates, failures by check."""

    executor: str
    executor_version: str
    plan: ParallelPlan
    precision: str
    workload: str
    evidence: tuple[NumericsEvidence, ...]
    updates: tuple[DistributedUpdate, ...]
    failures: tuple[str, ...]
    observed_collectives: tuple[ObservedCollective, ...]
    seconds: float
    receipts: tuple[str, ...] = ()
    """One line per compared step: the receipts' bytes and counts beside the flight recorder's."""

    @property
    def passed(self) -> bool:
        """True when every declared update passed every check."""
        return not self.failures and all(e.passed for e in self.evidence)

    @property
    def failed_checks(self) -> frozenset[str]:
        """Names of the checks that failed (numerics, determinism, collectives, receipts, observables)."""
        return frozenset(f.split("check '", 1)[1].split("'", 1)[0] for f in self.failures if "check '" in f)

    def certify(self, executor: Any, **kwargs: Any) -> Any:
        """A signed certificate envelope from this report, recording device kind and comm backend (``certify``).

        ``executor`` is what was verified: an object, a ``module:attr`` spec or a registered name.
        """
        if self.failures:
            raise CertificationError("verification failed: " + "; ".join(self.failures))
        target = resolve_executor(executor)
        device_kind, comm_backend = launch_for(target).mesh_kind(target, self.plan.world_size)
        kwargs.setdefault("device_kind", device_kind)
        kwargs.setdefault("comm_backend", comm_backend)
        return certify(self.evidence, executor=target, plan=self.plan, precision=self.precision, **kwargs)

    def summary(self) -> str:
        """A plain-text table: one row per update, then the failures."""
        window = (f", accumulation window {self.plan.gradient_accumulation_steps} calls x {self.plan.microbatches} "
                  "micro-batches" if self.plan.gradient_accumulation_steps * self.plan.microbatches > 1 else "")
        rows = [f"{self.executor} {self.executor_version} on {self.plan.describe()}{window} at {self.precision}, "
                f"workload {self.workload}: {'PASSED' if self.passed else 'FAILED'} in {self.seconds:.1f}s",
                f"{'update':<28}{'max abs':>11}{'max rel':>11}{'determ.':>9}{'collect.':>10}{'samples':>9}"]
        for e in self.evidence:
            rows.append(f"{e.node_id:<28}{e.maximum_absolute_error:>11.2e}{e.maximum_relative_error:>11.2e}"
                        f"{'yes' if e.deterministic else 'NO':>9}{'ok' if e.collectives_match else 'NO':>10}"
                        f"{e.sample_count:>9}")
        rows += [f"FAIL {f}" for f in self.failures]
        return "\n".join(rows)
