"""The SDC audit inside a torch_native session: replay a sampled step's local gradient before optimizer.step().

On an audited step (``verification.AuditSchedule``: rate r, plus the run's first step) the session
records the window's micro-steps and the RNG state at its start; the comm taps capture this rank's
local gradient per parameter before the data-parallel reduction. Then, before the commit:

1. parameters at rest: the live parameters are compared with the state taken after the last update (a
   flip in parameter memory between steps): bit for bit against the replicated plain copy loaded then
   (DDP, one rank), else (FSDP2/HSDP) bit for bit against a copy of this rank's local shards taken then;
2. peer replay: in one exchange every rank ships its window, RNG state, the digest of (batch, parameters),
   of its gradient and its at-rest verdict; the next rank of its data-parallel group (same tp/cp/pp
   coordinate) recomputes its predecessor's gradient from the shipped inputs and compares digests. Every
   rank replays at once, so the tensor-parallel peers of a replaying rank replay the same predecessor
   batch with it and their TP collectives line up; under TP each rank recomputes its own shard;
3. same-rank replay: the window is re-run on this rank with the same batches and RNG state (the
   taps capture without communicating) and its gradient is compared with the captured one. With
   ``replay="peer"`` (the default) it runs when a peer replay disagreed anywhere (the records exchange
   shows it; every rank then replays its own window, which tells a fault in the original computation
   from a persistent or auditor-side one) and where no peer exists (a world of one, pure TP); with
   ``replay="both"`` on every audited step. A peer's independent recomputation that matches bitwise (or
   within the bound) already proves what a same-rank replay would: the default halves the audit's cost,
   the way the EM audit recomputes on another worker and calls a witness only on a mismatch.

Where a plain copy of the module computes a rank's whole local gradient (DDP, FSDP2, HSDP, one rank:
``sdc_reference.reference_applies``) the recomputations that judge the executor use it
(``sdc_reference.PlainReference``; FSDP2/HSDP gather the full parameters into it for the audited step),
not the executor's machinery: the peer replays its predecessor's window on it, and the same-rank step
adds a ``reference`` record. A reference mismatch the executor's own replay reproduces is a
``backend_defect`` (``BackendDefectError`` under ``raise``); one it does not reproduce is a ``device`` fault.
Tensor-parallel plans (``sdc_tp_reference``) keep the executor's bitwise peer replay and add, on every audited
step, each rank's gradient shard against its shard of the plain copy's full gradient, within the harness's
tolerance; beyond it, every rank replays its own window through the executor to tell the two causes apart.

Comparison is bitwise (digests; ``bound=0``, the CPU/gloo case) or within ``bound`` (max abs).
Every rank ends with every rank's records (one all-gather; on a clean step at the defaults a one-integer
all-reduce saying so, every rank rebuilding the records from the first exchange), so the policy acts the same way on
all of them: ``warn`` records and commits, ``skip_step`` keeps the update out, ``raise`` raises
``SDCDetectedError`` on every rank. Gradients, RNG state and buffers are restored after replays,
so a clean audited run is bitwise the run without audit.
"""

from __future__ import annotations

import logging
from typing import Any

import attrs
import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ...contracts import AuditPolicy, SDCAuditRecord, from_dict, to_dict
from ...verification.sdc.digest import digest, max_abs_difference
from ...verification.sdc.schedule import AuditSchedule, BackendDefectError, SDCDetectedError
from ..training_options import AuditMode, AuditOptions, AuditReplay
from .comm_taps import CommTap, TapMode, fsdp_taps_supported
from .dp_mode import DataParallelMode
from .layouts import local_part, pre_wrap_fqn, unwrap
from .sdc_reference import PlainReference, reference_applies, reference_template, same_bits
from .sdc_tp_reference import (
    TensorParallelReference,
    attribute_causes,
    build_tp_reference,
    reference_record,
    tp_reference_applies,
    tp_reference_skip_reason,
)

_log = logging.getLogger(__name__)
_MAX = 1.7976931348623157e308




class SessionAudit:
    """Schedules, records, replays and judges audited steps of one ``TorchDistributedSession``."""

    def __init__(self, session: Any, tap: CommTap, options: AuditOptions, *, seed: int,
                 faults: FaultStrikes | None = None, template: nn.Module | None = None) -> None:
        self.replay, self.policy, self.bound = options.replay, options.policy, options.bound
        self.session, self.tap, self.faults = session, tap, faults
        self.schedule = AuditSchedule(rate=options.rate, seed=seed)
        self.rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self.world = session.plan.world_size
        # the whole data-parallel group: the ranks sharing this rank's pp, cp and tp coordinates
        groups = session.plan.data_parallel_group_ranks()
        dp_group = next(g for g in groups if self.rank in g)
        self.has_peer = len(dp_group) > 1
        # every auditor's subject: the rank before it in its data-parallel group
        self._subject_of = {a: g[(i - 1) % len(g)] for g in groups for i, a in enumerate(g)}
        self.predecessor = self._subject_of[self.rank]
        self._direct = session.dp_mode is DataParallelMode.NONE
        # DDP: local gradients come from on-demand hooks; replays run under no_sync() and read p.grad
        self._access = tap.ddp_access
        self._unsynced_replay = session.dp_mode.uses_ddp
        self.records: list[SDCAuditRecord] = []  # no ledger: check() returns them and the session's owner writes
        self.audited_steps = 0
        self._window: list[tuple[Any, Any, bool, float]] | None = None
        self._rng: dict[str, torch.Tensor] | None = None
        self._buffers: list[torch.Tensor] | None = None
        self._param_ref: str | None = None
        self._param_saved: dict[str, torch.Tensor] | None = None  # sharded: the local parameters' bits at rest
        self._param_ref_step: int | None = None
        self._reference = _plain_reference(session, template)
        # tensor parallelism: the plain copy judges this rank's gradient shard within a tolerance (sdc_tp_reference)
        tp_reference: tuple[TensorParallelReference | None, str | None] = (None, None)
        if tp_reference_applies(session.plan):
            tp_reference = build_tp_reference(session, template, options.bound)
        self._tp_reference, self.reference_skipped = tp_reference
        if self.reference_skipped is not None:
            _log.warning("SDC audit: the tensor-parallel plain reference is skipped (%s); audited steps are "
                         "replayed through the executor only", self.reference_skipped)
        self.step_reference_skipped: str | None = None
        """Why this audited step ran without the plain reference a TP session otherwise uses (receipts say it)."""
        self.prime(session.step)

    # ---- clock -----------------------------------------------------------------------------
    def is_audited(self, step: int) -> bool:
        """True when the step with this index is audited (same answer on every rank)."""
        return self.schedule.is_audited(step)

    def prime(self, step: int) -> None:
        """Take the parameters at rest when ``step`` will be audited (after an update, a load, or at start):
        replicated, their digest (the peer checks it) and the plain copy loaded with them (the at-rest check
        compares with it); sharded, a copy of this rank's local shards (cheaper than hashing them twice)."""
        self._param_ref, self._param_saved, self._param_ref_step = None, None, None
        if not self.is_audited(step):
            return
        self._param_ref_step = step
        if not self.session.dp_mode.replicated_parameters:
            self._param_saved = {name: t.clone() for name, t in self._local_params().items()}
            return
        self._param_ref = self._param_digest()
        if self._reference is not None and not self._reference.sharded:
            self._reference.load()

    def begin_window(self, step: int) -> None:
        """At the first micro-step of a window: strike planned parameter flips; start recording if audited."""
        self._disarm()
        audited = self.is_audited(step)
        if audited and self._param_ref_step != step:
            self.prime(step)  # e.g. after a checkpoint load: the reference is taken before any planned flip
        if self.faults is not None:
            self.faults.begin_window(step)
        if self._access is not None and audited:
            self._access.arm()  # DDP: capture the local gradient
        if not audited:
            self._window = None
            return
        self._window = []
        self._rng = _rng_state(self.session.device)
        self._buffers = [b.detach().clone() for b in self.session.module.buffers()]
        self.tap.mode = TapMode.CAPTURE

    def _disarm(self) -> None:
        if self._access is not None:
            self._access.disarm()

    def note(self, x: Any, y: Any, sync: bool, weight: float) -> None:
        """Record one micro-step of an audited window."""
        if self._window is not None and self.tap.mode is TapMode.CAPTURE:
            self._window.append((x, y, sync, weight))

    def abort_window(self) -> None:
        """Forget the window (discarded accumulation)."""
        self._window, self.tap.mode = None, TapMode.PASS
        self._disarm()
        self.tap.take()

    # ---- the audit ---------------------------------------------------------------------------
    def check(self, step: int) -> tuple[list[SDCAuditRecord], bool]:
        """Audit the window that is about to commit; (records of every rank, keep the update out?)."""
        self._disarm()
        if self._window is None:
            return [], False
        window, rng, self._window = self._window, self._rng, None
        if not window:  # pragma: no cover - a commit always follows at least one micro-step
            raise RuntimeError("audited window recorded no micro-step")
        self.tap.mode = TapMode.PASS
        observed = self.tap.take()
        if self._direct:  # no data-parallel reduction: the local gradient is the accumulated .grad
            observed = self._grads()  # (a planned flip struck it already: FaultStrikes.before_commit)
        injected = bool(self.tap.injected)
        self.audited_steps += 1
        mine, now = self._at_rest(step)
        self.step_reference_skipped = self.reference_skipped
        stash = self._stash()
        try:
            everyone = self._judge(step, window, rng, observed, injected, mine, now)
        finally:
            self._restore(stash)
            for reference in (self._reference, self._tp_reference):
                if reference is not None:
                    reference.release()
        return self._conclude(everyone)

    def _at_rest(self, step: int) -> tuple[list[SDCAuditRecord], str | None]:
        """The parameters-at-rest check: (this rank's record when they changed since the last update, their digest).
        With a replicated plain copy the live parameters are compared with it bit for bit (it was loaded with
        them when the digest was taken), so they are hashed once per audited step, not twice."""
        if not self.session.dp_mode.replicated_parameters:
            return self._sharded_at_rest(step), None
        reference = self._reference
        if self._param_ref is not None and reference is not None and not reference.sharded:
            if reference.matches_live():
                return [], self._param_ref
        now = self._param_digest()
        if self._param_ref is None or now == self._param_ref:
            if reference is not None and not reference.sharded:
                reference.load()  # the live parameters are as hashed: the copy (not loaded, or stale) follows them
            return [], now
        injected = bool(self.faults and self.faults.injected_params)
        return [self._record(step, self.rank, "parameters at rest", "same_rank", self._param_ref, now, False, _MAX,
                             injected=injected)], now

    def _sharded_at_rest(self, step: int) -> list[SDCAuditRecord]:
        """Sharded parameters: this rank's local shards bit for bit against their copy taken at ``prime``; the
        digests of both only in the record of a change."""
        saved, self._param_saved = self._param_saved, None
        if saved is None:
            return []
        live = self._local_params()
        if saved.keys() == live.keys() and all(same_bits(saved[n], live[n]) for n in live):
            return []
        injected = bool(self.faults and self.faults.injected_params)
        return [self._record(step, self.rank, "parameters at rest", "same_rank", digest(saved), digest(live), False,
                             _MAX, injected=injected)]

    def _judge(self, step: int, window: list, rng: Any, observed: dict, injected: bool, mine: list[SDCAuditRecord],
               now: str | None) -> list[SDCAuditRecord]:
        """One exchange of every rank's window, gradient digest and at-rest verdict; the peer's recomputation; the
        same-rank replays where no peer exists, with ``replay="both"``, or (a second round) when a peer disagreed
        anywhere; every rank's records. No replay runs when any rank's parameters changed at rest."""
        obs_d = digest(observed)
        # replicated parameters (DDP) must be bitwise equal on every rank: the peer checks the subject's digest
        ident = now if self.session.dp_mode.replicated_parameters else None
        shared = self._allgather(self._shipment(window, rng, ident, observed, obs_d, injected, bool(mine)))
        if any(s["at_rest"] for s in shared):
            return self._gather(mine)
        for reference in (self._reference, self._tp_reference):
            if reference is not None and reference.sharded:
                reference.load()  # every full parameter gathered (a collective: every rank is here)
        peer = self._peer(step, shared[self.predecessor], ident) if self.has_peer else None
        own = peer is None or self.replay is AuditReplay.BOTH
        if own:
            mine.extend(self._own_replays(step, window, rng, observed, obs_d, injected))
        if self._tp_reference is not None:
            mine.extend(self._tp_check(step, window, rng, observed, obs_d, injected))
        if peer is not None:
            mine.append(peer)
        everyone = self._findings(step, mine, shared)
        if not own and any(r.replay in ("peer", "reference") and not r.matched for r in everyone):
            # a peer (or the TP reference) disagreed somewhere: every rank replays its own window, which tells a
            # fault in the original computation (not reproduced) from a persistent one or a backend defect (reproduced)
            everyone += self._gather(self._own_replays(step, window, rng, observed, obs_d, injected))
        return attribute_causes(everyone) if self._tp_reference is not None else everyone

    def _tp_check(self, step: int, window: list, rng: Any, observed: dict, obs_d: str,
                  injected: bool) -> list[SDCAuditRecord]:
        """Tensor parallelism: this rank's gradient shard against its shard of the plain copy's full gradient,
        within the reference's tolerance (``sdc_tp_reference``); no record, and the receipt says why, when the
        captured gradients are not the copy's parameters (none captured, or FSDP2's flat fallback unit)."""
        reference = self._tp_reference
        assert reference is not None  # callers check
        if not observed or not set(observed) <= reference.names:
            self.step_reference_skipped = (f"the local gradients captured ({sorted(observed)[:4]}) are not the "
                                           "module's parameters, so the plain copy has nothing to compare")
            return []
        device = self.session.device
        found = reference.compare(window, lambda: _set_rng_state(rng, device), self._buffers, observed)
        return [reference_record(self, step, found, obs_d, injected)]

    def _shipment(self, window: list, rng: Any, ident: str | None, observed: dict, obs_d: str, injected: bool,
                  at_rest: bool) -> dict[str, Any]:
        """What this rank hands every other rank in the audit's one exchange before the recomputations."""
        out: dict[str, Any] = {"rank": self.rank, "at_rest": at_rest}
        if self.has_peer:  # tensors travel as raw bytes: pickling a tensor runs torch.save, unpickling torch.load
            batches = [(_to_wire(x), _to_wire(y), s, w) for x, y, s, w in window]
            rng_wire = {k: _to_wire(v) for k, v in rng.items()}
            out.update(window=batches, rng=rng_wire, inputs=digest((batches, rng_wire, ident)), grad=obs_d,
                       keys=sorted(observed), values=observed if self.bound > 0 else None, injected=injected)
        return out

    def _own_replays(self, step: int, window: list, rng: Any, observed: dict, obs_d: str,
                     injected: bool) -> list[SDCAuditRecord]:
        """This rank's window replayed through the executor (``same_rank``) and, where a plain copy applies,
        recomputed on it (``reference``): a reference mismatch the executor's replay reproduced is a
        ``backend_defect``; one it did not reproduce, a ``device`` fault."""
        replayed = self._replay(window, rng)
        exp_d = digest(replayed)
        matched, diff = self._compare(observed, replayed, exp_d == obs_d)
        out = [self._record(step, self.rank, self._unit(observed, replayed, matched), "same_rank", exp_d, obs_d,
                            matched, diff, injected=injected)]
        if self._reference_covers(observed):
            reference = self._reference_gradient(window, rng)
            ref_d = digest(reference)
            ok, ref_diff = self._compare(observed, reference, ref_d == obs_d)
            cause = "" if ok else ("backend_defect" if matched else "device")
            out.append(self._record(step, self.rank, self._unit(observed, reference, ok), "reference", ref_d, obs_d,
                                    ok, ref_diff, injected=injected, cause=cause))
        return out

    def _reference_covers(self, names: Any) -> bool:
        """Whether the plain copy recomputes a gradient with these names (a parameter that got no gradient has
        none on either side; only an FSDP2 input the taps could not split per parameter falls to the executor's
        own replay)."""
        return self._reference is not None and set(names) <= self._reference.names

    def _reference_gradient(self, window: list, rng: Any) -> dict[str, torch.Tensor]:
        """The window's gradient on the session's plain module copy (``sdc_reference``), from ``rng``."""
        assert self._reference is not None  # callers check
        device = self.session.device
        return self._reference.gradient(window, lambda: _set_rng_state(rng, device), self._buffers)

    def _peer(self, step: int, subject: dict[str, Any], ident: str | None) -> SDCAuditRecord:
        """This rank recomputes its predecessor's gradient from the shipped window; the finding about the subject."""
        view = digest((subject["window"], subject["rng"], ident))
        if view != subject["inputs"]:
            return self._record(step, subject["rank"], "batch+parameters", "peer", view, subject["inputs"], False,
                                _MAX, injected=subject["injected"])
        device = self.session.device
        window = [(_from_wire(x).to(device), _from_wire(y).to(device), s, w) for x, y, s, w in subject["window"]]
        rng = {k: _from_wire(v) for k, v in subject["rng"].items()}
        # a plain copy of the module recomputes it where one applies (independent of the executor's machinery)
        replayed = (self._reference_gradient(window, rng) if self._reference_covers(subject["keys"])
                    else self._replay(window, rng))
        exp_d = digest(replayed)
        if self.bound > 0:
            matched, diff = self._compare(subject["values"], replayed)
        else:
            matched, diff = exp_d == subject["grad"], 0.0 if exp_d == subject["grad"] else _MAX
        return self._record(step, subject["rank"], _peer_unit(subject), "peer", exp_d, subject["grad"], matched, diff,
                            injected=subject["injected"])

    # ---- replay mechanics --------------------------------------------------------------------
    def _replay(self, window: list, rng: Any) -> dict[str, torch.Tensor]:
        session = self.session
        for p in session.trainable():
            p.grad = None
        if self._buffers:
            with torch.no_grad():
                for b, saved in zip(session.module.buffers(), self._buffers):
                    b.copy_(saved)
        _set_rng_state(rng, session.device)
        self.tap.mode = TapMode.REPLAY
        try:
            for x, y, sync, weight in window:
                session.run_micro(x, y, sync=sync and not self._unsynced_replay, weight=weight)
        finally:
            self.tap.mode = TapMode.PASS
        return self._grads() if self._direct or self._unsynced_replay else self.tap.take()

    def _grads(self) -> dict[str, torch.Tensor]:
        # a DTensor gradient (TP without a data-parallel wrapper): this rank's shard, so a digest is this rank's
        return {n: local_part(p.grad).detach().clone() for n, p in self.session.named_trainable() if p.grad is not None}

    def _stash(self) -> dict[str, Any]:
        session = self.session
        return {"grads": [p.grad for p in session.trainable()], "rng": _rng_state(session.device),
                "buffers": [b.detach().clone() for b in session.module.buffers()]}

    def _restore(self, stash: dict[str, Any]) -> None:
        session = self.session
        for p, g in zip(session.trainable(), stash["grads"]):
            p.grad = g
        _set_rng_state(stash["rng"], session.device)
        with torch.no_grad():
            for b, saved in zip(session.module.buffers(), stash["buffers"]):
                b.copy_(saved)

    def _local_params(self) -> dict[str, torch.Tensor]:
        return {name: local_part(p).detach() for name, p in self.session.named_trainable()}

    def _param_digest(self) -> str:
        return digest(self._local_params())

    # ---- judging -------------------------------------------------------------------------------
    def _compare(self, observed: dict, replayed: dict, same: bool | None = None) -> tuple[bool, float]:
        if set(observed) != set(replayed):
            return False, _MAX
        if self.bound == 0.0:
            same = digest(observed) == digest(replayed) if same is None else same
            return same, 0.0 if same else min(max_abs_difference(observed, replayed), _MAX)
        diff = max_abs_difference(observed, replayed)
        diff = diff if diff == diff else _MAX  # NaN
        return diff <= self.bound, min(diff, _MAX)

    @staticmethod
    def _unit(observed: dict, replayed: dict, matched: bool) -> str:
        if matched:
            return "local_gradient"
        bad = [n for n in sorted(observed) if n not in replayed or digest(observed[n]) != digest(replayed[n])]
        return "local_gradient[" + ",".join(bad[:4]) + (",..." if len(bad) > 4 else "") + "]"

    def _record(self, step: int, rank: int, unit: str, replay: str, expected: str, observed: str, matched: bool,
                diff: float, *, injected: bool, cause: str = "", auditor: int | None = None) -> SDCAuditRecord:
        diff = 0.0 if matched and self.bound == 0.0 else float(min(diff, _MAX))
        return SDCAuditRecord(
            family="training", step=step, rank=rank, unit=unit, replay=replay, expected_digest=expected,
            observed_digest=observed, matched=matched, action="none" if matched else self.action(cause),
            auditor_rank=self.rank if auditor is None else auditor, attributed_rank=None if matched else rank,
            maximum_absolute_difference=diff, bound=self.bound, injected=injected, cause=cause,
        )

    def _allgather(self, value: Any) -> list[Any]:
        if self.world < 2:
            return [value]
        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, value)
        return gathered

    def _findings(self, step: int, mine: list[SDCAuditRecord], shared: list[dict[str, Any]]) -> list[SDCAuditRecord]:
        """Every rank's records of this round. When each rank's only record is a bitwise peer match (a clean step
        at the defaults) one all-reduce says so and every rank rebuilds them from the exchange it already holds,
        instead of a second all-gather of records; otherwise the records are gathered."""
        quick = (self.bound == 0.0 and len(mine) == 1 and mine[0].replay == "peer" and mine[0].matched)
        if self.world < 2 or not self._everywhere(quick):
            return self._gather(mine)
        return [self._peer_match(step, shared[self._subject_of[a]], a) for a in range(self.world)]

    def _peer_match(self, step: int, subject: dict[str, Any], auditor: int) -> SDCAuditRecord:
        """The record ``auditor`` makes when its recomputation of ``subject``'s gradient matched bitwise."""
        return self._record(step, subject["rank"], _peer_unit(subject), "peer", subject["grad"], subject["grad"], True,
                            0.0, injected=subject["injected"], auditor=auditor)

    def _everywhere(self, flag: bool) -> bool:
        """True when ``flag`` holds on every rank (one all-reduce of one integer)."""
        value = torch.tensor([int(flag)], dtype=torch.int32, device=self.session.device)
        dist.all_reduce(value, op=dist.ReduceOp.MIN)
        return bool(value.item())

    def _gather(self, mine: list[SDCAuditRecord]) -> list[SDCAuditRecord]:
        if self.world < 2:
            return mine
        gathered: list[Any] = [None] * self.world
        dist.all_gather_object(gathered, [to_dict(r) for r in mine])
        return [from_dict(r, SDCAuditRecord) for part in gathered for r in part]

    def action(self, cause: str) -> str:
        """The action a mismatch of ``cause`` gets: the policy's, or under ``raise_defects`` (the default)
        ``raise`` for a ``backend_defect`` and ``warn`` for anything else."""
        if self.policy is AuditPolicy.RAISE_DEFECTS:
            return AuditPolicy.RAISE.value if cause == "backend_defect" else AuditPolicy.WARN.value
        return self.policy.value

    def _conclude(self, records: list[SDCAuditRecord]) -> tuple[list[SDCAuditRecord], bool]:
        if self.policy is AuditPolicy.RAISE_DEFECTS:  # causes are known now: each record says what was done
            records = [r if r.matched else attrs.evolve(r, action=self.action(r.cause)) for r in records]
        self.records.extend(records)
        bad = [r for r in records if not r.matched]
        for r in bad:
            _log.warning("SDC audit mismatch: %s at step %d on rank %s (%s replay by rank %s), policy %s",
                         r.unit, r.step, r.attributed_rank, r.replay, r.auditor_rank, self.policy)
        if bad and self.policy is AuditPolicy.RAISE:
            if any(r.cause == "backend_defect" for r in bad):
                raise BackendDefectError(records)
            raise SDCDetectedError(records)
        if self.policy is AuditPolicy.RAISE_DEFECTS and any(r.cause == "backend_defect" for r in bad):
            raise BackendDefectError(records)  # every rank holds every record: raised on every rank
        return records, bool(bad) and self.policy is AuditPolicy.SKIP_STEP


def _plain_reference(session: Any, template: nn.Module | None) -> PlainReference | None:
    """The session's plain module copy where one applies; None (the executor's own replays, with a warning)
    when the module cannot be copied (``copy.deepcopy`` refused it, or a sharded session got no template)."""
    if not reference_applies(session.plan):
        return None
    if session.dp_mode.uses_fsdp and template is None:
        _log.warning("SDC audit: this FSDP2/HSDP session was built without the plain reference's template "
                     "(prepare() takes it before sharding); audited steps are replayed through the executor only")
        return None
    reference = PlainReference(session, template)
    try:
        reference.build()
    except Exception as exc:  # noqa: BLE001 - any deepcopy failure: audit without the reference, said loudly
        _log.warning("SDC audit: the module cannot be copied (%s: %s); audited steps are replayed through the "
                     "executor only, without the plain-copy reference", type(exc).__name__, exc)
        return None
    return reference


def sharded_reference_template(module: nn.Module, plan: Any, mode: DataParallelMode, audit: AuditOptions | None,
                               device: torch.device) -> nn.Module | None:
    """What ``prepare`` keeps before FSDP2/HSDP shards or TP splits ``module`` when the audit runs: the plain
    reference's template (``sdc_reference.reference_template``); None elsewhere, when the TP reference is skipped
    (``sdc_tp_reference.tp_reference_skip_reason``), or (with a warning) when it cannot be copied."""
    if audit is None:
        return None
    if tp_reference_applies(plan):
        if tp_reference_skip_reason(module) is not None:
            return None
    elif not mode.uses_fsdp or not reference_applies(plan):
        return None
    try:
        return reference_template(module, device)
    except Exception as exc:  # noqa: BLE001 - any deepcopy failure: audit without the reference, said loudly
        _log.warning("SDC audit: the module cannot be copied (%s: %s); audited steps are replayed through the "
                     "executor only, without the plain-copy reference", type(exc).__name__, exc)
        return None


def _peer_unit(subject: dict[str, Any]) -> str:
    """The unit a peer's record names: the local gradient of the shipped inputs (their digest's prefix)."""
    return f"local_gradient inputs={subject['inputs'][:23]}"


def _to_wire(t: torch.Tensor) -> tuple[str, tuple[int, ...], np.ndarray]:
    """A tensor as (dtype, shape, its bytes as a numpy array) for the audit's exchange (bit for bit)."""
    t = t.detach().cpu().contiguous()
    return str(t.dtype).removeprefix("torch."), tuple(t.shape), t.reshape(-1).view(torch.uint8).numpy()


def _from_wire(wire: tuple[str, tuple[int, ...], np.ndarray]) -> torch.Tensor:
    """The tensor ``_to_wire`` shipped (a CPU tensor with the same dtype, shape and bits)."""
    dtype, shape, raw = wire
    return torch.from_numpy(np.ascontiguousarray(raw, dtype=np.uint8)).view(getattr(torch, dtype)).reshape(shape)


def _rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def audit_supported(plan: Any, mode: DataParallelMode) -> str | None:
    """Why the in-session audit cannot run for this plan (None when it can)."""
    if plan.cp > 1:
        return ("the in-session SDC audit does not replay context-parallel sequence shards yet "
                "(pass audit=False, or audit those runs with verification.verify)")
    if plan.tp > 1 and mode.unit_shard_dim(plan):
        return ("the in-session SDC audit sees no local gradient under dp_replicate x tp without dp_shard (FSDP2 "
                "issues no reduce-scatter over its size-1 shard group); pass audit=False, or use dp_shard for the "
                "data-parallel axis")
    if mode.uses_fsdp and not fsdp_taps_supported():
        return "the FSDP2 audit needs FSDPModule.set_custom_reduce_scatter (torch >= 2.8)"
    return None


def resolve_audit(options: AuditOptions, plan: Any, mode: DataParallelMode) -> AuditOptions | None:
    """The audit a session runs for ``plan``: None when it is off (``audit=False``, or ``audit=None`` on a plan
    it cannot replay); raises for ``audit=True`` on such a plan. The fault injector is not the audit's:
    a session strikes its flips either way (``FaultStrikes``)."""
    if options.mode is AuditMode.OFF:
        return None
    reason = audit_supported(plan, mode)
    if reason is None:
        return options
    if options.mode is AuditMode.ON:
        raise ValueError(f"audit=True but {reason}")
    _log.warning("SDC audit off for this run: %s", reason)  # the default cannot audit this plan: say so, once
    return None


class FaultStrikes:
    """Strikes a ``verification.FaultInjector``'s planned bit flips into a session, audit on or off: parameter
    flips at a window's first micro-step; gradient flips where the local gradient is reduced (the comm taps:
    DDP's armed gradient hooks, FSDP2's reduce-scatter) or, without a data-parallel reduction, into the
    accumulated ``.grad`` just before the commit."""

    def __init__(self, session: Any, tap: CommTap, injector: Any) -> None:
        self.session, self.tap, self.injector = session, tap, injector
        self.rank = tap.rank
        self.injected_params: list[str] = []
        self._direct = session.dp_mode is DataParallelMode.NONE
        tap.injector = injector

    def begin_window(self, step: int) -> None:
        """Strike the window's planned parameter flips; arm DDP's gradient hooks when a gradient flip is due."""
        self.tap.step, self.tap.injected, self.injected_params = step, [], []
        self.end_window()  # hooks armed for an earlier window come off first
        for name, p in self.session.named_trainable():
            if self.injector.apply("parameter", name, local_part(p).detach(), rank=self.rank, step=step):
                self.injected_params.append(name)
        if self.tap.ddp_access is not None and self.tap.wants_flip():
            self.tap.ddp_access.arm()

    def before_commit(self) -> None:
        """Without a data-parallel reduction, strike a due gradient flip into the accumulated ``.grad``."""
        if self._direct and self.tap.wants_flip():
            for name, p in self.session.named_trainable():
                if p.grad is not None:  # a DTensor's own shard (the flip is this rank's, no collective)
                    self.tap.inject(name, local_part(p.grad))

    def end_window(self) -> None:
        """The window committed or was dropped: DDP's gradient hooks come off (later steps cost nothing)."""
        if self.tap.ddp_access is not None:
            self.tap.ddp_access.disarm()


def trainable(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """(pre-wrap name, parameter) of every trainable parameter."""
    return [(pre_wrap_fqn(n), p) for n, p in unwrap(module).named_parameters() if p.requires_grad]
