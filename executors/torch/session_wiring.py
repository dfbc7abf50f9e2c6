"""What surrounds a torch_native session's step, built in one place from its options.

The comm taps (collective accounting and the audit's view of local gradients), the gradient-mean
scheme (``gradient_mean``), the window's counts, health, fault strikes, the SDC audit and the
run's ledger. ``PreparedRun`` carries what ``prepare`` decided before the session existed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import torch

from ...verification.ledger import Ledger
from ..training_options import TrainOptions
from .comm_meter import CollectiveMeter
from .comm_taps import CommTap, install_taps
from .gradient_mean import DDPMean, MeanAtCommit, WindowCounts
from .health import SessionHealth
from .layouts import unwrap
from .run_ledger import RunLedger, current_rank
from .sdc_audit import FaultStrikes, SessionAudit, resolve_audit

if TYPE_CHECKING:
    from torch.nn.parallel import DistributedDataParallel

__all__ = ["PreparedRun", "SessionParts", "autocast_dtype", "check_mirrors", "wire_session"]


@attrs.frozen
class PreparedRun:
    """What ``prepare`` decided before the session existed: the admission decision, whether it created the
    default process group, and the ledger this rank writes (rank 0's, opened before the group existed)."""

    admission: Any = None
    owns_process_group: bool = False
    ledger: Ledger | None = None
    reference_template: Any = None
    """FSDP2/HSDP with the audit on: the module's plain structure taken before sharding (the audit's reference)."""


@attrs.frozen
class SessionParts:
    """The parts around a session's step (see the module docstring)."""

    tap: CommTap
    meter: Any
    """What counts this call's collectives: the tap (DDP, FSDP2) or a dispatch-mode ``CollectiveMeter`` (TP, CP)."""
    mean: MeanAtCommit | DDPMean
    counts: WindowCounts
    ledger: RunLedger
    health: SessionHealth | None
    faults: FaultStrikes | None
    audit: SessionAudit | None


def _gradient_mean(session: Any, tap: CommTap, counts_before_backward: bool) -> MeanAtCommit | DDPMean:
    plan = session.plan
    if not session.dp_mode.uses_ddp:
        return MeanAtCommit(plan, tap, session.device)
    ddp: DistributedDataParallel = session.module
    return DDPMean(ddp, plan, tap, session.device, counts_before_backward=counts_before_backward)


def wire_session(session: Any, options: TrainOptions, run: PreparedRun, *,
                 counts_before_backward: bool) -> SessionParts:
    """Build a session's parts in order: taps, gradient-mean scheme, counts, ledger, health, fault strikes, audit
    (the audit's at-rest digest of the parameters is taken last, once everything else is in place)."""
    plan, mode = session.plan, session.dp_mode
    audit_options = resolve_audit(options.audit, plan, mode)
    injector = options.audit.fault_injector
    tap = install_taps(session.module, plan, mode, gradient_access=audit_options is not None or injector is not None)
    rank = current_rank()
    ledger = RunLedger(run.ledger, rank=rank)
    health = None if options.health is None else SessionHealth(
        options.health, module=unwrap(session.module), device=session.device, rank=rank, world_size=plan.world_size)
    if health is not None:
        health.on_fatal = ledger.failed  # the health monitor reports; the ledger's one writer writes
    faults = None if injector is None else FaultStrikes(session, tap, injector)
    seed = options.seed or 0
    audit = None if audit_options is None else SessionAudit(session, tap, audit_options, seed=seed, faults=faults,
                                                         template=run.reference_template)
    ledger.start(executor=session.capabilities.name, plan=plan, precision=session.precision,
                 decision=run.admission, audit={} if audit_options is None else {
                     "rate": audit_options.rate, "policy": audit_options.policy.value, "bound": audit_options.bound,
                     "seed": seed, "replay": audit_options.replay.value})
    return SessionParts(tap=tap, meter=tap if tap.counting else CollectiveMeter(), counts=WindowCounts(
        tp=plan.tp, cp=plan.cp), mean=_gradient_mean(session, tap, counts_before_backward), ledger=ledger,
        health=health, faults=faults, audit=audit)


def check_mirrors(options: TrainOptions, precision: str, max_grad_norm: float | None, manual: bool) -> None:
    """mixle's session parameters and the options object must not disagree (one value per option)."""
    for name, given, value in (("precision", options.precision, precision),
                               ("max_grad_norm", options.max_grad_norm, max_grad_norm)):
        if given is not None and given != value:
            raise ValueError(f"{name}={value!r} but options.{name}={given!r}; give one value")
    if manual:
        raise ValueError("manual_data_parallel=True is not honoured by torch_native: gradients are reduced by the "
                         "DDP/FSDP2 wrapper the plan chooses (DataParallelMode); pass a module prepare() wrapped")


def autocast_dtype(precision: str) -> torch.dtype | None:
    """Mixed precisions: fp32 master weights and gradients, the forward under ``torch.autocast`` at this dtype."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
