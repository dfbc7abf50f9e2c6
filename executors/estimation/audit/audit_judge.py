"""The EM reference audit's judge: evidence in, a verdict and replay requests out; it holds no handle or runner.

Like the training step's commit decision (``executors/torch/commit.py``), judging is a pure function of what
the pass gathered. First :func:`replays_needed` names the audited chunks (and opened groups) whose committed
digest differs from the reference (or from the driver's own fold): the pass replays each on its worker
through the backend. Then :func:`judge_chunks` / :func:`judge_folds` classify every one: bitwise equal, or
within the tolerance and reproduced (rounding), matches; reproduced beyond it is a ``backend_defect``
(software); not reproduced, a ``device`` fault, which under ``quarantine`` with a spare healthy worker
quarantines that worker. :func:`enforce` raises where the policy says so. The pass applies the verdict.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from ....contracts import AuditPolicy, SDCAuditRecord, Tolerance
from ....verification.sdc.em import ChunkAudit, within_tolerance
from ....verification.sdc.schedule import BackendDefectError, SDCDetectedError

__all__ = ["ChunkEvidence", "FoldEvidence", "Verdict", "enforce", "judge_chunks", "judge_folds", "replays_needed"]

_MAX = 1.7976931348623157e308


@attrs.frozen
class ChunkEvidence:
    """One audited chunk as the pass saw it: its worker, own result (None where only its digest came back),
    the digest it committed to, the reference computed outside the backend, and whether a fault was planted."""

    chunk: int
    worker: int
    own: Any = attrs.field(eq=False)
    committed: str
    reference: Any = attrs.field(eq=False)
    injected: bool = False


@attrs.frozen
class FoldEvidence:
    """One opened combine group: ``expected`` digests its committed chunk digests with the driver's fold of the
    revealed results, ``observed`` the revealed results' digests with the sum the backend returned."""

    first: int
    last: int
    worker: int
    expected: str
    observed: str


@attrs.frozen
class Verdict:
    """What the judge decided: one ``ChunkAudit`` per chunk or group, and the workers to quarantine (in order)."""

    outcomes: tuple[ChunkAudit, ...]
    quarantine: tuple[int, ...] = ()


def replays_needed(chunks: Sequence[ChunkEvidence], digest: Callable[[Any], str]) -> tuple[int, ...]:
    """The audited chunks whose reference's digest is not the committed one (the pass replays each)."""
    return tuple(e.chunk for e in chunks if digest(e.reference) != e.committed)


def _action(matched: bool, cause: str, policy: AuditPolicy, quarantine: bool) -> str:
    if matched:
        return "none"
    return "warn" if policy is AuditPolicy.WARN else "quarantine" if quarantine else "raise"


def judge_chunks(chunks: Sequence[ChunkEvidence], replays: Mapping[int, Any], *, iteration: int,
                 policy: AuditPolicy, tolerance: Tolerance, digest: Callable[[Any], str],
                 healthy: Sequence[int], may_quarantine: bool) -> Verdict:
    """Each audited chunk against its reference, a mismatch classified by its ``replays[chunk]`` (module doc).

    ``healthy`` are the workers not yet quarantined; a device fault quarantines its worker only while another
    healthy one remains (and only where ``may_quarantine``: a runner that places work). Further device faults of
    a worker quarantined earlier in the same pass are that quarantine's (its chunks are all recomputed)."""
    left, outcomes, quarantined = list(healthy), [], []
    for e in chunks:
        expected, observed = digest(e.reference), e.committed
        matched, diff, bound, cause = True, 0.0, 0.0, ""
        if expected != observed:
            replayed = replays[e.chunk]
            reproduced = digest(replayed) == observed
            value = e.own if e.own is not None else replayed if reproduced else None
            matched, diff, bound = (within_tolerance(value, e.reference, tolerance.atol, tolerance.rtol)
                                    if value is not None else
                                    (False, _MAX, within_tolerance(e.reference, e.reference, tolerance.atol,
                                                                   tolerance.rtol)[2]))
            matched = matched and reproduced
            cause = "" if matched else "backend_defect" if reproduced else "device"
        # a second device fault of a worker already quarantined in this pass is covered by that quarantine
        quarantine = cause == "device" and (e.worker in quarantined or (
            may_quarantine and len(left) >= 2 and policy is AuditPolicy.QUARANTINE))
        record = SDCAuditRecord(
            family="em", step=iteration, rank=e.worker, unit=f"chunk:{e.chunk}", replay="reference",
            expected_digest=expected, observed_digest=observed, matched=matched,
            action=_action(matched, cause, policy, quarantine), auditor_rank=None,
            attributed_rank=None if matched else e.worker, maximum_absolute_difference=diff, bound=bound,
            injected=e.injected, cause=cause)
        if quarantine and e.worker not in quarantined:
            quarantined.append(e.worker)
            left = [w for w in left if w != e.worker]
        outcomes.append(ChunkAudit(iteration, e.chunk, (record,), e.own, e.worker if quarantine else None))
    return Verdict(tuple(outcomes), tuple(quarantined))


def judge_folds(groups: Sequence[FoldEvidence], replays: Mapping[int, str], *, iteration: int,
                policy: AuditPolicy, healthy: Sequence[int], may_quarantine: bool) -> Verdict:
    """Each opened group's sum against its committed chunks; a mismatch classified by ``replays[first]``, the
    group's observed digest folded and revealed again on its worker. A group of a worker an earlier group got
    quarantined is left out (the pass recomputes that worker's chunks)."""
    left, outcomes, quarantined = list(healthy), [], []
    for g in groups:
        if g.worker in quarantined:  # quarantined by an earlier group: its chunks are recomputed, not judged
            continue
        matched, cause = g.expected == g.observed, ""
        if not matched:
            cause = "backend_defect" if replays[g.first] == g.observed else "device"
        quarantine = cause == "device" and may_quarantine and len(left) >= 2 and policy is AuditPolicy.QUARANTINE
        record = SDCAuditRecord(
            family="em", step=iteration, rank=g.worker, unit=f"group:{g.first}-{g.last}", replay="reference",
            expected_digest=g.expected, observed_digest=g.observed, matched=matched,
            action=_action(matched, cause, policy, quarantine), auditor_rank=None,
            attributed_rank=None if matched else g.worker, cause=cause)
        if quarantine:
            quarantined.append(g.worker)
            left = [w for w in left if w != g.worker]
        outcomes.append(ChunkAudit(iteration, g.first, (record,), None, g.worker if quarantine else None))
    return Verdict(tuple(outcomes), tuple(quarantined))


def enforce(verdict: Verdict, policy: AuditPolicy) -> None:
    """Raise for the first outcome whose mismatch the policy does not let pass (``BackendDefectError`` for a
    software defect, else ``SDCDetectedError``); nothing when every mismatch is warned of or quarantined."""
    for outcome in verdict.outcomes:
        bad = [r for r in outcome.records if not r.matched]
        if bad and (policy is AuditPolicy.RAISE or bad[0].action == "raise"):
            if bad[0].cause == "backend_defect":
                raise BackendDefectError(outcome.records)
            raise SDCDetectedError(outcome.records)
