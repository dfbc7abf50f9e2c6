"""megatron under the verification harness protocol (``contracts.VerifiableExecutor``).

``VerifiableMegatron`` has the megatron backend's capabilities, version and declared updates, so a
certificate from its evidence admits ``MegatronBackend``. Its trials run the workload's plain module
in megatron's form for the plan (``verification_models.megatron_model``: the ``nn.Sequential`` cut
into ``pp`` stages, megatron's column/row-parallel linears for ``tp``, megatron's ``MoELayer`` for
``ep``) through ``prepare()`` with megatron's SGD without momentum (the workload's optimizer) and
report, per declared update: for ``metric:*`` the shared loss; for every other update the parameters
this rank holds after each step under the plain module's names (tensor-parallel shards unsharded,
experts by their global index, stages by their global layer index), plus, on the last stage, the
model output of the step's whole global batch (this replica's rows, gathered over data parallelism).
A plan with ``gradient_accumulation_steps=k`` trains each step's local batch as k calls (the harness's
accumulation window). The reference is the harness's plain single-process torch loop.
"""

from __future__ import annotations

from typing import Any

import torch

from ...contracts import ParallelPlan, PayloadKind
from ..torch.harness_adapter import BackendVerifiable
from .backend import MegatronBackend
from .verification_models import MegatronModel, group_mesh, megatron_model, sharded


class VerifiableMegatron(BackendVerifiable):
    """megatron as the harness sees it: same identity and declarations, trials via ``prepare()``."""

    def __init__(self, backend: MegatronBackend | None = None) -> None:
        super().__init__(backend or MegatronBackend())

    def megatron_model(self, plain: torch.nn.Sequential, plan: ParallelPlan, workload: Any) -> MegatronModel:
        """The megatron form of the workload's module for ``plan`` (``verification_models.megatron_model``)."""
        return megatron_model(plain, plan, workload)

    def open_trial(self, workload: Any, plan: ParallelPlan, *, precision: str, seed: int, rank: int,
                   world_size: int) -> MegatronTrial:
        """A prepared megatron session for ``workload`` on this rank."""
        return MegatronTrial(self, workload, plan, precision=precision, seed=seed, rank=rank)


class MegatronTrial:
    """One prepared megatron session driven step by step by the harness."""

    def __init__(self, executor: VerifiableMegatron, workload: Any, plan: ParallelPlan, *, precision: str,
                 seed: int, rank: int) -> None:
        plain = workload.build_module(seed)
        if not isinstance(plain, torch.nn.Sequential) or not hasattr(workload, "hidden"):
            raise ValueError(f"megatron verification runs an nn.Sequential workload with a 'hidden' width (the "
                             f"built-in 'mlp' or 'moe'), not {getattr(workload, 'name', workload)!r}")
        self.workload, self.plan, self.seed, self.rank = workload, plan, seed, rank
        self.updates = executor.describe_updates(plan)
        self.model = executor.megatron_model(plain, plan, workload)
        self.session = executor._backend.prepare(
            self.model.module, plan=plan, loss_fn=workload.loss, activation_shape=(workload.hidden,),
            optimizer="sgd", lr=workload.lr, sgd_momentum=0.0, precision=precision, seed=seed,
            moe_config=self.model.moe_config)
        self._outputs: list[torch.Tensor] = []
        if self.session.stage.post_process:
            self.session.stage.register_forward_hook(lambda _m, _i, out: self._outputs.append(out.detach().clone()))

    def _output(self) -> dict[str, Any]:
        """The step's model output on the last stage: this replica's rows, a DTensor over data parallelism."""
        from megatron.core import parallel_state as ps

        if not self._outputs:
            return {}
        local = torch.cat(self._outputs)
        self._outputs = []
        if self.plan.data_parallel_size == 1:
            return {"output": local}
        return {"output": sharded(local, group_mesh(ps.get_data_parallel_group(), local.device.type), 0)}

    def step(self, step: int) -> dict[str, dict[str, Any]]:
        """Train on this data-parallel replica's shard of the step's global batch; observables per update."""
        inputs, targets = self.workload.local_batch(step, self.seed, self.plan, self.rank)
        calls = self.plan.gradient_accumulation_steps  # the accumulation window: calls - 1 non-commit, then a commit
        pieces = zip(torch.tensor_split(inputs, calls), torch.tensor_split(targets, calls))
        receipt = [self.session.train_batch(x, y) for x, y in pieces][-1]
        if receipt.skipped:
            raise RuntimeError(f"megatron skipped step {step} during verification: {dict(receipt.extra)}")
        trained = {**self.model.parameters(self.session.stage), **self._output()}
        loss = {"loss": torch.tensor(receipt.loss, dtype=torch.float32)}
        return {u.node_id: loss if u.payload is PayloadKind.MESSAGE else trained for u in self.updates}

    def close(self) -> None:
        """Tear down megatron's parallel state (the harness owns the process group)."""
        self.session.close()
