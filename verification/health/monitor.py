"""TrainingHealthMonitor: per-step loss/grad-norm anomalies, MFU, stragglers and silent ranks, one report.

``observe_step`` scores each value against the rolling baseline *before* adding it; NaN/Inf fire
without warm-up; a full window whose spread is tiny relative to its median is a plateau (flagged
once until the loss moves again). ``observe_rank_times`` names a straggler: a rank slower than the others by
``straggler_ratio`` (and ``straggler_min_s``) on ``straggler_steps`` observed steps in a row, so one slow step
(an audited step's replay, a neighbour process on a shared machine) is noise, not a straggler;
``observe_rank_step``/``check_rank_liveness`` flag a rank that stopped reporting.
"""

from __future__ import annotations

import math
import statistics
import threading
from collections.abc import Sequence
from typing import Any

import attrs

from .baseline import RollingBaseline
from .flops import MFUSample, ModelFlopConfig

ANOMALY_KINDS = frozenset({
    "nan_inf_loss", "nan_inf_grad", "loss_spike", "grad_norm_spike", "loss_plateau", "restart_discontinuity",
    "straggler", "dead_rank", "hung_rank",
})


@attrs.frozen
class StepRecord:
    """One observed optimizer step."""

    step: int
    loss: float
    grad_norm: float | None = None
    step_time_s: float | None = None
    restart: bool = False


@attrs.frozen
class Anomaly:
    """One flagged anomaly: its kind, step, value and the baseline it was judged against (``rank`` when one
    rank is to blame: a straggler, a dead or hung rank)."""

    step: int
    kind: str = attrs.field(validator=attrs.validators.in_(ANOMALY_KINDS))
    value: float
    baseline: float | None
    z_score: float | None
    detected_at_step: int
    rank: int | None = None
    detail: str = ""

    def latency(self, injected_at_step: int) -> int:
        """Steps between the true anomaly step and its detection (0: caught on the same step)."""
        return self.detected_at_step - injected_at_step

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return attrs.asdict(self)


def _real(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    return float(value)


class TrainingHealthMonitor:
    """The run's health receipts: ``observe_step`` once per optimizer step, ``report()`` at the end.

    Thread-safe appends: a session's heartbeat thread may report a dead rank while a step runs.
    """

    def __init__(self, *, flop_config: ModelFlopConfig | None = None, peak_flops_per_sec: float | None = None,
                 loss_window: int = 20, loss_min_periods: int = 5, loss_z_thresh: float = 6.0,
                 grad_window: int = 20, grad_min_periods: int = 5, grad_z_thresh: float = 6.0,
                 rank_heartbeat_threshold: int = 50, plateau_rel_tol: float | None = 1e-6,
                 straggler_ratio: float = 1.5, straggler_min_s: float = 0.005, straggler_steps: int = 3) -> None:
        if flop_config is not None and not isinstance(flop_config, ModelFlopConfig):
            raise TypeError(f"flop_config must be a ModelFlopConfig or None, got {type(flop_config).__name__}")
        if peak_flops_per_sec is not None and not _real(peak_flops_per_sec, "peak_flops_per_sec") > 0:
            raise ValueError(f"peak_flops_per_sec must be > 0, got {peak_flops_per_sec}")
        for name, v in (("loss_z_thresh", loss_z_thresh), ("grad_z_thresh", grad_z_thresh),
                        ("straggler_min_s", straggler_min_s)):
            if not _real(v, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {v}")
        if not _real(straggler_ratio, "straggler_ratio") > 1:
            raise ValueError(f"straggler_ratio must be > 1, got {straggler_ratio}")
        if isinstance(straggler_steps, bool) or not isinstance(straggler_steps, int) or straggler_steps < 1:
            raise ValueError(f"straggler_steps must be an int >= 1, got {straggler_steps!r}")
        if isinstance(rank_heartbeat_threshold, bool) or not isinstance(rank_heartbeat_threshold, int) \
                or rank_heartbeat_threshold < 0:
            raise ValueError(f"rank_heartbeat_threshold must be an int >= 0, got {rank_heartbeat_threshold!r}")
        self.flop_config, self.peak_flops_per_sec = flop_config, peak_flops_per_sec
        self.loss_z_thresh, self.grad_z_thresh = float(loss_z_thresh), float(grad_z_thresh)
        self.plateau_rel_tol = None if plateau_rel_tol is None else float(plateau_rel_tol)
        self.straggler_ratio, self.straggler_min_s = float(straggler_ratio), float(straggler_min_s)
        self.straggler_steps = straggler_steps
        self._slow_streak: tuple[int, int, list[float]] | None = None  # (rank, steps in a row, its excess ratios)
        self.rank_heartbeat_threshold = rank_heartbeat_threshold
        self._loss = RollingBaseline(loss_window, loss_min_periods)
        self._grad = RollingBaseline(grad_window, grad_min_periods)
        self.records: list[StepRecord] = []
        self.anomalies: list[Anomaly] = []
        self.mfu_samples: list[MFUSample] = []
        self._on_plateau = False
        self._last_seen: dict[str, int] = {}
        self._flagged_dead: set[str] = set()
        self._lock = threading.Lock()

    # ---- per step ---------------------------------------------------------------------------
    def observe_step(self, step: int, loss: float, *, grad_norm: float | None = None,
                     step_time_s: float | None = None, batch_size: int | None = None, restart: bool = False,
                     tokens: int | None = None) -> list[Anomaly]:
        """Record one step; returns the anomalies raised at it (also kept in ``anomalies``).

        MFU is sampled when a FLOP config, a peak and ``step_time_s`` are known: FLOPs of ``tokens``
        counted tokens when given, else of ``batch_size`` (default 1) full sequences.
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be an int >= 0, got {step!r}")
        if self.records and step <= self.records[-1].step:
            raise ValueError(
                f"steps must increase strictly: previous {self.records[-1].step}, now {step}; "
                f"record each step once, with a step number above {self.records[-1].step}"
            )
        loss = _real(loss, "loss")
        grad = None if grad_norm is None else _real(grad_norm, "grad_norm")
        if grad is not None and math.isfinite(grad) and grad < 0:
            raise ValueError(f"grad_norm must be >= 0, got {grad}")
        if step_time_s is not None and not (math.isfinite(_real(step_time_s, "step_time_s")) and step_time_s > 0):
            raise ValueError(f"step_time_s must be finite and > 0, got {step_time_s}")
        if not isinstance(restart, bool):
            raise TypeError(f"restart must be a bool, got {restart!r}")
        self.records.append(StepRecord(step, loss, grad, None if step_time_s is None else float(step_time_s),
                                       restart))
        found = self._nonfinite(step, loss, grad)
        if math.isfinite(loss):
            found += self._score(step, loss, self._loss, self.loss_z_thresh,
                                 "restart_discontinuity" if restart else "loss_spike")
            found += self._plateau(step)
        if grad is not None and math.isfinite(grad):
            found += self._score(step, grad, self._grad, self.grad_z_thresh, "grad_norm_spike")
        self._sample_mfu(step, step_time_s, batch_size, tokens)
        self._add(found)
        return found

    def _nonfinite(self, step: int, loss: float, grad: float | None) -> list[Anomaly]:
        found = []
        if not math.isfinite(loss):
            found.append(Anomaly(step, "nan_inf_loss", loss, None, None, step))
        if grad is not None and not math.isfinite(grad):
            found.append(Anomaly(step, "nan_inf_grad", grad, None, None, step))
        return found

    @staticmethod
    def _score(step: int, value: float, baseline: RollingBaseline, thresh: float, kind: str) -> list[Anomaly]:
        z, base = baseline.z_score(value), baseline.baseline()
        baseline.update(value)
        if z is None or base is None or z <= thresh:
            return []
        return [Anomaly(step, kind, value, base[0], z, step)]

    def _plateau(self, step: int) -> list[Anomaly]:
        if self.plateau_rel_tol is None or len(self._loss) < self._loss.window:
            return []
        base = self._loss.baseline()
        assert base is not None  # a full window is past warm-up
        med, mad = base
        flat = mad <= self.plateau_rel_tol * max(abs(med), 1e-12)
        was, self._on_plateau = self._on_plateau, flat
        if not flat or was:
            return []
        return [Anomaly(step, "loss_plateau", med, med, None, step,
                        detail=f"the last {self._loss.window} losses vary by a MAD of {mad:.3g}")]

    def _sample_mfu(self, step: int, step_time_s: float | None, batch_size: int | None, tokens: int | None) -> None:
        if step_time_s is None or self.flop_config is None or self.peak_flops_per_sec is None:
            return
        flops = (self.flop_config.flops_for_tokens(tokens) if tokens is not None
                 else self.flop_config.flops_per_iter(batch_size or 1))
        if flops > 0:
            self.mfu_samples.append(MFUSample(step, flops, step_time_s, self.peak_flops_per_sec))

    # ---- ranks ------------------------------------------------------------------------------
    def observe_rank_times(self, step: int, seconds: Sequence[float]) -> list[Anomaly]:
        """Per-rank local step times of one step (index = rank); names the rank that took ``straggler_ratio``
        times the others' median (and at least ``straggler_min_s`` more) on ``straggler_steps`` steps in a row,
        once per such streak (a single slow step is the run's noise; ``straggler_steps=1`` flags it)."""
        times = [float(t) for t in seconds]
        if len(times) < 2:
            return []
        slow = max(range(len(times)), key=times.__getitem__)
        others = statistics.median(t for r, t in enumerate(times) if r != slow)
        if times[slow] <= max(others * self.straggler_ratio, others + self.straggler_min_s):
            self._slow_streak = None
            return []
        _, run, ratios = self._slow_streak if self._slow_streak and self._slow_streak[0] == slow else (slow, 0, [])
        self._slow_streak = (slow, run + 1, [*ratios, times[slow] / max(others, 1e-12)])
        if run + 1 != self.straggler_steps:  # flagged once per streak, when it has lasted straggler_steps steps
            return []
        steps = f" on {run + 1} steps in a row (median {statistics.median(self._slow_streak[2]):.2f}x)" \
            if run else ""
        found = [Anomaly(step, "straggler", times[slow], others, None, step, rank=slow,
                         detail=f"rank {slow} took {times[slow]:.4f} s, the other ranks' median {others:.4f} s"
                                f"{steps}")]
        self._add(found)
        return found

    def observe_rank_step(self, rank: int | str, step: int) -> None:
        """A heartbeat: ``rank`` completed ``step``; a rank heard from again after an outage is un-flagged."""
        name = str(rank)
        previous = self._last_seen.get(name)
        if previous is not None and step <= previous:
            raise ValueError(
                f"rank {name!r} heartbeat steps must increase strictly: previous {previous}, now {step}; "
                f"report each completed step once, with a step number above {previous}"
            )
        self._last_seen[name] = int(step)
        self._flagged_dead.discard(name)

    def check_rank_liveness(self, current_step: int) -> list[Anomaly]:
        """Flag (once per outage) every rank silent for more than ``rank_heartbeat_threshold`` steps."""
        if self._last_seen and current_step < max(self._last_seen.values()):
            raise ValueError(f"current_step={current_step} precedes an observed heartbeat")
        found = []
        for name, last in self._last_seen.items():
            silence = current_step - last
            if silence > self.rank_heartbeat_threshold and name not in self._flagged_dead:
                self._flagged_dead.add(name)
                found.append(Anomaly(last, "dead_rank", float(silence), float(self.rank_heartbeat_threshold), None,
                                     current_step, rank=int(name) if name.isdigit() else None))
        self._add(found)
        return found

    def record(self, anomaly: Anomaly) -> None:
        """Add an anomaly found elsewhere (the heartbeat thread's dead or hung rank)."""
        self._add([anomaly])

    def _add(self, found: list[Anomaly]) -> None:
        if found:
            with self._lock:
                self.anomalies.extend(found)

    # ---- summary ----------------------------------------------------------------------------
    def continuity_ok(self) -> bool:
        """True unless a restart_discontinuity was flagged."""
        return not any(a.kind == "restart_discontinuity" for a in self.anomalies)

    def state(self) -> dict[str, Any]:
        """The rolling baselines, to carry across a checkpoint so a resume is judged against its past."""
        return {"loss": self._loss.state(), "grad": self._grad.state()}

    def restore(self, state: dict[str, Any]) -> None:
        """Resume the baselines saved by ``state``."""
        self._loss, self._grad = RollingBaseline.from_state(state["loss"]), RollingBaseline.from_state(state["grad"])

    def report(self) -> dict[str, Any]:
        """A JSON-ready summary: steps, anomalies (by kind and each), MFU, restarts and continuity."""
        with self._lock:
            anomalies = list(self.anomalies)
        by_kind: dict[str, int] = {}
        for a in anomalies:
            by_kind[a.kind] = by_kind.get(a.kind, 0) + 1
        mfu = [s.mfu for s in self.mfu_samples]
        return {
            "n_steps": len(self.records), "n_anomalies": len(anomalies), "anomalies_by_kind": by_kind,
            "anomalies": [a.as_dict() for a in anomalies],
            "mfu": {"n_samples": len(mfu), "mean": statistics.fmean(mfu) if mfu else None,
                    "min": min(mfu) if mfu else None, "max": max(mfu) if mfu else None},
            "restarts": {"steps": [r.step for r in self.records if r.restart], "continuity_ok": self.continuity_ok()},
        }
