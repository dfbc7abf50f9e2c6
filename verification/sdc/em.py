"""SDC audit for EM: an audited chunk is recomputed by another worker, a third witnesses a mismatch.

EM sufficient statistics are additive and deterministic per chunk, so a chunk's statistics
computed on any healthy worker have the same bits. ``EMAuditor.audit_chunk`` recomputes a
chunk on the next healthy worker; on a mismatch a third worker's recomputation decides which
one is faulty (majority of three digests), that worker is quarantined, and the majority value is
used. ``audited_fold`` is the reference driver an EM handle can call per iteration: it assigns
chunks to healthy workers, audits the sampled ones, recomputes every chunk of a quarantined
worker, and combines in chunk order so the fit ends on the same bits as a clean run.

Peers run the backend's own code, so a backend that computes a chunk wrong the same way on every
worker passes them. ``EMAuditor.audit_reference`` therefore also compares an audited chunk with an
independent reference computed outside the backend (the handle's own numpy E-step of the chunk's
rows, in the driver); a mismatch is replayed on the same worker: reproduced, it is a deterministic
``backend_defect``; not reproduced, a ``device`` fault.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from ...contracts import EM_AUDIT_POLICIES, AuditPolicy, SDCAuditRecord, choose
from .digest import digest
from .schedule import EM_AUDIT_RATE, BackendDefectError, SDCDetectedError, audit_uniform

_log = logging.getLogger(__name__)
_MAX = 1.7976931348623157e308


def _leaves(value: Any) -> list[Any]:
    """The numeric leaves of a statistic in a fixed order (mappings by sorted key); anything else is one leaf."""
    if isinstance(value, Mapping):
        return [leaf for k in sorted(value, key=str) for leaf in _leaves(value[k])]
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


def within_tolerance(observed: Any, reference: Any, atol: float, rtol: float) -> tuple[bool, float, float]:
    """(every numeric element within ``atol + rtol * |reference|``, the largest |difference|, the bound that
    implies); a differing structure, a non-numeric leaf that differs or a NaN where the other is not, fails."""
    a, b = _leaves(observed), _leaves(reference)
    if len(a) != len(b):
        return False, _MAX, 0.0
    worst, scale, ok = 0.0, 0.0, True
    for x, y in zip(a, b):
        try:
            xa, ya = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        except (TypeError, ValueError):
            ok = ok and digest(x) == digest(y)
            continue
        if xa.shape != ya.shape:
            return False, _MAX, 0.0
        if xa.size == 0:
            continue
        same_nan = np.isnan(xa) & np.isnan(ya)
        diff = np.where(same_nan | (xa == ya), 0.0, np.abs(xa - ya))
        diff = np.where(np.isnan(diff), np.inf, diff)
        ok = ok and bool(np.all(diff <= atol + rtol * np.abs(ya)))
        worst = max(worst, float(diff.max()))
        scale = max(scale, float(np.nanmax(np.abs(np.where(np.isfinite(ya), ya, 0.0)))))
    bound = min(atol + rtol * scale, _MAX)
    return ok and worst <= bound, min(worst, _MAX), bound


@attrs.frozen
class ChunkAudit:
    """The outcome of auditing one chunk: records, the statistic to use, the worker quarantined."""

    iteration: int
    chunk: int
    records: tuple[SDCAuditRecord, ...]
    statistic: Any = attrs.field(eq=False)
    quarantined: int | None = None

    @property
    def matched(self) -> bool:
        """True when the first replay agreed with the primary."""
        return self.records[0].matched


class EMAuditor:
    """Chooses audited chunks (seeded), runs peer/witness replays, and tracks quarantined workers."""

    def __init__(self, *, rate: float = EM_AUDIT_RATE, seed: int = 0,
                 policy: AuditPolicy | str = AuditPolicy.QUARANTINE, digest: Callable[[Any], str] = digest) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"EM audit rate={rate} must be within [0, 1]")
        self.rate, self.seed = rate, seed
        self.policy = AuditPolicy(choose(AuditPolicy, policy, option="EMAuditor policy", allowed=EM_AUDIT_POLICIES))
        """What a mismatch does (``contracts.EM_AUDIT_POLICIES``): quarantine the faulty worker, raise, or record."""
        self.digest = digest
        """The checksum compared (default ``sdc.digest.digest``; EM handles pass ``statistic_digest``)."""
        self.quarantined: set[int] = set()
        self.records: list[SDCAuditRecord] = []
        """Every record, in the order found; the owner of the run's ledger writes them (audits write no ledger)."""

    def audited_chunks(self, iteration: int, num_chunks: int) -> tuple[int, ...]:
        """Chunks audited in ``iteration``: a seeded ``rate`` fraction, and one chunk of iteration 0 always."""
        chosen = {c for c in range(num_chunks) if audit_uniform(self.seed, iteration * 1_000_003 + c, "em") < self.rate}
        if iteration == 0 and num_chunks:
            chosen.add(int(audit_uniform(self.seed, 0, "em-first") * num_chunks))
        return tuple(sorted(chosen))

    def healthy(self, workers: Sequence[int]) -> list[int]:
        """``workers`` without the quarantined ones."""
        return [w for w in workers if w not in self.quarantined]

    def _others(self, workers: Sequence[int], exclude: set[int], start: int) -> list[int]:
        healthy = self.healthy(workers)
        if not healthy:
            return []
        begin = healthy.index(start) if start in healthy else 0
        ring = healthy[begin:] + healthy[:begin]
        return [w for w in ring if w not in exclude]

    def _record(self, iteration: int, chunk: int, rank: int, replay: str, auditor: int, expected: str,
                observed: str, action: str, attributed: int | None, injected: bool) -> SDCAuditRecord:
        matched = expected == observed
        return SDCAuditRecord(
            family="em", step=iteration, rank=rank, unit=f"chunk:{chunk}", replay=replay,
            expected_digest=expected, observed_digest=observed, matched=matched,
            action="none" if matched else action, auditor_rank=auditor,
            attributed_rank=None if matched else attributed, injected=injected,
        )

    def audit_chunk(
        self,
        *,
        iteration: int,
        chunk: int,
        primary: int,
        statistic: Any,
        recompute: Callable[[int], Any],
        workers: Sequence[int],
        injected: bool = False,
    ) -> ChunkAudit:
        """Recompute ``chunk`` on another worker with ``recompute(worker)``; witness and attribute on mismatch."""
        peers = self._others(workers, {primary}, primary)
        if not peers:
            raise ValueError(f"cannot audit chunk {chunk}: no healthy worker other than {primary} in {list(workers)}")
        auditor = peers[0]
        primary_digest = self.digest(statistic)
        replayed = recompute(auditor)
        replay_digest = self.digest(replayed)
        if replay_digest == primary_digest:
            record = self._record(iteration, chunk, primary, "peer", auditor, replay_digest, primary_digest,
                                  "none", None, injected)
            return self._finish(ChunkAudit(iteration, chunk, (record,), statistic))
        witnesses = [w for w in peers[1:]]
        action = self.policy.value
        if not witnesses:
            record = self._record(iteration, chunk, primary, "peer", auditor, replay_digest, primary_digest,
                                  "raise", None, injected)
            self._finish(ChunkAudit(iteration, chunk, (record,), statistic), enforce=False)
            raise SDCDetectedError([record])
        witness = witnesses[0]
        witnessed = recompute(witness)
        witness_digest = self.digest(witnessed)
        if witness_digest == replay_digest:
            faulty, value = primary, replayed
        elif witness_digest == primary_digest:
            faulty, value = auditor, statistic
        else:
            faulty, value, action = None, statistic, "raise"
        peer_record = self._record(iteration, chunk, primary, "peer", auditor, replay_digest, primary_digest,
                                   action, faulty, injected)
        witness_record = self._record(iteration, chunk, primary, "witness", witness, witness_digest,
                                      primary_digest, action, faulty, injected)
        quarantined = faulty if action == AuditPolicy.QUARANTINE else None
        if quarantined is not None:
            self.quarantined.add(quarantined)
        return self._finish(ChunkAudit(iteration, chunk, (peer_record, witness_record), value, quarantined))

    def audit_same_worker(self, *, iteration: int, chunk: int, worker: int, statistic: Any, replayed: Any,
                          injected: bool = False) -> ChunkAudit:
        """Compare a chunk with its replay on the same worker (runners that cannot place work on a peer).

        A mismatch cannot be attributed between two runs on one worker: it is recorded against
        ``worker`` and, unless the policy is ``warn``, raises ``SDCDetectedError``.
        """
        expected, observed = self.digest(replayed), self.digest(statistic)
        action = "warn" if self.policy is AuditPolicy.WARN else "raise"
        record = self._record(
            iteration, chunk, worker, "same_rank", worker, expected, observed, action, worker, injected
        )
        return self._finish(ChunkAudit(iteration, chunk, (record,), statistic))

    def audit_reference(self, *, iteration: int, chunk: int, worker: int, statistic: Any, reference: Any,
                        replay: Callable[[], Any], atol: float, rtol: float, injected: bool = False,
                        can_quarantine: bool = False, observed: str | None = None,
                        digest: Callable[[Any], str] | None = None) -> ChunkAudit:
        """Compare the backend's ``statistic`` of ``chunk`` with the independent ``reference``: where the bits
        differ ``replay()`` recomputes it on ``worker`` through the backend. It matches when bitwise equal, or
        within ``atol + rtol * |reference|`` and reproduced bitwise (a deterministic rounding difference, e.g.
        another engine); else a reproduced mismatch is a ``backend_defect`` (software, deterministic), one not
        reproduced a ``device`` fault of ``worker``. A device fault under policy ``quarantine`` with
        ``can_quarantine`` (a healthy worker remains to recompute) quarantines ``worker``; any other mismatch
        raises unless the policy is ``warn`` (quarantining a worker cannot mend software). ``observed`` is the
        digest the backend committed to when its ``statistic`` did not come back (None): the replay that
        reproduces that digest stands for it; one that does not leaves the difference unknown (the float maximum).
        ``digest`` replaces the auditor's checksum for this comparison (the one ``observed`` was made with)."""
        digest = self.digest if digest is None else digest
        expected = digest(reference)
        observed = digest(statistic) if observed is None else observed
        matched, diff, bound, cause = True, 0.0, 0.0, ""
        if expected != observed:  # the tolerance admits a deterministic rounding difference, not a transient one
            replayed = replay()
            reproduced = digest(replayed) == observed
            value = statistic if statistic is not None else replayed if reproduced else None
            matched, diff, bound = (within_tolerance(value, reference, atol, rtol) if value is not None else
                                    (False, _MAX, within_tolerance(reference, reference, atol, rtol)[2]))
            matched = matched and reproduced
            cause = "" if matched else "backend_defect" if reproduced else "device"
        quarantine = (cause == "device" and can_quarantine and self.policy is AuditPolicy.QUARANTINE)
        action = "none" if matched else ("warn" if self.policy is AuditPolicy.WARN else
                                         "quarantine" if quarantine else "raise")
        record = SDCAuditRecord(
            family="em", step=iteration, rank=worker, unit=f"chunk:{chunk}", replay="reference",
            expected_digest=expected, observed_digest=observed, matched=matched, action=action,
            auditor_rank=None, attributed_rank=None if matched else worker,
            maximum_absolute_difference=diff, bound=bound, injected=injected, cause=cause,
        )
        if quarantine:
            self.quarantined.add(worker)
        return self._finish(ChunkAudit(iteration, chunk, (record,), statistic, worker if quarantine else None))

    def audit_fold(self, *, iteration: int, first: int, last: int, worker: int, expected: str, observed: str,
                   replay: Callable[[], str], can_quarantine: bool = False) -> ChunkAudit:
        """A combine group's folded sum, bound to its chunks' committed results: ``expected`` digests the digests
        the pass committed to with the driver's own fold of the chunks' revealed results, ``observed`` the
        revealed results' digests with the sum the backend returned. Where they differ ``replay()`` folds and
        reveals the group again on ``worker`` through the backend (its ``observed``): reproduced, a
        ``backend_defect``; not, a ``device`` fault of ``worker``, quarantined under ``quarantine`` with
        ``can_quarantine``. Anything else that differs raises unless the policy is ``warn``."""
        matched, cause = expected == observed, ""
        if not matched:
            cause = "backend_defect" if replay() == observed else "device"
        quarantine = cause == "device" and can_quarantine and self.policy is AuditPolicy.QUARANTINE
        action = "none" if matched else ("warn" if self.policy is AuditPolicy.WARN else
                                         "quarantine" if quarantine else "raise")
        record = SDCAuditRecord(
            family="em", step=iteration, rank=worker, unit=f"group:{first}-{last}", replay="reference",
            expected_digest=expected, observed_digest=observed, matched=matched, action=action, auditor_rank=None,
            attributed_rank=None if matched else worker, cause=cause,
        )
        if quarantine:
            self.quarantined.add(worker)
        return self._finish(ChunkAudit(iteration, first, (record,), None, worker if quarantine else None))

    def _finish(self, outcome: ChunkAudit, *, enforce: bool = True) -> ChunkAudit:
        self.records.extend(outcome.records)
        bad = [r for r in outcome.records if not r.matched]
        if bad:
            _log.warning(
                "EM audit mismatch on %s, iteration %d: attributed to worker %s, action %s",
                bad[0].unit,
                outcome.iteration,
                bad[0].attributed_rank,
                bad[0].action,
            )
            if enforce and (self.policy is AuditPolicy.RAISE or bad[0].action == "raise"):
                if bad[0].cause == "backend_defect":
                    raise BackendDefectError(outcome.records)
                raise SDCDetectedError(outcome.records)
        return outcome


def _compute_chunks(num_chunks: int, owner: dict[int, int], compute: Callable[[int, int], Any], iteration: int,
                    injector: Any) -> tuple[dict[int, Any], set[int]]:
    """Every chunk's statistic on its owner, with the injector's strikes; the chunks it struck."""
    results: dict[int, Any] = {}
    struck: set[int] = set()
    for chunk in range(num_chunks):
        value = compute(owner[chunk], chunk)
        if injector is not None:
            if isinstance(value, dict):
                hit = any(
                    injector.apply("statistic", f"chunk:{chunk}/{k}", value[k], rank=owner[chunk], step=iteration)
                    for k in sorted(value)
                )
            else:
                hit = injector.apply("statistic", f"chunk:{chunk}", value, rank=owner[chunk], step=iteration)
            if hit:
                struck.add(chunk)
        results[chunk] = value
    return results, struck


def _recompute_quarantined(auditor: EMAuditor, outcome: ChunkAudit, workers: Sequence[int], owner: dict[int, int],
                           results: dict[int, Any], compute: Callable[[int, int], Any]) -> None:
    """Move every other chunk of the worker ``outcome`` quarantined to a survivor and recompute it there."""
    survivors = auditor.healthy(workers)
    if not survivors:
        raise RuntimeError("every worker is quarantined; cannot recompute")
    for other, worker in owner.items():
        if worker == outcome.quarantined and other != outcome.chunk:
            replacement = survivors[other % len(survivors)]
            results[other] = compute(replacement, other)
            owner[other] = replacement


def _audit_one(auditor: EMAuditor, iteration: int, chunk: int, owner: dict[int, int], results: dict[int, Any],
               compute: Callable[[int, int], Any], workers: Sequence[int], injected: bool) -> ChunkAudit:
    """Audit ``chunk`` (recomputed on a peer), keep the statistic the audit decided on, and recompute the
    chunks of a worker it quarantined."""

    def recompute(worker: int) -> Any:
        return compute(worker, chunk)

    outcome = auditor.audit_chunk(iteration=iteration, chunk=chunk, primary=owner[chunk], statistic=results[chunk],
                                  recompute=recompute, workers=workers, injected=injected)
    results[chunk] = outcome.statistic
    if outcome.quarantined is not None:
        _recompute_quarantined(auditor, outcome, workers, owner, results, compute)
    return outcome


def audited_fold(
    num_chunks: int,
    *,
    workers: Sequence[int],
    compute: Callable[[int, int], Any],
    combine: Callable[[Any, Any], Any],
    iteration: int,
    auditor: EMAuditor | None = None,
    injector: Any = None,
) -> tuple[Any, tuple[ChunkAudit, ...]]:
    """One EM iteration's statistics: ``compute(worker, chunk)`` per chunk, audited, combined in chunk order.

    ``injector`` (a ``FaultInjector``) strikes the primary computation only, with names
    ``chunk:<c>/<key>`` for mapping statistics (``chunk:<c>`` otherwise) and step = ``iteration``.
    """
    if num_chunks < 1:
        raise ValueError("audited_fold needs at least one chunk")
    healthy = auditor.healthy(workers) if auditor else list(workers)
    if not healthy:
        raise RuntimeError(f"every worker of {list(workers)} is quarantined; nothing can compute")
    owner = {c: healthy[c % len(healthy)] for c in range(num_chunks)}
    results, struck = _compute_chunks(num_chunks, owner, compute, iteration, injector)
    outcomes: list[ChunkAudit] = []
    if auditor is not None:
        for chunk in auditor.audited_chunks(iteration, num_chunks):
            outcomes.append(_audit_one(auditor, iteration, chunk, owner, results, compute, workers, chunk in struck))
    total = results[0]
    for chunk in range(1, num_chunks):
        total = combine(total, results[chunk])
    return total, tuple(outcomes)
