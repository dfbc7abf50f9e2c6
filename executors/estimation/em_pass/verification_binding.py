"""What makes a handle's passes verified: its admission, SDC audit and ledger, bound once, read after each pass.

:class:`VerifiedPasses` is a base of ``ChunkedEncodedData``: ``attach_verification`` (``encoded_data`` calls it)
binds the gate's admission decision, the ``EMAudit`` (with the driver's reference where the rows are at hand)
and the ledger's run_start; the properties read the audit's records and quarantine. The pass itself
(``em_pass.estep``) uses what is bound here; nothing here runs a pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import attrs

from ....contracts import ParallelPlan
from ....verification.ledger.chain import Ledger
from ..audit.sdc_audit import EM_AUDIT_RATE, EMAudit
from ..observability.metering import MeteredRunner
from ..options import VerificationOptions
from ..sources import ChunkPlace, OpenedSource
from .engine_choice import EngineChoice
from .estep import rows_reference, source_reference
from .runner_protocols import RunLedger

__all__ = ["VerifiedPasses"]


class _VerifiedHost(Protocol):
    """What the verification binding uses of the handle it is part of."""

    admission: Any
    ledger: RunLedger | None
    last_audits: tuple[Any, ...]
    _audit: EMAudit | None
    _audit_rows: Any
    _metered: MeteredRunner
    _fit_first: bool
    _failure: str | None

    @property
    def reference_audit(self) -> bool: ...

    @property
    def backend(self) -> str: ...

    @property
    def num_workers(self) -> int: ...

    @property
    def num_rows(self) -> int: ...

    @property
    def num_chunks(self) -> int: ...

    @property
    def engine(self) -> EngineChoice | None: ...

    @property
    def bounds(self) -> Sequence[tuple[int, int]]: ...

    @property
    def source(self) -> OpenedSource | None: ...

    @property
    def places(self) -> tuple[ChunkPlace, ...] | None: ...

    @property
    def audit_records(self) -> tuple[Any, ...]: ...

    def _attach_reference(self, audit: EMAudit) -> None: ...

    def _ledger_start(self, ledger: RunLedger, certificate: Any) -> None: ...


class VerifiedPasses:
    """The admission, SDC audit and ledger of a handle (module doc)."""

    admission: Any
    ledger: RunLedger | None
    _audit: EMAudit | None
    _audit_rows: Any
    _fit_first: bool
    _failure: str | None

    reference_audit = True
    """Whether the SDC audit also recomputes audited chunks outside the backend (where the rows are at hand)."""

    def _attach_reference(self: _VerifiedHost, audit: EMAudit) -> None:
        """Give ``audit`` the driver's reference where this handle keeps the rows, or reads them again from
        ``files(...)`` (SPMD handles agree on it)."""
        audit.reference = (rows_reference(self._audit_rows, self.bounds) if self._audit_rows is not None else
                                 source_reference(self.source, self.places))

    @property
    def audit(self: _VerifiedHost) -> EMAudit | None:
        """The handle's ``EMAudit`` (None when not audited)."""
        return self._audit

    @property
    def audit_records(self: _VerifiedHost) -> tuple[Any, ...]:
        """Every ``SDCAuditRecord`` of this handle's audited passes."""
        return self._audit.records if self._audit is not None else ()

    @property
    def last_audit_records(self: _VerifiedHost) -> tuple[Any, ...]:
        """The ``SDCAuditRecord``s of the last E-step."""
        return tuple(r for outcome in self.last_audits for r in outcome.records)

    @property
    def quarantined(self: _VerifiedHost) -> frozenset[int]:
        """Workers quarantined by the audit (they get no chunks)."""
        return self._audit.quarantined if self._audit is not None else frozenset()

    def readmit(self: _VerifiedHost, workers: Sequence[int] | None = None) -> None:
        """Give quarantined workers chunks again (all when ``workers`` is None), e.g. after a repair."""
        if self._audit is not None:
            self._audit.readmit(workers)
            if self.ledger is not None:
                self.ledger.note("quarantined worker(s) readmitted", workers=None if workers is None else list(workers))

    def begin_fit(self: _VerifiedHost) -> None:
        """Mark the next E-step as a fit's first: the audit then checks at least one chunk."""
        self._fit_first = True

    def record_failure(self: _VerifiedHost, error: BaseException) -> None:
        """Remember why the run failed; ``close`` writes it into the ledger's run_end."""
        self._failure = f"{type(error).__name__}: {error}"[:500]

    def attach_verification(self: _VerifiedHost, verification: VerificationOptions | None = None, *,
                            admission: Any = None, certificate: Any = None, **controls: Any) -> None:
        """Bind the admission decision, the SDC audit and the ledger (``encoded_data`` calls this).

        ``verification`` (a :class:`VerificationOptions`): ``audit=None`` audits when the runner has two
        workers or more; ``audit_rate`` defaults to 0.05; ``fault_injector`` needs the audit on. ``ledger``
        (a ``verification.Ledger`` or a path) gets run_start now, one receipt per E-step, every audit
        record, and run_end on ``close``. ``controls`` are its fields as keywords (made into one at once).
        ``admission`` is the gate's ``AdmissionDecision``.
        """
        base = VerificationOptions() if verification is None else verification
        chosen = attrs.evolve(base, **controls) if controls else base
        self.admission = admission
        ledger = chosen.ledger
        if ledger is not None and not isinstance(ledger, RunLedger):  # a path
            ledger = Ledger(ledger)
        on = (self.num_workers > 1) if chosen.audit is None else chosen.audit
        given = chosen.set_options()
        shaping = [k for k in ("audit_rate", "audit_policy", "audit_seed", "fault_injector") if k in given]
        if shaping and not on:
            raise ValueError(f"{'=, '.join(shaping)}= shape(s) the SDC audit, which is off for {self.num_workers} "
                             f"worker(s) by default; pass audit=True (or drop {'=, '.join(shaping)}=)")
        if on:
            rate = EM_AUDIT_RATE if chosen.audit_rate is None else float(chosen.audit_rate)
            audit = EMAudit(self._metered, rate=rate, policy=chosen.audit_policy, seed=chosen.audit_seed,
                            fault_injector=chosen.fault_injector)
            self._audit = audit
            if self.reference_audit:
                self._attach_reference(audit)
        if self._audit is None or self._audit.reference is None:
            self._audit_rows = None
        self.ledger = ledger
        if ledger is not None:
            self._ledger_start(ledger, certificate)

    def _ledger_start(self: _VerifiedHost, ledger: RunLedger, certificate: Any) -> None:
        decision = self.admission
        link = (
            certificate if certificate is not None else (decision.ledger_link if decision is not None else "unverified")
        )
        ledger.run_start(
            plan=ParallelPlan(dp_replicate=max(1, self.num_workers)),
            certificate=link,
            executor=decision.executor if decision is not None else f"em_{self.backend}",
            extra={
                "kind": "em_fit",
                "backend": self.backend,
                "rows": self.num_rows,
                "chunks": self.num_chunks,
                "workers": self.num_workers,
                "admission": decision.mode if decision is not None else None,
                "audit_rate": self._audit.rate if self._audit is not None else None,
                "audit_policy": self._audit.auditor.policy if self._audit is not None else None,
                "engine": "numpy (fp64)" if self.engine is None else str(self.engine),
            },
        )
