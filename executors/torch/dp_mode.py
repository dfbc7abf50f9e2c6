"""The data-parallel mode of a torch_native session, decided from the plan in one place."""

from __future__ import annotations

from enum import StrEnum

from ...contracts import ParallelAxis, ParallelPlan

A = ParallelAxis


class DataParallelMode(StrEnum):
    """How gradients are synchronized across data-parallel ranks: none, DDP, FSDP2 or HSDP (FSDP2 over 2-D)."""

    NONE = "none"
    DDP = "ddp"
    FSDP = "fsdp"
    HSDP = "hsdp"

    @classmethod
    def for_plan(cls, plan: ParallelPlan) -> DataParallelMode:
        """The mode a plan gets: sharded data axes (dp_shard, cp) mean FSDP2 (HSDP with replicas); replicas
        alone mean DDP, except beside TP, where FSDP2's no-shard HSDP composes with DTensor parameters."""
        if plan.dp_shard > 1 or plan.cp > 1:
            return cls.HSDP if plan.dp_replicate > 1 else cls.FSDP
        if plan.dp_replicate > 1:
            return cls.HSDP if plan.tp > 1 else cls.DDP
        return cls.NONE

    @property
    def uses_fsdp(self) -> bool:
        """True when FSDP2's ``fully_shard`` owns the module (FSDP or HSDP)."""
        return self in (DataParallelMode.FSDP, DataParallelMode.HSDP)

    @property
    def uses_ddp(self) -> bool:
        """True when the module is wrapped in DistributedDataParallel."""
        return self is DataParallelMode.DDP

    @property
    def replicated_parameters(self) -> bool:
        """True when every data-parallel rank holds the whole parameters (no FSDP2 sharding)."""
        return not self.uses_fsdp

    def mesh_axes(self) -> tuple[ParallelAxis, ...]:
        """The mesh dimensions the data-parallel wrapper spans, in mesh order (empty for NONE)."""
        if self is DataParallelMode.DDP:
            return (A.DP_REPLICATE,)
        if self is DataParallelMode.FSDP:
            return (A.DP_SHARD, A.CP)
        if self is DataParallelMode.HSDP:
            return (A.DP_REPLICATE, A.DP_SHARD)
        return ()

    def unit_shard_dim(self, plan: ParallelPlan) -> bool:
        """True when the mesh needs a size-1 dp_shard dimension: HSDP over replicas only (dp_replicate x tp)."""
        return self is DataParallelMode.HSDP and plan.dp_shard == 1 and plan.cp == 1
