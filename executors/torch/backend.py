"""TorchDistributedBackend (``torch_native``): DeviceMesh, TP, CP, FSDP2/HSDP or DDP for any nn.Module."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import torch
from torch import nn

from ...contracts import (
    BackendCapabilities,
    CollectiveKind,
    DistributedUpdate,
    ParallelAxis,
    ParallelPlan,
    PayloadKind,
    StateLayout,
)
from ...verification.ledger import Ledger
from ..training_admission import admit_training
from ..training_in_situ import in_situ_certifier
from ..training_options import TrainOptions
from .device_mesh import build_mesh, ensure_process_group, require_torch, resolve_device
from .dp_mode import DataParallelMode
from .in_situ_probe import probe_module
from .layouts import describe_parameter_layouts
from .losses import lm_token_loss
from .parallelize import parallelize, resolve_tp_plan
from .probe_gate import probe_at_prepare
from .run_ledger import current_rank, ledger_on_this_rank
from .sdc_audit import resolve_audit, sharded_reference_template
from .session import TorchDistributedSession
from .session_wiring import PreparedRun

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["CAPABILITIES", "TorchDistributedBackend", "build_optimizer", "check_prepare", "lm_token_loss"]

EXECUTOR_VERSION = "1.0.0"

A = ParallelAxis
CAPABILITIES = BackendCapabilities(
    name="torch_native",
    axes=frozenset({A.DP_REPLICATE, A.DP_SHARD, A.TP, A.CP}),
    precisions=frozenset({"fp32", "bf16", "fp16"}),
    distributed_optimizer=False,
    reshardable_checkpoint=True,
    elastic_restart=False,
    requirements=("torch>=2.6",),
    # compositions the test-suite does not run (yet): refused before any process group exists
    incompatible_axis_sets=(
        frozenset({A.CP, A.DP_REPLICATE}),
        frozenset({A.CP, A.TP}),
        frozenset({A.DP_REPLICATE, A.DP_SHARD, A.TP}),
    ),
)


def build_optimizer(
    optimizer: Any, params: list[torch.nn.Parameter], lr: float
) -> tuple[torch.optim.Optimizer, dict[str, Any]]:
    """An optimizer over the transformed parameters from a torch.optim class, its name, or a callable(params).

    None and 'auto' (mixle's default, which plans an optimizer for the model) mean AdamW here.
    """
    if optimizer is None or (isinstance(optimizer, str) and optimizer.strip().lower() == "auto"):
        optimizer = "AdamW"
    if isinstance(optimizer, str):
        classes: dict[str, Any] = {  # concrete torch.optim classes, which all take lr=
            name.lower(): cls
            for name, cls in vars(torch.optim).items()
            if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer) and cls is not torch.optim.Optimizer
        }
        cls = classes.get(optimizer.strip().lower())
        if cls is None:
            raise ValueError(
                f"unknown optimizer {optimizer!r}; name a torch.optim class (any case), one of: "
                f"{', '.join(sorted(c.__name__ for c in classes.values()))}"
            )
        opt = cls(params, lr=lr)
    elif isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer):
        concrete: Any = optimizer  # a subclass; the base Optimizer's signature has no lr=
        opt = concrete(params, lr=lr)
    elif callable(optimizer):
        opt = optimizer(params)
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(f"optimizer factory returned {type(opt).__name__}, expected a torch.optim.Optimizer")
    else:
        raise TypeError(f"optimizer must be a torch.optim class, its name or a callable(params), got {optimizer!r}")
    hyper = {
        k: (list(v) if isinstance(v, tuple) else v)
        for k, v in opt.defaults.items()
        if isinstance(v, (int, float, str, bool, type(None)))
        or (isinstance(v, tuple) and all(isinstance(i, (int, float)) for i in v))
    }
    return opt, {"name": type(opt).__name__, "hyperparameters": hyper}


@attrs.frozen
class PrepareSpec:
    """What ``prepare``'s checks decided, before admission and before any process group exists."""

    options: TrainOptions
    precision: str
    mode: DataParallelMode
    tp_styles: dict[str, Any]
    device: torch.device
    ledger: Ledger | None
    """The ledger this rank writes: rank 0's (a path opened here), None on the other ranks."""


def check_prepare(module: Any, plan: Any, options: TrainOptions) -> PrepareSpec:
    """Every check of ``prepare`` before admission and before any collective: the module and plan, torch's
    version, the plan against the capabilities, the audit against the plan, the TP plan against the model,
    the device, and who writes the ledger."""
    if not isinstance(plan, ParallelPlan):
        raise TypeError(f"plan must be a ParallelPlan, got {type(plan).__name__}")
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    require_torch()
    precision = options.precision or "fp32"
    CAPABILITIES.validate(plan, precision=precision)
    mode = DataParallelMode.for_plan(plan)
    if options.find_unused_parameters and not mode.uses_ddp:
        raise ValueError(f"find_unused_parameters=True is DDP's (a plan with dp_replicate>1 and no dp_shard, tp or "
                         f"cp); {plan.describe()} runs {mode.value}, which needs no such option: drop it")
    resolve_audit(options.audit, plan, mode)
    styles = resolve_tp_plan(module, options.tp_plan, plan.tp)
    ledger = ledger_on_this_rank(options.ledger, current_rank())
    return PrepareSpec(options=attrs.evolve(options, precision=precision), precision=precision, mode=mode,
                       tp_styles=styles, device=resolve_device(options.device), ledger=ledger)


def _materialize_mesh(plan: ParallelPlan, spec: PrepareSpec) -> tuple[DeviceMesh | None, bool]:
    """Seed, the process group (created from the torchrun environment when none exists) and the DeviceMesh."""
    if spec.options.seed is not None:
        torch.manual_seed(spec.options.seed)
    owns_pg = ensure_process_group(plan, spec.device)
    return build_mesh(plan, spec.device, unit_shard_dim=spec.mode.unit_shard_dim(plan)), owns_pg


def _update(node_id: str, payload: PayloadKind, collective: CollectiveKind, axes: tuple[ParallelAxis, ...],
            layout: StateLayout, note: str) -> DistributedUpdate:
    """One declared (inexact) communication node of a torch_native session."""
    return DistributedUpdate(node_id=node_id, payload=payload, collective=collective, mesh_axes=axes,
                             state_layout=layout, exact=False, notes=(note,))


class TorchDistributedBackend:
    """Native backend for ordinary PyTorch modules: mesh, transforms, optimizer and a resumable session."""

    name = "torch_native"

    @property
    def capabilities(self) -> BackendCapabilities:
        """What this backend executes and its tests exercise."""
        return CAPABILITIES

    @property
    def version(self) -> str:
        """Executor version bound into admission certificates."""
        return f"{EXECUTOR_VERSION}+torch{torch.__version__}"

    def describe_updates(self, plan: ParallelPlan) -> tuple[DistributedUpdate, ...]:
        """The DistributedUpdates a session for ``plan`` performs, one per communication node."""
        CAPABILITIES.validate(plan)
        P, C, L = PayloadKind, CollectiveKind, StateLayout
        updates: list[DistributedUpdate] = []
        mode = DataParallelMode.for_plan(plan)
        shard_axes = tuple(a for a in (A.DP_SHARD, A.CP) if plan.size(a) > 1)
        shard_names = ",".join(a.value for a in shard_axes)
        if mode.uses_ddp or (mode.uses_fsdp and not shard_axes):
            updates.append(_update("grad:dp_replicate", P.GRADIENT, C.ALL_REDUCE, (A.DP_REPLICATE,), L.REPLICATED,
                                   "DDP bucket all-reduce (HSDP with a shard group of one under TP); skipped on "
                                   "non-commit micro-steps"))
        elif mode.uses_fsdp:
            updates.append(_update(f"param:{shard_names}", P.PARAMETER, C.ALL_GATHER, shard_axes, L.SHARDED,
                                   "FSDP2 all-gathers parameters before forward and backward"))
            updates.append(_update(f"grad:{shard_names}", P.GRADIENT, C.REDUCE_SCATTER, shard_axes, L.SHARDED,
                                   "FSDP2 reduce-scatter; skipped on non-commit micro-steps"))
            if plan.dp_replicate > 1:
                updates.append(_update("grad:dp_replicate", P.GRADIENT, C.ALL_REDUCE, (A.DP_REPLICATE,), L.SHARDED,
                                       "HSDP all-reduce of the reduce-scattered shards across replicas"))
        if plan.tp > 1:
            updates.append(_update("act:tp", P.ACTIVATION, C.ALL_REDUCE, (A.TP,), L.SHARDED,
                                   "DTensor row-wise outputs / column-wise input gradients (all-gather for "
                                   "sequence or replicated outputs)"))
        if plan.cp > 1:
            updates.append(_update("kv:cp", P.KV_BLOCK, C.ALL_GATHER, (A.CP,), L.SHARDED,
                                   "context_parallel ring attention exchanges key/value blocks"))
            updates.append(_update("kv_grad:cp", P.KV_BLOCK, C.REDUCE_SCATTER, (A.CP,), L.SHARDED,
                                   "backward of the key/value all-gather: DTensor reduce-scatters the key/value "
                                   "gradients to their owners"))
        if plan.world_size > 1:
            axes = tuple(a for a in (A.DP_REPLICATE, A.DP_SHARD, A.CP, A.TP) if plan.size(a) > 1)
            updates.append(_update("metric:dp", P.SUFFICIENT_STATISTIC, C.ALL_REDUCE, axes, L.REPLICATED,
                                   "one float64 all-reduce per commit: loss sum, example/token counts, non-finite "
                                   "flag, squared grad norm"))
        if not updates:
            updates.append(DistributedUpdate(node_id="local", payload=P.GRADIENT, collective=C.NONE, mesh_axes=(),
                                             state_layout=L.REPLICATED, exact=True,
                                             notes=("single process: no communication",)))
        return tuple(updates)

    def _in_situ(self, module: nn.Module, plan: ParallelPlan, spec: PrepareSpec) -> Any:
        """The gate's in-situ certification for a launched run (``training_in_situ``): the harness's workload on
        these ranks through ``torch_native``'s harness adapter, plus the probe of ``module`` (copied, never
        touched) through this backend."""
        def probe() -> Any:
            return probe_module(self, module, plan, precision=spec.precision,
                                prepare_options={"device": spec.device,
                                                 "find_unused_parameters": spec.options.find_unused_parameters},
                                rank=current_rank())

        return in_situ_certifier(self.name, plan, spec.precision, device=spec.device, probe=probe,
                                 ensure_group=lambda: ensure_process_group(plan, spec.device))

    def prepare(self, module: nn.Module, *, plan: ParallelPlan, **options: Any) -> TorchDistributedSession:
        """Materialize the mesh, apply TP, CP, FSDP2/HSDP or DDP, build the optimizer, return a session.

        mixle's signature: the keywords become a ``TrainOptions`` at once (an unknown one is refused, and
        so is one only other backends honour, naming them). torch_native honours ``loss_fn``, ``optimizer``
        (a torch.optim class, its name or ``callable(params)``; AdamW by default), ``lr``, ``scheduler``
        (``callable(optimizer)``), ``max_grad_norm``, ``precision``, ``tp_plan``, ``device``, ``seed``,
        ``nonfinite``, ``admission``/``certificate``, the SDC audit's ``audit``, ``audit_rate``,
        ``audit_policy``, ``audit_bound``, ``audit_replay`` and ``fault_injector``, ``ledger`` and
        ``health``; docs/training.md says what each does.

        Every option is checked, and admission decided (``NotAdmittedError`` names the
        ``mixle-parallel certify`` command), before any process group, mesh or transform exists.
        ``ledger`` (a path or a ``verification.Ledger``) is written by rank 0 only (docs/training.md).
        """
        spec = check_prepare(module, plan, TrainOptions.from_keywords(self.name, options))
        decision = admit_training(self, plan, spec.precision, certificate=spec.options.certificate,
                                  admission=spec.options.admission, device=spec.device,
                                  auto_certify=self._in_situ(module, plan, spec),
                                  ensure_group=lambda: ensure_process_group(plan, spec.device))
        decision = probe_at_prepare(self, module, plan, spec.precision, spec.device, decision)
        mesh, owns_pg = _materialize_mesh(plan, spec)
        template = sharded_reference_template(module, plan, spec.mode, resolve_audit(spec.options.audit, plan,
                                                                                     spec.mode), spec.device)
        module = parallelize(module, mode=spec.mode, mesh=mesh, tp_styles=spec.tp_styles, device=spec.device,
                             find_unused_parameters=spec.options.find_unused_parameters)
        opt, receipt = build_optimizer(spec.options.optimizer, [p for p in module.parameters() if p.requires_grad],
                                       spec.options.lr)
        scheduler = _scheduler_for(spec.options.scheduler, opt)
        return TorchDistributedSession(
            module, plan=plan, capabilities=CAPABILITIES, mesh=mesh, device=spec.device, optimizer=opt,
            optimizer_receipt=receipt, parameter_layouts=describe_parameter_layouts(module, plan),
            precision=spec.precision, max_grad_norm=spec.options.max_grad_norm,
            scheduler=scheduler, options=spec.options,
            run=PreparedRun(admission=decision, owns_process_group=owns_pg, ledger=spec.ledger,
                            reference_template=template))


def _scheduler_for(factory: Any, optimizer: torch.optim.Optimizer) -> Any:
    """``scheduler=callable(optimizer)``'s result, which must have ``step()`` (a torch ``LRScheduler``)."""
    if factory is None:
        return None
    scheduler = factory(optimizer)
    if not callable(getattr(scheduler, "step", None)):
        raise TypeError(f"scheduler= must be callable(optimizer) returning an object with step() (e.g. "
                        f"lambda opt: torch.optim.lr_scheduler.StepLR(opt, 10)); it returned "
                        f"{type(scheduler).__name__}")
    return scheduler
