"""megatron under the verification harness protocol (``contracts.VerifiableExecutor``).

``VerifiableMegatron`` has the megatron backend's capabilities, version and declared updates, so a
certificate from its evidence admits ``MegatronBackend``. Its trials run the harness's MLP workload
(an ``nn.Sequential``, cut into ``pp`` stages) through ``prepare()`` with megatron's SGD without
momentum (the workload's optimizer) and report, per declared update: for ``act:pp`` (activations
forward, their gradients backward) the parameters of this rank's stage after each step, under their
global layer names, so the reference's full model covers every stage; for ``metric:pp`` and
``metric:dp`` the shared loss; for ``grad:dp`` the same stage parameters (they move only by the
averaged gradient). The reference is the harness's plain single-process torch loop.
"""

from __future__ import annotations

from typing import Any

import torch

from mixle_parallel.contracts import ParallelPlan, PayloadKind
from mixle_parallel.executors.megatron.backend import MegatronBackend
from mixle_parallel.executors.torch.verifiable import BackendVerifiable


class VerifiableMegatron(BackendVerifiable):
    """megatron as the harness sees it: same identity and declarations, trials via ``prepare()``."""

    def __init__(self, backend: MegatronBackend | None = None) -> None:
        super().__init__(backend or MegatronBackend())

    def open_trial(self, workload: Any, plan: ParallelPlan, *, precision: str, seed: int, rank: int,
                   world_size: int) -> MegatronTrial:
        """A prepared megatron session for ``workload`` on this rank."""
        return MegatronTrial(self._backend, workload, plan, precision=precision, seed=seed, rank=rank)


class MegatronTrial:
    """One prepared megatron session driven step by step by the harness."""

    def __init__(self, backend: MegatronBackend, workload: Any, plan: ParallelPlan, *, precision: str, seed: int,
                 rank: int) -> None:
        module = workload.build_module(seed)
        if not isinstance(module, torch.nn.Sequential) or not hasattr(workload, "hidden"):
            raise ValueError(f"megatron verification runs an nn.Sequential workload with a 'hidden' width (the "
                             f"built-in 'mlp'), not {getattr(workload, 'name', workload)!r}")
        self.workload, self.plan, self.seed, self.rank = workload, plan, seed, rank
        self.updates = backend.describe_updates(plan)
        self.session = backend.prepare(module, plan=plan, loss_fn=workload.loss, activation_shape=(workload.hidden,),
                                       optimizer="sgd", lr=workload.lr, sgd_momentum=0.0, precision=precision,
                                       seed=seed)

    def step(self, step: int) -> dict[str, dict[str, Any]]:
        """Train on this data-parallel replica's shard of the step's global batch; observables per update."""
        inputs, targets = self.workload.local_batch(step, self.seed, self.plan, self.rank)
        receipt = self.session.train_batch(inputs, targets)
        if receipt.skipped:
            raise RuntimeError(f"megatron skipped step {step} during verification: {dict(receipt.extra)}")
        params = {f"param/{name}": p.detach().clone() for name, p in self.session.stage.layers.named_parameters()}
        loss = {"loss": torch.tensor(receipt.loss, dtype=torch.float32)}
        return {u.node_id: loss if u.payload is PayloadKind.MESSAGE else params for u in self.updates}

    def close(self) -> None:
        """Tear down megatron's parallel state (the harness owns the process group)."""
        self.session.close()
