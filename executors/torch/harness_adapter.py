"""torch_native under the verification harness protocol (``contracts.VerifiableExecutor``).

``VerifiableTorchNative`` has torch_native's capabilities, version and declared updates, so a
certificate issued from its evidence admits ``TorchDistributedBackend``; its trials build a real
session with ``prepare()`` (mesh, TP, FSDP2/HSDP or DDP, the exact global-mean commit) and report,
per declared update, the tensor that update produces: ``grad:*`` the committed, unsharded global
gradients (captured inside ``optimizer.step``, after the commit's scaling); ``param:*`` the forward
outputs of the FSDP2 modules (what the all-gathered parameters computed); ``act:tp`` the outputs of
the TP layers; ``kv:cp`` the outputs of the workload's attention modules; ``metric:dp`` the reduced
global loss and target count. A plan with ``gradient_accumulation_steps=k`` trains each step's local batch as k calls.
Sharded values are returned as DTensors or deferred unshardings; the harness unshards them outside
the traced step.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel

from ...contracts import DistributedUpdate, ParallelPlan, PayloadKind
from .backend import TorchDistributedBackend
from .forward_capture import SHARDED_FEATURE_STYLES, ForwardCapture, expand_paths
from .layouts import unwrap


class BackendVerifiable:
    """A training backend as the harness sees it: the backend's identity, capabilities, declared updates
    and ``prepare()``, delegated unchanged, so a certificate from its evidence admits the backend itself.
    Subclasses add ``open_trial``."""

    verification_launch = "gloo"

    def __init__(self, backend: Any) -> None:
        self._backend = backend

    @property
    def capabilities(self) -> Any:
        """The backend's capabilities (certificates bind them)."""
        return self._backend.capabilities

    @property
    def version(self) -> str:
        """The backend's version (certificates bind it)."""
        return str(self._backend.version)

    def describe_updates(self, plan: ParallelPlan) -> tuple[DistributedUpdate, ...]:
        """The backend's declared updates for ``plan``."""
        return tuple(self._backend.describe_updates(plan))

    @property
    def certified_libraries(self) -> tuple[str, ...]:
        """The engines the backend loads (megatron-core, ...): a certificate names their versions, as the gate
        checks for the backend itself."""
        return tuple(getattr(self._backend, "certified_libraries", ()) or ())

    def prepare(self, module: Any, *, plan: ParallelPlan, **kwargs: Any) -> Any:
        """The backend's own ``prepare()`` (the conformance suite checks what it refuses)."""
        return self._backend.prepare(module, plan=plan, **kwargs)


class VerifiableTorchNative(BackendVerifiable):
    """torch_native as the harness sees it: same identity and declarations, trials via ``prepare()``."""

    def __init__(self, backend: TorchDistributedBackend | None = None) -> None:
        super().__init__(backend or TorchDistributedBackend())

    def open_trial(self, workload: Any, plan: ParallelPlan, *, precision: str, seed: int, rank: int,
                   world_size: int) -> TorchNativeTrial:
        """A prepared session for ``workload`` on this rank."""
        return TorchNativeTrial(self._backend, workload, plan, precision=precision, seed=seed, rank=rank)


def features_sharded(style: Any) -> bool:
    """True when a tp_plan style's layer hands on its slice of the last dimension (column-wise, local output)."""
    if isinstance(style, str):
        return style in SHARDED_FEATURE_STYLES
    return (isinstance(style, ColwiseParallel) and bool(getattr(style, "use_local_output", True))
            and any(isinstance(p, Shard) for p in getattr(style, "output_layouts", ())))


class TorchNativeTrial:
    """One prepared torch_native session driven step by step by the harness."""

    def __init__(self, backend: TorchDistributedBackend, workload: Any, plan: ParallelPlan, *, precision: str,
                 seed: int, rank: int, tp_plan: dict[str, Any] | None = None) -> None:
        self.workload, self.plan, self.seed, self.rank = workload, plan, seed, rank
        self.updates = backend.describe_updates(plan)
        self._grads: dict[int, Any] = {}
        self._receipts: list[Any] = []
        module = workload.build_module(seed)
        planned = workload.tp_plan() if plan.tp > 1 and hasattr(workload, "tp_plan") else None
        tp_plan = tp_plan if tp_plan is not None and planned is not None else planned

        def loss_fn(m: Any, x: Any, y: Any) -> tuple[Any, Any]:
            count = y.numel()  # workloads' losses are means over every target element
            return workload.loss(m(x), y) * count, torch.tensor(count)

        def optimizer(params: Any) -> Any:
            opt = workload.make_optimizer(params)
            step = opt.step

            def capturing_step(*args: Any, **kwargs: Any) -> Any:
                self._grads = {id(p): p.grad.detach().clone() for g in opt.param_groups for p in g["params"]
                               if p.grad is not None}
                return step(*args, **kwargs)

            opt.step = capturing_step
            return opt

        # audit=False: the harness measures the update itself; audit replays would add collectives to the trace
        self.session = backend.prepare(module, plan=plan, loss_fn=loss_fn, optimizer=optimizer, precision=precision,
                                       tp_plan=tp_plan, seed=seed, audit=False)
        self._names = {id(p): n.removeprefix("module.") for n, p in self.session.module.named_parameters()}
        root = unwrap(self.session.module)
        self._gathered = [n for n, m in root.named_modules() if isinstance(m, FSDPModule)]
        self._tp_layers = {p: features_sharded(style) for pattern, style in (planned or {}).items()
                           for p in expand_paths(root, [pattern])}
        attention = getattr(workload, "attention_paths", None)
        self._attention = expand_paths(root, attention()) if callable(attention) else [""]
        wanted = {p: False for p in (*self._gathered, *self._attention)}
        self.capture = ForwardCapture(self.session, {**wanted, **self._tp_layers})

    def _train(self, inputs: Any, targets: Any, step: int) -> Any:
        """The step's local batch as ``gradient_accumulation_steps`` calls; the last one commits."""
        calls = self.plan.gradient_accumulation_steps
        pieces = zip(torch.tensor_split(inputs, calls), torch.tensor_split(targets, calls)) if calls > 1 else [
            (inputs, targets)]
        self._receipts = [self.session.train_batch(x, y) for x, y in pieces]
        receipt = self._receipts[-1]
        if receipt.skipped:
            raise RuntimeError(f"torch_native skipped step {step} during verification: {dict(receipt.extra)}")
        return receipt

    def step(self, step: int) -> dict[str, dict[str, Any]]:
        """Train on this rank's shard of the step's global batch; per declared update the tensor it produces."""
        inputs, targets = self.workload.local_batch(step, self.seed, self.plan, self.rank)
        self.capture.begin_step()
        receipt = self._train(inputs, targets, step)
        grads = {f"grad/{self._names[key]}": g for key, g in self._grads.items()}
        out: dict[str, dict[str, Any]] = {}
        for update in self.updates:
            if update.node_id == "metric:dp":
                out[update.node_id] = {"loss": torch.tensor(receipt.loss, dtype=torch.float64),
                                       "count": torch.tensor(float(receipt.global_tokens_observed or 0))}
            elif update.payload is PayloadKind.GRADIENT:
                out[update.node_id] = grads
            elif update.payload is PayloadKind.PARAMETER:
                out[update.node_id] = self.capture.observables(self._gathered)
            elif update.payload is PayloadKind.ACTIVATION:
                out[update.node_id] = self.capture.observables(self._tp_layers)
            elif update.payload is PayloadKind.KV_BLOCK:
                out[update.node_id] = self.capture.observables(self._attention)
            else:
                raise ValueError(f"no observable for torch_native update {update.node_id!r} ({update.payload.value})")
        return out

    def receipts(self) -> list[Any]:
        """The StepReceipts the session issued during the last step (the harness checks them against the wire)."""
        return list(self._receipts)

    def close(self) -> None:
        """Release the session (the harness owns the process group); gradients a failed step left pending are
        dropped first, so ``close`` (which refuses pending gradients) never hides that step's error."""
        self.capture.close()
        if self.session.pending_accumulation:
            self.session.discard_accumulation()
        self.session.close()
