"""Health receipts of a torch_native session: tokens/s, MFU, anomalies, per-rank step time, the heartbeat.

``HealthOptions`` (defined with the other training options in ``executors.training_options``) is
what ``prepare(health=...)`` takes. ``SessionHealth`` times each rank's own
work in a step (the wait for its batch since the last commit plus its forward passes: the parts no
peer holds up under DDP), ships it in the commit's all-reduce of its counts (a slot per rank, so no new
collective), and turns the committed step into a ``health`` dict for the receipt.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.distributed as dist
from torch import nn

from ...verification.health import Anomaly, TrainingHealthMonitor
from ..training_options import FAILURE_POLICIES, HealthOptions, resolve_health
from .heartbeat import Heartbeat

log = logging.getLogger(__name__)
HEALTH_EXIT_CODE = 75  # EX_TEMPFAIL: an elastic agent (torchrun --max-restarts) restarts the job
__all__ = ["FAILURE_POLICIES", "HEALTH_EXIT_CODE", "HealthOptions", "RankFailureError", "SessionHealth",
           "dense_flops_per_token", "measured_peak_flops", "resolve_health"]
_peaks: dict[str, float] = {}
_sessions = 0


class RankFailureError(RuntimeError):
    """A peer rank is dead or hung (found by the heartbeat); the step cannot complete."""


def measured_peak_flops(device: torch.device, n: int = 512, reps: int = 8) -> float:
    """The best fp32 matmul rate of ``reps`` n x n products on ``device`` (cached per device and thread count)."""
    key = f"{device}:{torch.get_num_threads()}"
    if key not in _peaks:
        a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
        best = float("inf")
        for _ in range(reps + 1):
            start = time.perf_counter()
            (a @ b).sum().item()
            best = min(best, time.perf_counter() - start)
        _peaks[key] = 2.0 * n**3 / best
    return _peaks[key]


def dense_flops_per_token(module: nn.Module) -> Callable[[int], float]:
    """FLOPs per token by sequence length: mixle CausalLM's 6N + attention, else 6N over non-embedding
    parameters (counted before any sharding)."""
    if all(hasattr(module, a) for a in ("n_layer", "n_head", "d_model")):
        from ...verification.health import flop_config_from_causal_lm

        cfg = flop_config_from_causal_lm(module, 1)
        return lambda seq: attrs.evolve(cfg, seq_len=max(seq, 1)).flops_per_token
    n = sum(p.numel() for m in module.modules() if not isinstance(m, nn.Embedding)
            for p in m.parameters(recurse=False) if p.requires_grad)
    return lambda seq: 6.0 * n


class SessionHealth:
    """One rank's health bookkeeping for a session (see the module docstring)."""

    def __init__(self, options: HealthOptions, *, module: nn.Module | None, device: torch.device, rank: int,
                 world_size: int) -> None:
        self.options, self.rank, self.world = options, rank, world_size
        o = options
        self.monitor = TrainingHealthMonitor(
            flop_config=o.flop_config, peak_flops_per_sec=o.peak_flops_per_sec, loss_window=o.window,
            loss_min_periods=o.min_periods, loss_z_thresh=o.loss_z_thresh, grad_window=o.window,
            grad_min_periods=o.min_periods, grad_z_thresh=o.grad_z_thresh, straggler_ratio=o.straggler_ratio,
            straggler_min_s=o.straggler_min_s, straggler_steps=o.straggler_steps)
        # no module (megatron's pipeline stages hold a part of it): MFU only from a given flop_config
        self._flops = None if o.flop_config is not None or module is None else dense_flops_per_token(module)
        self._peak = o.peak_flops_per_sec or measured_peak_flops(device)
        self.on_fatal: Callable[[Anomaly], None] | None = None
        """Called with a fatal anomaly before the rank exits; the session that owns the ledger sets it."""
        self._busy = 0.0
        self._window_start: float | None = None
        self._last_end: float | None = None
        self._seq = 1
        self._restart = False
        self.heartbeat = self._start_heartbeat() if o.heartbeat and world_size > 1 else None

    # ---- timing, called by the session --------------------------------------------------------
    def begin_call(self, inputs: Any) -> None:
        """A train_batch call starts: the wait since the last commit counts as this rank's own time."""
        now = time.perf_counter()
        if self._window_start is None:
            self._window_start = now if self._last_end is None else self._last_end
        if self._last_end is not None:
            self._busy += now - self._last_end
            self._last_end = None
        if isinstance(inputs, torch.Tensor) and inputs.dim() >= 2:
            self._seq = int(inputs.shape[1])
        self.check_failure()

    def add_forward(self, seconds: float) -> None:
        """Time this rank spent in the loss function (its forward)."""
        self._busy += seconds

    def phase(self, name: str, step: int | None = None) -> None:
        """Tell the heartbeat where the step is."""
        if self.heartbeat is not None:
            self.heartbeat.set_phase(name, step)

    def rank_slots(self) -> torch.Tensor:
        """This rank's own time in its slot of a world-long vector (summed by the all-reduce of the commit's counts)."""
        slots = torch.zeros(self.world, dtype=torch.float64)
        slots[self.rank] = self._busy
        return slots

    # ---- the committed step ------------------------------------------------------------------
    def on_commit(self, step: int, *, loss: float, grad_norm: float | None, tokens: int,
                  rank_seconds: list[float] | None) -> dict[str, Any]:
        """Score the committed step; the ``health`` dict of its receipt."""
        now = time.perf_counter()
        elapsed = max(now - (self._window_start or now), 1e-9)
        flops = self._step_flops(tokens)
        restart, self._restart = self._restart, False
        found = self.monitor.observe_step(step, loss, grad_norm=grad_norm, step_time_s=elapsed, tokens=tokens,
                                          restart=restart)
        if rank_seconds is not None:
            found += self.monitor.observe_rank_times(step, rank_seconds)
        mfu = flops / (elapsed * self._peak * self.world) if flops else None
        self._busy, self._window_start, self._last_end = 0.0, None, now
        straggler = next((a.rank for a in found if a.kind == "straggler"), None)
        self.phase("idle", step)
        return {"step_time_s": elapsed, "tokens_per_s": tokens / elapsed, "mfu": mfu,
                "peak_flops_per_sec": self._peak, "rank_step_s": rank_seconds, "straggler": straggler,
                "anomalies": [a.as_dict() for a in found], "restart": restart}

    def mark_restart(self) -> None:
        """The session resumed from a checkpoint: the next committed step is recorded as a restart."""
        self._restart = True

    def on_skip(self, step: int | None = None, loss: float | None = None, grad_norm: float | None = None,
                ) -> list[Anomaly]:
        """A window ended without a commit (non-finite, audit skip, discard): restart its clock; a non-finite
        loss or gradient norm of step ``step`` is recorded (and returned) as an anomaly."""
        self._busy, self._window_start, self._last_end = 0.0, None, time.perf_counter()
        self.phase("idle")
        found = []
        if step is not None and loss is not None and not math.isfinite(loss):
            found.append(Anomaly(step, "nan_inf_loss", loss, None, None, step))
        if step is not None and grad_norm is not None and not math.isfinite(grad_norm):
            found.append(Anomaly(step, "nan_inf_grad", grad_norm, None, None, step))
        for a in found:
            self.monitor.record(a)
        return found

    def _step_flops(self, tokens: int) -> float:
        if self.options.flop_config is not None:
            return self.options.flop_config.flops_for_tokens(tokens)
        return 0.0 if self._flops is None else self._flops(self._seq) * tokens

    # ---- failures ----------------------------------------------------------------------------
    def _start_heartbeat(self) -> Heartbeat | None:
        global _sessions
        _sessions += 1
        base = dist.distributed_c10d._get_default_store()  # the process group's own store
        store = dist.PrefixStore(f"mixle_parallel/heartbeat/{_sessions}/", base)
        o = self.options
        beat = Heartbeat(store, rank=self.rank, world_size=self.world, on_failure=self._failed,
                         interval_s=o.heartbeat_interval_s, dead_after_s=o.dead_after_s, hung_after_s=o.hung_after_s)
        beat.start()
        return beat

    def _failed(self, anomaly: Anomaly) -> None:
        """The heartbeat found a dead or hung rank: record it, then exit, or leave it for the next call."""
        self.monitor.record(anomaly)
        message = f"mixle_parallel health: rank {self.rank} sees {anomaly.kind} rank {anomaly.rank}: {anomaly.detail}"
        log.error(message)
        if self.options.incident_dir:
            path = Path(self.options.incident_dir, f"incident-rank{self.rank}.json")
            path.write_text(json.dumps({"rank": self.rank, "anomaly": anomaly.as_dict()}))
        if self.on_fatal is not None:
            try:
                self.on_fatal(anomaly)
            except Exception:  # noqa: BLE001 - the ledger must not keep a failing rank alive
                log.exception("could not write the ledger's run_end")
        if self.options.on_failure == "exit":
            print(message + f"; exiting with code {HEALTH_EXIT_CODE} so the job can restart", file=sys.stderr,
                  flush=True)
            os._exit(HEALTH_EXIT_CODE)

    def check_failure(self) -> None:
        """Raise RankFailureError at a session call after the heartbeat found a failure (policy 'raise')."""
        beat = self.heartbeat
        if beat is not None and beat.failure is not None and self.options.on_failure == "raise":
            a = beat.failure
            raise RankFailureError(f"{a.kind}: {a.detail}; restart the job from the last checkpoint")

    def close(self) -> None:
        """Stop the heartbeat."""
        if self.heartbeat is not None:
            self.heartbeat.stop()
