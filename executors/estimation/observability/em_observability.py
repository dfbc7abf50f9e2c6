"""What each EM worker did in each pass, and the verdicts read from it: stragglers, skew, a fit report.

The handles emit :class:`RankRecord`s themselves (``executors.estimation.metering`` measures every
pass on the workers), so ``handle.rank_records``, the ledger's EM receipts and ``handle.fit_report()``
need nothing from the caller. The analysis functions are pure and also take records from elsewhere
(mixle's ``em_round`` telemetry events, ``records_from_events``).

Straggler rule (:func:`detect_stragglers`): each worker is compared with the median and the median
absolute deviation (MAD) of the *other* workers, so one slow worker cannot inflate the scale it is
judged against and two workers can already name one (mixle 0.8.2 pools every worker, which with two
workers never flags). A worker is slow when its time is at least ``threshold_ratio`` times the
others' median, exceeds it by ``min_excess_seconds``, and -- where the others spread (MAD > 0) --
its robust z-score ``(t - median) / (1.4826 * MAD)`` reaches ``z_threshold``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from numbers import Integral, Real
from typing import Any

import attrs

__all__ = [
    "FitReport",
    "ImbalanceReceipt",
    "RankRecord",
    "StragglerReport",
    "detect_stragglers",
    "fit_report",
    "json_ready_report",
    "imbalance_receipt",
    "plan_rebalance_weights",
    "record_rank_round",
    "records_from_events",
    "round_summary",
]

_MEASURED = (
    "rank", "round", "e_step_seconds", "m_step_seconds", "total_seconds", "bytes_processed",
    "accumulator_bytes", "n_obs", "chunks", "wait_seconds", "bytes_moved", "worker",
)
_MAD_TO_SIGMA = 1.4826  # MAD * this estimates the standard deviation of normal data


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or int(value) < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return int(value)


def _seconds(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)) or value < 0:
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


def _extra(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"extra must be a mapping, got {type(value).__name__}")
    clash = sorted(set(value) & set(_MEASURED))
    if clash:
        raise ValueError(f"extra cannot carry the measured field(s) {clash}; pass them as arguments")
    return dict(value)


@attrs.frozen(kw_only=True)
class RankRecord:
    """One worker's pass: compute (``e_step_seconds``) and wait seconds, rows, chunks, bytes.

    ``bytes_processed`` is the encoded data the worker read; ``accumulator_bytes`` the statistics it
    sent back; ``bytes_moved`` everything that crossed between driver and worker (payload + results).
    """

    rank: int = attrs.field(converter=lambda v: _count(v, "rank"))
    round: int = attrs.field(converter=lambda v: _count(v, "round"))
    e_step_seconds: float = attrs.field(converter=lambda v: _seconds(v, "e_step_seconds"))
    m_step_seconds: float = attrs.field(default=0.0, converter=lambda v: _seconds(v, "m_step_seconds"))
    bytes_processed: int = attrs.field(default=0, converter=lambda v: _count(v, "bytes_processed"))
    accumulator_bytes: int = attrs.field(default=0, converter=lambda v: _count(v, "accumulator_bytes"))
    n_obs: int = attrs.field(default=0, converter=lambda v: _count(v, "n_obs"))
    extra: dict[str, Any] = attrs.field(factory=dict, converter=_extra, eq=False, hash=False)
    chunks: int = attrs.field(default=0, converter=lambda v: _count(v, "chunks"))
    wait_seconds: float = attrs.field(default=0.0, converter=lambda v: _seconds(v, "wait_seconds"))
    bytes_moved: int = attrs.field(default=0, converter=lambda v: _count(v, "bytes_moved"))
    worker: str = attrs.field(default="", converter=str)

    @property
    def total_seconds(self) -> float:
        """Compute seconds of the pass (E-step plus any worker-side M-step)."""
        return self.e_step_seconds + self.m_step_seconds

    def as_features(self) -> dict[str, Any]:
        """Flat JSON-ready form (mixle's ``em_round`` event features, plus our fields)."""
        out = {name: getattr(self, name) for name in _MEASURED if name != "total_seconds"}
        return {**out, "total_seconds": self.total_seconds, **self.extra}

    @classmethod
    def from_features(cls, features: Mapping[str, Any]) -> RankRecord:
        """Inverse of :meth:`as_features`."""
        known = {k: features[k] for k in _MEASURED if k in features and k != "total_seconds"}
        known.setdefault("e_step_seconds", 0.0)
        return cls(**known, extra={k: v for k, v in features.items() if k not in _MEASURED})


def record_rank_round(telemetry: Any, *, rank: int, round: int, e_step_seconds: float, m_step_seconds: float = 0.0,
                      bytes_processed: int = 0, accumulator_bytes: int = 0, n_obs: int = 0,
                      run_id: str | None = None, extra: Mapping[str, Any] | None = None) -> Any:
    """Append one worker's round to ``telemetry`` as an ``em_round`` event and return the event.

    ``telemetry`` is a mixle ``Telemetry`` (anything with ``record(kind, features=, choice=, tags=)``)
    or a list, which gets the event as a dict ``{"kind", "features", "tags"}``.
    """
    rec = RankRecord(rank=rank, round=round, e_step_seconds=e_step_seconds, m_step_seconds=m_step_seconds,
                     bytes_processed=bytes_processed, accumulator_bytes=accumulator_bytes, n_obs=n_obs,
                     extra=dict(extra or {}))
    tags = {"run_id": run_id} if run_id is not None else {}
    if isinstance(telemetry, list):
        event = {"kind": "em_round", "features": rec.as_features(), "tags": tags}
        telemetry.append(event)
        return event
    if not callable(getattr(telemetry, "record", None)):
        raise TypeError(f"telemetry must be a list or have record(kind, features=...), got {type(telemetry).__name__}")
    return telemetry.record("em_round", features=rec.as_features(), choice=f"rank={rank}", tags=tags)


def records_from_events(events: Sequence[Any]) -> list[RankRecord]:
    """The :class:`RankRecord`s of the ``em_round`` events (mixle ``Event`` objects or dicts)."""
    out = []
    for ev in events:
        kind = ev.get("kind") if isinstance(ev, Mapping) else getattr(ev, "kind", None)
        if kind == "em_round":
            out.append(RankRecord.from_features(ev["features"] if isinstance(ev, Mapping) else ev.features))
    return out


def _checked(records: Sequence[RankRecord]) -> list[RankRecord]:
    seen: set[tuple[int, int]] = set()
    for rec in records:
        if not isinstance(rec, RankRecord):
            raise TypeError(f"records must be RankRecord values, got {type(rec).__name__}")
        if (rec.round, rec.rank) in seen:
            raise ValueError(f"two records for round {rec.round}, rank {rec.rank}; each worker has one per round")
        seen.add((rec.round, rec.rank))
    return list(records)


def _round_of(records: Sequence[RankRecord], round: int | None) -> tuple[int, list[RankRecord]]:
    records = _checked(records)
    r = max((rec.round for rec in records), default=0) if round is None else _count(round, "round")
    return r, sorted((rec for rec in records if rec.round == r), key=lambda rec: rec.rank)


@attrs.frozen(kw_only=True)
class StragglerReport:
    """One round's straggler verdict: each worker's seconds, ratio and robust z against the others."""

    round: int
    rank_seconds: dict[int, float]
    median_seconds: float
    mad_seconds: float
    ratios: dict[int, float]
    z_scores: dict[int, float]
    threshold_ratio: float
    z_threshold: float
    slow_ranks: tuple[int, ...]
    min_excess_seconds: float = 0.0

    @property
    def has_stragglers(self) -> bool:
        """Whether any worker was flagged."""
        return bool(self.slow_ranks)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (the ledger's receipts carry it)."""
        return {"round": self.round, "slow_ranks": list(self.slow_ranks), "median_seconds": self.median_seconds,
                "mad_seconds": self.mad_seconds, "rank_seconds": {str(k): v for k, v in self.rank_seconds.items()},
                "ratios": {str(k): _json_float(v) for k, v in self.ratios.items()}}


def _json_float(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)


def _verdict(t: float, others: list[float], ratio_min: float, z_min: float,
             excess_min: float) -> tuple[float, float, bool]:
    """(ratio, robust z, slow?) of time ``t`` against the other workers' times."""
    if not others:
        return 1.0, 0.0, False
    med = statistics.median(others)
    scale = _MAD_TO_SIGMA * statistics.median(abs(v - med) for v in others)
    ratio = t / med if med > 0 else (1.0 if t == 0 else math.inf)
    z = (t - med) / scale if scale > 0 else (math.inf if t > med else 0.0)
    return ratio, z, ratio >= ratio_min and t - med >= excess_min and (scale == 0 or z >= z_min)


def detect_stragglers(records: Sequence[RankRecord], *, round: int | None = None, threshold_ratio: float = 1.5,
                      z_threshold: float = 3.0, min_excess_seconds: float = 0.0) -> StragglerReport:
    """Flag the workers of one round (default: the last) that are slower than the rest (module doc)."""
    threshold_ratio = _seconds(threshold_ratio, "threshold_ratio")
    z_threshold = _seconds(z_threshold, "z_threshold")
    min_excess_seconds = _seconds(min_excess_seconds, "min_excess_seconds")
    if threshold_ratio < 1.0:
        raise ValueError(f"threshold_ratio must be >= 1.0 (a straggler is slower than the rest), got {threshold_ratio}")
    r, recs = _round_of(records, round)
    times = {rec.rank: rec.total_seconds for rec in recs}
    values = list(times.values())
    median = statistics.median(values) if values else 0.0
    mad = statistics.median(abs(v - median) for v in values) if values else 0.0
    ratios, zs, slow = {}, {}, []
    for rank, t in times.items():
        others = [v for k, v in times.items() if k != rank]
        ratios[rank], zs[rank], flagged = _verdict(t, others, threshold_ratio, z_threshold, min_excess_seconds)
        if flagged:
            slow.append(rank)
    return StragglerReport(round=r, rank_seconds=times, median_seconds=median, mad_seconds=mad, ratios=ratios,
                           z_scores=zs, threshold_ratio=threshold_ratio, z_threshold=z_threshold,
                           slow_ranks=tuple(slow), min_excess_seconds=min_excess_seconds)


@attrs.frozen(kw_only=True)
class ImbalanceReceipt:
    """One round's data skew: bytes and rows per worker, and each worker's bytes over the mean."""

    round: int
    bytes_per_rank: dict[int, int]
    n_obs_per_rank: dict[int, int]
    mean_bytes: float
    max_bytes_ratio: float
    skew_by_rank: dict[int, float]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (the ledger's receipts carry it)."""
        return {"round": self.round, "max_bytes_ratio": self.max_bytes_ratio,
                "n_obs_per_rank": {str(k): v for k, v in self.n_obs_per_rank.items()},
                "skew_by_rank": {str(k): v for k, v in self.skew_by_rank.items()}}


def imbalance_receipt(records: Sequence[RankRecord], *, round: int | None = None) -> ImbalanceReceipt:
    """How unevenly the data of one round (default: the last) was spread over the workers."""
    r, recs = _round_of(records, round)
    by_bytes = {rec.rank: rec.bytes_processed for rec in recs}
    mean = statistics.fmean(by_bytes.values()) if by_bytes else 0.0
    skew = {k: (b / mean if mean > 0 else 0.0) for k, b in by_bytes.items()}
    return ImbalanceReceipt(round=r, bytes_per_rank=by_bytes, n_obs_per_rank={rec.rank: rec.n_obs for rec in recs},
                            mean_bytes=mean, max_bytes_ratio=max(skew.values(), default=0.0), skew_by_rank=skew)


def plan_rebalance_weights(records: Sequence[RankRecord], *, round: int | None = None) -> dict[int, float]:
    """Per-worker weights for the next plan: observed throughput (rows per compute second), summing to
    the worker count, so a worker half as fast gets about half the rows (``balance_plan`` takes them)."""
    _, recs = _round_of(records, round)
    if not recs:
        return {}
    zero = [rec.rank for rec in recs if rec.total_seconds == 0.0]
    if zero:
        raise ValueError(f"worker(s) {zero} report zero compute seconds, so their throughput is unknown; "
                         "measure a round with real work first")
    rows = {rec.rank: float(rec.n_obs) for rec in recs}
    use_rows = all(v > 0 for v in rows.values())
    speed = {rec.rank: (rows[rec.rank] if use_rows else 1.0) / rec.total_seconds for rec in recs}
    total = math.fsum(speed.values())
    return {k: v / total * len(speed) for k, v in speed.items()}


@attrs.frozen(kw_only=True)
class FitReport:
    """A fit's summary: totals, and per round the straggler verdict and the data skew."""

    n_rounds: int
    n_ranks: int
    total_seconds: float
    total_wait_seconds: float
    total_bytes: int
    total_bytes_moved: int
    total_obs: int
    rounds: tuple[int, ...]
    stragglers_by_round: dict[int, StragglerReport]
    imbalance_by_round: dict[int, ImbalanceReceipt]
    worst_straggler_ratio: float
    worst_imbalance_ratio: float

    @property
    def any_stragglers(self) -> bool:
        """Whether any round flagged a worker."""
        return any(s.has_stragglers for s in self.stragglers_by_round.values())

    @property
    def slow_ranks(self) -> tuple[int, ...]:
        """Every worker flagged in any round."""
        return tuple(sorted({k for s in self.stragglers_by_round.values() for k in s.slow_ranks}))

    def render(self) -> str:
        """A few printable lines: totals, then one line per round."""
        lines = [f"fit_report: {self.n_ranks} worker(s) x {self.n_rounds} round(s), {self.total_seconds:.3f} s "
                 f"compute, {self.total_wait_seconds:.3f} s waiting, {self.total_bytes_moved} bytes moved"]
        for r in self.rounds:
            s, im = self.stragglers_by_round[r], self.imbalance_by_round[r]
            flag = f"STRAGGLERS={tuple(s.slow_ranks)}" if s.has_stragglers else "ok"  # mixle's rendering
            worst = max(s.ratios.values(), default=0.0)
            lines.append(f"  round {r}: median {s.median_seconds:.4f} s, worst {worst:.2f}x, "
                         f"data skew {im.max_bytes_ratio:.2f}x [{flag}]")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (``json.dumps`` writes the int round keys as strings)."""
        return {"n_rounds": self.n_rounds, "n_ranks": self.n_ranks, "total_seconds": self.total_seconds,
                "total_wait_seconds": self.total_wait_seconds, "total_bytes": self.total_bytes,
                "total_bytes_moved": self.total_bytes_moved, "total_obs": self.total_obs, "rounds": list(self.rounds),
                "worst_straggler_ratio": _json_float(self.worst_straggler_ratio),
                "worst_imbalance_ratio": self.worst_imbalance_ratio, "slow_ranks": list(self.slow_ranks),
                "any_stragglers": self.any_stragglers,  # mixle's key; rounds keyed by int as mixle's are
                "by_round": {r: {"stragglers": self.stragglers_by_round[r].as_dict(),
                                      "imbalance": self.imbalance_by_round[r].as_dict()} for r in self.rounds}}


def json_ready_report(report: FitReport) -> dict[str, Any]:
    """``report.as_dict()`` with the round keys as strings (what canonical JSON, e.g. the ledger, takes)."""
    out = report.as_dict()
    out["by_round"] = {str(r): v for r, v in out["by_round"].items()}
    return out


def fit_report(records: Sequence[RankRecord], *, threshold_ratio: float = 1.5, z_threshold: float = 3.0,
               min_excess_seconds: float = 0.0) -> FitReport:
    """Roll a fit's records (complete or so far) into one :class:`FitReport`; no records give zeros."""
    records = _checked(records)
    rounds = sorted({rec.round for rec in records})
    strag = {r: detect_stragglers(records, round=r, threshold_ratio=threshold_ratio, z_threshold=z_threshold,
                                  min_excess_seconds=min_excess_seconds) for r in rounds}
    imb = {r: imbalance_receipt(records, round=r) for r in rounds}
    return FitReport(
        n_rounds=len(rounds), n_ranks=len({rec.rank for rec in records}),
        total_seconds=math.fsum(rec.total_seconds for rec in records),
        total_wait_seconds=math.fsum(rec.wait_seconds for rec in records),
        total_bytes=sum(rec.bytes_processed for rec in records),
        total_bytes_moved=sum(rec.bytes_moved for rec in records), total_obs=sum(rec.n_obs for rec in records),
        rounds=tuple(rounds), stragglers_by_round=strag, imbalance_by_round=imb,
        worst_straggler_ratio=max((max(s.ratios.values(), default=0.0) for s in strag.values()), default=0.0),
        worst_imbalance_ratio=max((im.max_bytes_ratio for im in imb.values()), default=0.0),
    )


def round_summary(records: Sequence[RankRecord], *, min_excess_seconds: float = 0.0) -> dict[str, Any]:
    """What an EM receipt carries about one pass's workers: the stragglers named, the data skew, and
    per worker compute and wait seconds, rows and bytes moved (JSON-ready)."""
    if not records:
        return {"workers": 0, "stragglers": [], "imbalance_ratio": 0.0}
    strag = detect_stragglers(records, min_excess_seconds=min_excess_seconds)
    imb = imbalance_receipt(records)
    return {
        "workers": len(records),
        "stragglers": list(strag.slow_ranks),
        "imbalance_ratio": imb.max_bytes_ratio,
        "compute_seconds": {str(r.rank): r.e_step_seconds for r in records},
        "wait_seconds": {str(r.rank): r.wait_seconds for r in records},
        "rows": {str(r.rank): r.n_obs for r in records},
        "bytes_moved": {str(r.rank): r.bytes_moved for r in records},
    }
