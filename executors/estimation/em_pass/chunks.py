"""Chunks and chunk runners: the contract every EM backend implements, and the per-chunk E-step.

The contract (for backend authors: local, mp, mpi, spark, dask, ray, or yours)
-------------------------------------------------------------------------------
* Data of ``n`` rows is cut into chunks by :func:`chunk_bounds`, whose boundaries depend only on
  ``n`` and ``num_chunks``/``chunk_size`` -- never on the worker count. Chunk ids are ``0..c-1``.
  Each chunk is encoded once into an :class:`EncodedChunk` (``chunk_id``, ``start``, ``stop``,
  ``data``), so a function running on a worker knows which chunk it holds.
* A backend is a *chunk runner* (:class:`ChunkRunner`): ``name`` (the backend's name, in receipts
  and ledgers), ``num_workers`` (the workers it runs, the SDC audit's and the receipts' count);
  ``scatter(chunks)`` places the encoded chunks (list index == chunk id) on its workers once;
  ``map_chunks(fn, payload, chunk_ids=None)`` runs ``fn(chunk, payload)`` where each chunk is
  resident and returns the results **ordered by chunk id**; ``close()`` frees everything. ``fn`` is
  a module-level function and ``payload``
  plain data or model objects (both picklable). A runner recomputes the chunks of a dead worker
  on the survivors (raising :class:`WorkerLostError` only when none survive) and raises
  :class:`WorkerTimeoutError` for a worker that does not answer within its timeout.
  An SPMD runner (MPI) computes its own chunk ids and all-gathers, so every rank holds the full
  ordered list and runs the same combine, yielding the same model on every rank.
* ``handle.ChunkedEncodedData`` turns any runner into an encoded-data handle (the ``pysp_seq_*``
  methods). It combines E-step statistics in one fixed two-level order (:func:`combine_groups`:
  chunks folded in order within contiguous groups, then the groups folded in order), and
  initialization draws come from a per-chunk generator seeded by ``(seed, chunk_id)``
  (:func:`chunk_rng`), so every backend and every worker count yields the same bits.
* Worker-side folding (optional, a speed-up only): a runner that evaluates a worker's chunk list
  through :func:`apply_chunk_fn` lets a pass function such as :class:`GroupFold` fold each
  combine group that lies wholly in that list on the worker, returning the :class:`GroupStats`
  at the group's last chunk and ``None`` for its other chunks (or their own results, for the
  chunks it was asked to bring back, e.g. audited ones). One small result per group
  travels back instead of one per chunk; the bits are those of the driver's own fold.
* Optional capability, needed for the SDC audit to recompute a chunk on a *different* worker:
  a runner with ``supports_worker_placement = True`` also has ``worker_ids()`` (live worker ids,
  ints), ``chunk_owners()`` (the worker each chunk is resident on) and
  ``run_on_workers({worker: WorkerTask(fn, payload, chunk_ids)})`` returning, per worker, the
  results of its chunk ids in the order given (a chunk may be listed for several workers); a
  requested worker that is gone or dies raises :class:`WorkerUnavailableError`.
  ``compute_on(worker, fn, payload, chunk_ids)`` is the one-worker form. ``local``, ``mp``,
  ``dask`` and ``ray`` have it (``backends.runner_families.PlacesWork``); ``mpi``, ``torchrun`` and
  ``spark`` decline it (``DeclinesPlacement``: an SPMD rank / a Spark task cannot be aimed at a chosen
  worker), so their audits recompute a chunk on the same runner (``same_rank`` replays).
* A backend registers ``factory(data, **params) -> handle`` through
  ``executors.registry.register_encoded_data_backend`` and declares there (keywords, or attributes of
  the factory) the options it honours (``options=``), whether its workers are processes
  (``worker_processes=``; undeclared counts as yes) and ``planned_workers(options)``, the workers it
  will run, known before any starts (undeclared: ``num_workers``, else 1); the admission gate takes
  the world from these. ``handle.handle_from_runner(runner, data, **params)`` does the encoding and
  wiring (``params``: the options it did not use itself), so an engine backend is a runner plus a few
  lines. ``examples/em_backend_template.py`` is a complete one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from .combine_order import (
    DEFAULT_CHUNK_MULTIPLE,
    GroupFold,
    GroupStats,
    apply_chunk_fn,
    chunk_result,
    combine_groups,
    fold_group,
    fold_pass,
    group_of,
)
from .runner_protocols import places_work

DEFAULT_CHUNK_SIZE = 16384
"""Largest rows per chunk when neither ``num_chunks`` nor ``chunk_size`` is given."""

__all__ = [
    "GroupFold",
    "GroupStats",
    "apply_chunk_fn",
    "chunk_result",
    "combine_groups",
    "fold_group",
    "fold_pass",
    "group_of",
    "ChunkResult",
    "ChunkRunner",
    "DEFAULT_CHUNK_SIZE",
    "EStepResult",
    "DEFAULT_CHUNK_MULTIPLE",
    "EncodedChunk",
    "WorkerLostError",
    "WorkerTask",
    "WorkerTimeoutError",
    "WorkerUnavailableError",
    "chunk_bounds",
    "chunk_estep",
    "supports_worker_placement",
    "chunk_initialize",
    "chunk_log_density",
    "chunk_rng",
    "combine_in_chunk_order",
    "encode_chunks",
    "resolve_encoder",
    "seed_from",
]


class WorkerLostError(RuntimeError):
    """Every worker of a runner died, so the lost chunks cannot be recomputed anywhere."""


class WorkerTimeoutError(TimeoutError):
    """A worker did not answer within the runner's timeout (hung or overloaded)."""


class WorkerUnavailableError(WorkerLostError):
    """A worker asked to compute chosen chunks is gone or died meanwhile; ``workers`` names it."""

    def __init__(self, workers: Sequence[int], message: str) -> None:
        self.workers = tuple(int(w) for w in workers)
        super().__init__(message)


class WorkerTask(NamedTuple):
    """Work for one chosen worker: ``fn(chunk, payload)`` over ``chunk_ids``, in that order."""

    fn: Callable[[Any, Any], Any]
    payload: Any
    chunk_ids: tuple[int, ...]


def supports_worker_placement(runner: object) -> bool:
    """Whether ``runner`` can compute chosen chunks on a chosen worker: it is a ``WorkerPlacement`` (the
    members) and declares ``supports_worker_placement = True`` (``runner_protocols.places_work``)."""
    return places_work(runner)


def check_tasks(tasks: Any, num_chunks: int, live: Sequence[int], backend: str) -> dict[int, WorkerTask]:
    """Validate a ``run_on_workers`` request; a worker not in ``live`` raises ``WorkerUnavailableError``."""
    out: dict[int, WorkerTask] = {}
    for worker, task in tasks.items():
        fn, payload, ids = task
        ids = tuple(int(i) for i in ids)
        bad = [i for i in ids if not 0 <= i < num_chunks]
        if bad:
            raise IndexError(f"chunk ids {bad} are out of range: the {backend} runner holds chunks 0..{num_chunks - 1}")
        out[int(worker)] = WorkerTask(fn, payload, ids)
    gone = sorted(w for w, t in out.items() if t.chunk_ids and w not in set(live))
    if gone:
        raise WorkerUnavailableError(gone, f"{backend} worker(s) {gone} are not alive (live: {list(live)})")
    return out


class EncodedChunk(NamedTuple):
    """One encoded chunk: its id, its row range ``[start, stop)`` and the encoded data."""

    chunk_id: int
    start: int
    stop: int
    data: Any

    @property
    def count(self) -> int:  # type: ignore[override]  # deliberately shadows tuple.count (rows, not a method)
        """Rows in the chunk."""
        return self.stop - self.start


class ChunkResult(NamedTuple):
    """What the E-step of one chunk yields: rows, log-likelihood of the model used, statistics."""

    count: float  # type: ignore[assignment]  # a NamedTuple field may shadow tuple.count; mypy reads it as an override
    log_likelihood: float
    stats: Any


class EStepResult(NamedTuple):
    """One data pass: rows, log-likelihood of the model it scored, combined statistics, new model."""

    nobs: float
    log_likelihood: float
    stats: Any
    model: Any


@runtime_checkable
class ChunkRunner(Protocol):
    """A backend: places encoded chunks on workers once and maps functions over them (its name and worker count
    read-only: a plain attribute or a property)."""

    @property
    def name(self) -> str: ...

    @property
    def num_workers(self) -> int: ...

    def scatter(self, chunks: Sequence[Any]) -> None: ...

    def map_chunks(
        self, fn: Callable[[Any, Any], Any], payload: Any, chunk_ids: Sequence[int] | None = None
    ) -> list[Any]: ...

    def close(self) -> None: ...


# ---- chunking ---------------------------------------------------------------------------------
def chunk_bounds(
    num_rows: int, num_chunks: int | None = None, chunk_size: int | None = None
) -> tuple[tuple[int, int], ...]:
    """Row ranges of the chunks; they depend only on the row count and the chunking controls.

    ``num_chunks`` and ``chunk_size`` are taken as given. Without either, chunks hold at most
    ``DEFAULT_CHUNK_SIZE`` rows and their count is rounded up to a multiple of
    ``DEFAULT_CHUNK_MULTIPLE`` (when above one) so workers get equal shares.
    """
    if isinstance(num_rows, bool) or not isinstance(num_rows, (int, np.integer)) or num_rows < 0:
        raise ValueError(f"num_rows must be an int >= 0, got {num_rows!r}")
    if num_chunks is not None and chunk_size is not None:
        raise ValueError("give num_chunks or chunk_size, not both")
    if num_chunks is not None:
        if isinstance(num_chunks, bool) or not isinstance(num_chunks, (int, np.integer)) or num_chunks < 1:
            raise ValueError(f"num_chunks must be an int >= 1, got {num_chunks!r}")
        count = int(num_chunks)
    else:
        size = DEFAULT_CHUNK_SIZE if chunk_size is None else chunk_size
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
            raise ValueError(f"chunk_size must be an int >= 1, got {chunk_size!r}")
        count = max(1, math.ceil(num_rows / int(size)))
        if chunk_size is None and count > 1:
            count = -(-count // DEFAULT_CHUNK_MULTIPLE) * DEFAULT_CHUNK_MULTIPLE
    n = int(num_rows)
    count = max(1, min(count, n)) if n > 0 else 1
    edges = [(i * n) // count for i in range(count + 1)]
    return tuple((edges[i], edges[i + 1]) for i in range(count))


def resolve_encoder(estimator: Any = None, model: Any = None, encoder: Any = None) -> Any:
    """The encoder to use: explicit, else the model's, else the estimator's."""
    if encoder is not None:
        return encoder
    if model is not None:
        return model.encoder()
    if estimator is not None:
        return estimator.encoder()
    raise ValueError("cannot encode data without an encoder: pass estimator=, model= or encoder=")


def count_rows(data: Any) -> int:
    try:
        return len(data)
    except TypeError:
        raise TypeError(
            f"data must be a sized sequence or array of rows, got {type(data).__name__}; "
            "materialize it (list(...) or numpy.asarray(...)) first"
        ) from None


def encode_chunks(data: Any, encoder: Any, bounds: Sequence[tuple[int, int]]) -> list[EncodedChunk]:
    """Encode each row range of ``data`` with ``encoder`` (contiguous slices, chunk order)."""
    return [EncodedChunk(i, a, b, encoder.encode(data[a:b])) for i, (a, b) in enumerate(bounds)]


# ---- seeding ----------------------------------------------------------------------------------
def seed_from(rng: Any) -> int:
    """An int seed from ``None`` (fixed 0), an int, a RandomState or a Generator."""
    if rng is None:
        return 0
    if isinstance(rng, (bool, np.bool_)):
        raise TypeError("seed/rng must be an int, a numpy RandomState or Generator, got a bool")
    if isinstance(rng, (int, np.integer)):
        return int(rng)
    if isinstance(rng, np.random.RandomState):
        return int(rng.randint(2**31 - 1))
    if isinstance(rng, np.random.Generator):
        return int(rng.integers(2**31 - 1))
    raise TypeError(f"seed/rng must be an int, a numpy RandomState or Generator, got {type(rng).__name__}")


def chunk_rng(seed: int, chunk_id: int) -> np.random.Generator:
    """The generator of one chunk's initialization draws: a function of (seed, chunk id) only."""
    return np.random.default_rng(np.random.SeedSequence([int(seed) & 0xFFFFFFFFFFFFFFFF, int(chunk_id)]))


# ---- module-level chunk functions (picklable; run where the chunk is resident) ----------------
def chunk_estep(chunk: EncodedChunk, payload: tuple[Any, Any]) -> ChunkResult:
    """E-step of one chunk: statistics under ``model`` and the log-likelihood of ``model``."""
    estimator, model = payload
    acc = estimator.accumulator_factory().make()
    ll = acc.update(chunk.data, None, model)
    if ll is None:
        ll = model.log_density(chunk.data)
    return ChunkResult(float(chunk.count), float(np.sum(ll)), acc.value())


def chunk_log_density(chunk: EncodedChunk, model: Any) -> tuple[float, float]:
    """Rows and summed log density of ``model`` over one chunk."""
    return float(chunk.count), float(np.sum(model.log_density(chunk.data)))


def chunk_initialize(chunk: EncodedChunk, payload: tuple[Any, int, float]) -> tuple[float, Any]:
    """Random start of one chunk: rows kept with probability ``p``, draws from (seed, chunk id)."""
    estimator, seed, p = payload
    rng = chunk_rng(seed, chunk.chunk_id)
    weights = (rng.random(chunk.count) < p).astype(np.float64) if p < 1.0 else np.ones(chunk.count)
    acc = estimator.accumulator_factory().make()
    acc.initialize(chunk.data, weights, rng)
    return float(np.sum(weights)), acc.value()


def combine_in_chunk_order(estimator: Any, values: Sequence[Any]) -> Any:
    """Fold chunk statistics into one, strictly in the given (chunk) order."""
    acc = estimator.accumulator_factory().make()
    for value in values:
        acc.combine(value)
    return acc.value()


def ordered_sum(values: Sequence[float]) -> float:
    total = 0.0
    for v in values:
        total += float(v)
    return total
