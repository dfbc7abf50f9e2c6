"""What every launcher shares: the context a launched rank receives and the attestation binding it.

A launcher (torchrun, Lightning Fabric, Ray Train) starts processes and gives each one a rank.
Before any training code runs, :func:`bind_launched_rank` turns that runtime rank into a
:class:`~mixle_parallel.contracts.WorkerTopologyAttestation` -- the plan's coordinate for the
rank, computed by the same rank math every executor uses -- and checks it against the live
``torch.distributed`` default group when one exists. A rank whose launcher-reported rank, world
size or process-group rank disagree with the plan fails here, not inside a collective.

No torch, lightning or ray at module level: ``torch.distributed`` is looked up only when a
launched rank is bound or released.
"""

from __future__ import annotations

import sys
from typing import Any

import attrs

from ...contracts import (
    MeshCoordinate,
    ParallelPlan,
    WorkerTopologyAttestation,
    attest_worker_coordinate,
)


@attrs.frozen
class LaunchContext:
    """What a launched rank's training function receives: its plan, its attestation, and its launcher.

    ``handle`` is the launcher's own object for this rank (the ``lightning.fabric.Fabric``, the
    torchrun ``Resources``, the Ray Train context); ``admission`` the decision the launch gate took
    before the ranks started (``launchers.admission``; None where the launcher has no gate). Neither
    takes part in equality.
    """

    plan: ParallelPlan
    attestation: WorkerTopologyAttestation
    launcher: str
    local_rank: int
    handle: Any = attrs.field(default=None, eq=False, repr=False)
    admission: Any = attrs.field(default=None, eq=False, repr=False)

    @property
    def rank(self) -> int:
        """This process's global rank."""
        return self.attestation.rank

    @property
    def world_size(self) -> int:
        """The number of launched ranks (equal to ``plan.world_size``)."""
        return self.attestation.world_size

    @property
    def coordinate(self) -> MeshCoordinate:
        """This rank's coordinate on the plan's mesh."""
        return self.attestation.coordinate

    @property
    def data_parallel_index(self) -> int:
        """This rank's index in the data-parallel domain: which share of the global batch it reads."""
        c = self.attestation.coordinate
        return c.dp_replicate * self.plan.dp_shard + c.dp_shard

    @property
    def is_logging_rank(self) -> bool:
        """True on global rank 0, the one rank that should write logs and files once."""
        return self.attestation.rank == 0


def _live_process_group() -> tuple[int, int] | None:
    """(rank, world size) of the initialized torch.distributed default group, else None."""
    if "torch" not in sys.modules:  # nothing can have initialized a process group
        return None
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.get_rank(), dist.get_world_size()


def bind_launched_rank(
    plan: ParallelPlan,
    *,
    launcher: str,
    rank: int,
    world_size: int,
    local_rank: int = 0,
    handle: Any = None,
    expected: WorkerTopologyAttestation | None = None,
    admission: Any = None,
) -> LaunchContext:
    """Attest the rank a launcher reports against ``plan`` (and the live process group); return its context.

    ``expected`` is the attestation the launching side computed for this rank (Ray Train hands
    one to each worker): the rank's own attestation must equal it. ``admission``: the launch gate's decision.
    """
    try:
        attestation = attest_worker_coordinate(plan, actual_world_size=world_size, rank=rank)
    except ValueError as err:
        raise RuntimeError(
            f"{launcher} started rank {rank} of {world_size}, which does not fit plan {plan.describe()}: {err}. "
            f"Launch exactly plan.world_size={plan.world_size} processes"
        ) from err
    if expected is not None and expected != attestation:
        raise RuntimeError(
            f"{launcher} rank {rank} was handed attestation {expected} but the plan places it at "
            f"{attestation}; the launcher and the worker disagree on the rank order"
        )
    live = _live_process_group()
    if live is not None and live != (rank, world_size):
        raise RuntimeError(
            f"{launcher} reports rank {rank} of {world_size} but the torch.distributed default group has rank "
            f"{live[0]} of {live[1]}; initialize the process group from the launcher's rank and world size"
        )
    if isinstance(local_rank, bool) or not isinstance(local_rank, int) or local_rank < 0:
        raise ValueError(f"local_rank must be a non-negative int, got {local_rank!r}")
    return LaunchContext(plan=plan, attestation=attestation, launcher=launcher, local_rank=local_rank, handle=handle,
                         admission=admission)


def release_process_group() -> bool:
    """Destroy the torch.distributed default group if one exists, once what the rank's work left in reference
    cycles is collected (``executors.torch.device_mesh.destroy_default_group``: left to the interpreter's exit,
    their C++ teardown aborted 2 of 7 Fabric ddp ranks); True when one was destroyed."""
    if _live_process_group() is None:  # no group: the torch executor's module is not imported for nothing
        return False
    from ..torch.device_mesh import destroy_default_group

    return destroy_default_group()


def describe_attestations(plan: ParallelPlan) -> tuple[WorkerTopologyAttestation, ...]:
    """The attestation of every rank of ``plan``, in rank order (what a launcher hands out)."""
    return tuple(
        attest_worker_coordinate(plan, actual_world_size=plan.world_size, rank=r) for r in range(plan.world_size)
    )
