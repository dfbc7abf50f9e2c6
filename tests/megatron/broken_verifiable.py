"""Megatron verification targets with one realistic parallelism bug each; the harness must refuse them.

Module-level classes so the harness's spawned gloo ranks import them by ``module:attr``.
"""

from __future__ import annotations

from typing import Any

import torch

from mixle_parallel.contracts import ParallelPlan
from mixle_parallel.executors.megatron.harness_adapter import VerifiableMegatron
from mixle_parallel.executors.megatron.verification_models import MegatronModel


class _LocalRowLinear(torch.nn.Module):
    """A row-parallel layer's local matmul with its output all-reduce left out (each rank keeps a partial sum)."""

    def __init__(self, wrapped: torch.nn.Module) -> None:
        super().__init__()
        self.layer = wrapped.layer  # the RowParallelLinear's own parameters, names unchanged

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(hidden, self.layer.weight, self.layer.bias)


class RowParallelWithoutAllReduce(VerifiableMegatron):
    """tp: the RowParallelLinear's output all-reduce is skipped."""

    def megatron_model(self, plain: torch.nn.Sequential, plan: ParallelPlan, workload: Any) -> MegatronModel:
        model = super().megatron_model(plain, plan, workload)
        build = model.module

        def broken(config: Any) -> torch.nn.Sequential:
            from megatron.core.tensor_parallel import RowParallelLinear

            layers = build(config)
            return torch.nn.Sequential(*(_LocalRowLinear(layer) if isinstance(getattr(layer, "layer", None),
                                                                                RowParallelLinear) else layer
                                         for layer in layers))

        model.module = broken
        return model


class ExpertGradientsSummed(VerifiableMegatron):
    """ep: expert gradients are summed over the data-parallel replicas instead of averaged."""

    def megatron_model(self, plain: torch.nn.Sequential, plan: ParallelPlan, workload: Any) -> MegatronModel:
        model = super().megatron_model(plain, plan, workload)
        build, replicas = model.module, float(plan.data_parallel_size)

        def broken(config: Any) -> torch.nn.Sequential:
            layers = build(config)
            for name, param in layers.named_parameters():
                if ".experts." in name:
                    param.register_hook(lambda grad: grad * replicas)
            return layers

        model.module = broken
        return model
