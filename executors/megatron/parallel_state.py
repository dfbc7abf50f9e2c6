"""ParallelPlan -> megatron-core parallel_state: sizes, rank order checks, declared updates.

The plan's rank order (pp, dp_replicate, dp_shard, cp, tp; tp fastest) is megatron-core's
default order ``"tp-cp-ep-dp-pp"`` read from the other end, so megatron's tensor-, context-,
data- and pipeline-parallel ranks equal the plan's coordinate on every rank. Megatron's
expert groups are cut from the (tp, cp, dp) domain with ``expert_tensor_parallel_size``
ranks fastest; they agree with the plan's ep groups (blocks of ``ep`` ranks of a data-parallel
group) exactly when ``etp == tp`` and ``cp == 1`` — other ep layouts are rejected here.
Only this module's functions that start with ``initialize`` or ``megatron_`` touch megatron.
"""

from __future__ import annotations

from typing import Any

from ...contracts import (
    CapabilityError,
    CollectiveKind,
    DistributedUpdate,
    MeshCoordinate,
    ParallelAxis,
    ParallelPlan,
    PayloadKind,
    StateLayout,
)

MEGATRON_ORDER = "tp-cp-ep-dp-pp"


def layout_problems(plan: ParallelPlan) -> tuple[str, ...]:
    """Reasons megatron-core would place ``plan``'s ranks differently from the plan (empty: agrees)."""
    found = []
    if plan.ep > 1 and plan.etp != plan.tp:
        found.append(
            f"ep={plan.ep} with etp={plan.etp} != tp={plan.tp}: megatron cuts expert groups across the "
            "leftover tensor-parallel ranks, not from the plan's data-parallel groups; set etp=tp"
        )
    if plan.ep > 1 and plan.cp > 1:
        found.append(
            f"ep={plan.ep} with cp={plan.cp}: megatron's expert groups span context-parallel ranks, "
            "the plan's span data-parallel ranks only; set cp=1 for expert parallelism"
        )
    return tuple(found)


def check_layout(plan: ParallelPlan) -> None:
    """Raise CapabilityError when megatron's rank placement would disagree with the plan's."""
    found = layout_problems(plan)
    if found:
        raise CapabilityError("; ".join(found))


def megatron_sizes(plan: ParallelPlan) -> dict[str, Any]:
    """Keyword arguments for ``parallel_state.initialize_model_parallel`` from the plan."""
    check_layout(plan)
    return {
        "tensor_model_parallel_size": plan.tp,
        "pipeline_model_parallel_size": plan.pp,
        "context_parallel_size": plan.cp,
        "expert_model_parallel_size": plan.ep,
        "expert_tensor_parallel_size": plan.etp,
        # HSDP: the distributed optimizer shards over dp_shard inside each dp_replicate replica.
        "num_distributed_optimizer_instances": plan.dp_replicate if plan.dp_shard > 1 else 1,
        "order": MEGATRON_ORDER,
    }


def megatron_rank_generator_coordinate(plan: ParallelPlan, rank: int) -> MeshCoordinate:
    """The coordinate megatron's own ``RankGenerator`` gives ``rank`` (no process group needed)."""
    from megatron.core.parallel_state import RankGenerator

    check_layout(plan)
    dense = RankGenerator(tp=plan.tp, ep=1, dp=plan.data_parallel_size, pp=plan.pp, cp=plan.cp,
                          order=MEGATRON_ORDER)
    edp = plan.world_size // (plan.pp * plan.etp * plan.ep)
    expert = RankGenerator(tp=plan.etp, ep=plan.ep, dp=edp, pp=plan.pp, cp=1, order=MEGATRON_ORDER)

    def index(generator: Any, token: str) -> int:
        for group in generator.get_ranks(token):
            if rank in group:
                return list(group).index(rank)
        raise AssertionError(f"rank {rank} is in no megatron {token} group")  # pragma: no cover

    dp = index(dense, "dp")
    return MeshCoordinate(
        pp=index(dense, "pp"),
        dp_replicate=dp // plan.dp_shard,
        dp_shard=dp % plan.dp_shard,
        cp=index(dense, "cp"),
        tp=index(dense, "tp"),
        ep=index(expert, "ep"),
        etp=index(expert, "tp"),
    )


def initialize_parallel_state(plan: ParallelPlan, *, gloo_groups: bool) -> None:
    """Initialize megatron's parallel_state from the plan on an already initialized world."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    if not dist.is_initialized():
        raise RuntimeError(
            "the megatron backend needs torch.distributed initialized first (torchrun, a launcher, "
            "or init_process_group); it uses the existing world and builds megatron's groups in it"
        )
    plan.validate_world_size(dist.get_world_size())
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(**megatron_sizes(plan), create_gloo_process_groups=gloo_groups)


def megatron_live_coordinate(plan: ParallelPlan) -> MeshCoordinate:
    """This rank's coordinate as megatron's initialized parallel_state reports it.

    Megatron has one data-parallel rank; it is split into (dp_replicate, dp_shard) with the
    plan's dp_shard size, the split megatron's distributed-optimizer instances use.
    """
    from megatron.core import parallel_state as ps

    dp = ps.get_data_parallel_rank()
    return MeshCoordinate(
        pp=ps.get_pipeline_model_parallel_rank(),
        dp_replicate=dp // plan.dp_shard,
        dp_shard=dp % plan.dp_shard,
        cp=ps.get_context_parallel_rank(),
        tp=ps.get_tensor_model_parallel_rank(),
        ep=ps.get_expert_model_parallel_rank(),
        etp=ps.get_expert_tensor_parallel_rank(),
    )


def describe_megatron_updates(plan: ParallelPlan, *, sharded_data_parallel: bool) -> tuple[DistributedUpdate, ...]:
    """The communication the megatron backend performs for ``plan``, one record per update."""
    updates: list[DistributedUpdate] = []
    dp_axes = tuple(a for a in (ParallelAxis.DP_REPLICATE, ParallelAxis.DP_SHARD) if plan.size(a) > 1)
    if dp_axes:
        if sharded_data_parallel and plan.dp_shard > 1:
            updates.append(DistributedUpdate(
                "grad:dp", PayloadKind.GRADIENT, CollectiveKind.REDUCE_SCATTER, dp_axes, StateLayout.SHARDED,
                exact=False, notes=("megatron DDP grad buffers, distributed optimizer",)))
            updates.append(DistributedUpdate(
                "param:dp_shard", PayloadKind.PARAMETER, CollectiveKind.ALL_GATHER, (ParallelAxis.DP_SHARD,),
                StateLayout.SHARDED, exact=False, notes=("updated parameter shards gathered after the step",)))
        else:
            updates.append(DistributedUpdate(
                "grad:dp", PayloadKind.GRADIENT, CollectiveKind.ALL_REDUCE, dp_axes, StateLayout.REPLICATED,
                exact=False, notes=("megatron DDP contiguous grad buffers, averaged over data parallel",)))
        updates.append(DistributedUpdate(
            "metric:dp", PayloadKind.MESSAGE, CollectiveKind.ALL_REDUCE, dp_axes, StateLayout.REPLICATED,
            exact=False, notes=("reduce_sums and receipt counts",)))
    if plan.pp > 1:
        updates.append(DistributedUpdate(
            "act:pp", PayloadKind.ACTIVATION, CollectiveKind.P2P, (ParallelAxis.PP,), StateLayout.PIPELINE_LOCAL,
            exact=False, notes=(f"1F1B schedule, {plan.microbatches} microbatches; activations forward, "
                                "their gradients backward",)))
        updates.append(DistributedUpdate(
            "metric:pp", PayloadKind.MESSAGE, CollectiveKind.ALL_REDUCE, (ParallelAxis.PP,),
            StateLayout.REPLICATED, exact=False, notes=("the last stage's loss shared with every stage",)))
    if plan.tp > 1:
        updates.append(DistributedUpdate(
            "act:tp", PayloadKind.ACTIVATION, CollectiveKind.ALL_REDUCE, (ParallelAxis.TP,), StateLayout.SHARDED,
            exact=False, notes=("RowParallelLinear output all-reduce; ColumnParallelLinear input-grad all-reduce",)))
        updates.append(DistributedUpdate(
            "grad_norm:tp", PayloadKind.MESSAGE, CollectiveKind.ALL_REDUCE, (ParallelAxis.TP,),
            StateLayout.REPLICATED, exact=False,
            notes=("the optimizer's global gradient norm, summed over the tensor-parallel shards",)))
    if plan.ep > 1:
        updates.append(DistributedUpdate(
            "token:ep", PayloadKind.TOKEN, CollectiveKind.ALL_GATHER, (ParallelAxis.EP,), StateLayout.EXPERT_LOCAL,
            exact=False, notes=("megatron MoE allgather token dispatcher: tokens to every expert rank",)))
        updates.append(DistributedUpdate(
            "token_combine:ep", PayloadKind.TOKEN, CollectiveKind.REDUCE_SCATTER, (ParallelAxis.EP,),
            StateLayout.EXPERT_LOCAL, exact=False,
            notes=("the dispatcher's combine: expert outputs reduce-scattered back to the tokens' ranks",)))
    return tuple(updates)
