"""The ``torchrun`` backend: SPMD EM over ``torch.distributed`` (gloo on CPU, nccl where CUDA is).

Every rank runs the same program (``torchrun --nproc-per-node N script.py``). Rank ``r`` holds a
contiguous block of chunk ids, as under ``mpi``. A data pass broadcasts the root's payload, each
rank computes its block (folding its complete combine groups itself, ``GroupFold``), and the
entries travel up a fixed binomial tree (rank ``r`` receives from ``r + 2^k`` at step ``k``, in that
order) to the root, which then holds every entry by chunk id; the ordered entries go back down the
same tree by broadcast, and every rank folds them in the canonical two-level order. No rank
gathers per-chunk statistics from every other rank at once, at most ``DEFAULT_CHUNK_MULTIPLE``
folded groups travel per pass, and every rank ends on the bits of every other backend.

A failure in one rank's chunks travels up the tree like a result and is raised on every rank, so
no rank is left blocked in a collective; a rank that does not answer within the process group's
timeout makes the collectives fail.
"""

from __future__ import annotations

import io
import os
import pickle
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from ..api import encoded_data
from ..audit.sdc_audit import EMAudit
from ..audit.spmd_audit import attach_spmd_reference
from ..compat.reference_handles import BuiltByEncodedData
from ..em_pass.chunks import apply_chunk_fn
from ..handle import ChunkedEncodedData
from .chunk_assignment import (
    block_assignment,
    ordered_results,
    requested_ids,
)
from .deadline import DEFAULT_TIMEOUT_S
from .mpi import MPIEncodedData
from .optional_engine import require_engine
from .runner_families import SPMDRunner
from .spmd_schedule import map_tag, tag_code
from .spmd_sources import source_row_placeholder
from .torchrun_group import init_default_group, torchrun_variables
from .wire_bytes import WireBytes, dumps

__all__ = ["TorchRunChunkError", "TorchRunEncodedData", "TorchRunRunner", "torchrun_encoded_data", "torchrun_out"]


class TorchRunChunkError(RuntimeError):
    """A chunk function failed on some rank; raised on every rank so none is left blocked."""


def _dist() -> Any:
    return require_engine("torch.distributed", "torch")


def torchrun_out(root: int = 0) -> TextIO:
    """``sys.stdout`` on the root rank, a discarded buffer on the others (for prints in SPMD scripts)."""
    try:
        dist = _dist()
        rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK") or 0)
    except ImportError:
        rank = int(os.environ.get("RANK") or 0)
    return sys.stdout if rank == int(root) else io.StringIO()


def torchrun_world_size() -> int:
    """The world size of this torchrun job (1 outside one), without importing torch if it is not loaded."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size())
    return int(os.environ.get("WORLD_SIZE") or 1)


class TorchRunRunner(SPMDRunner):
    """SPMD chunk runner over a ``torch.distributed`` process group (the default group by default)."""

    name = "torchrun"

    def __init__(self, group: Any = None, *, root: int = 0, root_only: bool = False, init_process_group: bool = True,
                 backend: str | None = None, timeout: float | None = DEFAULT_TIMEOUT_S) -> None:
        self.dist = _dist()
        self.group = group
        launched = "RANK" in os.environ or "WORLD_SIZE" in os.environ
        self.single_process = group is None and not self.dist.is_initialized() and not launched
        """Outside torchrun with no process group: a world of this one process (as mixle 0.8.2 runs)."""
        if not self.dist.is_initialized() and not self.single_process:
            if not init_process_group or not torchrun_variables():
                raise RuntimeError(
                    "backend='torchrun' needs torch.distributed: start the script with `torchrun --nproc-per-node N "
                    "script.py` (it sets RANK/WORLD_SIZE), or call torch.distributed.init_process_group first")
            init_default_group(backend, timeout)
        if self.single_process:
            self._init_ranks(0, 1, root, root_only, "process group")
        else:
            self._init_ranks(int(self.dist.get_rank(group=group)), int(self.dist.get_world_size(group=group)), root,
                             root_only, "process group")
        self.tree_steps: list[tuple[int, int]] = []
        """The (peer, step) pairs this rank received from in the last pass's reduction (for tests)."""
        self.wire = WireBytes()
        """This rank's pass bytes: the pickled payload, subtree entries and ordered results, as they crossed."""

    def _device(self) -> Any:
        """Where this group's tensors live: the current CUDA device under nccl, else the CPU."""
        torch = require_engine("torch", "torch")
        if self.dist.get_backend(self.group) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _exchange(self, tag: str, size: int) -> list[int]:
        """Every rank's ``size`` in rank order, all-gathered in one fixed-size tensor with the :func:`tag_code` of
        its step, which are checked first (the tags themselves gathered only to name a divergence)."""
        torch = require_engine("torch", "torch")
        mine = torch.tensor([tag_code(tag), size], dtype=torch.int64, device=self._device())
        out = [torch.empty_like(mine) for _ in range(self.size)]
        self.dist.all_gather(out, mine, group=self.group)
        rows = [t.tolist() for t in out]
        self.schedule.check_codes(tag, [r[0] for r in rows], self._gather_tags)
        return [int(r[1]) for r in rows]

    def _gather_tags(self, tag: str) -> list[str]:
        """Every rank's ``tag`` in rank order (only to name a divergence)."""
        out: list[Any] = [None] * self.size
        self.dist.all_gather_object(out, tag, group=self.group)
        return [str(t) for t in out]

    def _agree(self, operation: str) -> None:
        """The schedule check as a step of its own (``all_gather``, ``scatter``; nothing to check alone)."""
        if self.size > 1:
            self._exchange(self.schedule.next_tag(operation), 0)

    def all_gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order (a collective: every rank calls it)."""
        self._agree("all_gather")
        gathered = self.tree_reduce({self.rank: value})
        return [v for _, v in self.broadcast(sorted(gathered.items()) if gathered is not None else None)]

    # -- object collectives --------------------------------------------------------------------
    def _global(self, rank: int) -> int:
        return rank if self.group is None else int(self.dist.get_global_rank(self.group, rank))

    def broadcast(self, value: Any) -> Any:
        """The root's ``value`` on every rank."""
        if self.size == 1:
            return value
        box = [value if self.is_root else None]
        self.dist.broadcast_object_list(box, src=self._global(self.root), group=self.group)
        return box[0]

    def _broadcast_pickled(self, value: Any, operation: str) -> Any:
        """One pickle of the root's ``value`` on every rank, counted (sent once per peer, received once): its size
        all-gathered with every rank's tag of this step (checked before anything runs, ``spmd_schedule``), then
        its bytes broadcast -- the two collectives ``broadcast_object_list`` makes."""
        if self.size == 1:
            return value
        torch = require_engine("torch", "torch")
        blob = dumps(value) if self.is_root else b""
        size = self._exchange(self.schedule.next_tag(operation), len(blob))[self.root]
        if self.is_root:
            buffer = torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(self._device())
        else:
            buffer = torch.empty(size, dtype=torch.uint8, device=self._device())
        self.dist.broadcast(buffer, src=self._global(self.root), group=self.group)
        if self.is_root:
            self.wire.count_sent(blob, copies=self.size - 1)
            return value
        blob = buffer.cpu().numpy().tobytes()
        self.wire.count_received(blob)
        return pickle.loads(blob)

    def tree_reduce(self, mine: dict[Any, Any]) -> dict[Any, Any] | None:
        """Merge every rank's ``{key: value}`` up a binomial tree rooted at ``root``; the merged dict on the
        root, None elsewhere. Step ``k``: relative rank ``v`` with ``v % 2^(k+1) == 0`` receives from ``v + 2^k``."""
        rel = (self.rank - self.root) % self.size
        merged = dict(mine)
        self.tree_steps = []
        step = 1
        while step < self.size:
            if rel % (2 * step) == step:  # send my subtree's entries to my parent, then I am done
                parent = (rel - step + self.root) % self.size
                blob = dumps(merged)
                self.dist.send_object_list([blob], dst=self._global(parent), group=self.group)
                self.wire.count_sent(blob)
                return None
            child = rel + step
            if rel % (2 * step) == 0 and child < self.size:
                box: list[Any] = [None]
                peer = (child + self.root) % self.size
                self.dist.recv_object_list(box, src=self._global(peer), group=self.group)
                self.wire.count_received(box[0])
                merged.update(pickle.loads(box[0]))
                self.tree_steps.append((peer, step))
            step *= 2
        return merged

    # -- the runner contract -------------------------------------------------------------------
    def scatter(self, chunks: Sequence[Any] | None) -> None:
        """Keep this rank's block (``root_only``: the root sends each rank its block)."""
        self._agree("scatter")
        if self.root_only:
            parts = None
            if self.is_root:
                if chunks is None:
                    raise ValueError("root_only=True: the root rank must pass the chunks")
                parts = [{i: chunks[i] for i in ids} for ids in block_assignment(len(chunks), self.size)]
            n = self.broadcast(len(chunks) if self.is_root and chunks is not None else None)
            out: list[Any] = [None]
            if self.size == 1:
                out = [parts[0] if parts else {}]
            else:
                self.dist.scatter_object_list(out, parts, src=self._global(self.root), group=self.group)
            mine = out[0]
        else:
            if chunks is None:
                raise ValueError(f"rank {self.rank} passed no chunks; every rank needs the data unless root_only=True")
            n = len(chunks)
            mine = {i: chunks[i] for i in self.owned_chunk_ids(n)}
            missing = [i for i, c in mine.items() if c is None]
            if missing:
                raise ValueError(f"rank {self.rank} owns chunks {missing} but was given None for them")
        self._num_chunks = int(n)
        self._local = mine

    def map_chunks(self, fn: Callable[[Any, Any], Any], payload: Any,
                   chunk_ids: Sequence[int] | None = None) -> list[Any]:
        """Collective: the root's payload to all, own chunks computed, entries reduced up the tree and the
        ordered list broadcast back. Every rank must call it with the same ``fn`` and ``chunk_ids`` (checked
        first: ``spmd_schedule``)."""
        payload = self._broadcast_pickled(payload, map_tag(fn, chunk_ids))
        ids = requested_ids(chunk_ids, self._num_chunks)
        mine: dict[Any, Any] = {}
        failure: BaseException | None = None
        try:
            own = [i for i in ids if i in self._local]
            mine = dict(zip(own, apply_chunk_fn(fn, payload, own, self._local.__getitem__)))
        except Exception as exc:  # noqa: BLE001 - sent up the tree and raised on every rank
            failure = exc
            mine = {("error", self.rank): "".join(traceback.format_exception_only(type(exc), exc)).strip()}
        merged = self.tree_reduce(mine)
        outcome: Any = None
        if merged is not None:
            errors = sorted((k[1], v) for k, v in merged.items() if isinstance(k, tuple))
            outcome = ("error", errors) if errors else ("ok", ordered_results(merged, ids, self.name))
        kind, value = self._broadcast_pickled(outcome, "map_chunks: the ordered results")
        if kind == "error":
            detail = "; ".join(f"rank {r}: {e}" for r, e in value)
            raise TorchRunChunkError(f"chunk function failed on {len(value)} rank(s): {detail}") from failure
        return list(value)

    def close(self) -> None:
        """Drop this rank's chunks (the process group stays for the job's other handles)."""
        self._local = {}


class TorchRunEncodedData(BuiltByEncodedData, ChunkedEncodedData):
    """The generic handle over ``torch.distributed`` ranks; each rank encodes only its block.

    ``TorchRunEncodedData(data, estimator=None, model=None, encoder=None, sub_chunks=1, group=None,
    root=0, root_only=False, init_process_group=True, backend=None)`` is mixle's constructor: it is
    ``encoded_data(data, backend="torchrun", ...)``, called on every rank.
    """

    def _attach_reference(self, audit: EMAudit) -> None:
        """Every rank agrees on the audit's sample and references (``spmd_audit``)."""
        attach_spmd_reference(audit, self.runner, self._audit_rows, self.bounds, self.source, self.places)

    backend_name = "torchrun"

    runner: TorchRunRunner

    @classmethod
    def _build(cls, data: Any, estimator: Any = None, model: Any = None, encoder: Any = None, sub_chunks: int = 1,
               group: Any = None, root: int = 0, root_only: bool = False, init_process_group: bool = True,
               backend: str | None = None, **options: Any) -> Any:
        return encoded_data(data, estimator=estimator, model=model, encoder=encoder, sub_chunks=sub_chunks,
                            comm=group, root=root, root_only=root_only, backend="torchrun", backend_name=backend,
                            init_process_group=init_process_group, **options)

    @classmethod
    def over_runner(cls, runner: TorchRunRunner, data: Any, *, num_rows: int, **params: Any) -> TorchRunEncodedData:
        """The handle over an existing runner (what ``encoded_data(backend="torchrun")`` builds); ``params`` are
        the handle's options."""
        obj = object.__new__(cls)
        ChunkedEncodedData.__init__(obj, runner, data, num_rows=num_rows, **params)
        return obj

    _ensure_scattered = MPIEncodedData._ensure_scattered  # the same SPMD encoding: own block, or root_only


def _row_count(runner: TorchRunRunner, data: Any, root_only: bool) -> int:
    """Rows of the data, the same on every rank (checked), before any chunk is encoded (0 for a source: the
    handle counts its parts)."""
    placeholder = source_row_placeholder(data, root_only, "torchrun")
    if placeholder is not None:
        return placeholder
    n = len(data) if data is not None and (runner.is_root or not root_only) else None
    if root_only:
        return int(runner.broadcast(n))
    if data is None:
        raise ValueError(f"rank {runner.rank} passed data=None; pass the rows on every rank or root_only=True")
    rows = runner.tree_reduce({runner.rank: n})
    counts: list[tuple[int, int]] = runner.broadcast(sorted(rows.items()) if rows is not None else None)
    if len({c for _, c in counts}) != 1:
        raise ValueError(f"ranks hold different row counts {dict(counts)}; pass the same rows on every rank")
    return int(n or 0)


def torchrun_encoded_data(data: Any, *, group: Any = None, comm: Any = None, root: int = 0, root_only: bool = False,
                          backend_name: str | None = None, init_process_group: bool = True,
                          timeout: float | None = DEFAULT_TIMEOUT_S, **params: Any) -> TorchRunEncodedData:
    """``encoded_data(..., backend="torchrun")``: call on every rank (SPMD); ``group=`` (or ``comm=``) a
    process group, ``backend_name=`` the process-group backend when this call initializes it."""
    runner = TorchRunRunner(group if group is not None else comm, root=root, root_only=root_only,
                            init_process_group=init_process_group, backend=backend_name, timeout=timeout)
    if all(params.get(k) is None for k in ("estimator", "model", "encoder")):
        raise ValueError("backend='torchrun' needs an estimator, a model or an encoder to encode the rows")
    num_rows = _row_count(runner, data, root_only)
    return TorchRunEncodedData.over_runner(runner, data if (runner.is_root or not root_only) else None,
                                           num_rows=num_rows, **params)

ENCODED_DATA_OPTIONS = frozenset({"comm", "group", "root", "root_only", "timeout", "backend_name",
                                  "init_process_group", "batch_size", "shuffle", "seed"})
"""The ``encoded_data`` options the torchrun backend honours besides the handle's own (ranks: torchrun)."""

WORKER_PROCESSES = True


def planned_workers(options: Any) -> int:
    """The job's ranks: the given group's size, the initialized default group's, else torchrun's WORLD_SIZE."""
    group = options.extra.get("group", options.comm)
    if group is not None:
        return int(_dist().get_world_size(group=group))
    return torchrun_world_size()
