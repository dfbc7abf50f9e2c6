"""The closed vocabularies of the contracts, serialized by value."""

from __future__ import annotations

from enum import StrEnum


class ParallelAxis(StrEnum):
    """Named dimensions understood by mixle-parallel and external training engines."""

    DP_REPLICATE = "dp_replicate"
    DP_SHARD = "dp_shard"
    TP = "tp"
    PP = "pp"
    CP = "cp"
    EP = "ep"
    ETP = "etp"


# Physical mesh order, slowest-varying first: tp varies fastest (neighbouring ranks), as torchtitan.
PHYSICAL_AXES: tuple[ParallelAxis, ...] = (
    ParallelAxis.PP,
    ParallelAxis.DP_REPLICATE,
    ParallelAxis.DP_SHARD,
    ParallelAxis.CP,
    ParallelAxis.TP,
)
# Overlapping groups cut from the physical domains, not extra mesh dimensions.
DERIVED_AXES: tuple[ParallelAxis, ...] = (ParallelAxis.EP, ParallelAxis.ETP)
ALL_AXES: tuple[ParallelAxis, ...] = PHYSICAL_AXES + DERIVED_AXES


class PayloadKind(StrEnum):
    """What an update moves between ranks."""

    GRADIENT = "gradient"
    SUFFICIENT_STATISTIC = "sufficient_statistic"
    PARAMETER = "parameter"
    ACTIVATION = "activation"
    KV_BLOCK = "kv_block"
    TOKEN = "token"
    MESSAGE = "message"


class CollectiveKind(StrEnum):
    """Collective or point-to-point operation required by an update."""

    NONE = "none"
    ALL_REDUCE = "all_reduce"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_GATHER = "all_gather"
    ALL_TO_ALL = "all_to_all"
    BROADCAST = "broadcast"
    P2P = "p2p"
    CUSTOM = "custom"


class StateLayout(StrEnum):
    """Where the state an update touches lives."""

    REPLICATED = "replicated"
    SHARDED = "sharded"
    PIPELINE_LOCAL = "pipeline_local"
    EXPERT_LOCAL = "expert_local"
    OFFLOADED = "offloaded"


# Numeric precisions a backend may claim; the names executors and certificates use.
KNOWN_PRECISIONS: frozenset[str] = frozenset({"fp64", "fp32", "tf32", "bf16", "fp16", "fp8"})
