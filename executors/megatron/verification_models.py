"""The harness's plain reference models rebuilt with megatron-core's parallel layers, and their observables.

``megatron_model(plain, plan, workload)`` turns the workload's single-process module into what
``MegatronBackend.prepare`` runs for ``plan``: the ``nn.Sequential`` itself (pp, dp), a builder that
replaces each pair of ``nn.Linear`` layers by ``ColumnParallelLinear`` -> ``RowParallelLinear``
holding this tensor-parallel rank's slices of the plain weights (tp), or a builder of megatron's
``MoELayer`` holding the plain router and this expert-parallel rank's experts (ep). The result's
``parameters(stage)`` names every parameter this rank holds by the plain module's name, sharded
ones as DTensors over megatron's tensor-parallel group (the harness unshards them outside the
traced step), so the reference's full tensors are compared, never this rank's slices.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ...contracts import ParallelPlan
from .stages import DropBias

MOE_VERIFICATION_CONFIG = {"add_bias_linear": False, "moe_aux_loss_coeff": 0.0,
                           "moe_router_load_balancing_type": "none"}
"""MoE settings the reference MoE follows: top-k of the router logits, softmax over the k chosen, no aux loss."""


def group_mesh(group: Any, device_type: str = "cpu") -> Any:
    """A 1-D DeviceMesh over an existing process group (no new group is created)."""
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh.from_group(group, device_type)


def sharded(tensor: torch.Tensor, mesh: Any, dim: int) -> Any:
    """``tensor`` as this rank's ``Shard(dim)`` piece of a DTensor over ``mesh`` (whole on ``full_tensor()``)."""
    from torch.distributed.tensor import DTensor, Shard

    return DTensor.from_local(tensor, mesh, [Shard(dim)], run_check=False)


class MegatronModel:
    """What ``prepare()`` gets for one verification trial and how to name what it trains."""

    def __init__(self, module: Any, *, rename: Callable[[str], str | None], moe_config: dict[str, Any] | None = None,
                 ) -> None:
        self.module, self.moe_config, self._rename = module, moe_config, rename

    def parameters(self, stage: Any) -> dict[str, Any]:
        """``param/<plain name>`` of every parameter this rank holds (tensor-parallel shards as DTensors)."""
        from megatron.core import parallel_state as ps

        mesh = None
        out: dict[str, Any] = {}
        for name, param in stage.layers.named_parameters():
            plain = self._rename(name)
            if plain is None:
                continue
            value = param.detach().clone()
            if getattr(param, "tensor_model_parallel", False) and ps.get_tensor_model_parallel_world_size() > 1:
                mesh = mesh or group_mesh(ps.get_tensor_model_parallel_group(), value.device.type)
                value = sharded(value, mesh, int(getattr(param, "partition_dim")))  # noqa: B009 - megatron's attribute
            out[f"param/{plain}"] = value
        return out


def megatron_model(plain: nn.Sequential, plan: ParallelPlan, workload: Any) -> MegatronModel:
    """The megatron form of the workload's plain module for ``plan`` (see the module docstring)."""
    if plan.ep > 1:
        if getattr(workload, "experts", None) is None:
            raise ValueError(f"megatron verification of ep={plan.ep} runs a mixture-of-experts workload (the "
                             f"built-in 'moe'), not {getattr(workload, 'name', workload)!r}")
        return _moe_model(plain, plan, workload)
    if plan.tp > 1:
        if plan.pp > 1:
            raise ValueError(f"megatron verification runs tp={plan.tp} and pp={plan.pp} separately (the MLP "
                             "workload's tensor-parallel pair cannot be cut into stages); verify --plan tp=N and "
                             "--plan pp=N")
        return _tensor_parallel_model(plain)
    return MegatronModel(plain, rename=lambda name: name)


# ---- tensor parallelism ------------------------------------------------------------------------
def _linear_pairs(plain: nn.Sequential) -> list[int]:
    linears = [i for i, layer in enumerate(plain) if isinstance(layer, nn.Linear)]
    if not linears or len(linears) % 2:
        raise ValueError(f"tensor-parallel verification needs an even number of nn.Linear layers (column-parallel, "
                         f"then row-parallel), the workload's module has {len(linears)}")
    return linears


def _tensor_parallel_model(plain: nn.Sequential) -> MegatronModel:
    linears = _linear_pairs(plain)

    def build(config: Any) -> nn.Sequential:
        from megatron.core import parallel_state as ps
        from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

        rank, size = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
        layers: list[nn.Module] = []
        layer: Any
        for i, layer in enumerate(plain):
            if i not in linears:
                layers.append(layer)
                continue
            column = linears.index(i) % 2 == 0
            kind = ColumnParallelLinear if column else RowParallelLinear
            extra = {"gather_output": False} if column else {"input_is_parallel": True, "skip_bias_add": False}
            parallel = kind(layer.in_features, layer.out_features, config=config, init_method=nn.init.zeros_,
                            bias=layer.bias is not None, **extra)
            dim = 0 if column else 1
            with torch.no_grad():
                parallel.weight.copy_(layer.weight.chunk(size, dim=dim)[rank])
                if layer.bias is not None:  # a column layer's bias is sharded, a row layer's is whole
                    parallel.bias.copy_(layer.bias.chunk(size)[rank] if column else layer.bias)
            layers.append(DropBias(parallel))
        return nn.Sequential(*layers)

    return MegatronModel(build, rename=lambda name: name.replace(".layer.", ".", 1))


# ---- expert parallelism ------------------------------------------------------------------------
class MoEStage(nn.Module):
    """megatron-core's MoELayer (SequentialMLP experts, TopKRouter) on ``(batch, hidden)`` tokens."""

    def __init__(self, config: Any, experts: int) -> None:
        super().__init__()
        from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
        from megatron.core.transformer.spec_utils import build_module

        self.moe = build_module(get_moe_module_spec(use_te=False, num_experts=experts), config=config)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Route, dispatch, run the experts and combine; megatron's (seq, batch, hidden) with seq = 1."""
        out, bias = self.moe(hidden.unsqueeze(0))
        return (out if bias is None else out + bias).squeeze(0)


def _moe_model(plain: nn.Sequential, plan: ParallelPlan, workload: Any) -> MegatronModel:
    experts, local = int(workload.experts), int(workload.experts) // plan.ep
    if len(plain) != 1 or not hasattr(plain[0], "router"):
        raise ValueError("the mixture-of-experts workload's module must be nn.Sequential(<moe with router, experts>)")
    reference: Any = plain[0]

    def build(config: Any) -> nn.Sequential:
        from megatron.core import parallel_state as ps

        stage: Any = MoEStage(config, experts)
        first = ps.get_expert_model_parallel_rank() * local
        with torch.no_grad():
            stage.moe.router.weight.copy_(reference.router.weight)
            for i, expert in enumerate(stage.moe.experts.local_experts):
                up, down = reference.experts[first + i][0], reference.experts[first + i][2]
                expert.linear_fc1.weight.copy_(up.weight)
                expert.linear_fc2.weight.copy_(down.weight)
        return nn.Sequential(stage)

    def rename(name: str) -> str | None:
        from megatron.core import parallel_state as ps

        if name == "0.moe.router.weight":
            return "0.router.weight"
        parts = name.split(".")  # 0.moe.experts.local_experts.<i>.linear_fc<1|2>.weight
        if parts[2:4] != ["experts", "local_experts"]:
            raise ValueError(f"unexpected megatron MoE parameter {name!r}; the verification MoE has a router and "
                             "SequentialMLP experts only")
        index = ps.get_expert_model_parallel_rank() * local + int(parts[4])
        return f"0.experts.{index}.{0 if parts[5] == 'linear_fc1' else 2}.weight"

    config = {**MOE_VERIFICATION_CONFIG, "num_moe_experts": experts, "moe_router_topk": int(workload.topk),
              "ffn_hidden_size": int(workload.ffn)}
    return MegatronModel(build, rename=rename, moe_config=config)
