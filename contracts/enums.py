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


class AuditPolicy(StrEnum):
    """What a run does when an SDC audit finds a mismatch (training and EM share this vocabulary)."""

    WARN = "warn"
    """Record the mismatch (receipt, ledger) and go on."""
    RAISE = "raise"
    """Stop with ``SDCDetectedError``; nothing of the audited step is committed."""
    SKIP_STEP = "skip_step"
    """Training: keep the audited update out (parameters and clocks unchanged) and go on."""
    QUARANTINE = "quarantine"
    """EM: take the suspect worker out and recompute its chunks elsewhere."""
    RAISE_DEFECTS = "raise_defects"
    """Training's default: a ``backend_defect`` (a wrong result a same-rank replay reproduces: the software) stops
    the run with ``BackendDefectError`` on every rank; a ``device`` fault is recorded and the run goes on, as
    ``warn``. Its records' action is ``raise`` or ``warn``, what was done."""


TRAINING_AUDIT_POLICIES: tuple[AuditPolicy, ...] = (
    AuditPolicy.WARN, AuditPolicy.RAISE, AuditPolicy.SKIP_STEP, AuditPolicy.RAISE_DEFECTS)
"""The policies a training session honours."""
EM_AUDIT_POLICIES: tuple[AuditPolicy, ...] = (AuditPolicy.QUARANTINE, AuditPolicy.RAISE, AuditPolicy.WARN)
"""The policies an EM handle honours."""


class AdmissionMode(StrEnum):
    """How the admission gate let a run through (written into every receipt and ledger entry)."""

    CERTIFIED = "certified"
    """A signed certificate from a trusted key passed every check."""
    UNVERIFIED = "unverified"
    """The caller opted out with ``admission="unverified"``."""
    LOCAL = "local"
    """One process on the CPU: no mesh, nothing to admit."""
    VERIFYING = "verifying"
    """The verification harness's own run, proven by the capability it holds."""


def choose(enum: type[StrEnum], value: object, *, option: str, allowed: tuple[StrEnum, ...] | None = None) -> StrEnum:
    """``value`` as a member of ``enum`` (a member or its string), or ``ValueError`` naming ``option`` and the
    values it takes (``allowed``, default every member)."""
    members = tuple(allowed if allowed is not None else tuple(enum))
    text = value.value if isinstance(value, StrEnum) else value
    for member in members:
        if member.value == text:
            return member
    raise ValueError(f"{option}={value!r} is not one of {', '.join(repr(m.value) for m in members)}")


def comm_backend_for(device: object) -> str:
    """The torch.distributed communication backend for a device: ``nccl`` on CUDA, ``gloo`` otherwise.

    ``device`` is a device kind (``"cuda"``, ``"cpu"``), a ``torch.device`` or anything with a ``type``.
    """
    kind = getattr(device, "type", device)
    if not isinstance(kind, str):
        raise TypeError(f"device must be a device kind such as 'cuda' or 'cpu' or a torch.device, got {device!r}")
    return "nccl" if kind.split(":", 1)[0] == "cuda" else "gloo"
