"""torch_native under the verification harness protocol (``contracts.VerifiableExecutor``).

``VerifiableTorchNative`` has torch_native's capabilities, version and declared updates, so a
certificate issued from its evidence admits ``TorchDistributedBackend``; its trials build a real
session with ``prepare()`` (mesh, TP, FSDP2/HSDP or DDP, the exact global-mean commit) and report,
per declared update, the committed global gradients (captured inside ``optimizer.step``, after
the commit's scaling) and the parameters after the step, plus the global loss for ``metric:dp``.
Sharded values are returned as DTensors; the harness unshards them outside the traced step.
"""

from __future__ import annotations

from typing import Any

import torch

from mixle_parallel.contracts import DistributedUpdate, ParallelPlan, PayloadKind
from mixle_parallel.executors.torch.backend import TorchDistributedBackend


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


class TorchNativeTrial:
    """One prepared torch_native session driven step by step by the harness."""

    def __init__(self, backend: TorchDistributedBackend, workload: Any, plan: ParallelPlan, *, precision: str,
                 seed: int, rank: int) -> None:
        self.workload, self.plan, self.seed, self.rank = workload, plan, seed, rank
        self.updates = backend.describe_updates(plan)
        self._grads: dict[int, Any] = {}
        module = workload.build_module(seed)
        tp_plan = workload.tp_plan() if plan.tp > 1 and hasattr(workload, "tp_plan") else None

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

    def step(self, step: int) -> dict[str, dict[str, Any]]:
        """Train on this rank's shard of the step's global batch; observables per declared update."""
        inputs, targets = self.workload.local_batch(step, self.seed, self.plan, self.rank)
        receipt = self.session.train_batch(inputs, targets)
        if receipt.skipped:
            raise RuntimeError(f"torch_native skipped step {step} during verification: {dict(receipt.extra)}")
        grads = {f"grad/{self._names[key]}": g for key, g in self._grads.items()}
        params = {f"param/{n.removeprefix('module.')}": p.detach().clone()
                  for n, p in self.session.module.named_parameters()}
        loss = {"loss": torch.tensor(receipt.loss, dtype=torch.float64)}
        out: dict[str, dict[str, Any]] = {}
        for update in self.updates:
            if update.node_id == "metric:dp":
                out[update.node_id] = loss
            elif update.payload is PayloadKind.GRADIENT:
                out[update.node_id] = grads
            else:
                out[update.node_id] = {**grads, **params}
        return out

    def close(self) -> None:
        """Release the session (the harness owns the process group)."""
        self.session.close()
