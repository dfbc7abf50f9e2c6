"""The chunk runners' families and the code each family shares: process pools, actor clusters, SPMD collectives.

* :class:`ProcessPoolRunner` (``local``, ``mp``): workers on this machine, any of which can compute any chunk;
  the worker count checked the same way, a plan's blocks (``assign_chunks``), chunk owners over the live
  workers.
* :class:`ActorClusterRunner` (``dask``, ``ray``): one resident actor per cluster worker; the pass bytes counted
  in a ``WireBytes``, the straggler bookkeeping (workers given up, chunks recomputed, workers that answered).
* :class:`SPMDRunner` (``mpi``, ``torchrun``): every rank runs the same program and holds its own block; the
  ranks, the root, the blocks and the collective schedule.
* ``spark`` is a family of one (a cached RDD, no worker of its own to aim at): it shares the two common bases,
  :class:`CountedTransport` and :class:`DeclinesPlacement`, with the others and has no family base.

:class:`PlacesWork` / :class:`DeclinesPlacement` are the two answers to the SDC audit's question "can this
runner compute a chunk on a chosen worker?" (``em_pass.runner_protocols.WorkerPlacement``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic

from ....contracts.resources import local_cpu_count
from ..em_pass.chunks import WorkerTask
from .chunk_assignment import block_assignment, block_owners, place_blocks
from .deadline import StragglerClock, WorkerKey
from .spmd_schedule import CollectiveSchedule
from .wire_bytes import WireBytes

__all__ = ["ActorClusterRunner", "CountedTransport", "DeclinesPlacement", "PlacesWork", "ProcessPoolRunner",
           "SPMDRunner"]

class CountedTransport:
    """A runner whose pass traffic is counted in a ``WireBytes`` (``wire_bytes``): its totals are read from it."""

    wire: WireBytes

    @property
    def transport_bytes(self) -> int:
        """Pass bytes sent and received so far (models and functions out, statistics back)."""
        return self.wire.total

    @property
    def transport_messages(self) -> int:
        """Messages handed to and taken from the transport so far (``WireBytes.messages``)."""
        return self.wire.messages


class PlacesWork:
    """A runner that computes chosen chunks on a chosen worker (the SDC audit's replays on another worker)."""

    supports_worker_placement = True
    run_on_workers: Callable[[dict[int, WorkerTask]], dict[int, list[Any]]]

    def compute_on(
        self, worker: int, fn: Callable[[Any, Any], Any], payload: Any, chunk_ids: Sequence[int]
    ) -> list[Any]:
        """``fn`` over ``chunk_ids`` on worker ``worker`` (the one-worker form of ``run_on_workers``)."""
        return self.run_on_workers({worker: WorkerTask(fn, payload, tuple(chunk_ids))})[worker]


class DeclinesPlacement:
    """A runner that cannot aim work at a chosen worker: its SDC audit replays a chunk on the same runner
    (``same_rank``)."""

    name: str
    supports_worker_placement = False
    """Declined (``placement_refusal`` says why); the SDC audit recomputes a chunk on the same runner instead."""
    placement_refusal = ""
    """Why this runner cannot compute chosen chunks on a chosen worker (named in ``compute_on``'s refusal)."""

    def compute_on(
        self, worker: int, fn: Callable[[Any, Any], Any], payload: Any, chunk_ids: Sequence[int]
    ) -> list[Any]:
        """Not supported: this runner cannot aim work at a chosen worker (``placement_refusal``)."""
        raise NotImplementedError(
            f"the {self.name} runner cannot compute chosen chunks on a chosen worker ({self.placement_refusal}); "
            "check supports_worker_placement first"
        )


class ProcessPoolRunner(PlacesWork):
    """Workers on this machine, any of which can compute any chunk (``local``'s threads, ``mp``'s processes)."""

    name: str
    num_workers: int
    _num_chunks: int
    _blocks: list[list[int]] | None
    worker_ids: Callable[[], list[int]]

    def _pool_size(self, num_workers: int | None) -> int:
        """``num_workers`` checked (an int >= 1), one per local CPU when None."""
        n = local_cpu_count() if num_workers is None else num_workers
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{self.name} backend num_workers must be an int >= 1, got {num_workers!r}")
        return n

    def assign_chunks(self, blocks: Sequence[Sequence[int]]) -> None:
        """Send chunks to workers by a plan: ``blocks[w]`` are worker ``w``'s chunk ids (a ``Placement``'s
        shards); balanced blocks again once a worker is lost."""
        self._blocks = place_blocks(blocks, self.num_workers, self._num_chunks, self.name)

    def _planned(self) -> list[list[int]] | None:
        """The plan's blocks while every worker is live, else None (balanced blocks over the live ones)."""
        return self._blocks if self._blocks is not None and self.worker_ids() == list(range(self.num_workers)) \
            else None

    def chunk_owners(self) -> list[int]:
        """The worker each chunk goes to in a plain pass (the plan's blocks, or contiguous blocks over the live
        workers)."""
        live = self.worker_ids()
        owners = [0] * self._num_chunks
        if live:
            for w, ids in zip(live, self._planned() or block_assignment(self._num_chunks, len(live))):
                for i in ids:
                    owners[i] = w
        return owners


class ActorClusterRunner(PlacesWork, CountedTransport, Generic[WorkerKey]):
    """One resident actor per cluster worker (``dask``, ``ray``): counted pass bytes and straggler bookkeeping."""

    timeout: float | None
    straggler_timeout: float | None
    """``straggler_timeout=``: the straggler deadline in seconds (None: ``deadline.straggler_deadline``'s rule)."""
    stragglers: list[int]
    """Workers (ids) whose actor the others outran by the straggler deadline: given up (for tests and logs)."""
    recovered_chunks: list[int]
    """Chunk ids a straggler owed, recomputed by the other actors (for tests and logs)."""
    _answered: set[WorkerKey]  # workers that answered a pass: a fresh one (importing modules) is never a straggler

    def _init_stragglers(self, straggler_timeout: float | None) -> None:
        self.stragglers, self.recovered_chunks, self._answered = [], [], set()
        self.straggler_timeout = straggler_timeout

    def _straggler_clock(self) -> StragglerClock:
        """The clock of one pass's (or placed run's) straggler deadline."""
        return StragglerClock(self.timeout, self.straggler_timeout)

    def _note_straggler(self, worker: int, owed: Sequence[int]) -> None:
        """Record worker ``worker`` given up as a straggler and the chunks it owed (recomputed elsewhere)."""
        self.stragglers.append(worker)
        self.recovered_chunks.extend(owed)


class SPMDRunner(DeclinesPlacement, CountedTransport):
    """Every rank runs the same program and holds its own block of chunks (``mpi``, ``torchrun``)."""

    placement_refusal = "an SPMD rank computes only its own block"

    def _init_ranks(self, rank: int, size: int, root: int, root_only: bool, where: str) -> None:
        """This rank's place in a world of ``size`` ranks (``root`` checked to be one of them, in ``where``)."""
        self.rank, self.size = rank, size
        if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < self.size:
            raise ValueError(f"root={root!r} is not a rank of this {where} (size {self.size})")
        self.root = root
        self.root_only = bool(root_only)
        self.num_workers = self.size
        self.blocks: list[list[int]] | None = None
        """The chunk ids each rank holds when a source says so (``rank_local``); None: contiguous blocks."""
        self._local: dict[int, Any] = {}
        self._num_chunks = 0
        self.schedule = CollectiveSchedule()
        """Every collective step checked against the other ranks' before it runs (``spmd_schedule``)."""

    @property
    def is_root(self) -> bool:
        """Whether this process is the root rank."""
        return self.rank == self.root

    def owned_chunk_ids(self, num_chunks: int) -> list[int]:
        """The contiguous block of chunk ids this rank holds."""
        return (self.blocks or block_assignment(num_chunks, self.size))[self.rank]

    def chunk_owners(self) -> list[int]:
        """The rank each chunk is computed on (contiguous blocks, or a source's blocks)."""
        return block_owners(self.blocks or block_assignment(self._num_chunks, self.size), self._num_chunks)
