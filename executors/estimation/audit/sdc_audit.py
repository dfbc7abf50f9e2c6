"""SDC audit of the EM E-step inside an encoded-data handle.

With the reference (the handle holds the rows: ``rows_reference``; or fetches one chunk again from its source:
``source_reference``; on SPMD handles every rank agrees on it, ``spmd_audit``), ``EMAudit._reference_pass``:

1. The pass hands the backend the same tasks whichever chunks are audited: every chunk on its worker, no
   chunk named, each folded group bringing back the ``commit_digest`` of each of its chunks' own
   results (``GroupFold(commit=True)``), a commitment. The audited chunks are a ``rate`` sample drawn from a
   generator seeded with an HMAC of (seed, iteration) under a per-handle secret, plus one on the first E-step
   of every fit.
2. The driver recomputes each audited chunk's E-step from the rows on a thread while the workers fold; it is
   the one recomputation (the backend computes no chunk twice).
3. ``EMAuditor.audit_reference`` compares it with the committed digest; where they differ a replay on the
   same worker through the backend decides: it reproduces the digest and lies within
   ``EM_REFERENCE_TOLERANCE`` (rounding), it reproduces and lies beyond (``backend_defect``: raises unless
   ``warn``), or it does not reproduce (``device``): under ``quarantine`` with a healthy worker left that
   worker is quarantined, its chunks recomputed on the others and checked against the reference again, so
   the fit ends on the same bits as a clean run.

Without the reference (a source that cannot read one chunk alone; mixle's ``AuditedMPEncodedData``, whose peer
evaluations are counted), on a runner that can place work (``supports_worker_placement``: local, mp, dask,
ray) one round computes every chunk on its primary *and* every audited chunk (a seeded ``rate`` fraction,
``EMAuditor.audited_chunks``) on the next healthy worker; ``EMAuditor.audit_chunk`` compares the two by
``statistic_digest``; on a mismatch a third worker witnesses and the majority names the faulty worker, which
is quarantined (two workers: ``SDCDetectedError``). Runners without placement (mpi, spark) recompute an
audited chunk on the same runner (``same_rank`` replays). Fault injection (``audit_injection``) strikes
inside the worker that computes a chunk.

The audit writes no ledger: ``take_events`` hands its findings (``SDCAuditRecord`` values and
``AuditNote`` values for lost / quarantined workers, in the order found) to the handle, which owns
the run's ledger and writes them.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from ....contracts import EM_AUDIT_POLICIES, AuditPolicy, SDCAuditRecord, choose
from ....contracts.estimation import statistic_digest
from ....verification.harness.em_reference import EM_REFERENCE_TOLERANCE
from ....verification.sdc.em import ChunkAudit, EMAuditor, within_tolerance
from ....verification.sdc.schedule import EM_AUDIT_RATE, SDCDetectedError, audit_uniform
from ..em_pass.chunks import (
    ChunkResult,
    EncodedChunk,
    GroupFold,
    GroupStats,
    WorkerLostError,
    WorkerTask,
    WorkerUnavailableError,
    chunk_estep,
    chunk_result,
    group_of,
    supports_worker_placement,
)
from ..em_pass.combine_order import commit_digest, committed_result
from ..engines.chunk_assignment import block_assignment
from .audit_injection import chunk_estep_struck, flip_statistic  # re-exported here, their earlier home
from .audit_receipt import em_receipt  # re-exported here, its earlier home
from .fold_binding import bind_folded_sums

__all__ = ["EM_AUDIT_RATE", "AuditNote", "EMAudit", "chunk_estep_struck", "em_receipt", "flip_statistic",
           "rows_reference", "source_reference"]


# ---- the audit driver ------------------------------------------------------------------------------
def _ring_next(healthy: Sequence[int], primary: int) -> int | None:
    """The worker ``EMAuditor`` picks as the auditor of ``primary``'s chunk: next healthy in ring order."""
    if not healthy:
        return None
    begin = healthy.index(primary) if primary in healthy else 0
    ring = list(healthy[begin:]) + list(healthy[:begin])
    others = [w for w in ring if w != primary]
    return others[0] if others else None


@attrs.frozen
class AuditNote:
    """A ledger note the audit found (a lost or quarantined worker); the handle writes it."""

    message: str
    fields: Mapping[str, Any] = attrs.field(factory=dict)


AuditEvent = SDCAuditRecord | AuditNote
"""What ``EMAudit.take_events`` returns, in the order found."""


class EMAudit:
    """The SDC audit state of one handle: the seeded auditor, quarantined and lost workers, injector."""

    def __init__(self, runner: Any, *, rate: float = EM_AUDIT_RATE,
                 policy: AuditPolicy | str = AuditPolicy.QUARANTINE, seed: int = 0, fault_injector: Any = None) -> None:
        self.runner = runner
        chosen = choose(AuditPolicy, policy, option="audit_policy", allowed=EM_AUDIT_POLICIES)
        self.auditor = EMAuditor(rate=rate, seed=seed, policy=chosen, digest=statistic_digest)
        self.injector = fault_injector
        self.placement = supports_worker_placement(runner)
        if fault_injector is not None and not self.placement:
            raise ValueError(
                f"fault_injector= needs a runner that computes chosen chunks on a chosen worker; the "
                f"{runner.name!r} runner declares supports_worker_placement=False (use mp, local, dask or ray)"
            )
        self.lost: set[int] = set()
        self.reference: Callable[[int, Any, Any], Any] | None = None
        """``reference(chunk, estimator, model)``: the chunk's E-step computed outside the backend (the handle
        sets it where it holds the rows); each audited chunk is also compared with it (``audit_reference``)."""
        self.tolerance = EM_REFERENCE_TOLERANCE
        """What a reference comparison allows where the bits differ (the harness's EM bound)."""
        self.peer_replays = False
        self.computes: Callable[[int], bool] | None = None
        """Which audited chunks' reference this process computes (None: all; SPMD: each rank its own)."""
        self.gather: Callable[[Any], list[Any]] | None = None
        """SPMD: every rank's value in rank order (a collective), to share the references so every rank judges
        the same and enters the same replays; None in one driver."""
        self._secret = secrets.token_bytes(32)  # never leaves the driver: the backend cannot draw the sample
        self._owner = secrets.token_hex(8)  # names this audit's passes in the workers' retained results
        """With a reference, whether audited chunks are still also computed on a peer in the pass (mixle's
        ``AuditedMPEncodedData`` counts those evaluations); by default the reference replaces the peer replay,
        which only checked the backend against itself, and a mismatch is classified by a same-worker replay."""
        self._events: list[AuditEvent] = []
        self._taken = 0  # auditor records already moved to _events

    # -- findings for the ledger's owner -------------------------------------------------------------
    def _sync(self) -> None:
        fresh = self.auditor.records[self._taken:]
        self._taken += len(fresh)
        self._events.extend(fresh)

    def _note(self, message: str, **fields: Any) -> None:
        self._sync()
        self._events.append(AuditNote(message, fields))

    def take_events(self) -> tuple[AuditEvent, ...]:
        """The records and notes found since the last call, in order (the handle writes them to its ledger)."""
        self._sync()
        events, self._events = tuple(self._events), []
        return events

    # -- state ----------------------------------------------------------------------------------
    @property
    def rate(self) -> float:
        """Fraction of chunks audited per E-step."""
        return self.auditor.rate

    @property
    def records(self) -> tuple[Any, ...]:
        """Every ``SDCAuditRecord`` so far."""
        return tuple(self.auditor.records)

    @property
    def quarantined(self) -> frozenset[int]:
        """Workers quarantined after an attributed mismatch."""
        return frozenset(self.auditor.quarantined)

    def readmit(self, workers: Sequence[int] | None = None) -> None:
        """Give quarantined workers chunks again (after the hardware was checked or replaced)."""
        if workers is None:
            self.auditor.quarantined.clear()
        else:
            self.auditor.quarantined.difference_update(int(w) for w in workers)

    def live(self) -> list[int]:
        """Live worker ids not lost during an audited pass."""
        return [w for w in self.runner.worker_ids() if w not in self.lost]

    def healthy(self) -> list[int]:
        """Live workers that are not quarantined."""
        return self.auditor.healthy(self.live())

    @property
    def excluded(self) -> bool:
        """True when some worker must get no chunks (quarantined or lost in an audited pass)."""
        return bool(self.auditor.quarantined or self.lost)

    def audited_chunks(self, iteration: int, num_chunks: int, *, first_of_fit: bool = False) -> tuple[int, ...]:
        """Chunks audited at ``iteration``: the seeded sample, plus one on the first E-step of a fit. Against the
        reference the sample is drawn with this handle's secret as well, so a backend that knows the seed and
        the rule still cannot tell the audited chunks (the tasks name none; ``_reference_pass``)."""
        if self.reference is not None and not self.peer_replays:
            return self._secret_sample(iteration, num_chunks, first_of_fit)
        chosen = set(self.auditor.audited_chunks(iteration, num_chunks))
        if first_of_fit and not chosen and num_chunks:
            chosen.add(int(audit_uniform(self.auditor.seed, iteration, "em-fit-first") * num_chunks))
        return tuple(sorted(chosen))

    def _secret_sample(self, iteration: int, n: int, first_of_fit: bool) -> tuple[int, ...]:
        """The ``rate`` sample of ``EMAuditor.audited_chunks`` (one chunk of iteration 0 always, one on a fit's
        first E-step), drawn from a generator seeded with an HMAC of (seed, iteration) under ``self._secret``:
        one HMAC per pass, not one per chunk, and as unpredictable without the secret."""
        mac = hmac.new(self._secret, f"{self.auditor.seed}:{iteration}:em".encode(), hashlib.sha256).digest()
        draws = np.random.Generator(np.random.PCG64(int.from_bytes(mac, "big"))).random(n + 1)
        chosen = {int(c) for c in np.flatnonzero(draws[:n] < self.auditor.rate)}
        if n and (iteration == 0 or (first_of_fit and not chosen)):
            chosen.add(min(int(draws[n] * n), n - 1))
        return tuple(sorted(chosen))

    def _owners(self, num_chunks: int, healthy: list[int]) -> list[int]:
        preferred = list(self.runner.chunk_owners()) if hasattr(self.runner, "chunk_owners") else []
        if len(preferred) == num_chunks and all(w in healthy for w in preferred):
            return preferred
        owners = [0] * num_chunks
        for w, ids in zip(healthy, block_assignment(num_chunks, len(healthy))):
            for c in ids:
                owners[c] = w
        if len(preferred) == num_chunks:  # keep resident placement where the owner is still healthy
            owners = [p if p in healthy else o for p, o in zip(preferred, owners)]
        return owners

    # -- placed rounds ---------------------------------------------------------------------------
    def _round(self, jobs: dict[int, list[int]], estimator: Any, model: Any, iteration: int | None,
               struck: set[tuple[int, int]], fold: GroupFold | None = None) -> dict[tuple[int, int], Any]:
        """Compute ``jobs`` (worker -> chunk ids) in one placed round; strike planned flips inside workers.

        With ``fold``, a worker without planned flips folds its complete groups, bringing back the own
        results of ``fold.raw`` (the audited chunks, read with ``chunk_result``); the entries are then
        for ``fold_pass``."""
        tasks: dict[int, WorkerTask] = {}
        for w, ids in jobs.items():
            if not ids:
                continue
            flips: dict[int, tuple[tuple[int, int], ...]] = {}
            if self.injector is not None and iteration is not None:
                for c in ids:
                    found = []
                    while (flip := self.injector.claim("statistic", f"chunk:{c}", rank=w, step=iteration)) is not None:
                        found.append((flip.index, flip.bit))
                    if found:
                        flips[c] = tuple(found)
                        struck.add((w, c))
            if flips:
                tasks[w] = WorkerTask(chunk_estep_struck, (estimator, model, flips), tuple(ids))
            else:
                tasks[w] = WorkerTask(  # GroupFold is callable through its __call__, unseen by mypy on a NamedTuple
                    fold if fold is not None else chunk_estep,  # type: ignore[arg-type]  # NamedTuple __call__
                    (estimator, model),
                    tuple(ids),
                )
        out = self.runner.run_on_workers(tasks)
        return {(w, c): value for w, task in tasks.items() for c, value in zip(task.chunk_ids, out[w])}

    def _note_lost(self, exc: WorkerUnavailableError) -> None:
        self.lost.update(exc.workers)
        self._note(f"worker(s) {list(exc.workers)} lost during an audited pass; their chunks move to "
                   "the healthy workers", workers=list(exc.workers))

    def _healthy_or_raise(self) -> list[int]:
        healthy = self.healthy()
        if not healthy:
            raise WorkerLostError(
                f"no healthy worker left (quarantined {sorted(self.auditor.quarantined)}, lost {sorted(self.lost)}); "
                "create a new handle on replaced hardware"
            )
        return healthy

    def placed_map(self, fn: Callable[[Any, Any], Any], payload: Any, num_chunks: int,
                   ids: Sequence[int] | None = None) -> list[Any]:
        """``fn`` over the chunks, only on healthy workers; results in chunk order."""
        wanted = list(range(num_chunks)) if ids is None else sorted(ids)
        for _ in range(len(self.runner.worker_ids()) + 1):
            healthy = self._healthy_or_raise()
            owners = self._owners(num_chunks, healthy)
            jobs: dict[int, list[int]] = {}
            for c in wanted:
                jobs.setdefault(owners[c], []).append(c)
            try:
                out = self.runner.run_on_workers({w: WorkerTask(fn, payload, tuple(cs)) for w, cs in jobs.items()})
            except WorkerUnavailableError as exc:
                self._note_lost(exc)
                continue
            values = {c: v for w, cs in jobs.items() for c, v in zip(cs, out[w])}
            return [values[c] for c in wanted]
        raise WorkerLostError("workers kept dying during one pass; create a new handle")

    # -- the audited E-step ----------------------------------------------------------------------
    def estep_results(self, handle: Any, estimator: Any, model: Any, iteration: int,
                      *, first_of_fit: bool) -> tuple[list[Any], tuple[ChunkAudit, ...]]:
        """The E-step entries of one audited pass (chunk order, for ``fold_pass``; each audited chunk's own
        result, or its committed digest, readable with ``committed_result``) and the audit outcomes."""
        audited = self.audited_chunks(iteration, handle.num_chunks, first_of_fit=first_of_fit)
        if self.reference is not None and not self.peer_replays:
            mine = [c for c in audited if self.computes is None or self.computes(c)]
            references = _Background(self.reference, mine, estimator, model) if audited else None
            return self._reference_pass(handle, estimator, model, iteration, audited, references)
        if self.reference is None:
            return self._backend_pass(handle, estimator, model, iteration, audited)
        return self._named_and_secret_pass(handle, estimator, model, iteration, audited, first_of_fit)

    def _named_and_secret_pass(self, handle: Any, estimator: Any, model: Any, iteration: int, audited: tuple[int, ...],
                               first_of_fit: bool) -> tuple[list[Any], tuple[ChunkAudit, ...]]:
        """The pass with peer replays of the chunks it names (mixle's draw) and, on it, the secret sample's
        reference audit and group opening, so sparing exactly the named chunks does not pass."""
        secret, token = self._secret_sample(iteration, handle.num_chunks, first_of_fit), f"{self._owner}:{iteration}"
        chunks = tuple(sorted(set(audited) | set(secret)))
        references = _Background(self.reference, chunks, estimator, model) if chunks else None  # type: ignore[arg-type]
        entries, outcomes = self._backend_pass(handle, estimator, model, iteration, audited, token)
        if references is None:
            return entries, outcomes
        refs = references.result()  # mixle's chunks, then the secret ones, against the reference
        outcomes += self._against_reference(entries, refs, estimator, model, iteration, chunks)
        owners = self._chunk_owners(len(entries))
        folds = bind_folded_sums(self, entries, (estimator, model), iteration, secret, owners, token)
        self._mend_quarantined(entries, folds, owners, estimator, model, iteration)
        return entries, outcomes + folds

    def _injection_pending(self, iteration: int) -> bool:
        """Whether a planned fault strikes at ``iteration`` (the pass then runs placed, so it can strike)."""
        return self.injector is not None and any(f.step == iteration for f in self.injector.pending)

    def _backend_pass(self, handle: Any, estimator: Any, model: Any, iteration: int,
                      audited: tuple[int, ...], token: str = "") -> tuple[list[Any], tuple[ChunkAudit, ...]]:
        """The pass through the backend, audited chunks replayed on a peer (or on the same runner); with a
        ``token`` every folded group also commits to its chunks' digests and keeps their results."""
        if not self.placement:
            return self._same_runner(handle, estimator, model, iteration, audited, token)
        pending = self._injection_pending(iteration)
        if not audited and not self.excluded and not pending:
            return handle.estep_entries(estimator, model, commit=bool(token), retain=token), ()
        for _ in range(len(self.runner.worker_ids()) + 1):
            try:
                return self._placed_pass(estimator, model, iteration, handle.num_chunks, audited, token)
            except WorkerUnavailableError as exc:
                self._note_lost(exc)
        raise WorkerLostError("workers kept dying during one audited pass; create a new handle")

    def _reference_pass(self, handle: Any, estimator: Any, model: Any, iteration: int, audited: tuple[int, ...],
                        references: _Background | None) -> tuple[list[Any], tuple[ChunkAudit, ...]]:
        """The pass, the same tasks whether or not (and whichever) chunks are audited: every folded group commits
        to its chunks' digests, and only then are the audited chunks compared with ``references`` (computed
        outside the backend meanwhile). A device fault quarantines its worker and its chunks are recomputed."""
        pending = self._injection_pending(iteration)
        struck: set[tuple[int, int]] = set()
        token = f"{self._owner}:{iteration}"
        if not (self.placement and (self.excluded or pending)):
            entries = handle.estep_entries(estimator, model, commit=True, retain=token)
        else:
            entries = self._committed_round(estimator, model, iteration, handle.num_chunks, struck, token)
        if references is None:
            return entries, ()
        refs, owners = self._shared(references), self._chunk_owners(len(entries))
        outcomes = self._against_reference(entries, refs, estimator, model, iteration, audited,
                                           struck if self.placement else None, owners)
        self._mend_quarantined(entries, outcomes, owners, estimator, model, iteration)
        self._recheck(entries, refs, outcomes)
        folds = bind_folded_sums(self, entries, (estimator, model), iteration, audited, owners, token)
        self._mend_quarantined(entries, folds, owners, estimator, model, iteration)
        return entries, outcomes + folds

    def _mend_quarantined(self, entries: list[Any], outcomes: Sequence[ChunkAudit], owners: list[int], estimator: Any,
                          model: Any, iteration: int) -> None:
        """After a device fault quarantined a worker (a placed runner), recompute its chunks on the others."""
        found = [o for o in outcomes if o.quarantined is not None] if self.placement else []
        for o in found:
            self._note(f"worker {o.quarantined} quarantined after a mismatch with the reference it did not reproduce "
                       f"on {o.records[0].unit.replace(':', ' ')} at iteration {iteration}; its chunks are "
                       "recomputed on the others", worker=o.quarantined, chunk=o.chunk, iteration=iteration)
        if found:
            self._mend(entries, {}, owners, estimator, model)

    def _shared(self, references: _Background) -> dict[int, Any]:
        """The references by chunk: this process's, or (SPMD) every rank's gathered, so each rank has them all;
        a rank whose reference failed makes every rank raise, none is left waiting in a collective."""
        if self.gather is None:
            return references.result()
        try:
            mine, failure = references.result(), ""
        except Exception as exc:  # noqa: BLE001 - shared with every rank, then raised on all
            mine, failure = {}, f"{type(exc).__name__}: {exc}"
        parts = self.gather((mine, failure))
        failures = [f"rank {r}: {f}" for r, (_, f) in enumerate(parts) if f]
        if failures:
            raise RuntimeError(f"the SDC audit's reference failed on {'; '.join(failures)}")
        return {c: v for part, _ in parts for c, v in part.items()}

    def _committed_round(self, estimator: Any, model: Any, iteration: int, n: int,
                         struck: set[tuple[int, int]], token: str = "") -> list[Any]:
        """The pass on the healthy workers only (planned flips struck), groups committed to their digests."""
        for _ in range(len(self.runner.worker_ids()) + 1):
            owners = self._owners(n, self._healthy_or_raise())
            jobs: dict[int, list[int]] = {}
            for c in range(n):
                jobs.setdefault(owners[c], []).append(c)
            try:
                values = self._round(jobs, estimator, model, iteration, struck,
                                     GroupFold(chunk_estep, n, frozenset(), True, token))
            except WorkerUnavailableError as exc:
                self._note_lost(exc)
                continue
            return [values[(owners[c], c)] for c in range(n)]
        raise WorkerLostError("workers kept dying during one audited pass; create a new handle")

    def _replay(self, worker: int, c: int, estimator: Any, model: Any) -> Any:
        """Chunk ``c`` recomputed through the backend on ``worker`` (or on the runner, without placement)."""
        if self.placement:
            value = self._round({worker: [c]}, estimator, model, None, set())[(worker, c)]
        else:
            value = self.runner.map_chunks(chunk_estep, (estimator, model), chunk_ids=[c])[0]
        return chunk_result([value], 0) if isinstance(value, GroupStats) else value

    def _against_reference(self, entries: list[Any], references: dict[int, Any], estimator: Any, model: Any,
                           iteration: int, audited: tuple[int, ...], struck: set[tuple[int, int]] | None = None,
                           owners: list[int] | None = None) -> tuple[ChunkAudit, ...]:
        """Each audited chunk's statistic as the pass will fold it, against the reference computed outside the
        backend; a mismatch is replayed on the chunk's worker through the backend to classify it. With
        ``struck`` (a placed pass that replays on no peer) a device fault quarantines its worker where a
        healthy one remains."""
        owners = self._chunk_owners(len(entries)) if owners is None else owners
        spare = struck is not None and len(self.healthy()) >= 2
        outcomes = []
        for c in audited:
            worker = owners[c]

            def replay(c: int = c, worker: int = worker) -> Any:
                return self._replay(worker, c, estimator, model)

            own, committed = committed_result(entries, c)
            outcomes.append(self.auditor.audit_reference(
                iteration=iteration, chunk=c, worker=worker, statistic=own, observed=committed, digest=commit_digest,
                reference=references[c], replay=replay,
                atol=self.tolerance.atol, rtol=self.tolerance.rtol,
                injected=struck is not None and any(k[1] == c for k in struck), can_quarantine=spare))
            if outcomes[-1].quarantined is not None:
                spare = len(self.healthy()) >= 2
        return tuple(outcomes)

    def _chunk_owners(self, num_chunks: int) -> list[int]:
        """The worker each chunk was computed on (for the record and the same-worker replay)."""
        if self.placement:
            return self._owners(num_chunks, self.healthy() or self.live())
        if hasattr(self.runner, "chunk_owners"):
            return list(self.runner.chunk_owners())
        return [w for w, ids in enumerate(block_assignment(num_chunks, self.runner.num_workers)) for _ in ids]

    def _placed_pass(self, estimator: Any, model: Any, iteration: int, n: int,
                     audited: tuple[int, ...], token: str = "") -> tuple[list[Any], tuple[ChunkAudit, ...]]:
        """One placed pass, each audited chunk also computed on its ring peer in the same round; then the
        audit, and the mending of what it found."""
        healthy = self._healthy_or_raise()
        owners = self._owners(n, healthy)
        jobs: dict[int, list[int]] = {}
        for c in range(n):
            jobs.setdefault(owners[c], []).append(c)
        for c in audited:
            w = _ring_next(healthy, owners[c])
            if w is not None:
                jobs.setdefault(w, []).append(c)
        struck: set[tuple[int, int]] = set()
        values = self._round(jobs, estimator, model, iteration, struck,
                             GroupFold(chunk_estep, n, frozenset(audited), bool(token), token))
        entries = [values[(owners[c], c)] for c in range(n)]
        outcomes, decided = self._peer_audits(entries, values, owners, estimator, model, iteration, audited, struck)
        for outcome in outcomes:
            if outcome.quarantined is not None:
                self._note(f"worker {outcome.quarantined} quarantined after a witnessed mismatch on "
                           f"chunk {outcome.chunk} at iteration {iteration}; its chunks are recomputed on the "
                           "others", worker=outcome.quarantined, chunk=outcome.chunk, iteration=iteration)
        self._mend(entries, decided, owners, estimator, model)
        return entries, tuple(outcomes)

    def _peer_audits(self, entries: list[Any], values: dict[tuple[int, int], Any], owners: list[int],
                     estimator: Any, model: Any, iteration: int, audited: tuple[int, ...],
                     struck: set[tuple[int, int]]) -> tuple[list[ChunkAudit], dict[int, Any]]:
        """Each audited chunk against its peer's replay (a witness on a mismatch; one worker left: a same-worker
        replay); the outcomes and the statistics the audit decided on where they are not the primary's."""
        outcomes: list[ChunkAudit] = []
        decided: dict[int, Any] = {}
        live = self.live()
        for c in audited:
            primary = chunk_result(entries, c)
            if len(self.auditor.healthy(live)) < 2:
                replay = self._round({owners[c]: [c]}, estimator, model, iteration, struck)[(owners[c], c)]
                outcome = self.auditor.audit_same_worker(
                    iteration=iteration, chunk=c, worker=owners[c], statistic=primary, replayed=replay,
                    injected=any(k[1] == c for k in struck))
            else:
                def recompute(worker: int, c: int = c) -> Any:
                    if (worker, c) not in values:
                        values.update(self._round({worker: [c]}, estimator, model, iteration, struck))
                    value = values[(worker, c)]
                    return chunk_result([value], 0) if isinstance(value, GroupStats) else value

                outcome = self.auditor.audit_chunk(
                    iteration=iteration, chunk=c, primary=owners[c], statistic=primary, recompute=recompute,
                    workers=live, injected=any(k[1] == c for k in struck))
            if outcome.statistic is not primary and statistic_digest(outcome.statistic) != statistic_digest(primary):
                decided[c] = outcome.statistic
            if outcome.quarantined is not None:
                decided.setdefault(c, outcome.statistic)
            outcomes.append(outcome)
        return outcomes, decided

    def _mend(self, entries: list[Any], decided: dict[int, Any], owners: list[int], estimator: Any,
              model: Any) -> None:
        """Recompute, per chunk on healthy workers, the chunks of a quarantined worker and every group holding
        one of them or a chunk whose audited statistic is not its primary's (a group folded with a bad chunk in
        it cannot be mended in place); the audit's own statistic stands for the decided chunks."""
        n = len(entries)
        touched = {group_of(n, c) for c in range(n) if owners[c] in self.auditor.quarantined} | {
            group_of(n, c) for c in decided}
        redo = sorted(c for a, b in touched for c in range(a, b) if c not in decided)
        if redo:
            for c, value in zip(redo, self.placed_map(chunk_estep, (estimator, model), n, redo)):
                entries[c] = value
        for c, value in decided.items():
            entries[c] = value

    def _recheck(self, entries: list[Any], references: dict[int, Any], outcomes: Sequence[ChunkAudit]) -> None:
        """After a quarantine, the recomputed chunk must agree with its reference, else nothing mended it."""
        for outcome in outcomes:
            if outcome.quarantined is None:
                continue
            ok, _, _ = within_tolerance(entries[outcome.chunk], references[outcome.chunk], self.tolerance.atol,
                                        self.tolerance.rtol)
            if not ok:
                raise SDCDetectedError(outcome.records)

    def _same_runner(self, handle: Any, estimator: Any, model: Any, iteration: int,
                     audited: tuple[int, ...], token: str = "") -> tuple[list[Any], tuple[ChunkAudit, ...]]:
        results = handle.estep_entries(estimator, model, raw=audited, commit=bool(token), retain=token)
        if not audited:
            return results, ()
        replays = self.runner.map_chunks(chunk_estep, (estimator, model), chunk_ids=list(audited))
        owners = self._chunk_owners(len(results))
        outcomes = []
        for c, replay in zip(audited, replays):
            outcomes.append(
                self.auditor.audit_same_worker(
                    iteration=iteration, chunk=c, worker=owners[c], statistic=chunk_result(results, c), replayed=replay
                )
            )
        return results, tuple(outcomes)


def rows_reference(handle: Any) -> Callable[[int, Any, Any], ChunkResult]:
    """``reference(chunk, estimator, model)``: the chunk's E-step recomputed in the driver from the rows ``handle``
    keeps (``_audit_rows``) with its encoder, outside the backend's runner and transport."""

    def reference(chunk: int, estimator: Any, model: Any) -> ChunkResult:
        rows, encoder = handle._audit_rows, handle._encoder
        if rows is None or encoder is None:
            raise RuntimeError("this handle keeps no rows for the audit's reference (sources, SPMD or audit off)")
        a, b = handle.bounds[chunk]
        return chunk_estep(EncodedChunk(chunk, a, b, encoder.encode(rows[a:b])), (estimator, model))

    return reference


def source_reference(handle: Any) -> Callable[[int, Any, Any], ChunkResult] | None:
    """For a handle over a source: ``reference(chunk, estimator, model)``, the chunk's rows fetched again into this
    process by its place in the source (file or partition, row offset) through the source's plain data API
    (a file read; dask, Spark or Ray computing that one partition slice; a rank's own rows), encoded and
    E-stepped here, outside the backend's runner, E-step and transport; None for a source that cannot read
    one chunk alone."""
    source = handle.source
    if source is None or not source.reads_chunks:
        return None

    def reference(chunk: int, estimator: Any, model: Any) -> ChunkResult:
        if handle._encoder is None:
            raise RuntimeError("the audit's reference runs after the handle's chunks are encoded")
        return chunk_estep(source.read_chunk(handle.places[chunk], handle._encoder), (estimator, model))

    return reference


class _Background:
    """``reference(c, estimator, model)`` for each audited chunk on a thread of the driver, started at once, so the
    recomputation overlaps the backend's pass (numpy releases the GIL; the driver mostly waits on its workers)."""

    def __init__(self, reference: Callable[[int, Any, Any], Any], chunks: Sequence[int], estimator: Any,
                 model: Any) -> None:
        self._out: dict[int, Any] = {}
        self._error: BaseException | None = None

        def work() -> None:
            try:
                for c in chunks:
                    self._out[c] = reference(c, estimator, model)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller by result()
                self._error = exc

        self._thread = threading.Thread(target=work, name="em-audit-reference", daemon=True)
        self._thread.start()

    def result(self) -> dict[int, Any]:
        """The references by chunk id (waits for the thread; re-raises what it raised)."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._out
