"""TorchDistributedSession: micro-steps, the accumulation clock, exact global-mean commits, receipts."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from torch import nn

from ...contracts import (
    SCHEMA_VERSION,
    BackendCapabilities,
    ParallelAxis,
    ParallelPlan,
    ParameterLayout,
    SDCAuditRecord,
    StepReceipt,
    TorchSessionState,
    from_dict,
    to_dict,
)
from ...verification.sdc.schedule import SDCDetectedError
from .checkpoint import load_checkpoint, save_checkpoint
from .comm_meter import CollectiveMeter
from .comm_taps import CommTap
from .dp_mode import DataParallelMode
from .grads import local_grads, scale_grads, weighted_square_sum
from .health import SessionHealth
from .sdc_audit import SessionAudit, trainable
from .window_counts import WindowCounts

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

LossFn = Callable[[nn.Module, Any, Any], tuple[torch.Tensor, Any]]

COUNTS_BEFORE_BACKWARD_DEVICES = frozenset({"cpu"})
"""Device types on which a DDP session all-reduces the window's counts before the commit's backward."""


def _already_mean() -> float:
    """The hook's factor when the backward already produced the global mean."""
    return 1.0


_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
"""Mixed precisions: fp32 master weights and gradients, the forward under ``torch.autocast`` at this dtype."""


class TorchDistributedSession:
    """A transformed module plus its optimizer, the accumulation clock and explicit mesh semantics.

    The committed gradient is the exact global mean: every micro-step back-propagates its loss
    *sum* times the gradient-averaging group size (so DDP's/FSDP2's averaging cancels), and the
    commit divides by the global count taken from one small all-reduce. Under DDP that count is
    all-reduced before the commit's backward, which then yields the mean itself (docs/training.md).
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        plan: ParallelPlan,
        capabilities: BackendCapabilities,
        mesh: Any,
        device: torch.device,
        optimizer: torch.optim.Optimizer,
        optimizer_receipt: dict[str, Any],
        parameter_layouts: tuple[ParameterLayout, ...],
        precision: str,
        max_grad_norm: float | None,
        scheduler: Any = None,
        loss_fn: LossFn,
        dp_mode: DataParallelMode = DataParallelMode.NONE,
        cp_mesh: Any = None,
        nonfinite: str = "raise",
        admission: Any = None,
        owns_process_group: bool = False,
        tap: CommTap | None = None,
        audit: dict[str, Any] | None = None,
        ledger: Any = None,
        health: SessionHealth | None = None,
    ) -> None:
        if nonfinite not in ("raise", "skip"):
            raise ValueError(f"nonfinite must be 'raise' or 'skip', got {nonfinite!r}")
        self.module, self.plan, self.capabilities, self.mesh = module, plan, capabilities, mesh
        self.device, self.optimizer, self.scheduler = device, optimizer, scheduler
        self.optimizer_receipt = dict(optimizer_receipt)
        self.parameter_layouts = parameter_layouts
        self.precision, self.max_grad_norm, self.loss_fn = precision, max_grad_norm, loss_fn
        self.dp_mode, self.cp_mesh, self.nonfinite = dp_mode, cp_mesh, nonfinite
        self.admission = admission
        self._admission_extra = (admission.receipt_extra() if hasattr(admission, "receipt_extra")
                                 else {"admission": admission})
        self._owns_pg = owns_process_group
        self._distributed = plan.world_size > 1
        self._world = plan.world_size
        # DDP / FSDP2 / HSDP average gradients over every data axis (dp_replicate, dp_shard, cp)
        self._grad_scale = float(plan.dp_replicate * plan.dp_shard * plan.cp)
        self._params = [p for p in module.parameters() if p.requires_grad]
        # DDP / FSDP2 are counted by cheap taps at their comm layer; TP / CP by the dispatch-mode meter
        self._tap = tap if tap is not None else CommTap(counting=False, rank=0)
        self._meter = self._tap if self._tap.counting else CollectiveMeter()
        self._dispatch_meter = not self._tap.counting
        # DDP behind the counting hook: the window's counts are all-reduced between the commit micro-step's
        # forward and its backward, so the reduced gradient comes out as the global mean with no pass of
        # our own: a one-micro-step window back-propagates loss_sum / global tokens (fp16 excepted: such
        # small gradients would lose bits) and its buckets are all-reduced as they are; a longer window's
        # accumulated buckets are multiplied by 1 / global tokens in the hook
        # (CPU only: on CUDA reading the count before the backward would stall the host on the forward;
        # there the counts ride the commit's all-reduce after the backward is queued)
        self._reduce_in_backward = (self._distributed and dp_mode.uses_ddp and self._tap.counting
                                    and device.type in COUNTS_BEFORE_BACKWARD_DEVICES)
        self._prescale_ok = self._reduce_in_backward and precision != "fp16" and plan.microbatches == 1
        self._backward_scale = 1.0 if self._reduce_in_backward else self._grad_scale
        self._params_named: list[tuple[str, nn.Parameter]] | None = None
        self.ledger = ledger
        self._sync_enabled: bool | None = None
        self._step = 0
        self._pending = 0
        self._last_micro: tuple[Any, Any] | None = None
        self._closed = False
        self._counts = WindowCounts(tp=plan.tp, cp=plan.cp, tap=self._tap, comm_device=self._comm_device())
        self._health = health
        if health is not None:
            health.on_fatal = self._log_fatal  # the health monitor reports; this session writes the ledger
        self._forward_s = 0.0
        self._audit = None
        if audit:
            self._audit = SessionAudit(self, self._tap, **audit)

    # ---- public API ------------------------------------------------------------------------
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
        return TorchSessionState(
            step=self._step, pending_accumulation=self._pending, optimizer_receipt=self.optimizer_receipt
        )

    def restore_state(self, state: TorchSessionState) -> None:
        """Resume the clocks from ``state`` (a checkpoint restores tensors; pending gradients are not saved)."""
        if state.pending_accumulation:
            raise ValueError(
                f"cannot resume mid-accumulation (pending_accumulation={state.pending_accumulation}); "
                "save checkpoints after a commit or call finish_accumulation()/discard_accumulation() first"
            )
        self._step = state.step
        self._pending = 0
        self._counts.reset()
        if self._audit is not None:
            self._audit.prime(self._step)

    def train_batch(self, inputs: Any, targets: Any) -> StepReceipt:
        """Accumulate one local batch (split into ``plan.microbatches``) and commit when the clock fires."""
        self._check_open()
        if self._health is not None:
            self._health.begin_call(inputs)
        micro = self._split(inputs, targets)
        commit = self._pending + 1 == self.plan.gradient_accumulation_steps
        self._meter.reset()
        if self._pending == 0 and self._audit is not None:
            self._audit.begin_window(self._step)
        with self._metering():
            for i, (x, y) in enumerate(micro):
                self._micro_step(x, y, sync=commit and i == len(micro) - 1, weight=1.0)
            self._pending += 1
            if commit:
                return self._commit()
        return self._skipped_receipt(reason="accumulating")

    def finish_accumulation(self) -> StepReceipt | None:
        """Commit what is pending now, before the clock fires (e.g. at the end of an epoch).

        The synchronizing backward DDP/FSDP2 need is a re-run of the last micro-batch with weight 0:
        it adds exact zeros and lets them reduce the accumulated gradients. None when nothing is pending.
        """
        self._check_open()
        if self._pending == 0:
            return None
        self._meter.reset()
        with self._metering():
            self._flush_unsynced()
            return self._commit()

    def discard_accumulation(self) -> StepReceipt | None:
        """Drop pending gradients without touching parameters or optimizer state; None when nothing is pending."""
        self._check_open()
        if self._pending == 0:
            return None
        self._meter.reset()
        with self._metering():
            if self.dp_mode.uses_fsdp:
                self._flush_unsynced()  # FSDP2 keeps unsynced grads inside; reduce them so zero_grad clears them
        if self._audit is not None:
            self._audit.abort_window()
        if self._health is not None:
            self._health.on_skip()
        receipt = self._skipped_receipt(reason="discarded", window=True)
        self._clear_gradients()
        return receipt

    def reduce_sums(self, *values: float) -> tuple[float, ...]:
        """Sum scalar metrics over the two-dimensional data-parallel domain (dp_replicate x dp_shard)."""
        self._check_open()
        if not self._distributed:
            return tuple(float(v) for v in values)
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self._comm_device())
        for axis in (ParallelAxis.DP_REPLICATE, ParallelAxis.DP_SHARD):
            names = self.mesh.mesh_dim_names or ()
            if axis.value in names and self.mesh.size(names.index(axis.value)) > 1:
                dist.all_reduce(t, group=self.mesh.get_group(axis.value))
        return tuple(float(v) for v in t.cpu().tolist())

    def save_checkpoint(
        self,
        path: str,
        *,
        loader_state: Any = None,
        typed_scheduler_state: Any = None,
        extra: Any = None,
        asynchronous: bool = False,
    ) -> Any:
        """Save model, optimizer, scheduler, clocks, RNG and loader state as a new published generation.

        Collective (every rank calls it). Returns a handle whose ``wait()`` (collective) returns the
        published folder; see docs/checkpoints.md and ``executors.torch.checkpoint``.
        """
        self._check_open()
        if self._pending:
            raise ValueError(
                f"cannot save mid-accumulation (pending_accumulation={self._pending}): pending gradients are "
                "not checkpointed; save after a commit or call finish_accumulation()/discard_accumulation() first"
            )
        handle = save_checkpoint(
            path, model=self.module, optimizer=self.optimizer, scheduler=self.scheduler,
            session_state=to_dict(self.state())["data"], loader_state=loader_state,
            typed_scheduler_state=typed_scheduler_state, extra=extra, asynchronous=asynchronous,
        )
        if self.ledger is not None:
            self.ledger.checkpoint(step=self._step, path=str(path),
                                   extra={"event": "save", "asynchronous": bool(asynchronous)})
        return handle

    def load_checkpoint(self, path: str, *, allow_world_size_change: bool = False, trust: str = "signed",
                        allow_rollback: bool = False) -> dict[str, Any]:
        """Restore model, optimizer, scheduler, RNG and the step clock from the generation ``path`` publishes.

        Collective. A checkpoint saved at another world size is refused unless
        ``allow_world_size_change=True`` (then DCP reshards and rank-local state is re-derived by
        the rule in docs/checkpoints.md). The manifest must be signed by a trusted key (``trust=
        "unsigned"`` skips that) and ``LATEST`` must not be rolled back (``allow_rollback=True``).
        Returns loader_state, typed_scheduler_state, extra,
        saved_world_size and the rest of ``executors.torch.checkpoint.load_checkpoint``'s dict.
        """
        self._check_open()
        loaded = load_checkpoint(
            path, model=self.module, optimizer=self.optimizer, scheduler=self.scheduler,
            allow_world_size_change=allow_world_size_change, trust=trust, allow_rollback=allow_rollback,
        )
        self.restore_state(from_dict(
            {"kind": "TorchSessionState", "version": SCHEMA_VERSION, "data": loaded["session_state"]},
            TorchSessionState,
        ))
        self._clear_gradients()
        if self._health is not None:
            self._health.mark_restart()  # the next receipt says the clock resumed here
        if self.ledger is not None:
            self.ledger.checkpoint(step=self._step, path=str(path), extra={"event": "load"})
        return loaded

    @property
    def owns_process_group(self) -> bool:
        """True when ``prepare`` created the default process group (from the torchrun environment)."""
        return self._owns_pg

    def close(self) -> None:
        """Release the session (health thread, ledger). The process group stays, as in mixle 0.8.2: the script
        may destroy it; one ``prepare`` created is destroyed at interpreter exit otherwise."""
        if self._closed:
            return
        self._closed = True
        if self._health is not None:
            self._health.close()
        if self.ledger is not None:
            audit = self._audit
            self.ledger.run_end(status="ok", steps=self._step, extra={
                "audited_steps": audit.audited_steps if audit else 0,
                "audit_mismatches": sum(not r.matched for r in audit.records) if audit else 0})

    # ---- micro-steps ----------------------------------------------------------------------
    def _micro_step(self, x: Any, y: Any, *, sync: bool, weight: float) -> None:
        self._last_micro = (x, y)

        def count(loss_sum: torch.Tensor, counted: Any) -> float:  # after the forward, before the backward
            if self._health is not None:
                self._health.add_forward(self._forward_s)
            if weight:
                self._counts.add(loss_sum, counted, self._rows(x))
            factor = 1.0
            if sync and self._reduce_in_backward:
                self._counts.start_reduce(self._rank_slots())
                if self._prescale_ok and self._pending == 0 and weight == 1.0:  # the window's only micro-step
                    factor = self._counts.mean_coef()  # the backward makes the mean; the hook leaves it alone
                    self._tap.bucket_coef = _already_mean
                else:  # the hook scales the accumulated buckets
                    self._tap.bucket_coef = self._counts.mean_coef
            if self._audit is not None:  # a replay back-propagates with the same weight
                self._audit.note(x, y, sync, weight * factor)
            return factor

        self.run_micro(x, y, sync=sync, weight=weight, after_forward=count)

    def run_micro(self, x: Any, y: Any, *, sync: bool, weight: float,
                  after_forward: Callable[[torch.Tensor, Any], float] | None = None) -> tuple[torch.Tensor, Any]:
        """One forward/backward of a micro-batch (no clock, no counters): what a step and an audit replay run.

        ``after_forward(loss_sum, count)`` runs between the forward and the backward (the step's counters);
        the backward's weight is multiplied by what it returns.
        """
        self._tap.syncing = sync
        with self._sync_context(sync), self._cp_context(x, y) as (x, y):
            if self._health is not None:
                self._health.phase("forward")
                start = time.perf_counter()
                with self._autocast():
                    loss_sum, count = self.loss_fn(self.module, x, y)
                self._forward_s = time.perf_counter() - start
                self._health.phase("backward")
            else:
                with self._autocast():
                    loss_sum, count = self.loss_fn(self.module, x, y)
            if after_forward is not None:
                weight = weight * after_forward(loss_sum, count)
            (loss_sum * (self._backward_scale * weight)).backward()
        return loss_sum, count

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

    def _flush_unsynced(self) -> None:
        if self._last_micro is None:  # pragma: no cover - pending > 0 implies a micro-step ran
            raise RuntimeError("no micro-batch to synchronize with")
        x, y = self._last_micro
        self._micro_step(x, y, sync=True, weight=0.0)

    def _sync_context(self, sync: bool) -> Any:
        # the module is the DistributedDataParallel wrapper under DDP, an FSDPModule under FSDP/HSDP
        if self.dp_mode.uses_ddp:
            return contextlib.nullcontext() if sync else cast("DistributedDataParallel", self.module).no_sync()
        if self.dp_mode.uses_fsdp and self._sync_enabled is not sync:
            cast("FSDPModule", self.module).set_requires_gradient_sync(sync)
            self._sync_enabled = sync
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def _cp_context(self, x: Any, y: Any) -> Any:
        if self.cp_mesh is None:
            yield x, y
            return
        from torch.distributed.tensor.experimental import context_parallel
        from torch.nn.attention import SDPBackend, sdpa_kernel

        x, y = x.clone(), y.clone()  # context_parallel shards its buffers in place
        backends = [SDPBackend.MATH] if self.device.type == "cpu" else [
            SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
        with sdpa_kernel(backends), context_parallel(
            self.cp_mesh, buffers=[x, y], buffer_seq_dims=[1, 1], no_restore_buffers={x, y}
        ):
            yield x, y

    def _autocast(self) -> Any:
        dtype = _AUTOCAST_DTYPES.get(self.precision)
        if dtype is not None:  # fp32 master weights and gradients, the forward under autocast
            return torch.autocast(device_type=self.device.type, dtype=dtype)
        return contextlib.nullcontext()

    def _metering(self) -> Any:
        return self._meter if self._distributed and self._dispatch_meter else contextlib.nullcontext()

    # ---- commit ---------------------------------------------------------------------------
    def _commit(self) -> StepReceipt:
        audit_extra: dict[str, Any] = {}
        if self._audit is not None:
            audited = self._audit.is_audited(self._step)
            try:
                records, skip = self._audit.check(self._step)
            except SDCDetectedError as exc:
                self._log_audit_records(exc.records)  # raise policy: the records still reach the ledger
                self._clear_gradients()  # nothing committed, clocks unchanged
                raise
            except Exception:
                self._clear_gradients()  # a failed replay: nothing committed, clocks unchanged
                raise
            self._log_audit_records(records)
            audit_extra = {"audited": audited}
            if records:
                audit_extra["sdc_audit"] = [to_dict(r)["data"] for r in records]
            if skip:
                tokens = float(self._counts.tokens)
                if self._health is not None:
                    self._health.on_skip()
                receipt = self._receipt(skipped=True, loss=float(self._counts.loss) / tokens if tokens else math.nan,
                                        window=True, extra={"reason": "sdc_audit", **audit_extra})
                self._clear_gradients()
                return receipt
        if self._health is not None and self._distributed:
            self._health.phase("commit")
        if self._counts.reducing:
            # DDP: the counts were all-reduced during the backward and the reduced gradients, identical on
            # every rank, are already the global mean: the local norm is the global norm
            values = self._finish_counts()
            square = float(weighted_square_sum(local_grads(self._params), 1))
            grads_are_means = True
        else:
            # one all-reduce over the world of the counts and the gradients' squared norm
            square_t = weighted_square_sum(local_grads(self._params), self._world)
            stats = torch.cat([self._counts.stats(self._rank_slots()), square_t[None]])
            if self._distributed:
                stats = stats.to(self._comm_device())
                dist.all_reduce(stats)
                self._tap.add("all_reduce", stats.numel() * stats.element_size())
            values = stats.cpu().tolist()
            square = values.pop()
            grads_are_means = False
        loss_sum, examples, tokens, nonfinite = (float(v) for v in values[:4])
        rank_seconds = [float(v) for v in values[4:]] if len(values) > 4 else None
        examples_i, tokens_i = int(round(examples)), int(round(tokens))
        if tokens <= 0:
            return self._reject("no_counted_targets", examples_i, tokens_i, math.nan, math.nan)
        loss = loss_sum / tokens
        coef = 1.0 if grads_are_means else 1.0 / tokens
        norm = math.sqrt(square) * coef if square >= 0 else math.nan
        if nonfinite or not (math.isfinite(norm) and math.isfinite(loss)):
            return self._reject("nonfinite", examples_i, tokens_i, loss, norm)
        clipped = False
        if self.max_grad_norm is not None and norm > self.max_grad_norm:
            clipped = True
            coef *= self.max_grad_norm / (norm + 1e-6)
        if coef != 1.0:
            scale_grads(self._params, coef)
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self._step += 1
        if self._audit is not None:
            self._audit.prime(self._step)
        extra: dict[str, Any] = {"grad_norm": norm, "clipped": bool(clipped), **audit_extra}
        if self._health is not None:
            extra["health"] = self._health.on_commit(self._step, loss=loss, grad_norm=norm, tokens=tokens_i,
                                                     rank_seconds=rank_seconds)
        receipt = self._receipt(skipped=False, loss=loss, window=True, examples=examples_i, tokens=tokens_i,
                                extra=extra)
        self._clear_gradients()
        return receipt

    def _finish_counts(self) -> list[float]:
        """The window's global counts (DDP, counts reduced before the backward); the hook's scaling ends here."""
        self._tap.bucket_coef = None
        return self._counts.finish_reduce()

    def _rank_slots(self) -> torch.Tensor | None:
        """Health's per-rank step times, which ride the counts' all-reduce (None without health or peers)."""
        return self._health.rank_slots() if self._health is not None and self._distributed else None

    def _reject(self, reason: str, examples: int, tokens: int, loss: float, norm: float) -> StepReceipt:
        extra: dict[str, Any] = {"reason": reason, "grad_norm": norm if math.isfinite(norm) else None}
        if self._health is not None:
            extra["health"] = {"anomalies": [a.as_dict() for a in self._health.on_skip(self._step + 1, loss, norm)]}
        receipt = self._receipt(skipped=True, loss=loss, window=True, examples=examples, tokens=tokens,
                                extra=extra)
        self._clear_gradients()
        if self.nonfinite == "raise" or reason != "nonfinite":
            raise FloatingPointError(
                f"step {self._step + 1} not committed ({reason}): global loss {loss}, gradient norm {norm}. "
                "Pending gradients were discarded and parameters, optimizer state and clocks are unchanged; "
                "fix the data/learning rate, or pass nonfinite='skip' to skip such steps"
                if reason == "nonfinite" else
                f"step {self._step + 1} not committed: the loss counted no targets on any rank "
                f"(global examples {examples}); check the targets/ignore_index"
            )
        return receipt

    def _clear_gradients(self) -> None:
        if self._counts.reducing:  # a commit that stopped early: finish the started all-reduce
            self._finish_counts()
        self.optimizer.zero_grad(set_to_none=True)
        self._pending = 0
        self._counts.reset()

    # ---- receipts -------------------------------------------------------------------------
    def _skipped_receipt(self, *, reason: str, window: bool = False) -> StepReceipt:
        c = self._counts
        loss_t, tokens_t = (c.loss, c.tokens) if window else (c.calls_loss, c.calls_tokens)
        tokens = float(tokens_t)
        receipt = self._receipt(
            skipped=True, loss=float(loss_t) / tokens if tokens else math.nan, window=window,
            extra={"reason": reason, "pending_accumulation": self._pending},
        )
        c.reset_calls()
        return receipt

    def _receipt(self, *, skipped: bool, loss: float, window: bool, examples: int | None = None,
                 tokens: int | None = None, extra: dict[str, Any]) -> StepReceipt:
        c = self._counts
        ex_t, tok_t = (c.examples, c.tokens) if window else (c.calls_examples, c.calls_tokens)
        nbytes, counts = self._meter.snapshot()
        receipt = StepReceipt(
            step=self._step,
            loss=float(loss),
            local_examples=int(round(float(ex_t))),
            local_tokens=int(round(float(tok_t))),
            microbatches=self.plan.microbatches,
            accumulation_steps=self.plan.gradient_accumulation_steps,
            data_parallel_size=self.plan.data_parallel_size,
            optimizer=str(self.optimizer_receipt.get("name", type(self.optimizer).__name__)),
            precision=self.precision,
            collective_bytes=int(nbytes),
            skipped=skipped,
            extra={**extra, "collectives": counts, **self._admission_extra},
            global_examples_observed=examples,
            global_tokens_observed=tokens,
        )
        if self.ledger is not None:
            self.ledger.receipt(receipt, rank=dist.get_rank() if dist.is_initialized() else 0)
        return receipt

    # ---- ledger (this session is its one writer; the audit and health monitor only report) ------
    def _log_audit_records(self, records: Sequence[SDCAuditRecord]) -> None:
        """Write an audited step's records to the ledger, in the order the audit found them."""
        if self.ledger is not None:
            for record in records:
                self.ledger.audit(record)

    def _log_fatal(self, anomaly: Any) -> None:
        """Write run_end(status="failed") for a fatal health anomaly (the heartbeat calls it before exit)."""
        if self.ledger is not None:
            self.ledger.run_end(status="failed", steps=anomaly.detected_at_step, extra={"health": anomaly.as_dict()})

    # ---- helpers --------------------------------------------------------------------------
    def _split(self, inputs: Any, targets: Any) -> list[tuple[Any, Any]]:
        n = self.plan.microbatches
        rows = self._rows(inputs)
        if self._rows(targets) != rows:
            raise ValueError(f"inputs hold {rows} rows but targets hold {self._rows(targets)}; they must match")
        if rows < n:
            raise ValueError(
                f"a local batch of {rows} rows cannot be split into microbatches={n}; give every rank at "
                f"least {n} rows or lower plan.microbatches"
            )
        if n == 1:
            return [(inputs, targets)]
        return list(zip(torch.tensor_split(inputs, n), torch.tensor_split(targets, n)))

    @staticmethod
    def _rows(value: Any) -> int:
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            raise TypeError(f"inputs and targets must be tensors with a batch dimension, got {type(value).__name__}")
        return int(value.shape[0])

    def comm_device(self) -> torch.device:
        """Where small control tensors for collectives live (the device on CUDA, else the CPU)."""
        return self._comm_device()

    def _comm_device(self) -> torch.device:
        return self.device if self.device.type == "cuda" else torch.device("cpu")

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this TorchDistributedSession is closed; prepare a new one")
