"""SDC audit of the EM E-step inside an encoded-data handle: ``EMAudit`` keeps the audit's state and picks the pass.

With the reference (the handle holds the rows: ``estep.rows_reference``; or fetches the audited chunks again from
their source: ``estep.source_reference``; on SPMD handles every rank agrees on it, ``spmd_audit``), the pass is
``estep.reference_pass`` (read it top to bottom):

1. The pass hands the backend the same tasks on every pass, audited or not: every chunk on its worker, no
   chunk named, each folded group bringing back the ``commit_digest`` of each of its chunks' own results
   (``GroupFold(commit=True)``), a commitment. A group without a well-formed commitment per chunk is refused
   (``commitments.check_commitments``: a ``BackendDefectError`` naming the group).
2. Only then is the sample drawn (``audit_draw``): from fresh entropy, systematically (every chunk once per
   ``ceil(1/rate)`` passes; one chunk per worker on a fit's first pass), recorded in the pass's receipt.
   Before the commitments nothing differs between an audited and an unaudited pass (no thread, no state).
3. The driver recomputes each audited chunk's E-step from the rows (the one recomputation: the backend
   computes no chunk twice), and the judge (``audit_judge``) compares it with the committed digest; where
   they differ a replay on the same worker through the backend decides: it reproduces the digest and lies
   within ``EM_REFERENCE_TOLERANCE`` (rounding), it reproduces and lies beyond (``backend_defect``: raises
   unless ``warn``), or it does not reproduce (``device``): under ``quarantine`` with a healthy worker left
   that worker is quarantined, its chunks recomputed on the others and checked against the reference again, so
   the fit ends on the same bits as a clean run.

Without the reference (a source that cannot read one chunk alone) the audited chunks (a seeded ``rate``
fraction, ``EMAuditor.audited_chunks``) are recomputed through the backend on a peer (``peer_replay``, over the
placed rounds of ``placed_rounds``); mixle's ``AuditedMPEncodedData`` names its own draw
(``compat.named_draw``: peer replays, then the secret sample's reference audit on the same pass). Fault
injection (``audit_injection``) strikes inside the worker that computes a chunk.

The audit writes no ledger: ``take_events`` hands its findings (``audit_findings``: ``SDCAuditRecord`` values
and ``AuditNote`` values for lost / quarantined workers, in the order found) to the pass, which writes them to
the handle's ledger.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

from ....contracts import EM_AUDIT_POLICIES, AuditPolicy, choose
from ....contracts.estimation import statistic_digest
from ....verification.harness.em_reference import EM_REFERENCE_TOLERANCE
from ....verification.sdc.em import ChunkAudit, EMAuditor
from ....verification.sdc.inject import FaultInjector
from ....verification.sdc.schedule import EM_AUDIT_RATE, audit_uniform
from ..backends.chunk_assignment import block_assignment
from ..em_pass.chunks import ChunkRunner, GroupFold, GroupStats, chunk_estep, chunk_result
from ..em_pass.estep import References, reference_pass
from ..em_pass.runner_protocols import ChunkOwnership, WorkerPlacement, places_work
from .audit_draw import Draw, SystematicDraw, fresh_entropy
from .audit_findings import AuditEvent, Findings
from .audit_judge import Verdict, enforce
from .peer_replay import backend_pass
from .placed_rounds import committed_round, mend, owners_on, placed_map, placed_round
from .reveal_mode import empty_statistic_bytes, ship_own_results

__all__ = ["EM_AUDIT_RATE", "EMAudit", "NamedDraw"]

_log = logging.getLogger("mixle_parallel.verification.sdc.em")  # the auditor's logger, as before


class NamedDraw(Protocol):
    """A pass whose audited chunks are named ahead (mixle's draw: ``compat.named_draw.NamedDrawPass``)."""

    def audited_chunks(self, iteration: int, num_chunks: int, *, first_of_fit: bool = False) -> tuple[int, ...]: ...

    def run(self, audit: EMAudit, payload: tuple[Any, Any], iteration: int, num_chunks: int, encoder: Any,
            first_of_fit: bool) -> tuple[list[Any], tuple[ChunkAudit, ...]]: ...


class EMAudit:
    """The SDC audit state of one handle: the seeded auditor, quarantined and lost workers, injector."""

    def __init__(self, runner: ChunkRunner, *, rate: float = EM_AUDIT_RATE,
                 policy: AuditPolicy | str = AuditPolicy.QUARANTINE, seed: int = 0,
                 fault_injector: FaultInjector | None = None) -> None:
        self.runner = runner
        chosen = choose(AuditPolicy, policy, option="audit_policy", allowed=EM_AUDIT_POLICIES)
        self.auditor = EMAuditor(rate=rate, seed=seed, policy=chosen, digest=statistic_digest)
        self.injector = fault_injector
        self.placement = places_work(runner)
        if fault_injector is not None and not self.placement:
            raise ValueError(
                f"fault_injector= needs a runner that computes chosen chunks on a chosen worker; the "
                f"{runner.name!r} runner declares supports_worker_placement=False (use mp, local, dask or ray)"
            )
        self.lost: set[int] = set()
        self.reference: References | None = None
        """``reference(chunks, encoder, estimator, model)``: the chunks' E-steps computed outside the backend (the
        handle sets it where it holds the rows or can read them again); each audited chunk is compared with it."""
        self.tolerance = EM_REFERENCE_TOLERANCE
        """What a reference comparison allows where the bits differ (the harness's EM bound)."""
        self.named_draw: NamedDraw | None = None
        """mixle's draw naming each pass's audited chunks (``compat.named_draw``; ``AuditedMPEncodedData`` counts
        their peer evaluations), or None: against the reference the secret sample alone, which replaces the peer
        replay (that only checked the backend against itself); a mismatch is classified by a same-worker replay."""
        self.computes: Callable[[int], bool] | None = None
        """Which audited chunks' reference this process computes (None: all; SPMD: each rank its own)."""
        self.gather: Callable[[Any], list[Any]] | None = None
        """SPMD: every rank's value in rank order (a collective), to share the references so every rank judges
        the same and enters the same replays; None in one driver."""
        self.sampler = SystematicDraw(rate)
        """The reference audit's systematic draw (``audit_draw``): every chunk audited once per ``ceil(1/rate)``
        passes; each pass's sample is drawn from fresh entropy after the pass's commitments are in."""
        self.draws: list[Draw] = []
        """Every pass's ``Draw`` so far (its entropy, published after the draw; ``audit_draw.recheck_draws``)."""
        self.last_draw: Draw | None = None
        self.agree: Callable[[bytes], bytes] | None = None
        """SPMD: the root's entropy on every rank (a collective), so every rank draws the same sample."""
        self._owner = secrets.token_hex(8)  # names this audit's passes in the workers' retained results
        self._sized: tuple[Any, int | None] | None = None  # an estimator and its empty statistic's pickled bytes
        self._placement_checked: object = None  # the runner last found to place work (``audit.runner`` may change)
        self.findings = Findings(self.auditor.records)
        """What the audit found and the ledger's owner has not taken yet (``take_events``)."""

    @property
    def placer(self) -> WorkerPlacement:
        """The runner, as one that places work on chosen workers (only placed passes ask)."""
        runner = self.runner
        if self._placement_checked is not runner:  # a Protocol's isinstance walks its members: once per runner
            if not isinstance(runner, WorkerPlacement):
                raise RuntimeError(f"the {runner.name!r} runner cannot compute chosen chunks on a chosen worker")
            self._placement_checked = runner
        return cast(WorkerPlacement, runner)

    def take_events(self) -> tuple[AuditEvent, ...]:
        """The records and notes found since the last call, in order (the pass writes them to the ledger)."""
        return self.findings.take()

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
        return [w for w in self.placer.worker_ids() if w not in self.lost]

    def healthy(self) -> list[int]:
        """Live workers that are not quarantined."""
        return self.auditor.healthy(self.live())

    @property
    def excluded(self) -> bool:
        """True when some worker must get no chunks (quarantined or lost in an audited pass)."""
        return bool(self.auditor.quarantined or self.lost)

    def audited_chunks(self, iteration: int, num_chunks: int, *, first_of_fit: bool = False) -> tuple[int, ...]:
        """Chunks a pass audits where its tasks name them (peer replays: the seeded sample, plus one on the first
        E-step of a fit). Against the reference no rule tells them ahead: each pass's sample is drawn after its
        commitments are in (``draw_sample``; the past ones are in ``draws``)."""
        if self.named_draw is not None:
            return self.named_draw.audited_chunks(iteration, num_chunks, first_of_fit=first_of_fit)
        if self.reference is not None:
            raise RuntimeError("the reference audit draws each pass's sample after the pass's commitments are in, "
                               "so no pass's sample is known ahead; read audit.draws for the passes done")
        chosen = set(self.auditor.audited_chunks(iteration, num_chunks))
        if first_of_fit and not chosen and num_chunks:
            chosen.add(int(audit_uniform(self.auditor.seed, iteration, "em-fit-first") * num_chunks))
        return tuple(sorted(chosen))

    def draw_sample(self, num_chunks: int, owners: Sequence[int], *, first_of_fit: bool) -> tuple[int, ...]:
        """The chunks this pass audits, drawn now (after every group committed) from fresh entropy, systematically
        (``audit_draw``); on SPMD every rank takes the root's entropy (``agree``, a collective)."""
        entropy = fresh_entropy()
        if self.agree is not None:
            entropy = self.agree(entropy)
        drawn = self.sampler.draw(entropy, num_chunks, owners, first_of_fit=first_of_fit)
        self.draws.append(drawn)
        self.last_draw = drawn
        return drawn.chunks

    # -- the audited E-step ----------------------------------------------------------------------
    def estep_results(self, estimator: Any, model: Any, iteration: int, *, num_chunks: int, encoder: Any,
                      first_of_fit: bool) -> tuple[list[Any], tuple[ChunkAudit, ...]]:
        """The E-step entries of one audited pass (chunk order, for ``fold_pass``; each audited chunk's own
        result, or its committed digest, readable with ``committed_result``) and the audit outcomes. Against the
        reference the pass is ``estep.reference_pass``; it is given plain values, never the handle."""
        self.last_draw = None
        if self.named_draw is not None:
            return self.named_draw.run(self, (estimator, model), iteration, num_chunks, encoder, first_of_fit)
        if self.reference is not None:
            return reference_pass(self, estimator, model, iteration=iteration, num_chunks=num_chunks,
                                  encoder=encoder, first_of_fit=first_of_fit)
        audited = self.audited_chunks(iteration, num_chunks, first_of_fit=first_of_fit)
        return backend_pass(self, (estimator, model), iteration, num_chunks, audited)

    def pass_token(self, iteration: int) -> str:
        """The token a pass's folding workers keep their chunks' own results under (for the reveals)."""
        return f"{self._owner}:{iteration}"

    def fold_entries(self, payload: tuple[Any, Any], n: int, raw: Sequence[int] = (), *, commit: bool = False,
                     token: str = "", seal: bool = False) -> list[Any]:
        """One pass's entries, every chunk on its worker (healthy ones only), groups folded where a worker holds
        them whole: the ``raw`` chunks' own results come back (with ``seal``, folded groups' as ``SealedResult``),
        with ``commit`` every chunk's digest, with ``token`` the workers keep their groups' own results for a
        ``GroupReveal``."""
        fold = GroupFold(chunk_estep, n, frozenset(int(c) for c in raw), commit, token, seal)
        out = placed_map(self, fold, payload, n) if self.excluded else self.runner.map_chunks(fold, payload)  # type: ignore[arg-type]  # NamedTuple __call__
        if len(out) != n:
            raise RuntimeError(f"backend {self.runner.name!r} returned {len(out)} chunk results for {n} chunks; a "
                               "runner must return one result per chunk, ordered by chunk id")
        return out

    def committed_pass(self, payload: tuple[Any, Any], iteration: int, n: int,
                       token: str) -> tuple[list[Any], set[tuple[int, int]]]:
        """The pass's entries, every folded group committed to its chunks' digests and kept under ``token``, and
        the (worker, chunk) pairs a planned fault struck (a pass with one pending runs placed, to strike)."""
        struck: set[tuple[int, int]] = set()
        if self.placement and (self.excluded or self.injection_pending(iteration)):
            return committed_round(self, *payload, iteration, n, struck, token), struck
        own = range(n) if self.ships_own_results(payload[0], n) else ()
        return self.fold_entries(payload, n, own, commit=True, token="" if own else token, seal=bool(own)), struck

    def ships_own_results(self, estimator: Any, num_chunks: int) -> bool:
        """Whether every chunk of a pass brings its own result back with the pass (``reveal_mode``: no reveal
        round), which also lets the pass wait to be judged; the estimator's statistic size is measured once."""
        if self._sized is None or self._sized[0] is not estimator:
            self._sized = (estimator, empty_statistic_bytes(estimator))
        return ship_own_results(self.gather is not None, self._sized[1], num_chunks)

    def references(self, chunks: Sequence[int], encoder: Any, estimator: Any, model: Any) -> dict[int, Any]:
        """The references of ``chunks`` by chunk: those this process computes, or (SPMD) every rank's gathered, so
        each rank has them all; a rank whose reference failed makes every rank raise, none is left waiting in a
        collective."""
        assert self.reference is not None  # only reference passes ask
        mine = [c for c in chunks if self.computes is None or self.computes(c)]
        if self.gather is None:
            return self.reference(mine, encoder, estimator, model)
        try:
            found, failure = self.reference(mine, encoder, estimator, model), ""
        except Exception as exc:  # noqa: BLE001 - shared with every rank, then raised on all
            found, failure = {}, f"{type(exc).__name__}: {exc}"
        parts = self.gather((found, failure))
        failures = [f"rank {r}: {f}" for r, (_, f) in enumerate(parts) if f]
        if failures:
            raise RuntimeError(f"the SDC audit's reference failed on {'; '.join(failures)}")
        return {c: v for part, _ in parts for c, v in part.items()}

    def apply(self, verdict: Verdict) -> None:
        """Apply the judge's verdict: its records (up to the first the policy does not let pass), its quarantines
        and their notes; then raise where the policy says so (``audit_judge.enforce``)."""
        for outcome in verdict.outcomes:
            self.auditor.records.extend(outcome.records)
            bad = [r for r in outcome.records if not r.matched]
            if bad:
                _log.warning("EM audit mismatch on %s, iteration %d: attributed to worker %s, action %s",
                             bad[0].unit, outcome.iteration, bad[0].attributed_rank, bad[0].action)
                if self.auditor.policy is AuditPolicy.RAISE or bad[0].action == "raise":
                    break
            if outcome.quarantined is not None:
                self.auditor.quarantined.add(outcome.quarantined)
        enforce(verdict, self.auditor.policy)

    def mend_quarantined(self, entries: list[Any], outcomes: Sequence[ChunkAudit], owners: Sequence[int],
                         payload: tuple[Any, Any], iteration: int) -> None:
        """After a device fault quarantined a worker (a placed runner), recompute its chunks on the others."""
        found = [o for o in outcomes if o.quarantined is not None] if self.placement else []
        noted: set[int | None] = set()
        for o in found:
            if o.quarantined in noted:  # one note per worker, naming its first mismatch
                continue
            noted.add(o.quarantined)
            self.findings.note(
                f"worker {o.quarantined} quarantined after a mismatch with the reference it did not reproduce on "
                f"{o.records[0].unit.replace(':', ' ')} at iteration {iteration}; its chunks are recomputed on the "
                "others", worker=o.quarantined, chunk=o.chunk, iteration=iteration)
        if found:
            mend(self, entries, {}, owners, *payload)

    def injection_pending(self, iteration: int) -> bool:
        """Whether a planned fault strikes at ``iteration`` (the pass then runs placed, so it can strike)."""
        return self.injector is not None and any(f.step == iteration for f in self.injector.pending)

    def placed_map(self, fn: Callable[[Any, Any], Any], payload: Any, num_chunks: int) -> list[Any]:
        """``fn`` over the chunks, only on healthy workers (a pass while some worker is kept idle); chunk order."""
        return placed_map(self, fn, payload, num_chunks)

    def replay(self, worker: int, c: int, payload: tuple[Any, Any]) -> Any:
        """Chunk ``c`` recomputed through the backend on ``worker`` (or on the runner, without placement)."""
        if self.placement:
            value = placed_round(self, {worker: [c]}, *payload, None, set())[(worker, c)]
        else:
            value = self.runner.map_chunks(chunk_estep, payload, chunk_ids=[c])[0]
        return chunk_result([value], 0) if isinstance(value, GroupStats) else value

    def chunk_owners(self, num_chunks: int) -> list[int]:
        """The worker each chunk was computed on (for the record and the same-worker replay)."""
        if self.placement:
            return owners_on(self.runner, num_chunks, self.healthy() or self.live())
        if isinstance(self.runner, ChunkOwnership):
            return list(self.runner.chunk_owners())
        return [w for w, ids in enumerate(block_assignment(num_chunks, self.runner.num_workers)) for _ in ids]
