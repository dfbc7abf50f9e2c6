"""mixle's ``sdc_audit`` names over our audit: ``AuditedMPEncodedData``, ``SDCAuditReceipt``, ``inject_bit_flip``.

``AuditedMPEncodedData`` is the ``mp`` handle with the SDC audit always on (``executors.estimation.
sdc_audit``: audited chunks recomputed on a peer, a third worker witnesses a mismatch, the faulty
worker is quarantined and its chunks recomputed) and every pass folded by
:func:`~.finite_guard.guarded_fold_pass`, which names the chunk and worker of a NaN/Inf; a non-finite
run of chunks folded on a worker is recomputed there chunk by chunk to name the very chunk.

mixle 0.8.2's instrumentation sits on top: each E-step audits ``round(audit_rate x chunks)`` chunks
drawn without replacement from the handle's ``rng`` (``audit_rate`` is writable and read each round;
none with fewer than two healthy workers), ``last_round_audit_eval_count`` counts two evaluations per
audited chunk (its primary and its peer) plus one per witness, ``arm_corruption(hook)`` passes every
evaluation of an audited chunk as mixle's payload (pickled ``(count, statistic)`` bytes) through
``hook(worker_id, chunk_id, role, payload) -> payload`` (role ``primary``, ``audit`` or ``witness``)
until ``arm_corruption(None)``, and each mismatch's :class:`SDCAuditReceipt` carries mixle's fields
(byte sizes, sha256 of the payloads and of their canonical statistic bytes, ``first_diff_byte_offset``,
``mismatch_reason``, the witness, the suspects, the quarantine status).

mixle's draw is named in the pass (its own results come back), so a backend could spare exactly those chunks;
the same passes therefore also run the secret-sample reference audit (``named_draw.NamedDrawPass``):
every folded group commits to its chunks' digests, the secretly drawn chunks are compared with the reference
and their groups opened. Its records join ``audit_records``; mixle's round fields count mixle's draw only.
"""

from __future__ import annotations

import copy
import hashlib
import math
import pickle  # nosec B403 - mixle's audit payloads, made and read in this process only
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs
import numpy as np

from ....contracts import AuditPolicy, SDCAuditRecord
from ....contracts.estimation import canonical_statistic_bytes
from ....verification.sdc.inject import BitFlip, FaultInjector
from ..audit.placed_rounds import owners_on
from ..audit.sdc_audit import EMAudit
from ..backends.mp import MPChunkRunner
from ..em_pass.chunks import ChunkResult, GroupStats, WorkerTask, chunk_estep
from ..em_pass.finite_guard import (
    NonFiniteStatisticError,
    check_chunk_result,
    guarded_fold_pass,
)
from ..em_pass.runner_wrapper import ForwardingRunner
from ..handle import ChunkedEncodedData
from .named_draw import NamedDrawPass

__all__ = ["AuditedMPEncodedData", "CorruptionHook", "SDCAuditReceipt", "audit_receipts", "inject_bit_flip"]

CorruptionHook = Callable[[int, int, str, bytes], bytes]
"""mixle's ``hook(worker_id, shard_id, role, payload) -> payload`` over pickled ``(count, statistic)`` bytes."""


def inject_bit_flip(payload: bytes, bit_offset: int | None = None) -> bytes:
    """``payload`` with exactly one bit flipped (default: the middle bit; offsets wrap around)."""
    if not isinstance(payload, (bytes, bytearray)):
        raise TypeError(f"inject_bit_flip takes bytes, got {type(payload).__name__}; for statistics in a "
                        "running fit use BitFlip('statistic', 'chunk:<c>', rank=, step=) with arm_corruption")
    if not payload:
        raise ValueError("cannot flip a bit of an empty payload")
    bits = len(payload) * 8
    offset = bits // 2 if bit_offset is None else int(bit_offset) % bits
    out = bytearray(payload)
    out[offset // 8] ^= 1 << (offset % 8)
    return bytes(out)


@attrs.frozen(kw_only=True)
class SDCAuditReceipt:
    """One detected mismatch in mixle's terms: round, shard (chunk), primary/audit/witness workers,
    digests, suspects and what was done; ``records`` are the ``SDCAuditRecord``s it was read from.

    ``primary_sha256``/``audit_sha256`` are the sha256 of the two payloads (mixle's) where the handle
    captured them, else the records' statistic digests."""

    round: int
    shard_id: int
    primary_worker: int
    audit_worker: int | None
    primary_sha256: str
    audit_sha256: str
    witness_worker: int | None = None
    suspected_workers: tuple[int, ...] = ()
    quarantine_status: str = "not_requested"
    comparison_mode: str = "bitwise"
    max_abs_error: float = 0.0
    records: tuple[SDCAuditRecord, ...] = ()
    primary_nbytes: int = 0
    """Bytes of the primary's payload (mixle's pickled ``(count, statistic)``; 0 when none was captured)."""
    audit_nbytes: int = 0
    first_diff_byte_offset: int | None = None
    """First byte where the two payloads differ (the shorter length when one is a prefix of the other)."""
    audit_rtol: float = 0.0
    audit_atol: float = 0.0
    max_rel_error: float = 0.0
    mismatch_reason: str = ""
    primary_canonical_sha256: str = ""
    """sha256 of the primary statistic's canonical bytes (of ``raw:`` + payload when it does not decode)."""
    audit_canonical_sha256: str = ""
    primary_value_repr: str = attrs.field(default="", repr=False)
    audit_value_repr: str = attrs.field(default="", repr=False)

    def summary(self) -> str:
        """One line for logs."""
        return (f"SDC audit mismatch: round={self.round} shard={self.shard_id} primary={self.primary_worker} "
                f"audit={self.audit_worker} witness={self.witness_worker} primary={self.primary_sha256[:19]} "
                f"audit={self.audit_sha256[:19]} primary_bytes={self.primary_nbytes} audit_bytes={self.audit_nbytes} "
                f"first_diff_byte={self.first_diff_byte_offset} reason={self.mismatch_reason!r} "
                f"suspects={list(self.suspected_workers)} status={self.quarantine_status} "
                f"comparison={self.comparison_mode}")


_STATUS: dict[str, str] = {AuditPolicy.QUARANTINE: "quarantined", AuditPolicy.RAISE: "raised",
                           AuditPolicy.WARN: "warned", AuditPolicy.SKIP_STEP: "skipped"}
"""mixle's ``quarantine_status`` of a mismatch, by the policy that handled it (a record's text finds its key)."""


def audit_receipts(records: Iterable[SDCAuditRecord], payloads: dict[tuple[int, int, str], bytes] | None = None,
                   *, rtol: float = 0.0, atol: float = 0.0) -> list[SDCAuditReceipt]:
    """One :class:`SDCAuditReceipt` per mismatched (step, chunk) among EM ``SDCAuditRecord``s; ``payloads``
    (``(step, chunk, role) -> bytes``, what ``AuditedMPEncodedData`` captured) fill mixle's byte fields."""
    grouped: dict[tuple[int, str], list[SDCAuditRecord]] = {}
    for r in records:
        grouped.setdefault((r.step, r.unit), []).append(r)
    out = []
    for (step, unit), recs in grouped.items():
        bad = [r for r in recs if not r.matched]
        if not bad:
            continue
        first = next((r for r in recs if r.replay in ("peer", "same_rank")), recs[0])
        witness = next((r for r in recs if r.replay == "witness"), None)
        suspects = tuple(sorted({r.attributed_rank for r in bad if r.attributed_rank is not None}))
        shard = int(unit.split(":", 1)[1]) if unit.startswith("chunk:") else -1
        wire = _payload_fields((payloads or {}).get((step, shard, "primary")),
                               (payloads or {}).get((step, shard, "audit")))
        fields: dict[str, Any] = dict(
            round=step, shard_id=shard,
            primary_worker=first.rank, audit_worker=first.auditor_rank, primary_sha256=first.observed_digest,
            audit_sha256=first.expected_digest, witness_worker=witness.auditor_rank if witness else None,
            suspected_workers=suspects, quarantine_status=_STATUS.get(bad[0].action, bad[0].action),
            max_abs_error=max(r.maximum_absolute_difference for r in bad), records=tuple(recs),
            audit_rtol=rtol, audit_atol=atol)
        fields.update(wire)  # the payloads' own digests (mixle's) where they were captured
        out.append(SDCAuditReceipt(**fields))
    return out


def _decoded(payload: bytes) -> tuple[Any, str]:
    """(the payload's ``(count, statistic)``, "") or (None, why it does not decode)."""
    try:
        value = pickle.loads(payload)  # nosec B301 - bytes this process made from a worker's result
        canonical_statistic_bytes(value)
    except Exception as exc:  # noqa: BLE001 - a corrupted payload may not even unpickle; still a receipt
        return None, f"payload decode/schema failure: {type(exc).__name__}: {exc}"
    return value, ""


def _first_difference(left: Any, right: Any, path: str = "statistic") -> str:
    """Path of the first leaf whose bits differ between two decoded payloads ("" when none)."""
    if isinstance(left, (tuple, list)) and isinstance(right, (tuple, list)) and len(left) == len(right):
        diffs = (_first_difference(a, b, f"{path}[{i}]") for i, (a, b) in enumerate(zip(left, right)))
        return next((d for d in diffs if d), "")
    try:
        same = canonical_statistic_bytes(left) == canonical_statistic_bytes(right)
    except Exception:  # noqa: BLE001 - a leaf our codec does not carry: compare its pickles
        same = pickle.dumps(left) == pickle.dumps(right)
    return "" if same else f"{path}: bits differ"


def _abs_errors(left: Any, right: Any) -> tuple[float, float]:
    """Largest absolute and relative difference over the numeric leaves (inf for a shape mismatch)."""
    try:
        a = np.concatenate([np.ravel(np.asarray(x, dtype=float)) for x in _numeric_leaves(left)] or [np.zeros(0)])
        b = np.concatenate([np.ravel(np.asarray(x, dtype=float)) for x in _numeric_leaves(right)] or [np.zeros(0)])
    except (TypeError, ValueError):
        return math.inf, math.inf
    if a.shape != b.shape:
        return math.inf, math.inf
    if not a.size:
        return 0.0, 0.0
    with np.errstate(invalid="ignore", divide="ignore"):
        diff = np.abs(a - b)
        scale = np.maximum(np.abs(a), np.abs(b))
        rel = np.where(scale > 0, diff / np.where(scale > 0, scale, 1.0), 0.0)
    return float(np.nanmax(diff)) if diff.size else 0.0, float(np.nanmax(rel)) if rel.size else 0.0


def _numeric_leaves(value: Any) -> list[Any]:
    if isinstance(value, (tuple, list)):
        return [leaf for v in value for leaf in _numeric_leaves(v)]
    if isinstance(value, dict):
        return [leaf for k in sorted(value, key=str) for leaf in _numeric_leaves(value[k])]
    return [value]


def _payload_fields(primary: bytes | None, audit: bytes | None) -> dict[str, Any]:
    """mixle's receipt fields of two payloads (none when they were not captured)."""
    if primary is None or audit is None:
        return {}
    n = min(len(primary), len(audit))
    first = next((i for i in range(n) if primary[i] != audit[i]), None)
    if first is None and len(primary) != len(audit):
        first = n
    p_value, p_err = _decoded(primary)
    a_value, a_err = _decoded(audit)
    if p_err or a_err:
        reason, errors = p_err or a_err, (math.inf, math.inf)
        p_canon = hashlib.sha256(b"raw:" + primary).hexdigest()
        a_canon = hashlib.sha256(b"raw:" + audit).hexdigest()
    else:
        reason = _first_difference(p_value, a_value) or "payload bytes differ; the statistics are equal"
        errors = _abs_errors(p_value, a_value)
        p_canon = hashlib.sha256(canonical_statistic_bytes(p_value)).hexdigest()
        a_canon = hashlib.sha256(canonical_statistic_bytes(a_value)).hexdigest()
    return {"primary_nbytes": len(primary), "audit_nbytes": len(audit), "first_diff_byte_offset": first,
            "primary_sha256": hashlib.sha256(primary).hexdigest(), "audit_sha256": hashlib.sha256(audit).hexdigest(),
            "mismatch_reason": reason, "max_rel_error": errors[1], "primary_canonical_sha256": p_canon,
            "audit_canonical_sha256": a_canon, "primary_value_repr": repr(p_value)[:2000] if not p_err else p_err,
            "audit_value_repr": repr(a_value)[:2000] if not a_err else a_err}


class _PayloadTap(ForwardingRunner):
    """The audit's runner, seen through mixle's payloads: every evaluation of a chunk audited this round
    becomes pickled ``(count, statistic)`` bytes, passes the corruption hook, is kept for the receipt and
    decoded back (an undecodable payload stands as a statistic of NaNs, which agrees with nothing)."""

    def __init__(self, inner: Any, handle: AuditedMPEncodedData) -> None:
        self.inner, self.handle = inner, handle

    def run_on_workers(self, tasks: dict[int, WorkerTask]) -> dict[int, list[Any]]:
        """The wrapped ``run_on_workers``; audited chunks' results through :meth:`AuditedMPEncodedData._tap`."""
        out = self.inner.run_on_workers(tasks)
        for w, task in tasks.items():
            values = out.get(w)
            if values is None:
                continue
            for i, c in enumerate(task.chunk_ids):
                values[i] = self.handle._tap(int(w), int(c), values[i])
        return out


class AuditedMPEncodedData(ChunkedEncodedData):
    """The ``mp`` handle with the SDC audit always on and every combine NaN/Inf-guarded (module doc).

    mixle's arguments are taken; ``audit_rtol``/``audit_atol`` are recorded only, since our audit
    compares statistics bitwise (a chunk's statistics have the same bits on every worker).
    ``max_retries`` is recorded only: the mp runner recomputes a lost worker's chunks on the
    survivors until none is left. ``rng`` (a ``numpy.random.RandomState``, a seed, or None for seed 0)
    draws the audited chunks of each round.
    """

    def __init__(self, data: Sequence[Any], estimator: Any = None, encoder: Any = None,
                 num_workers: int | None = None, sub_chunks: int = 1, max_retries: int = 2,
                 audit_rate: float = 0.1, audit_rtol: float = 1e-12, audit_atol: float = 1e-12,
                 rng: Any = None, worker_timeout_s: float = 30.0, *, num_chunks: int | None = None,
                 audit_policy: AuditPolicy | str = AuditPolicy.QUARANTINE, ledger: Any = None,
                 fault_injector: Any = None) -> None:
        for name, value in (("audit_rtol", audit_rtol), ("audit_atol", audit_atol)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if isinstance(sub_chunks, bool) or not isinstance(sub_chunks, int) or sub_chunks < 1:
            raise ValueError(f"sub_chunks must be an int >= 1, got {sub_chunks!r}")
        self.audit_rtol, self.audit_atol, self.max_retries = float(audit_rtol), float(audit_atol), int(max_retries)
        self._audit = None  # made by attach_verification below; the rate is kept until then
        self.audit_rate = audit_rate
        self._audit_rng = rng if hasattr(rng, "choice") else np.random.RandomState(_seed(rng))
        self._last_model: Any = None
        self._corrupt_hook: CorruptionHook | None = None
        self._round_iteration = -1
        self._round_owners: list[int] = []
        self._round_roles: dict[int, list[str]] = {}
        self._payloads: dict[tuple[int, int, str], bytes] = {}
        self._receipts: list[SDCAuditReceipt] = []
        self.last_round_audit_mismatches: list[SDCAuditReceipt] = []
        """The receipts of the last E-step's mismatches."""
        self.last_round_audit_eval_count = 0
        """Evaluations the last E-step's audit made: 2 per audited chunk (primary, peer) + 1 per witness."""
        runner = MPChunkRunner(num_workers, timeout=worker_timeout_s)
        workers = runner.num_workers
        chunks = num_chunks if num_chunks is not None else max(1, workers * int(sub_chunks))
        try:
            super().__init__(runner, data, estimator=estimator, encoder=encoder, num_chunks=chunks)
            self.attach_verification(admission=None, audit=True, audit_rate=self._audit_rate,
                                     audit_policy=audit_policy, audit_seed=_seed(rng), ledger=ledger,
                                     fault_injector=fault_injector)
        except BaseException:
            runner.close()
            raise
        audit = self._held_audit()
        audit.runner = _PayloadTap(audit.runner, self)
        # mixle's draw replaces the seeded sample: its primary/audit/witness evaluations, then the reference too
        audit.named_draw = NamedDrawPass(self._audited_chunks)

    def _held_audit(self) -> EMAudit:
        """The audit this handle always has (``attach_verification(audit=True)`` in the constructor)."""
        audit = self._audit
        if audit is None:
            raise RuntimeError("AuditedMPEncodedData always has its SDC audit; this one was built without it")
        return audit

    # -- mixle's instrumentation ----------------------------------------------------------------
    @property
    def audit_rate(self) -> float:
        """Fraction of chunks audited per E-step, read at every round (writable, within [0, 1])."""
        return self._audit_rate

    @audit_rate.setter
    def audit_rate(self, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or not 0.0 <= value <= 1.0:
            raise ValueError(f"audit_rate must be finite and within [0, 1], got {value!r}")
        self._audit_rate = float(value)
        audit = self._audit
        if audit is not None:  # the secret sample's reference audit runs at the same rate
            audit.auditor.rate = self._audit_rate

    def _audited_chunks(self, iteration: int, num_chunks: int, *, first_of_fit: bool = False) -> tuple[int, ...]:
        """This round's audited chunks: ``round(audit_rate x chunks)`` drawn without replacement from ``rng``."""
        audit = self._held_audit()
        healthy = audit.healthy()
        self._round_owners = owners_on(audit.runner, num_chunks, healthy) if healthy else []
        self._round_roles = {}
        n_audit = max(0, min(int(round(self._audit_rate * num_chunks)), num_chunks))
        if n_audit == 0 or len(healthy) < 2:
            return ()
        chosen = self._audit_rng.choice(np.arange(num_chunks), size=n_audit, replace=False)
        self._round_roles = {int(c): [] for c in chosen}
        return tuple(sorted(self._round_roles))

    def _tap(self, worker: int, chunk: int, value: Any) -> Any:
        """One evaluation of ``chunk`` on ``worker``: through mixle's payload form when the chunk is audited."""
        roles = self._round_roles.get(chunk)
        if roles is None or len(roles) >= 3:
            return value
        if worker == self._round_owners[chunk] and "primary" not in roles:
            role = "primary"
        elif "audit" not in roles and worker != self._round_owners[chunk]:
            role = "audit"
        elif roles.count("audit") and self._payloads.get((self._round_iteration, chunk, "primary")) != \
                self._payloads.get((self._round_iteration, chunk, "audit")):
            role = "witness"
        else:
            return value  # a recompute after the audit (a quarantined worker's group), not one of mixle's roles
        roles.append(role)
        result = value.last if isinstance(value, GroupStats) else value
        if result is None:
            return value
        payload = pickle.dumps((float(result[0]), result[2]), protocol=pickle.HIGHEST_PROTOCOL)
        changed = payload
        if self._corrupt_hook is not None:
            changed = self._corrupt_hook(worker, chunk, role, payload)
            if not isinstance(changed, (bytes, bytearray)):
                raise TypeError(f"the arm_corruption hook returned a {type(changed).__name__} for chunk {chunk} "
                                f"({role} on worker {worker}); it must return the payload bytes")
            changed = bytes(changed)
        self._payloads[(self._round_iteration, chunk, role)] = changed
        if changed == payload:
            return value
        decoded, _ = _decoded(changed)
        if decoded is None or not isinstance(decoded, tuple) or len(decoded) != 2:
            decoded = (result[0], _nan_like(result[2]))
        replaced = ChunkResult(float(decoded[0]), float(result[1]), decoded[1])
        return value._replace(last=replaced) if isinstance(value, GroupStats) else replaced

    @property
    def audit_receipts(self) -> list[SDCAuditReceipt]:
        """One receipt per detected mismatch so far."""
        return list(self._receipts)

    @property
    def last_round_audited_shards(self) -> set[int]:
        """Chunks audited in the last E-step (mixle's draw; the secret sample's reference audit is in the records)."""
        return {o.chunk for o in self.last_audits
                if o.chunk in self._round_roles and o.records[0].unit.startswith("chunk:")}

    def arm_corruption(self, flips: CorruptionHook | BitFlip | Iterable[BitFlip] | FaultInjector | None) -> None:
        """mixle's payload hook ``hook(worker_id, chunk_id, role, payload) -> payload`` (module doc), active until
        ``arm_corruption(None)``; or planned bit flips of chunk statistics struck inside the workers
        (``BitFlip('statistic', 'chunk:<c>', rank=<worker>, step=<iteration>, index, bit)``, or a
        ``FaultInjector``). ``None`` clears both."""
        audit = self._held_audit()
        if flips is None:
            self._corrupt_hook, audit.injector = None, None
        elif isinstance(flips, FaultInjector):
            audit.injector = flips
        elif isinstance(flips, BitFlip):
            audit.injector = FaultInjector([flips])
        elif callable(flips):
            self._corrupt_hook = flips
        else:
            audit.injector = FaultInjector(list(flips))

    def pysp_stream_accumulate(self, estimator: Any, model: Any) -> tuple[float, Any]:
        """One audited, guarded pass: ``(nobs, statistics)``."""
        result = self.estep(estimator, model)
        return result.nobs, result.stats

    # -- the guarded fold -----------------------------------------------------------------------
    def _fold_entries(self, estimator: Any, entries: list[Any]) -> Any:
        sources = self._metered.chunk_workers
        try:
            return guarded_fold_pass(estimator, entries, where="AuditedMPEncodedData", workers=sources)
        except NonFiniteStatisticError as exc:
            a, b = exc.chunks
            if a == b or len(exc.workers) != 1 or exc.stage != "entry":
                raise
            raise self._pinpoint(estimator, a, b, exc.workers[0], exc) from exc

    def _pinpoint(self, estimator: Any, a: int, b: int, worker: int, exc: NonFiniteStatisticError) -> Exception:
        """Recompute chunks ``a..b`` one by one on ``worker`` to name the chunk that is non-finite."""
        model = self._last_model
        task = WorkerTask(chunk_estep, (estimator, model), tuple(range(a, b + 1)))
        out = self._metered.run_on_workers({worker: task})
        for c, result in zip(range(a, b + 1), out[worker]):
            try:
                check_chunk_result(result, c, (worker,), where="AuditedMPEncodedData")
            except NonFiniteStatisticError as found:
                return found
        return NonFiniteStatisticError(f"{exc}; recomputed chunk by chunk on worker {worker} they are finite: a "
                                       f"transient fault on that worker", chunks=exc.chunks, workers=exc.workers,
                                       element=exc.element, stage="transient")

    def estep(self, estimator: Any, model: Any) -> Any:
        """The audited, guarded E-step (see ``ChunkedEncodedData.estep``), with mixle's round fields."""
        self._last_model = model
        self._round_iteration, self._round_roles = self.iteration, {}
        self._payloads = {}
        records_before = len(self.audit_records)
        try:
            return super().estep(estimator, model)
        finally:
            fresh = list(self.audit_records)[records_before:]
            named = {f"chunk:{c}" for c in self._round_roles}  # mixle's draw, not the secret sample's
            audited = {r.unit for r in fresh if r.unit in named}
            witnesses = sum(r.replay == "witness" for r in fresh)
            self.last_round_audit_eval_count = 2 * len(audited) + witnesses
            self.last_round_audit_mismatches = audit_receipts(fresh, self._payloads, rtol=self.audit_rtol,
                                                              atol=self.audit_atol)
            self._receipts.extend(self.last_round_audit_mismatches)


def _nan_like(value: Any) -> Any:
    """A statistic of ``value``'s shape with every float NaN: what an undecodable payload stands as."""
    if isinstance(value, np.ndarray):
        return np.full(value.shape, np.nan) if value.dtype.kind in "fc" else value
    if isinstance(value, (float, np.floating)):
        return math.nan
    if isinstance(value, (tuple, list)):
        return type(value)(_nan_like(v) for v in value)
    if isinstance(value, dict):
        return {k: _nan_like(v) for k, v in value.items()}
    return value


def _seed(rng: Any) -> int:
    """A seed from ``rng`` (None: 0; an int; a generator's next draw, taken from a copy so ``rng`` is untouched)."""
    if rng is None:
        return 0
    if isinstance(rng, int) and not isinstance(rng, bool):
        return rng
    rng = copy.deepcopy(rng)
    return int(rng.randint(2**31 - 1)) if hasattr(rng, "randint") else int(rng.integers(2**31 - 1))
