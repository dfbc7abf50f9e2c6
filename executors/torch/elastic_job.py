"""mixle's ``ElasticTrainingJob``: in-process data parallelism that survives a rank that dies or hangs mid-step.

The driver holds the canonical model and optimizer. Each step every live ``SimulatedRank`` runs
forward and backward on a replica of the canonical weights and stops at the gradient rendezvous;
the driver waits for them (at most ``step_timeout_s``), drops the ranks that failed, hung or were
killed, and applies the example-weighted mean of the survivors' gradients: the exact global-mean
gradient over the rows that were trained. A step is committed whole or not at all, and only the
ranks whose batch was committed advance their loader position, so a respawned rank resumes at the
first batch not yet trained on: no batch is skipped and none is trained twice. This is a thread
simulation of the protocol; the real elastic job (torchrun restarts, DCP resharding) is in
docs/training.md.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from ...verification.health import TrainingHealthMonitor
from .checkpoint import save_checkpoint
from .fault_tolerant import (
    AsyncCheckpointHandle,
    LoaderState,
    _loader_doc,
    load_checkpoint_extra,
)
from .simulated_rank import (
    LocalLoss,
    SimulatedRank,
    StepResult,
    check_index,
    check_positive_seconds,
)

BatchForRank = Callable[[int, LoaderState], tuple[Any, Any]]


def weighted_mean_grads(results: list[StepResult]) -> list[torch.Tensor]:
    """The example-weighted mean of the ranks' gradients, summed in rank order (the global-mean gradient)."""
    ordered = sorted(results, key=lambda r: r.rank)
    total = sum(r.examples for r in ordered)
    return [torch.stack([r.grads[i] * (r.examples / total) for r in ordered]).sum(0)
            for i in range(len(ordered[0].grads))]


def _check_kill_set(kill_ranks: Iterable[Any], world_size: int, dead: set[int]) -> set[int]:
    kills = set(kill_ranks)
    if any(isinstance(r, bool) or not isinstance(r, int) for r in kills):
        raise TypeError(f"kill_ranks must hold int rank ids, got {sorted(map(repr, kills))}")
    outside = sorted(r for r in kills if not 0 <= r < world_size)
    if outside:
        raise ValueError(f"kill_ranks {outside} are outside the world of {world_size} ranks")
    already = sorted(kills & dead)
    if already:
        raise ValueError(f"kill_ranks {already} are already dead; respawn_rank() them first")
    return kills


class ElasticTrainingJob:
    """A data-parallel loop over ``world_size`` simulated ranks that degrades to the survivors when one dies.

    ``batch_fn_for_rank(rank, loader_state)`` gives a rank its batch at its position; checkpoints are
    our verified generations (``checkpoint()``), and ``respawn_rank`` brings a dead rank back. Drive it
    from the thread that built it (the methods share state without locks; another thread is refused).
    """

    def __init__(self, model_factory: Callable[[], Any], world_size: int, batch_fn_for_rank: BatchForRank,
                 checkpoint_dir: str, *, seed: int = 0, lr: float = 1e-2, step_timeout_s: float = 5.0,
                 health_monitor: TrainingHealthMonitor | None = None, loss_fn: LocalLoss | None = None) -> None:
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
        seed = check_index(seed, "seed")
        for name, fn in (("model_factory", model_factory), ("batch_fn_for_rank", batch_fn_for_rank)):
            if not callable(fn):
                raise TypeError(f"{name} must be callable, got {type(fn).__name__}")
        if health_monitor is not None and not isinstance(health_monitor, TrainingHealthMonitor):
            raise TypeError(f"health_monitor must be a TrainingHealthMonitor, got {type(health_monitor).__name__}")
        self.model_factory, self.world_size, self.batch_fn_for_rank = model_factory, world_size, batch_fn_for_rank
        self.checkpoint_dir = str(checkpoint_dir)
        self.step_timeout_s = check_positive_seconds(step_timeout_s, "step_timeout_s")
        self.loss_fn = loss_fn
        self.canonical_model = model_factory()
        if not isinstance(self.canonical_model, nn.Module):
            raise TypeError(f"model_factory must return a torch.nn.Module, got {type(self.canonical_model).__name__}")
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
            raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
        self.canonical_optimizer = torch.optim.SGD(self.canonical_model.parameters(), lr=float(lr))
        self.health = health_monitor or TrainingHealthMonitor(loss_window=10, loss_min_periods=3, loss_z_thresh=6.0)
        self.loader_states: dict[int, LoaderState] = {
            r: LoaderState(seed=seed, epoch=0, rank=r, world_size=world_size) for r in range(world_size)}
        self.ranks: dict[int, SimulatedRank] = {}
        for r in range(world_size):
            self._spawn_rank(r)
        self.dead_ranks: set[int] = set()
        self.pending_restart = False
        self.last_checkpoint_handle: AsyncCheckpointHandle | None = None
        self.history: list[dict[str, Any]] = []
        self._owner_thread_id = threading.get_ident()

    def _spawn_rank(self, rank_id: int) -> None:
        def batch() -> tuple[Any, Any]:
            return self.batch_fn_for_rank(rank_id, self.loader_states[rank_id])

        self.ranks[rank_id] = SimulatedRank(rank_id, self.model_factory, batch, loss_fn=self.loss_fn,
                                            hold_timeout_s=max(60.0, 2 * self.step_timeout_s))

    def _check_single_driver(self, method: str) -> None:
        if threading.get_ident() != self._owner_thread_id:
            raise RuntimeError(f"ElasticTrainingJob.{method}() called from thread {threading.current_thread().name!r}, "
                               "another thread than the one that built the job; run_step/checkpoint/respawn_rank "
                               "share state without locks, so drive them all from that one thread (checkpoint "
                               "between steps)")

    @property
    def last_step(self) -> int | None:
        """The last committed step (None before the first)."""
        return self.history[-1]["step"] if self.history else None

    # ---- one step ------------------------------------------------------------------------------
    def run_step(self, step: int, kill_ranks: Iterable[int] = frozenset()) -> dict[str, Any]:
        """Run and commit step ``step`` over the live ranks; ``kill_ranks`` die at the rendezvous (after their
        backward, before the update) and are left out, as are ranks that fail or miss ``step_timeout_s``.

        Returns the step's record (also appended to ``history``). When no rank survives nothing is committed
        and RuntimeError says so: respawn ranks and run the same step again.
        """
        self._check_single_driver("run_step")
        step = check_index(step, "step")
        if self.last_step is not None and step <= self.last_step:
            raise ValueError(f"step {step} must be greater than the last committed step {self.last_step}")
        kills = _check_kill_set(kill_ranks, self.world_size, self.dead_ranks)
        live = sorted(r for r in self.ranks if r not in self.dead_ranks)
        if not live:
            raise RuntimeError("every rank is dead; respawn_rank() at least one before the next step")
        results, failures, gone = self._gather(step, live, kills)
        self.dead_ranks |= gone
        if not results:
            raise RuntimeError(f"step {step} not committed: every live rank died ({failures or 'killed'}); "
                               "parameters and loader positions are unchanged, respawn ranks and rerun it")
        return self._commit(step, results, failures, gone)

    def _gather(self, step: int, live: list[int], kills: set[int],
                ) -> tuple[list[StepResult], dict[int, str], set[int]]:
        """Start the step on ``live``, release survivors at the rendezvous, collect their results."""
        canonical = {k: v.detach().clone() for k, v in self.canonical_model.state_dict().items()}
        arrived: queue.SimpleQueue[int] = queue.SimpleQueue()
        deadline = time.monotonic() + self.step_timeout_s
        for r in live:
            self.ranks[r].start_step(step, canonical, on_started=arrived.put)
        failures: dict[int, str] = {}
        released: list[int] = []
        waiting = set(live)
        while waiting:
            try:
                r = arrived.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            waiting.discard(r)
            if self.ranks[r].error is not None:
                failures[r] = f"failed before the rendezvous: {self.ranks[r].error!r}"
            elif r in kills:
                self.ranks[r].cancel()
            else:
                self.ranks[r].release()
                released.append(r)
        for r in waiting:  # hung: never reached the rendezvous in time
            self.ranks[r].cancel()
            failures[r] = f"did not reach the gradient rendezvous within step_timeout_s={self.step_timeout_s} s"
        results = []
        for r in released:
            try:
                result = self.ranks[r].join(max(0.0, deadline - time.monotonic()) + 1.0)
            except (RuntimeError, TimeoutError) as err:
                self.ranks[r].cancel()
                failures[r] = str(err)
                continue
            if result is None:
                failures[r] = "was released but produced no result"
            else:
                results.append(result)
        gone = set(live) - {res.rank for res in results}
        return results, failures, gone

    def _commit(self, step: int, results: list[StepResult], failures: dict[int, str], gone: set[int],
                ) -> dict[str, Any]:
        grads = weighted_mean_grads(results)
        self.canonical_optimizer.zero_grad(set_to_none=True)
        for p, g in zip(self.canonical_model.parameters(), grads):
            p.grad = g.to(p.dtype).clone()
        self.canonical_optimizer.step()
        self.canonical_optimizer.zero_grad(set_to_none=True)
        examples = sum(r.examples for r in results)
        loss = sum(r.loss * r.examples for r in results) / examples
        norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))
        for res in results:  # only a committed batch moves its rank's position
            self.loader_states[res.rank] = self.loader_states[res.rank].advanced()
        restart, self.pending_restart = self.pending_restart, False
        anomalies = self.health.observe_step(step, loss, grad_norm=norm, restart=restart, batch_size=examples)
        record = {
            "step": step, "loss": loss, "grad_norm": norm, "examples": examples,
            "survivors": sorted(r.rank for r in results), "newly_dead": sorted(gone),
            "rank_failures": dict(sorted(failures.items())), "restart": restart,
            "rank_grad_norms": {r.rank: r.grad_norm for r in sorted(results, key=lambda r: r.rank)},
            "anomalies": [a.kind for a in anomalies],
        }
        self.history.append(record)
        return record

    # ---- checkpoints and respawns --------------------------------------------------------------
    def checkpoint(self, path: str | None = None) -> AsyncCheckpointHandle:
        """Snapshot the canonical model, optimizer, every rank's loader position and the step clock (updates
        committed; ``extra["last_step"]`` the last step's label) in the background, as a verified generation
        under ``path`` (default ``checkpoint_dir``)."""
        self._check_single_driver("checkpoint")
        target = path or self.checkpoint_dir
        if self.last_checkpoint_handle is not None and not self.last_checkpoint_handle.done:
            self.last_checkpoint_handle.wait()  # one write in flight at a time
        start = time.perf_counter()
        extra = {"loader_states": {str(r): s.to_dict() for r, s in sorted(self.loader_states.items())},
                 "last_step": self.last_step, "world_size": self.world_size}
        handle = save_checkpoint(target, model=self.canonical_model, optimizer=self.canonical_optimizer,
                                 session_state={"step": len(self.history)},  # updates committed, as a session's
                                 loader_state=_loader_doc(self.loader_states[0]), extra={"user": extra},
                                 asynchronous=True)
        self.last_checkpoint_handle = AsyncCheckpointHandle(handle, target, time.perf_counter() - start)
        return self.last_checkpoint_handle

    def respawn_rank(self, rank_id: int, checkpoint_path: str | None = None, *, trust: str = "signed") -> LoaderState:
        """Bring ``rank_id`` back (a live one is replaced, as mixle does); it joins the current canonical
        weights at its first uncommitted batch.

        The checkpoint (default ``checkpoint_dir``; a write in flight there is waited for) must hold this
        rank's position, at or behind the committed one; the rank resumes at the committed position, so
        batches committed since the checkpoint are not trained twice. The next step is marked a restart.
        The checkpoint is verified as every load is (signature, lineage, high-water mark): an unsigned or
        rolled-back one is refused unless ``trust="unsigned"``.
        """
        self._check_single_driver("respawn_rank")
        rank_id = check_index(rank_id, "rank_id")
        if rank_id >= self.world_size:
            raise ValueError(f"rank_id {rank_id} is outside the world of {self.world_size} ranks")
        path = checkpoint_path or self.checkpoint_dir
        handle = self.last_checkpoint_handle
        if handle is not None and handle.path == path:
            handle.wait()
        saved = self._saved_position(rank_id, path, trust)
        committed = self.loader_states[rank_id]
        if (saved.seed, saved.epoch, saved.world_size) != (committed.seed, committed.epoch, committed.world_size) \
                or saved.batch_idx > committed.batch_idx:
            raise RuntimeError(f"the checkpoint at {path} holds rank {rank_id} at {saved}, which is not a past "
                               f"position of this job's rank (committed: {committed}); pass this job's checkpoint")
        live = self.ranks.get(rank_id) if rank_id not in self.dead_ranks else None
        if live is not None:  # between steps a live rank is idle: stop its thread before replacing it
            live.cancel()
            live.wait_finished(self.step_timeout_s)
        self.dead_ranks.discard(rank_id)
        self._spawn_rank(rank_id)
        self.pending_restart = True
        return committed

    def _saved_position(self, rank_id: int, path: str, trust: str) -> LoaderState:
        states = load_checkpoint_extra(path, trust=trust).get("loader_states")
        if not isinstance(states, dict):
            raise RuntimeError(f"the checkpoint at {path} holds no per-rank loader states; it was not written by "
                               "ElasticTrainingJob.checkpoint()")
        saved = states.get(str(rank_id), states.get(rank_id))
        if saved is None:
            raise RuntimeError(f"the checkpoint at {path} holds no loader state for rank {rank_id}")
        state = LoaderState.from_dict(saved)
        if state.rank != rank_id:
            raise RuntimeError(f"the checkpoint at {path} stores rank {state.rank}'s state under rank {rank_id}")
        return state

    def continuity_ok(self) -> bool:
        """True unless a step after a respawn was flagged as a loss discontinuity."""
        return self.health.continuity_ok()

    def close(self, timeout: float = 5.0) -> None:
        """Cancel every rank's step in flight and wait (bounded) for their threads to finish."""
        for rank in self.ranks.values():
            rank.cancel()
        deadline = time.monotonic() + timeout
        for rank in self.ranks.values():
            rank.wait_finished(max(0.0, deadline - time.monotonic()))


__all__ = ["ElasticTrainingJob", "weighted_mean_grads"]
