"""What the EM pass needs of a chunk runner, as Protocols: all chunks, chunks on chosen workers, and the extras.

:class:`~.chunks.ChunkRunner` is the work on all chunks every backend does. The audit's placed work (replays on
a chosen worker, reveals, the recomputation of a quarantined worker's chunks) needs :class:`WorkerPlacement`,
which a runner declares with ``supports_worker_placement = True`` (``mpi``, ``spark`` and the task runners
declare False: an SPMD rank or a Spark task cannot be aimed at a chosen worker). The rest are optional
capabilities the pass and the handle read where a runner has them: the worker each chunk is resident on
(:class:`ChunkOwnership`), chunk blocks assigned to workers by a placement (:class:`AssignsChunks`) and the
counters of its transport (:class:`CountsTransport`). Every check is an ``isinstance`` against one of these
(``runtime_checkable``), never a probe of a name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = ["AssignsChunks", "ChunkOwnership", "CountsTransport", "WorkerPlacement", "places_work",
           "transport_count"]


@runtime_checkable
class ChunkOwnership(Protocol):
    """A runner that knows the worker each chunk is resident on (SPMD ranks, placed pools)."""

    def chunk_owners(self) -> Sequence[int]: ...


@runtime_checkable
class WorkerPlacement(ChunkOwnership, Protocol):
    """A runner that computes chosen chunks on chosen workers (the audit's replays, reveals and mending)."""

    supports_worker_placement: bool

    def worker_ids(self) -> Sequence[int]: ...

    def run_on_workers(self, tasks: Mapping[int, Any]) -> dict[int, list[Any]]: ...


@runtime_checkable
class AssignsChunks(Protocol):
    """A runner whose chunk blocks can be assigned to its workers (a planner's ``Placement``)."""

    def assign_chunks(self, blocks: Sequence[Sequence[int]]) -> None: ...


@runtime_checkable
class CountsTransport(Protocol):
    """A runner that counts what it hands its transport (bytes and messages of the passes so far)."""

    transport_bytes: int
    transport_messages: int


def places_work(runner: object) -> bool:
    """Whether ``runner`` computes chosen chunks on chosen workers: it has the members and declares it."""
    return isinstance(runner, WorkerPlacement) and bool(runner.supports_worker_placement)


def transport_count(runner: object, name: str) -> int | None:
    """The runner's ``transport_bytes`` / ``transport_messages`` so far, or None where it does not count."""
    if name not in ("transport_bytes", "transport_messages"):
        raise ValueError(f"no transport counter named {name!r}: transport_bytes or transport_messages")
    if not isinstance(runner, CountsTransport):
        return None
    found = runner.transport_bytes if name == "transport_bytes" else runner.transport_messages
    return None if found is None else int(found)
