"""SDC audit for training steps: replay a sampled step's local gradient and compare before optimizer.step().

How an executor uses it, inside a step, after backward and before ``optimizer.step()``::

    if auditor.should_audit(step):                       # same answer on every rank (seeded)
        verdict = auditor.audit(step=step, rank=rank, observed=local_grads,
                                recompute=lambda: replay_local_grads(batch, rng_state),
                                inputs=(batch, params), defer_policy=True)
        verdict = auditor.agree(verdict, group=dp_group)  # every rank learns every finding
        if verdict.skip: ...keep the update out (zero grads / skip optimizer.step())

``observed`` is this rank's local gradient captured before the reduction (e.g. in a DDP comm
hook); ``recompute`` replays it with the same batch and RNG state. ``audit_peer`` lets the next
rank of the data-parallel group recompute it from the shipped batch, checked by a digest of
batch and parameters. Comparison is bitwise (``bound=0``) or within an absolute bound.
Policies: ``warn`` (record and go on), ``raise`` (``SDCDetectedError``), ``skip_step``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from ...contracts import TRAINING_AUDIT_POLICIES, AuditPolicy, SDCAuditRecord, choose
from .digest import digest, max_abs_difference
from .schedule import AuditSchedule, SDCDetectedError

_log = logging.getLogger(__name__)


@attrs.frozen
class AuditVerdict:
    """The records of one audited step and whether the update must be kept out."""

    records: tuple[SDCAuditRecord, ...] = ()
    skip: bool = False

    @property
    def mismatched(self) -> tuple[SDCAuditRecord, ...]:
        """Records whose replay disagreed."""
        return tuple(r for r in self.records if not r.matched)

    @property
    def attributed_ranks(self) -> frozenset[int]:
        """Ranks blamed for a mismatch."""
        return frozenset(r.attributed_rank for r in self.mismatched if r.attributed_rank is not None)


class TrainingAuditor:
    """Audits sampled training steps by replay and applies the policy; keeps every record."""

    def __init__(
        self,
        schedule: AuditSchedule | None = None,
        *,
        policy: AuditPolicy | str = AuditPolicy.WARN,
        bound: float = 0.0,
    ) -> None:
        self.policy = AuditPolicy(choose(AuditPolicy, policy, option="audit policy", allowed=TRAINING_AUDIT_POLICIES))
        if bound < 0:
            raise ValueError(f"audit bound must be >= 0 (0 means bitwise), got {bound}")
        self.schedule = schedule or AuditSchedule()
        self.bound = float(bound)
        self.records: list[SDCAuditRecord] = []
        """Every fresh record, in the order found; the run's ledger owner writes them (audits write no ledger)."""

    def should_audit(self, step: int) -> bool:
        """True when ``step`` is scheduled for audit."""
        return self.schedule.is_audited(step)

    def _record(self, *, step: int, rank: int, unit: str, replay: str, expected: Any, observed: Any,
                auditor_rank: int, injected: bool, expected_digest: str | None = None,
                observed_digest: str | None = None) -> SDCAuditRecord:
        exp_d = expected_digest or digest(expected)
        obs_d = observed_digest or digest(observed)
        if expected is not None and observed is not None:
            difference = max_abs_difference(expected, observed)
        else:
            difference = 0.0 if exp_d == obs_d else float("inf")
        matched = exp_d == obs_d if self.bound == 0.0 else difference <= self.bound
        finite = difference if difference != float("inf") else 1.7976931348623157e308
        return SDCAuditRecord(
            family="training", step=step, rank=rank, unit=unit, replay=replay,
            expected_digest=exp_d, observed_digest=obs_d, matched=matched,
            action="none" if matched else self.policy.value, auditor_rank=auditor_rank,
            attributed_rank=None if matched else rank,
            maximum_absolute_difference=0.0 if matched and self.bound == 0.0 else finite,
            bound=self.bound, injected=injected,
        )

    def audit(
        self,
        *,
        step: int,
        rank: int,
        observed: Mapping[str, Any],
        recompute: Callable[[], Mapping[str, Any]],
        inputs: Any = None,
        injected: bool = False,
        defer_policy: bool = False,
    ) -> AuditVerdict:
        """Same-rank replay: recompute the local gradient and compare it with ``observed``.

        Pass ``defer_policy=True`` when ``agree`` follows, so ``raise`` fires on every rank there.
        """
        unit = "local_gradient" + (f" inputs={digest(inputs)[:23]}" if inputs is not None else "")
        replayed = recompute()
        record = self._record(step=step, rank=rank, unit=unit, replay="same_rank", expected=replayed,
                              observed=observed, auditor_rank=rank, injected=injected)
        return self._conclude((record,), enforce=not defer_policy)

    def audit_peer(
        self,
        *,
        step: int,
        rank: int,
        group_ranks: Sequence[int],
        batch: Any,
        params: Any,
        observed: Mapping[str, Any],
        recompute_on: Callable[[Any], Mapping[str, Any]],
        group: Any = None,
        injected: bool = False,
    ) -> AuditVerdict:
        """Peer replay over torch.distributed: the next rank of ``group_ranks`` recomputes this rank's gradient.

        Every rank ships (batch, digest of batch+params, digest of its gradient) to the group; each
        rank checks its predecessor's inputs digest against (received batch, its own replicated
        parameters), recomputes with ``recompute_on(batch)`` and compares. All records reach all ranks.
        """
        import torch.distributed as dist

        ranks = list(group_ranks)
        if rank not in ranks or len(ranks) < 2:
            raise ValueError(f"peer audit needs rank {rank} in a group of >= 2 ranks, got {ranks}")
        mine = {"rank": rank, "batch": batch, "inputs": digest((batch, params)), "grad": digest(observed),
                "injected": injected}
        gathered: list[Any] = [None] * len(ranks)
        dist.all_gather_object(gathered, mine, group=group)
        position = ranks.index(rank)
        subject = gathered[(position - 1) % len(ranks)]
        own_view = digest((subject["batch"], params))
        if own_view != subject["inputs"]:
            unit = "batch+parameters"
            record = self._record(step=step, rank=subject["rank"], unit=unit, replay="peer", expected=None,
                                  observed=None, auditor_rank=rank, injected=subject["injected"],
                                  expected_digest=own_view, observed_digest=subject["inputs"])
        else:
            replayed = recompute_on(subject["batch"])
            record = self._record(step=step, rank=subject["rank"], unit=f"local_gradient inputs={own_view[:23]}",
                                  replay="peer", expected=None, observed=None, auditor_rank=rank,
                                  injected=subject["injected"], expected_digest=digest(replayed),
                                  observed_digest=subject["grad"])
        everyone: list[Any] = [None] * len(ranks)
        dist.all_gather_object(everyone, record, group=group)
        return self._conclude(tuple(everyone))

    def agree(self, verdict: AuditVerdict, *, group: Any = None) -> AuditVerdict:
        """Share every rank's records over ``group`` so all ranks apply the same policy decision."""
        import torch.distributed as dist

        size = dist.get_world_size(group)
        gathered: list[Any] = [None] * size
        dist.all_gather_object(gathered, list(verdict.records), group=group)
        merged = tuple(r for part in gathered for r in part)
        return self._conclude(merged, already_recorded=verdict.records)

    def _conclude(self, records: tuple[SDCAuditRecord, ...], *, enforce: bool = True,
                  already_recorded: tuple[SDCAuditRecord, ...] = ()) -> AuditVerdict:
        fresh = [r for r in records if r not in already_recorded]
        self.records.extend(fresh)
        mismatch = any(not r.matched for r in records)
        verdict = AuditVerdict(records, skip=self.policy is AuditPolicy.SKIP_STEP and mismatch)
        if verdict.mismatched:
            for record in verdict.mismatched:
                _log.warning("SDC audit mismatch: %s at step %d on rank %s (%s replay by rank %s)",
                             record.unit, record.step, record.attributed_rank, record.replay, record.auditor_rank)
            if self.policy is AuditPolicy.RAISE and enforce:
                raise SDCDetectedError(verdict.records)
        return verdict
