"""The ``mpi`` chunk runner: SPMD over an mpi4py communicator.

Every rank runs the same program. Rank ``r`` holds a contiguous block of chunk ids; a data pass
broadcasts the payload from the root (so every rank scores the same model), computes its own
chunks and all-gathers, so every rank holds the full list ordered by chunk id and runs the same
combine: statistics are reduced in one fixed order and every rank ends on the same bits.

With ``root_only=True`` only the root has the rows: it encodes the chunks and scatters each rank
its block; the other ranks pass ``data=None``. Otherwise every rank has the rows and encodes only
its own chunks. A failure inside one rank's chunk function is all-gathered and raised on every
rank, so one bad rank does not leave the others blocked in a collective. Before the all-gather the
ranks meet at a non-blocking barrier polled against ``timeout``: a rank that does not arrive (hung
in its chunks) makes the others raise ``WorkerTimeoutError`` instead of waiting forever (run the
script with ``python -m mpi4py`` so an uncaught error aborts the whole job).
"""

from __future__ import annotations

import io
import pickle
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from ..api import encoded_data
from ..audit.sdc_audit import EMAudit
from ..audit.spmd_audit import attach_spmd_reference
from ..compat.reference_handles import BuiltByEncodedData
from ..em_pass.chunks import EncodedChunk, WorkerTimeoutError, apply_chunk_fn, resolve_encoder
from ..handle import ChunkedEncodedData
from ..options import EncodedDataOptions
from .chunk_assignment import (
    block_assignment,
    ordered_results,
    requested_ids,
)
from .deadline import DEFAULT_TIMEOUT_S, Deadline, check_timeout
from .optional_engine import require_engine
from .runner_families import SPMDRunner
from .spmd_schedule import map_tag
from .spmd_sources import scatter_source, source_row_placeholder
from .wire_bytes import WireBytes, dumps

__all__ = ["MPIChunkError", "MPIEncodedData", "MPIRunner", "mpi_encoded_data", "mpi_out"]


class MPIChunkError(RuntimeError):
    """A chunk function failed on some rank; raised on every rank so none is left blocked."""


class MPIRunner(SPMDRunner):
    """SPMD chunk runner over an mpi4py communicator (``COMM_WORLD`` by default)."""

    name = "mpi"

    def __init__(
        self,
        comm: Any = None,
        *,
        root: int = 0,
        root_only: bool = False,
        timeout: float | None = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.timeout = check_timeout(timeout)
        if comm is None:
            comm = require_engine("mpi4py.MPI", "mpi").COMM_WORLD
        self.comm = comm
        self._init_ranks(int(comm.Get_rank()), int(comm.Get_size()), root, root_only, "communicator")
        self.wire = WireBytes()
        """This rank's pass bytes: the pickled payload and every rank's pickled results, as they crossed."""

    def _agree(self, operation: str) -> None:
        """The schedule check as a step of its own (``scatter``: once per handle; nothing to check alone)."""
        if self.size > 1:
            self.schedule.check(self.comm.allgather(self.schedule.next_tag(operation)))

    # -- placement ----------------------------------------------------------------------------
    def scatter(self, chunks: Sequence[Any] | None) -> None:
        """Keep this rank's block (``root_only``: the root sends each rank its block).

        Without ``root_only`` each rank passes the full-length list (entries it does not own may
        be ``None``); with it, only the root's ``chunks`` are read.
        """
        self._agree("scatter")
        if self.root_only:
            parts = None
            n = None
            if self.is_root:
                if chunks is None:
                    raise ValueError("root_only=True: the root rank must pass the chunks")
                n = len(chunks)
                parts = [[(i, chunks[i]) for i in ids] for ids in block_assignment(n, self.size)]
            n = self.comm.bcast(n, root=self.root)
            mine = self.comm.scatter(parts, root=self.root)
        else:
            if chunks is None:
                raise ValueError(f"rank {self.rank} passed no chunks; every rank needs the data unless root_only=True")
            n = len(chunks)
            counts = self.comm.allgather(n)
            if len(set(counts)) != 1:
                raise ValueError(
                    f"ranks disagree on the number of chunks {counts}; give every rank the same rows and "
                    "chunking, or pass root_only=True and the rows on the root only"
                )
            mine = [(i, chunks[i]) for i in self.owned_chunk_ids(n)]
            missing = [i for i, c in mine if c is None]
            if missing:
                raise ValueError(f"rank {self.rank} owns chunks {missing} but was given None for them")
        self._num_chunks = int(n)
        self._local = dict(mine)

    def all_gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order (a collective: every rank calls it)."""
        if self.size == 1:
            return [value]
        parts = self.comm.allgather((self.schedule.next_tag("all_gather"), value))  # the step's tag travels along
        self.schedule.check([tag for tag, _ in parts])
        return [v for _, v in parts]

    # -- data passes --------------------------------------------------------------------------
    def map_chunks(
        self, fn: Callable[[Any, Any], Any], payload: Any, chunk_ids: Sequence[int] | None = None
    ) -> list[Any]:
        """Collective: the root's payload to all, own chunks computed, results all-gathered in order.

        Every rank must call it with the same ``fn`` and ``chunk_ids`` (checked first: ``spmd_schedule``).
        """
        payload = self._share_payload(payload, map_tag(fn, chunk_ids))
        ids = requested_ids(chunk_ids, self._num_chunks)
        mine: list[tuple[int, Any]] = []
        error: str | None = None
        failure: BaseException | None = None
        try:
            own = [i for i in ids if i in self._local]
            mine = list(zip(own, apply_chunk_fn(fn, payload, own, self._local.__getitem__)))
        except Exception as exc:  # noqa: BLE001 - shared with every rank below, then re-raised
            failure = exc
            error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        self._meet(ids)
        gathered = self._all_results((mine, error))
        errors = [(r, e) for r, (_, e) in enumerate(gathered) if e is not None]
        if errors:
            detail = "; ".join(f"rank {r}: {e}" for r, e in errors)
            raise MPIChunkError(f"chunk function failed on {len(errors)} rank(s): {detail}") from failure
        results: dict[int, Any] = {}
        for part, _ in gathered:
            results.update(part)
        return ordered_results(results, ids, self.name)

    def _share_payload(self, payload: Any, operation: str) -> Any:
        """The root's payload on every rank, one pickle (counted: sent once per peer, received once), all-gathered
        with every rank's tag of this step, which are checked before anything is computed (``spmd_schedule``)."""
        if self.size == 1:
            return payload
        tag = self.schedule.next_tag(operation)
        parts = self.comm.allgather((tag, dumps(payload) if self.is_root else None))
        self.schedule.check([t for t, _ in parts])
        blob = parts[self.root][1]
        if self.is_root:
            self.wire.count_sent(blob, copies=self.size - 1)
            return payload
        self.wire.count_received(blob)
        return pickle.loads(blob)

    def _all_results(self, mine: Any) -> list[Any]:
        """Every rank's ``mine`` in rank order, all-gathered as pickles (this rank's sent to each peer)."""
        if self.size == 1:
            return [mine]
        own = dumps(mine)
        blobs = self.comm.allgather(own)
        self.wire.count_sent(own, copies=self.size - 1)
        self.wire.count_received(*(b for r, b in enumerate(blobs) if r != self.rank))
        return [mine if r == self.rank else pickle.loads(b) for r, b in enumerate(blobs)]

    def _meet(self, ids: list[int]) -> None:
        """Wait for every rank at a non-blocking barrier, at most ``timeout`` seconds."""
        if self.timeout is None or self.size == 1:
            return
        request = self.comm.Ibarrier()
        deadline = Deadline(self.timeout)
        pause = 1e-5
        while not request.Test():
            if deadline.expired():
                raise WorkerTimeoutError(
                    f"mpi rank {self.rank} waited {self.timeout} s for the other ranks to finish their "
                    f"chunks (pass over {len(ids)} chunk(s)); a rank is hung or "
                    "overloaded. Raise timeout= (seconds); run with `python -m mpi4py` so this aborts the job."
                )
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)

    def close(self) -> None:
        """Drop this rank's chunks (MPI itself stays initialized; the launcher owns it)."""
        self._local = {}


class MPIEncodedData(BuiltByEncodedData, ChunkedEncodedData):
    """The generic handle, encoding on each rank only what that rank holds.

    ``MPIEncodedData(data, estimator=None, encoder=None, sub_chunks=1, comm=None, root=0,
    root_only=False)`` is mixle 0.8.2's constructor: ``encoded_data(data, backend="mpi", ...)``,
    called on every rank.
    """

    def _attach_reference(self, audit: EMAudit) -> None:
        """Every rank agrees on the audit's sample and references (``spmd_audit``)."""
        attach_spmd_reference(audit, self.runner, self._audit_rows, self.bounds, self.source, self.places)

    backend_name = "mpi"

    runner: MPIRunner

    @classmethod
    def _build(cls, data: Any, estimator: Any = None, encoder: Any = None, sub_chunks: int = 1, comm: Any = None,
               root: int = 0, root_only: bool = False, **options: Any) -> Any:
        return encoded_data(data, estimator=estimator, encoder=encoder, sub_chunks=sub_chunks, comm=comm, root=root,
                            root_only=root_only, backend="mpi", **options)

    @classmethod
    def over_runner(cls, runner: MPIRunner, data: Any, *, num_rows: int, **params: Any) -> MPIEncodedData:
        """The handle over an existing runner (what ``encoded_data(backend="mpi")`` builds); ``params`` are the
        handle's options."""
        obj = object.__new__(cls)
        ChunkedEncodedData.__init__(obj, runner, data, num_rows=num_rows, **params)
        return obj

    def _ensure_scattered(self, estimator: Any, model: Any) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed; create a new handle with encoded_data(...)")
        if self._scattered:
            return
        runner = self.runner
        if self.source is not None:
            scatter_source(self, estimator, model)
        elif runner.root_only and not runner.is_root:
            runner.scatter(None)
        else:
            if self._encoder is None:
                self._encoder = resolve_encoder(estimator, model)
            if self._data is None:
                raise ValueError(f"rank {runner.rank} has no rows to encode; pass the data to encoded_data()")
            wanted = range(len(self.bounds)) if runner.root_only else runner.owned_chunk_ids(len(self.bounds))
            chunks: list[Any] = [None] * len(self.bounds)
            for i in wanted:
                a, b = self.bounds[i]
                chunks[i] = EncodedChunk(i, a, b, self._encoder.encode(self._data[a:b]))
            runner.scatter(chunks)
        self._scattered = True
        self._data = None


def mpi_encoded_data(
    data: Any,
    *,
    comm: Any = None,
    root: int = 0,
    root_only: bool = False,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    **params: Any,
) -> MPIEncodedData:
    """``encoded_data(..., backend="mpi")``: call on every rank (SPMD); see the module docstring."""
    runner = MPIRunner(comm, root=root, root_only=root_only, timeout=timeout)
    num_rows = source_row_placeholder(data, root_only, "mpi")  # None: rows in memory, counted here
    if num_rows is None and root_only:
        n = len(data) if runner.is_root else None
        num_rows = runner.comm.bcast(n, root=runner.root)
    elif num_rows is None:
        if data is None:
            raise ValueError(f"rank {runner.rank} passed data=None; pass the rows on every rank or root_only=True")
        num_rows = len(data)
        counts = runner.comm.allgather(num_rows)
        if len(set(counts)) != 1:
            raise ValueError(f"ranks hold different row counts {counts}; pass the same rows on every rank")
    return MPIEncodedData.over_runner(runner, data if (runner.is_root or not root_only) else None, num_rows=num_rows,
                                      **params)


ENCODED_DATA_OPTIONS = frozenset({"comm", "root", "root_only", "timeout", "batch_size", "shuffle", "seed"})
"""The ``encoded_data`` options the mpi backend honours besides the handle's own (ranks: mpiexec -n)."""

WORKER_PROCESSES = True


def planned_workers(options: EncodedDataOptions) -> int:
    """The ranks of ``comm`` (default ``COMM_WORLD``)."""
    comm = options.comm if options.comm is not None else require_engine("mpi4py.MPI", "mpi").COMM_WORLD
    return int(comm.Get_size())


def mpi_out(comm: Any = None, root: int = 0) -> Any:
    """``sys.stdout`` on the root rank, a discarded buffer elsewhere (mixle's ``mpi_out``): print progress once."""
    comm = comm if comm is not None else require_engine("mpi4py.MPI", "mpi").COMM_WORLD
    return sys.stdout if comm.Get_rank() == root else io.StringIO()
