"""TorchDistributedSession: the training step, readable top to bottom in this module.

``train_batch`` splits this rank's batch into micro-steps. Each micro-step runs the forward, adds
its loss sum and counted targets to the window's counts, lets the gradient-mean scheme act before
the backward (DDP on the CPU starts the counts' all-reduce there), and back-propagates. When the
accumulation clock fires, ``_commit`` audits the window (when it is sampled), takes the window's
global totals from the scheme, lets the pure ``commit.decide`` turn them into the loss, norm, clip
and scale, and ``commit.step`` applies them.
Every call returns a ``StepReceipt``. What surrounds the step is built by ``session_wiring``: comm
taps, the gradient-mean scheme (``gradient_mean``), health, fault strikes, the SDC audit and the
run's ledger (``run_ledger``); the clocks, metrics, checkpoints and ``close`` are ``session_base``'s.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from ...contracts import (
    BackendCapabilities,
    ParallelAxis,
    ParallelPlan,
    ParameterLayout,
    StepReceipt,
    UnusedParametersError,
    to_dict,
)
from ...verification.sdc.schedule import SDCDetectedError
from ..training_options import NonfinitePolicy, TrainOptions
from .commit import Commit, decide, group_learning_rates
from .commit import step as commit_step
from .device_mesh import axis_mesh
from .dp_mode import DataParallelMode
from .losses import lm_token_loss
from .session_base import SessionBase
from .session_wiring import PreparedRun, autocast_dtype, check_mirrors, wire_session

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

LossFn = Callable[[nn.Module, Any, Any], tuple[torch.Tensor, Any]]

COUNTS_BEFORE_BACKWARD_DEVICES = frozenset({"cpu"})
"""Device types on which a DDP session starts the window's counts' all-reduce as the commit micro-step's backward
starts, and its comm hook scales each bucket to the global mean (elsewhere the commit does, after the backward)."""


class TorchDistributedSession(SessionBase):
    """A transformed module plus its optimizer, the accumulation clock and explicit mesh semantics.

    mixle's signature, plus ``options`` (a ``TrainOptions``: loss, non-finite policy, audit, health,
    ledger) and ``run`` (what ``prepare`` decided: admission, process-group ownership, the ledger).
    The committed gradient is the exact global mean (docs/training.md, "Gradients: the exact global mean").
    """

    def __init__(self, module: nn.Module, *, plan: ParallelPlan, capabilities: BackendCapabilities, mesh: Any,
                 device: torch.device, optimizer: torch.optim.Optimizer, optimizer_receipt: dict[str, Any],
                 parameter_layouts: tuple[ParameterLayout, ...], precision: str, max_grad_norm: float | None,
                 scheduler: Any = None, manual_data_parallel: bool = False, options: TrainOptions | None = None,
                 run: PreparedRun | None = None) -> None:
        options, run = options or TrainOptions(), run or PreparedRun()
        check_mirrors(options, precision, max_grad_norm, manual_data_parallel)
        self.module, self.plan, self.capabilities, self.mesh = module, plan, capabilities, mesh
        self.device, self.optimizer, self.scheduler = torch.device(device), optimizer, scheduler
        self.optimizer_receipt, self.parameter_layouts = dict(optimizer_receipt), parameter_layouts
        self.precision, self.max_grad_norm = precision, max_grad_norm
        self.loss_fn: LossFn = options.loss_fn or lm_token_loss
        self.nonfinite, self.admission = options.nonfinite, run.admission
        self.dp_mode = DataParallelMode.for_plan(plan)
        self._check_unused = self.dp_mode.uses_ddp and not options.find_unused_parameters
        self.cp_mesh = axis_mesh(mesh, ParallelAxis.CP) if plan.cp > 1 else None
        self._admission_extra = (run.admission.receipt_extra() if hasattr(run.admission, "receipt_extra")
                                 else {"admission": run.admission})
        self._owns_pg, self._distributed = run.owns_process_group, plan.world_size > 1
        self._params = [p for p in module.parameters() if p.requires_grad]
        self._params_named: list[tuple[str, nn.Parameter]] | None = None
        self._step = self._pending = 0
        self._last_micro: tuple[Any, Any] | None = None
        self._sync_enabled: bool | None = None
        self._closed, self._forward_s = False, 0.0
        self._autocast_dtype = autocast_dtype(precision)
        parts = wire_session(self, options, run,
                             counts_before_backward=self.device.type in COUNTS_BEFORE_BACKWARD_DEVICES)
        self._tap, self._meter, self._mean, self._counts = parts.tap, parts.meter, parts.mean, parts.counts
        self._ledger, self._health, self._faults, self._audit = parts.ledger, parts.health, parts.faults, parts.audit

    # ---- the step -------------------------------------------------------------------------
    def train_batch(self, inputs: Any, targets: Any) -> StepReceipt:
        """Accumulate one local batch (split into ``plan.microbatches``) and commit when the clock fires."""
        self._check_open()
        if self._health is not None:
            self._health.begin_call(inputs)
        micro = self._split(inputs, targets)
        commit = self._pending + 1 == self.plan.gradient_accumulation_steps
        self._meter.reset()
        if self._pending == 0:
            self._begin_window()
        with self._metering():
            for i, (x, y) in enumerate(micro):
                self._micro_step(x, y, sync=commit and i == len(micro) - 1, weight=1.0)
            self._pending += 1
            if commit:
                return self._commit()
        return self._skipped_receipt(reason="accumulating")

    def _begin_window(self) -> None:
        """The window's first micro-step: the audit starts recording (when sampled), planned flips strike."""
        if self._audit is not None:
            self._audit.begin_window(self._step)
        elif self._faults is not None:
            self._faults.begin_window(self._step)

    def _micro_step(self, x: Any, y: Any, *, sync: bool, weight: float) -> None:
        """Forward, the window's counts, what the gradient-mean scheme does before the backward, backward."""
        self._last_micro = (x, y)
        with self._micro_context(x, y, sync) as (xs, ys):
            loss_sum, counted = self._forward(xs, ys)
            if self._health is not None:
                self._health.add_forward(self._forward_s)
            if weight:
                self._counts.add(loss_sum, counted, self._rows(x))
            self._mean.before_backward(self._counts, sync=sync, rank_slots=self._rank_slots() if sync else None)
            if self._audit is not None:  # a replay back-propagates with the same weight
                self._audit.note(x, y, sync, weight)
            self._backward(loss_sum, weight)
            if sync and self._check_unused:
                self._refuse_unused_parameters()

    def _refuse_unused_parameters(self) -> None:
        """DDP without ``find_unused_parameters``: a trainable parameter without a gradient after the commit's
        backward left its bucket unreduced (a wrong norm and unsynchronized gradients). Name them and stop."""
        missing = [name for name, p in self.named_trainable() if p.grad is None]
        if missing:
            self._clear_gradients()  # nothing committed; the counts' all-reduce this rank started is finished
            raise UnusedParametersError(missing, where=f"step {self._step + 1}'s backward")

    def run_micro(self, x: Any, y: Any, *, sync: bool, weight: float) -> tuple[torch.Tensor, Any]:
        """One forward/backward of a micro-batch with no clock and no counts: what an audit replay runs."""
        with self._micro_context(x, y, sync) as (xs, ys):
            loss_sum, count = self._forward(xs, ys)
            self._backward(loss_sum, weight)
        return loss_sum, count

    @contextlib.contextmanager
    def _micro_context(self, x: Any, y: Any, sync: bool) -> Iterator[tuple[Any, Any]]:
        """Gradient sync on or off for this micro-step, and its context-parallel shard of (x, y)."""
        self._tap.syncing = sync
        with self._sync_context(sync), self._cp_context(x, y) as xy:
            yield xy

    def _forward(self, x: Any, y: Any) -> tuple[torch.Tensor, Any]:
        """``loss_fn(module, x, y)`` under autocast; with health on, timed and its phase reported."""
        health = self._health
        if health is not None:
            health.phase("forward")
            start = time.perf_counter()
        with self._autocast():
            out = self.loss_fn(self.module, x, y)
        if health is not None:
            self._forward_s = time.perf_counter() - start
            health.phase("backward")
        return out

    def _backward(self, loss_sum: torch.Tensor, weight: float) -> None:
        (loss_sum * (self._mean.backward_scale * weight)).backward()

    def _commit(self) -> StepReceipt:
        """Audit the window (when sampled), then its global totals, the commit's arithmetic and the step."""
        audit_extra, keep_out = self._audit_window()
        if keep_out:
            return self._skip_window("sdc_audit", audit_extra)
        if self._health is not None and self._distributed:
            self._health.phase("commit")
        totals = self._mean.totals(self._counts, self._params, self._rank_slots())
        decision = decide(totals, self.max_grad_norm)
        if decision.refused is not None:
            return self._reject(decision)
        rates = group_learning_rates(self.optimizer)  # the rates this step uses, before the scheduler moves them
        commit_step(decision, self._params, self.optimizer, self.scheduler)
        self._step += 1
        if self._audit is not None:
            self._audit.prime(self._step)
        extra: dict[str, Any] = {"grad_norm": decision.norm, "clipped": decision.clipped, **audit_extra}
        if self._health is not None:
            seconds = list(totals.rank_seconds) if totals.rank_seconds else None
            extra["health"] = self._health.on_commit(self._step, loss=decision.loss, grad_norm=decision.norm,
                                                     tokens=decision.tokens, rank_seconds=seconds)
        receipt = self._receipt(skipped=False, loss=decision.loss, window=True, examples=decision.examples,
                                tokens=decision.tokens, extra=extra, learning_rates=rates)
        self._clear_gradients()
        return receipt

    def _audit_window(self) -> tuple[dict[str, Any], bool]:
        """Strike a due gradient flip, then audit the window when it is sampled: (receipt extra, keep it out?)."""
        if self._faults is not None:
            self._faults.before_commit()
        if self._audit is None:
            return {}, False
        audited = self._audit.is_audited(self._step)
        try:
            records, keep_out = self._audit.check(self._step)
        except SDCDetectedError as exc:
            self._ledger.audit(exc.records)  # raise policy: the records still reach the ledger
            self._clear_gradients()  # nothing committed, clocks unchanged
            raise
        except Exception:
            self._clear_gradients()  # a failed replay: nothing committed, clocks unchanged
            raise
        self._ledger.audit(records)
        extra: dict[str, Any] = {"audited": audited}
        if records:
            extra["sdc_audit"] = [to_dict(r)["data"] for r in records]
        if audited and self._audit.step_reference_skipped is not None:  # TP: no plain reference, said why
            extra["sdc_reference_skipped"] = self._audit.step_reference_skipped
        return extra, keep_out

    def _skip_window(self, reason: str, extra: dict[str, Any]) -> StepReceipt:
        """The audit kept the window out: a skipped receipt with this rank's loss; nothing committed."""
        tokens = float(self._counts.tokens)
        if self._health is not None:
            self._health.on_skip()
        receipt = self._receipt(skipped=True, loss=float(self._counts.loss) / tokens if tokens else math.nan,
                                window=True, extra={"reason": reason, **extra})
        self._clear_gradients()
        return receipt

    def _reject(self, decision: Commit) -> StepReceipt:
        """A refused commit (no counted target, non-finite): gradients cleared, clocks unchanged; raise or skip."""
        norm = decision.norm
        extra: dict[str, Any] = {"reason": decision.refused, "grad_norm": norm if math.isfinite(norm) else None}
        if self._health is not None:
            found = self._health.on_skip(self._step + 1, decision.loss, norm)
            extra["health"] = {"anomalies": [a.as_dict() for a in found]}
        receipt = self._receipt(skipped=True, loss=decision.loss, window=True, examples=decision.examples,
                                tokens=decision.tokens, extra=extra)
        self._clear_gradients()
        if decision.refused == "nonfinite" and self.nonfinite is NonfinitePolicy.SKIP:
            return receipt
        if decision.refused == "nonfinite":
            raise FloatingPointError(
                f"step {self._step + 1} not committed (nonfinite): global loss {decision.loss}, gradient norm {norm}. "
                "Pending gradients were discarded and parameters, optimizer state and clocks are unchanged; "
                "fix the data/learning rate, or pass nonfinite='skip' to skip such steps")
        raise FloatingPointError(
            f"step {self._step + 1} not committed: the loss counted no targets on any rank "
            f"(global examples {decision.examples}); check the targets/ignore_index")

    def _clear_gradients(self) -> None:
        self._mean.abandon()  # a commit that stopped early: finish what the scheme started
        if self._faults is not None:
            self._faults.end_window()
        self.optimizer.zero_grad(set_to_none=True)
        self._pending = 0
        self._counts.reset()

    def _skipped_receipt(self, *, reason: str, window: bool = False) -> StepReceipt:
        c = self._counts
        loss_t, tokens_t = (c.loss, c.tokens) if window else (c.calls_loss, c.calls_tokens)
        tokens = float(tokens_t)
        receipt = self._receipt(skipped=True, loss=float(loss_t) / tokens if tokens else math.nan, window=window,
                                extra={"reason": reason, "pending_accumulation": self._pending})
        c.reset_calls()
        return receipt

    def _receipt(self, *, skipped: bool, loss: float, window: bool, examples: int | None = None,
                 tokens: int | None = None, extra: dict[str, Any],
                 learning_rates: tuple[float, ...] | None = None) -> StepReceipt:
        c = self._counts
        ex_t, tok_t = (c.examples, c.tokens) if window else (c.calls_examples, c.calls_tokens)
        nbytes, counts = self._meter.snapshot()
        receipt = StepReceipt(
            step=self._step, loss=float(loss), local_examples=int(round(float(ex_t))),
            local_tokens=int(round(float(tok_t))), microbatches=self.plan.microbatches,
            accumulation_steps=self.plan.gradient_accumulation_steps, data_parallel_size=self.plan.data_parallel_size,
            optimizer=str(self.optimizer_receipt.get("name", type(self.optimizer).__name__)), precision=self.precision,
            collective_bytes=int(nbytes), skipped=skipped, extra={**extra, "collectives": counts,
                                                                  **self._admission_extra},
            global_examples_observed=examples, global_tokens_observed=tokens,
            learning_rates=group_learning_rates(self.optimizer) if learning_rates is None else learning_rates)
        self._ledger.receipt(receipt)
        return receipt

    def finish_accumulation(self) -> StepReceipt | None:
        """Commit what is pending now, before the clock fires (e.g. at the end of an epoch): the last micro-batch
        runs again with weight 0 in a synchronizing backward, whose zeros let DDP/FSDP2 reduce the rest.
        None when nothing is pending."""
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

    def _flush_unsynced(self) -> None:
        if self._last_micro is None:  # pragma: no cover - pending > 0 implies a micro-step ran
            raise RuntimeError("no micro-batch to synchronize with")
        self._micro_step(*self._last_micro, sync=True, weight=0.0)

    # ---- the step's helpers ---------------------------------------------------------------
    def _split(self, inputs: Any, targets: Any) -> list[tuple[Any, Any]]:
        n, rows = self.plan.microbatches, self._rows(inputs)
        if self._rows(targets) != rows:
            raise ValueError(f"inputs hold {rows} rows but targets hold {self._rows(targets)}; they must match")
        if rows < n:
            raise ValueError(f"a local batch of {rows} rows cannot be split into microbatches={n}; give every rank "
                             f"at least {n} rows or lower plan.microbatches")
        if n == 1:
            return [(inputs, targets)]
        return list(zip(torch.tensor_split(inputs, n), torch.tensor_split(targets, n)))

    @staticmethod
    def _rows(value: Any) -> int:
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            raise TypeError(f"inputs and targets must be tensors with a batch dimension, got {type(value).__name__}")
        return int(value.shape[0])

    def _rank_slots(self) -> torch.Tensor | None:
        """Health's per-rank step times, which ride the counts' all-reduce (None without health or peers)."""
        return self._health.rank_slots() if self._health is not None and self._distributed else None

    def _sync_context(self, sync: bool) -> Any:
        # the module is the DistributedDataParallel wrapper under DDP, an FSDPModule under FSDP/HSDP
        if self.dp_mode.uses_ddp:
            return contextlib.nullcontext() if sync else cast("DistributedDataParallel", self.module).no_sync()
        if self.dp_mode.uses_fsdp and self._sync_enabled is not sync:
            cast("FSDPModule", self.module).set_requires_gradient_sync(sync)
            self._sync_enabled = sync
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def _cp_context(self, x: Any, y: Any) -> Iterator[tuple[Any, Any]]:
        if self.cp_mesh is None:
            yield x, y
            return
        from torch.distributed.tensor.experimental import context_parallel
        from torch.nn.attention import SDPBackend, sdpa_kernel

        x, y = x.clone(), y.clone()  # context_parallel shards its buffers in place
        backends = [SDPBackend.MATH] if self.device.type == "cpu" else [
            SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
        with sdpa_kernel(backends), context_parallel(self.cp_mesh, buffers=[x, y], buffer_seq_dims=[1, 1],
                                                     no_restore_buffers={x, y}):
            yield x, y

    def _autocast(self) -> Any:
        if self._autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self._autocast_dtype)

    def _metering(self) -> Any:
        return self._meter if self._distributed and not self._tap.counting else contextlib.nullcontext()

