"""MegatronSession: a megatron-core model chunk, its optimizer and the accumulation clock.

One ``train_batch`` call runs megatron's forward/backward schedule (1F1B with ``pp`` stages,
plain accumulation without) over ``plan.microbatches`` microbatches of this rank's local batch;
gradients accumulate in megatron DDP's contiguous buffers until ``plan.gradient_accumulation_steps``
calls have been made, then ``finalize_model_grads`` reduces them over data parallelism and the
megatron optimizer steps. Every call returns a ``StepReceipt``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import torch
import torch.distributed as dist

from ...contracts import (
    BackendCapabilities,
    MeshCoordinate,
    ParallelPlan,
    StepReceipt,
    TorchSessionState,
    WorkerTopologyAttestation,
)
from ..torch.comm_meter import CollectiveMeter
from ..torch.commit import group_learning_rates
from ..torch.health import SessionHealth
from ..training_options import MEGATRON, UnhonouredOptionError
from .checkpoint import load_stage, save_stage
from .cpu_compat import cpu_compat
from .stages import PipelineStage, transport_shape

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _split(tensor: torch.Tensor | None, parts: int, what: str) -> list[torch.Tensor | None]:
    if tensor is None:
        return [None] * parts
    if tensor.shape[0] % parts:
        raise ValueError(
            f"{what} has {tensor.shape[0]} examples, which plan.microbatches={parts} does not divide; "
            "pass a local batch that is a multiple of the microbatch count"
        )
    return list(torch.chunk(tensor, parts, dim=0))


SAVE_OPTIONS = ("loader_state", "typed_scheduler_state", "extra", "asynchronous")
"""``TorchDistributedSession.save_checkpoint``'s keywords (torch_native honours them, megatron does not)."""
LOAD_OPTIONS = ("allow_world_size_change",)
"""``TorchDistributedSession.load_checkpoint``'s keywords that torch_native honours and megatron does not
(a megatron checkpoint always reshards)."""


def refuse_session_options(options: dict[str, Any], torch_only: tuple[str, ...], method: str) -> None:
    """Refuse every keyword of a megatron session method: unknown ones (``TypeError``) and torch_native's
    (``UnhonouredOptionError`` naming the option, the backend and the backend that honours it)."""
    for key in options:
        if key not in torch_only:
            raise TypeError(f"MegatronSession.{method}() got an unexpected keyword argument {key!r}")
        raise UnhonouredOptionError(f"option {key}= of {method}() is not honoured by the {MEGATRON!r} backend; it is "
                         f"honoured by 'torch_native'. Leave it out here")


def count_tokens(targets: torch.Tensor | None, examples: int, ignore_index: int = -100) -> int:
    """Token targets (integer tensors) count their entries other than ``ignore_index``; else one per example."""
    if targets is None or targets.is_floating_point():
        return examples
    return int((targets != ignore_index).sum())


class MegatronSession:
    """A prepared megatron-core training session with the torch_native session interface."""

    def __init__(self, *, model: Any, stage: PipelineStage, optimizer: Any, plan: ParallelPlan,
                 capabilities: BackendCapabilities, loss_fn: LossFn, device: torch.device, precision: str,
                 optimizer_name: str, admission: Any, attestation: WorkerTopologyAttestation,
                 health: SessionHealth | None = None) -> None:
        self.model, self.stage, self.optimizer, self.plan = model, stage, optimizer, plan
        self.capabilities, self.loss_fn, self.device, self.precision = capabilities, loss_fn, device, precision
        self.optimizer_name, self.admission, self.health = optimizer_name, admission, health
        self.attestation = attestation
        self.coordinate: MeshCoordinate = attestation.coordinate  # prepare() checked megatron's equals it
        self._step = 0
        self._pending = 0
        self._pending_examples = 0
        self._pending_tokens = 0
        self._pending_losses: list[float] = []
        self._pending_bytes = 0
        self._closed = False

    # ---- identity --------------------------------------------------------------------
    @property
    def data_parallel_rank(self) -> int:
        """This rank's index in its megatron data-parallel group."""
        from megatron.core import parallel_state as ps

        return ps.get_data_parallel_rank()

    @property
    def is_logging_rank(self) -> bool:
        """True on the one rank that holds the loss and should log: last stage, tp/cp/dp index 0."""
        c = self.coordinate
        return c.pp == self.plan.pp - 1 and c.tp == 0 and c.cp == 0 and self.data_parallel_rank == 0

    @property
    def state(self) -> TorchSessionState:
        """The session's non-tensor clocks."""
        return TorchSessionState(step=self._step, pending_accumulation=self._pending,
                                 optimizer_receipt={"optimizer": self.optimizer_name})

    # ---- training --------------------------------------------------------------------
    def _compat(self) -> contextlib.AbstractContextManager[bool]:
        return cpu_compat(self.device)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this MegatronSession is closed; prepare a new one")

    def _run_schedule(self, inputs: torch.Tensor | None, targets: torch.Tensor | None) -> tuple[list[float], int]:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        m = self.plan.microbatches
        xs, ys = _split(inputs, m, "inputs"), _split(targets, m, "targets")
        sized = inputs if inputs is not None else targets
        if sized is None:
            raise ValueError("train_batch needs inputs (first stage) or targets (last stage); both are None")
        if self.stage.pre_process and inputs is None:
            raise ValueError(f"pipeline stage {self.stage.stage} is the first stage and needs inputs")
        if self.stage.post_process and targets is None:
            raise ValueError(f"pipeline stage {self.stage.stage} is the last stage and needs targets")
        micro_batch = sized.shape[0] // m
        seq_length, _ = transport_shape(self.stage.activation_shape)
        scale = 1.0 / self.plan.gradient_accumulation_steps
        loss_fn = self.loss_fn

        def forward_step(data_iterator: Iterator[tuple[Any, Any]], model: Any) -> tuple[torch.Tensor, Callable]:
            x, y = next(data_iterator)
            out = model(x.to(self.device) if x is not None else None)

            def loss_func(output: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
                loss = loss_fn(output, y.to(self.device))
                return loss * scale, {"loss": loss.detach()}

            return out, loss_func

        forward_backward = get_forward_backward_func()
        results = forward_backward(
            forward_step_func=forward_step,
            data_iterator=iter(list(zip(xs, ys))),
            model=[self.model],
            num_microbatches=m,
            seq_length=seq_length,
            micro_batch_size=micro_batch,
            forward_only=False,
        )
        return [float(r["loss"]) for r in results], int(sized.shape[0])

    def _measure(self) -> CollectiveMeter:
        return CollectiveMeter()

    def train_batch(self, inputs: torch.Tensor | None, targets: torch.Tensor | None) -> StepReceipt:
        """Run one local batch through the schedule; commit an optimizer step when the clock fires.

        Every rank of a data-parallel replica passes the same batch: the first stage uses the
        inputs, the last stage the targets (a stage may pass None for what it does not use).
        """
        self._check_open()
        if self.health is not None:
            self.health.begin_call(inputs)
            self.health.phase("forward")
        with self._compat():
            meter = self._measure()
            with meter:
                losses, examples = self._run_schedule(inputs, targets)
            self._pending_bytes += int(getattr(meter, "bytes", 0))
            self._pending += 1
            self._pending_examples += examples
            self._pending_tokens += count_tokens(targets, examples)
            self._pending_losses.extend(losses)
            if self._pending < self.plan.gradient_accumulation_steps:
                return self._receipt(skipped=True, reason="accumulating")
            return self._commit(rescale=1.0)

    def finish_accumulation(self) -> StepReceipt | None:
        """Commit the pending gradients now (averaged over the calls made), or None if nothing is pending."""
        self._check_open()
        if self._pending == 0:
            return None
        with self._compat():
            return self._commit(rescale=self.plan.gradient_accumulation_steps / self._pending)

    def discard_accumulation(self) -> StepReceipt | None:
        """Drop pending gradients without touching parameters or optimizer state; None if nothing is pending."""
        self._check_open()
        if self._pending == 0:
            return None
        with self._compat():
            self.model.zero_grad_buffer()
            self.optimizer.zero_grad()
        receipt = self._receipt(skipped=True, reason="discarded")
        self._reset_window()
        return receipt

    def _commit(self, rescale: float) -> StepReceipt:
        from megatron.core.distributed import finalize_model_grads

        meter = self._measure()
        with meter:
            if rescale != 1.0:
                self.model.scale_gradients(rescale)
            finalize_model_grads([self.model])
            ok, grad_norm, _ = self.optimizer.step()
            self.model.zero_grad_buffer()
            self.optimizer.zero_grad()
        self._pending_bytes += int(getattr(meter, "bytes", 0))
        if not ok:
            receipt = self._receipt(skipped=True, reason="optimizer reported an unsuccessful update")
        else:
            self._step += 1
            receipt = self._receipt(skipped=False, reason=None, grad_norm=grad_norm)
        if self.health is not None:
            receipt = self._with_health(receipt, grad_norm if ok else None)
        self._reset_window()
        return receipt

    def _with_health(self, receipt: StepReceipt, grad_norm: float | None) -> StepReceipt:
        """The receipt with ``extra["health"]``: step time, tokens/s, MFU (with a flop_config), anomalies.
        Per-rank step times are not gathered here (megatron's schedule interleaves the stages' work)."""
        assert self.health is not None
        if receipt.skipped:
            self.health.on_skip()
            return receipt
        health = self.health.on_commit(self._step, loss=receipt.loss, rank_seconds=None, tokens=receipt.global_tokens,
                                       grad_norm=None if grad_norm is None else float(grad_norm))
        return attrs.evolve(receipt, extra={**receipt.extra, "health": health})

    def _reset_window(self) -> None:
        self._pending = 0
        self._pending_examples = 0
        self._pending_tokens = 0
        self._pending_losses = []
        self._pending_bytes = 0

    def _shared_loss_and_counts(self) -> tuple[float, float, int, int]:
        """The loss averaged over data parallelism (every stage gets the last stage's), this rank's
        data-parallel replica's own loss, and the global example/token counts."""
        from megatron.core import parallel_state as ps

        local = sum(self._pending_losses) / len(self._pending_losses) if self._pending_losses else 0.0
        values = torch.tensor([local, float(self._pending_examples), float(self._pending_tokens)],
                              dtype=torch.float64)
        if self.plan.pp > 1:
            loss = values[:1].clone() if self.stage.post_process else torch.zeros(1, dtype=torch.float64)
            dist.all_reduce(loss, group=ps.get_pipeline_model_parallel_group())
            values[0] = loss[0]
        local = float(values[0])
        weighted = torch.tensor([local * float(values[1]), float(values[1]), float(values[2])], dtype=torch.float64)
        if self.plan.data_parallel_size > 1:
            dist.all_reduce(weighted, group=ps.get_data_parallel_group())
        mean = float(weighted[0] / weighted[1]) if weighted[1] > 0 else local
        return mean, local, int(weighted[1]), int(weighted[2])

    def _receipt(self, *, skipped: bool, reason: str | None, grad_norm: float | None = None) -> StepReceipt:
        loss, local_loss, global_examples, global_tokens = self._shared_loss_and_counts()
        extra: dict[str, Any] = {
            "local_loss": local_loss,
            "backend": "megatron",
            **(self.admission.receipt_extra() if hasattr(self.admission, "receipt_extra")
               else {"admission": self.admission}),
            "pp_stage": self.stage.stage,
            "cpu_compat": self.device.type == "cpu",
        }
        if reason is not None:
            extra["reason"] = reason
        if grad_norm is not None:
            extra["grad_norm"] = float(grad_norm)
        return StepReceipt(
            step=self._step,
            loss=loss,
            local_examples=self._pending_examples,
            local_tokens=self._pending_tokens,
            microbatches=self.plan.microbatches,
            accumulation_steps=max(1, self._pending),
            data_parallel_size=self.plan.data_parallel_size,
            optimizer=self.optimizer_name,
            precision=self.precision,
            collective_bytes=self._pending_bytes,
            skipped=skipped,
            extra=extra,
            global_examples_observed=global_examples,
            global_tokens_observed=global_tokens,
            learning_rates=group_learning_rates(self.optimizer),
        )

    # ---- metrics, checkpoints, shutdown ------------------------------------------------
    def reduce_sums(self, *values: float) -> tuple[float, ...]:
        """Sum scalar metrics over this rank's data-parallel group (every rank gets the sums)."""
        from megatron.core import parallel_state as ps

        self._check_open()
        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64)
        if self.plan.data_parallel_size > 1 and values:
            dist.all_reduce(tensor, group=ps.get_data_parallel_group())
        return tuple(float(v) for v in tensor)

    def save_checkpoint(self, path: str, **options: Any) -> None:
        """Save model and optimizer with megatron's dist_checkpointing (reshardable across pp/tp/dp).

        torch_native's save options (``loader_state``, ``typed_scheduler_state``, ``extra``,
        ``asynchronous``) are refused by name: this checkpoint holds the model, the optimizer and the step.
        """
        refuse_session_options(options, SAVE_OPTIONS, "save_checkpoint")
        self._check_open()
        if self._pending:
            raise RuntimeError(
                f"{self._pending} accumulated micro-steps are pending; call finish_accumulation() or "
                "discard_accumulation() before saving so the checkpoint holds a committed state"
            )
        with self._compat():
            save_stage(self.stage, self.optimizer, path, step=self._step, plan=self.plan)

    def load_checkpoint(self, path: str, **options: Any) -> dict[str, Any]:
        """Load a checkpoint saved by any plan of the same model (resharded to this one); returns the saved clocks.

        The generation's signature (``trust="signed"``, or ``"unsigned"`` to skip it, logged) and lineage
        (``allow_rollback=True`` loads an older one on purpose) are checked before any byte is used, as
        torch_native's are. ``allow_world_size_change`` is refused by name: a megatron checkpoint always reshards.
        """
        trust = options.pop("trust", "signed")
        allow_rollback = options.pop("allow_rollback", False)
        refuse_session_options(options, LOAD_OPTIONS, "load_checkpoint")
        if not isinstance(allow_rollback, bool):
            raise TypeError(f"allow_rollback must be a bool, got {allow_rollback!r}")
        self._check_open()
        with self._compat():
            info = load_stage(self.stage, self.optimizer, path, trust=trust, allow_rollback=allow_rollback)
        self._step = int(info["step"])
        self._reset_window()
        return info

    def close(self) -> None:
        """Tear down megatron's parallel state (the world itself stays up for its owner)."""
        if self._closed:
            return
        from megatron.core import parallel_state

        self._closed = True
        if self.health is not None:
            self.health.close()
        parallel_state.destroy_model_parallel()
