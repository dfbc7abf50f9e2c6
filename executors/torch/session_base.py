"""What a torch_native session offers around its step: clocks, metrics, checkpoints, shutdown.

``TorchDistributedSession`` (``session.py``, the step itself) builds on this class; everything here
reads or resets the session's state between steps and never runs one.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ...contracts import ParallelAxis, ParallelPlan, TorchSessionState
from .checkpoint import load_session, save_session
from .gradient_mean import WindowCounts
from .health import SessionHealth
from .run_ledger import RunLedger
from .sdc_audit import SessionAudit, trainable

_log = logging.getLogger(__name__)


class PendingGradientsError(RuntimeError, ValueError):
    """A save or close while gradients of an unfinished accumulation window are pending: they are not state.

    A ``RuntimeError`` as in mixle 0.8.2 (its code catches that) and a ``ValueError`` as before here."""


def _pending_message(action: str, pending: int) -> str:
    return (f"cannot {action} mid-accumulation (pending_accumulation={pending}): finish gradient accumulation "
            "first -- call finish_accumulation() to commit the pending gradients or discard_accumulation() to "
            "drop them")


class SessionBase:
    """The clocks, metrics, checkpoints and shutdown of a session (its step is ``TorchDistributedSession``'s)."""

    module: nn.Module
    plan: ParallelPlan
    mesh: Any
    device: torch.device
    optimizer: torch.optim.Optimizer
    optimizer_receipt: dict[str, Any]
    _step: int
    _pending: int
    _closed: bool
    _owns_pg: bool
    _distributed: bool
    _params: list[nn.Parameter]
    _params_named: list[tuple[str, nn.Parameter]] | None
    _counts: WindowCounts
    _ledger: RunLedger
    _health: SessionHealth | None
    _audit: SessionAudit | None

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this TorchDistributedSession is closed; prepare a new one")

    def _drop_pending(self) -> None:
        """Pending gradients dropped with no collective (a failure is being handled: peers may be gone)."""
        if self._audit is not None:
            self._audit.abort_window()
        self.optimizer.zero_grad(set_to_none=True)
        self._pending = 0
        self._counts.reset()

    def _clear_gradients(self) -> None:  # pragma: no cover - the session defines it
        raise NotImplementedError

    @property
    def step(self) -> int:
        """Optimizer updates committed so far."""
        return self._step

    @property
    def pending_accumulation(self) -> int:
        """train_batch calls accumulated since the last commit."""
        return self._pending

    def state(self) -> TorchSessionState:
        """The session's non-tensor clocks, serializable as JSON."""
        return TorchSessionState(step=self._step, pending_accumulation=self._pending,
                                 optimizer_receipt=self.optimizer_receipt)

    def restore_state(self, state: TorchSessionState) -> None:
        """Resume the clocks from ``state`` (a checkpoint restores tensors; pending gradients are not saved)."""
        if state.pending_accumulation:
            raise ValueError(
                f"cannot resume mid-accumulation (pending_accumulation={state.pending_accumulation}); "
                "save checkpoints after a commit or call finish_accumulation()/discard_accumulation() first")
        self._step, self._pending = state.step, 0
        self._counts.reset()
        if self._audit is not None:
            self._audit.prime(self._step)

    def reduce_sums(self, *values: float) -> tuple[float, ...]:
        """Sum scalar metrics over the two-dimensional data-parallel domain (dp_replicate x dp_shard)."""
        self._check_open()
        if not self._distributed:
            return tuple(float(v) for v in values)
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.comm_device())
        names = self.mesh.mesh_dim_names or ()
        for axis in (ParallelAxis.DP_REPLICATE, ParallelAxis.DP_SHARD):
            if axis.value in names and self.mesh.size(names.index(axis.value)) > 1:
                dist.all_reduce(t, group=self.mesh.get_group(axis.value))
        return tuple(float(v) for v in t.cpu().tolist())

    def save_checkpoint(self, path: str, *, loader_state: Any = None, typed_scheduler_state: Any = None,
                        extra: Any = None, asynchronous: bool = False, provenance: bool = False,
                        data: Any = None) -> Any:
        """Save model, optimizer, scheduler, clocks, RNG and loader state as a new published generation.

        Collective (every rank calls it). Returns a handle whose ``wait()`` (collective) returns the
        published folder; see docs/checkpoints.md and ``checkpoint.save_session``. ``provenance=True`` (the
        run's final save, or any generation): rank 0 then writes ``gen-N.intoto.json`` beside the generation,
        signed, binding the run's ledger head and certificate (``checkpoint_provenance``); ``data`` identifies
        the training data in it (paths, an array, or a description). It needs a synchronous save and a ledger.
        """
        self._check_open()
        if self._pending:
            raise PendingGradientsError(_pending_message("save", self._pending))
        if provenance and asynchronous:
            raise ValueError("provenance=True needs a synchronous save (asynchronous=False); for an asynchronous one "
                             "call checkpoint_provenance.write_checkpoint_provenance(handle.wait(), ledger=...) "
                             "on rank 0")
        if data is not None and not provenance:
            raise ValueError("data= identifies the training data in a provenance statement; pass provenance=True")
        handle = save_session(path, self, loader_state=loader_state, typed_scheduler_state=typed_scheduler_state,
                              extra=extra, asynchronous=asynchronous)
        self._ledger.checkpoint(step=self._step, path=str(path),
                                extra={"event": "save", "asynchronous": bool(asynchronous)})
        if provenance:
            self._ledger.provenance(handle.path, data=data)
        return handle

    def load_checkpoint(self, path: str, *, allow_world_size_change: bool = False, trust: str = "signed",
                        allow_rollback: bool = False) -> dict[str, Any]:
        """Restore model, optimizer, scheduler, RNG and the step clock from the generation ``path`` publishes.

        Collective. A checkpoint saved at another world size is refused unless
        ``allow_world_size_change=True`` (then DCP reshards and rank-local state is re-derived by
        the rule in docs/checkpoints.md). The manifest must be signed by a trusted key (``trust=
        "unsigned"`` skips that) and ``LATEST`` must not be rolled back (``allow_rollback=True``).
        Returns loader_state, typed_scheduler_state, extra, saved_world_size and the rest of
        ``checkpoint.load_checkpoint``'s dict; the next committed receipt says the run restarted here.
        """
        self._check_open()
        loaded = load_session(path, self, allow_world_size_change=allow_world_size_change, trust=trust,
                              allow_rollback=allow_rollback)
        self._clear_gradients()
        if self._health is not None:
            self._health.mark_restart()
        self._ledger.checkpoint(step=self._step, path=str(path), extra={"event": "load"})
        return loaded

    @property
    def owns_process_group(self) -> bool:
        """True when ``prepare`` created the default process group (from the torchrun environment)."""
        return self._owns_pg

    def close(self) -> None:
        """Release the session (health thread, the ledger's run_end). The process group stays, as in mixle 0.8.2:
        the script may destroy it; one ``prepare`` created is destroyed at interpreter exit otherwise.

        Refused while gradients are pending (:class:`PendingGradientsError`, as mixle 0.8.2): commit them with
        ``finish_accumulation()`` or drop them with ``discard_accumulation()`` first. Called while an exception
        is being handled (a ``finally`` after a failed step), it drops them instead, with a logged warning:
        cleanup never raises over the error that caused it."""
        if self._closed:
            return
        if self._pending:
            failure = sys.exc_info()[1]
            if failure is None:
                raise PendingGradientsError(_pending_message("close", self._pending))
            _log.warning("closing the session while handling %s: its %d pending micro-step(s) of gradients are "
                         "dropped", type(failure).__name__, self._pending)
            self._drop_pending()
        self._closed = True
        if self._health is not None:
            self._health.close()
        audit = self._audit
        self._ledger.end(steps=self._step, extra={
            "audited_steps": audit.audited_steps if audit else 0,
            "audit_mismatches": sum(not r.matched for r in audit.records) if audit else 0})

    def trainable(self) -> list[nn.Parameter]:
        """The parameters the optimizer updates."""
        return self._params

    def named_trainable(self) -> list[tuple[str, nn.Parameter]]:
        """(pre-wrap name, parameter) of every trainable parameter."""
        if self._params_named is None:
            self._params_named = trainable(self.module)
        return self._params_named

    @property
    def audit_records(self) -> tuple[Any, ...]:
        """Every SDCAuditRecord of this session's audited steps (all ranks' findings, on every rank)."""
        return tuple(self._audit.records) if self._audit is not None else ()

    def comm_device(self) -> torch.device:
        """Where small control tensors for collectives live (the device on CUDA, else the CPU)."""
        return self.device if self.device.type == "cuda" else torch.device("cpu")
