"""TorchDistributedBackend (``torch_native``): DeviceMesh, TP, CP, FSDP2/HSDP or DDP for any nn.Module."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import torch
import torch.distributed as dist
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
from ...verification.admission import AdmissionDecision, require_admission
from ...verification.sdc.schedule import AUDIT_POLICIES, DEFAULT_AUDIT_RATE
from .comm_taps import install_taps
from .device_mesh import (
    axis_mesh,
    build_mesh,
    ensure_process_group,
    require_torch,
    resolve_device,
)
from .dp_mode import DataParallelMode
from .health import SessionHealth, resolve_health
from .layouts import describe_parameter_layouts, unwrap
from .losses import lm_token_loss
from .parallelize import parallelize, resolve_tp_plan
from .sdc_audit import AUDIT_REPLAYS, audit_supported
from .session import TorchDistributedSession

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

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
class _PrepareSpec:
    """What the plan check decided, before admission and before any process group exists."""

    mode: DataParallelMode
    tp_styles: dict[str, Any]
    device: torch.device
    audit: dict[str, Any] | None


def _check_prepare_inputs(module: Any, plan: Any, precision: str, max_grad_norm: float | None,
                          nonfinite: str) -> None:
    """``prepare``'s argument checks, before anything is built or any process group exists."""
    if not isinstance(plan, ParallelPlan):
        raise TypeError(f"plan must be a ParallelPlan, got {type(plan).__name__}")
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    require_torch()
    CAPABILITIES.validate(plan, precision=precision)
    if max_grad_norm is not None and not max_grad_norm > 0:
        raise ValueError(f"max_grad_norm must be > 0 or None, got {max_grad_norm}")
    if nonfinite not in ("raise", "skip"):
        raise ValueError(f"nonfinite must be 'raise' or 'skip', got {nonfinite!r}")


def _materialize_mesh(plan: ParallelPlan, spec: _PrepareSpec, seed: int | None) -> tuple[DeviceMesh | None, bool]:
    """Seed, the process group (created from the torchrun environment when none exists) and the DeviceMesh."""
    if seed is not None:
        torch.manual_seed(seed)
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

    def prepare(
        self,
        module: nn.Module,
        *,
        plan: ParallelPlan,
        loss_fn: Callable[..., Any] | None = None,
        optimizer: Any = "AdamW",
        lr: float = 1e-3,
        scheduler: Callable[[torch.optim.Optimizer], Any] | None = None,
        max_grad_norm: float | None = None,
        precision: str = "fp32",
        tp_plan: dict[str, Any] | None = None,
        device: Any = None,
        seed: int | None = None,
        nonfinite: str = "raise",
        admission: Any = None,
        certificate: Any = None,
        audit: bool | None = None,
        audit_rate: float = DEFAULT_AUDIT_RATE,
        audit_policy: str = "warn",
        audit_bound: float = 0.0,
        audit_replay: str = "peer",
        fault_injector: Any = None,
        ledger: Any = None,
        health: Any = None,
    ) -> TorchDistributedSession:
        """Materialize the mesh, apply TP, CP, FSDP2/HSDP or DDP, build the optimizer, return a session.

        Admission: on a real device mesh (world size > 1 or an accelerator) the run needs a signed
        certificate (passed as ``certificate``/``admission=``, named by ``MIXLE_PARALLEL_CERTIFICATE``,
        or found in the local store) that passes every gate check, else ``NotAdmittedError`` (naming
        the ``mixle-parallel certify`` command) is raised before any process group, mesh or transform
        exists; ``admission="unverified"`` runs anyway and every receipt says so.

        SDC audit (``audit``: None = on where supported, True = required, False = off): at
        ``audit_rate`` (plus the first step) a step's local gradient is recomputed by a peer of its
        data-parallel group from the shipped batch and RNG state (and on the same rank when a peer
        disagreed or none exists; ``audit_replay="both"``: on every audited step) before
        ``optimizer.step()``; ``audit_policy`` is 'warn', 'raise' or 'skip_step';
        ``audit_bound`` is the allowed max abs difference (0 = bitwise). ``fault_injector`` (a
        ``verification.FaultInjector``) strikes planned bit flips in gradients (before reduction) or
        parameters (at the start of a step). ``ledger`` (a ``verification.Ledger``) receives run_start,
        every receipt, audit records, checkpoint events and run_end.

        Health (``health``: None/True = on with ``HealthOptions()`` defaults, False = off, a
        ``HealthOptions`` or a dict of its fields): every committed receipt carries
        ``extra["health"]`` (step time, tokens/s, MFU against ``peak_flops_per_sec`` or a measured
        matmul peak, per-rank step times with the straggler named, loss/grad-norm anomalies); on a
        multi-rank mesh a heartbeat through the process group's store finds a dead or hung rank.
        """
        spec = _plan_check(module, plan, precision=precision, max_grad_norm=max_grad_norm, nonfinite=nonfinite,
                           tp_plan=tp_plan, device=device, audit=(audit, audit_rate, audit_policy, audit_bound,
                                                                  seed, audit_replay))
        health_options = resolve_health(health)
        decision = self._admission_gate(plan, precision, admission, certificate, spec.device)
        mesh, owns_pg = _materialize_mesh(plan, spec, seed)
        module = parallelize(module, mode=spec.mode, mesh=mesh, tp_styles=spec.tp_styles, device=spec.device)
        # DDP keeps its built-in all-reduce; the audit or a fault injector arms local-gradient hooks
        # only on the steps that need them
        tap = install_taps(module, plan, spec.mode,
                           gradient_access=spec.audit is not None or fault_injector is not None)
        opt, receipt = build_optimizer(optimizer, [p for p in module.parameters() if p.requires_grad], lr)
        monitor = None if health_options is None else SessionHealth(
            health_options, module=unwrap(module), device=spec.device,
            rank=dist.get_rank() if dist.is_initialized() else 0, world_size=plan.world_size)
        session = TorchDistributedSession(
            module, plan=plan, capabilities=CAPABILITIES, mesh=mesh, device=spec.device, optimizer=opt,
            optimizer_receipt=receipt, parameter_layouts=describe_parameter_layouts(module, plan),
            precision=precision, max_grad_norm=max_grad_norm,
            scheduler=scheduler(opt) if scheduler is not None else None, loss_fn=loss_fn or lm_token_loss,
            dp_mode=spec.mode,
            cp_mesh=axis_mesh(mesh, A.CP) if plan.cp > 1 else None, nonfinite=nonfinite,
            admission=decision, owns_process_group=owns_pg, tap=tap, ledger=ledger,
            audit=None if spec.audit is None else {**spec.audit, "injector": fault_injector},
            health=monitor,
        )
        _ledger_run_start(ledger, self.name, plan, precision, decision, spec.audit)
        return session

    def _admission_gate(
        self, plan: ParallelPlan, precision: str, admission: Any, certificate: Any, device: torch.device
    ) -> AdmissionDecision:
        """The admission gate: runs before any process group, mesh, transform or optimizer is built."""
        return require_admission(
            self,
            plan,
            precision,
            certificate=certificate,
            admission=admission,
            world_size=plan.world_size,
            device_kind=device.type,
            comm_backend="nccl" if device.type == "cuda" else "gloo",
        )


def _plan_check(module: Any, plan: Any, *, precision: str, max_grad_norm: float | None, nonfinite: str,
                tp_plan: dict[str, Any] | None, device: Any, audit: tuple[Any, ...]) -> _PrepareSpec:
    """Step 1 of ``prepare``: every argument, the plan, the TP plan against the model and the audit options,
    checked before admission and before any collective."""
    _check_prepare_inputs(module, plan, precision, max_grad_norm, nonfinite)
    mode = DataParallelMode.for_plan(plan)
    audit_options = _audit_options(plan, mode, *audit)
    styles = resolve_tp_plan(module, tp_plan, plan.tp)
    return _PrepareSpec(mode=mode, tp_styles=styles, device=resolve_device(device), audit=audit_options)


def _ledger_run_start(ledger: Any, executor: str, plan: ParallelPlan, precision: str, decision: AdmissionDecision,
                      audit: dict[str, Any] | None) -> None:
    """The ledger's run_start entry (when a ledger is given): plan, certificate link, admission mode, audit."""
    if ledger is None:
        return
    audit_extra = {k: v for k, v in (audit or {}).items() if k != "enabled"}
    ledger.run_start(plan=plan, certificate=decision.envelope or decision.ledger_link, executor=executor, extra={
        "precision": precision, "admission": decision.mode,
        "rank": dist.get_rank() if dist.is_initialized() else 0, "audit": audit_extra})


def _audit_options(
    plan: ParallelPlan,
    mode: DataParallelMode,
    audit: bool | None,
    rate: float,
    policy: str,
    bound: float,
    seed: int | None,
    replay: str = "peer",
) -> dict[str, Any] | None:
    """The SessionAudit options, None when the audit is off; raises for a bad option or an unsupported plan."""
    if audit not in (None, True, False):
        raise ValueError(f"audit must be None (on where supported), True or False, got {audit!r}")
    if policy not in AUDIT_POLICIES:
        raise ValueError(f"audit_policy={policy!r}; allowed: {list(AUDIT_POLICIES)}")
    if not 0.0 <= float(rate) <= 1.0:
        raise ValueError(f"audit_rate={rate} must be within [0, 1] (the first step is always audited)")
    if not float(bound) >= 0.0:
        raise ValueError(f"audit_bound={bound} must be >= 0 (0 = bitwise)")
    if replay not in AUDIT_REPLAYS:
        raise ValueError(
            f"audit_replay={replay!r}; allowed: {list(AUDIT_REPLAYS)} ('peer': a peer recomputes, "
            "the same rank on a disagreement; 'both': both on every audited step)"
        )
    if audit is False:
        return None
    reason = audit_supported(plan, mode)
    if reason is not None:
        if audit:
            raise ValueError(f"audit=True but {reason}")
        return None
    return {"rate": float(rate), "policy": policy, "bound": float(bound), "seed": int(seed or 0), "replay": replay}
