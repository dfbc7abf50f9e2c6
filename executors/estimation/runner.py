"""Chunk runners and the one generic encoded-data handle every EM backend shares.

The contract (for backend authors: local, mp, mpi, spark, dask, ray, or yours)
-------------------------------------------------------------------------------
* Data of ``n`` rows is cut into chunks by :func:`chunk_bounds`, whose boundaries depend only on
  ``n`` and ``num_chunks``/``chunk_size`` -- never on the worker count. Chunk ids are ``0..c-1``.
  Each chunk is encoded once into an :class:`EncodedChunk` (``chunk_id``, ``start``, ``stop``,
  ``data``), so a function running on a worker knows which chunk it holds.
* A backend is a *chunk runner* (:class:`ChunkRunner`): ``scatter(chunks)`` places the encoded
  chunks (list index == chunk id) on its workers once; ``map_chunks(fn, payload, chunk_ids=None)``
  runs ``fn(chunk, payload)`` where each chunk is resident and returns the results **ordered by
  chunk id**; ``close()`` frees everything. ``fn`` is a module-level function and ``payload``
  plain data or model objects (both picklable). A runner recomputes the chunks of a dead worker
  on the survivors (raising :class:`WorkerLostError` only when none survive) and raises
  :class:`WorkerTimeoutError` for a worker that does not answer within its timeout.
  An SPMD runner (MPI) computes its own chunk ids and all-gathers, so every rank holds the full
  ordered list and runs the same combine, yielding the same model on every rank.
* :class:`ChunkedEncodedData` turns any runner into an encoded-data handle (the ``pysp_seq_*``
  methods). It combines chunk statistics **in chunk order** with the estimator's accumulator, and
  initialization draws come from a per-chunk generator seeded by ``(seed, chunk_id)``
  (:func:`chunk_rng`), so every backend and every worker count yields the same bits.
* A backend registers ``factory(data, **params) -> handle`` through
  ``executors.registry.register_encoded_data_backend``; :func:`handle_from_runner` does the
  encoding and wiring, so an engine backend is a runner plus a few lines.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from mixle_parallel.contracts.estimation import statistic_digest

DEFAULT_CHUNK_SIZE = 16384
"""Rows per chunk when neither ``num_chunks`` nor ``chunk_size`` is given."""

__all__ = [
    "ChunkResult", "ChunkRunner", "ChunkedEncodedData", "DEFAULT_CHUNK_SIZE", "EStepResult",
    "EncodedChunk", "WorkerLostError", "WorkerTimeoutError", "chunk_bounds", "chunk_estep",
    "chunk_initialize", "chunk_log_density", "chunk_rng", "combine_in_chunk_order", "encode_chunks",
    "handle_from_runner", "resolve_encoder", "seed_from",
]


class WorkerLostError(RuntimeError):
    """Every worker of a runner died, so the lost chunks cannot be recomputed anywhere."""


class WorkerTimeoutError(TimeoutError):
    """A worker did not answer within the runner's timeout (hung or overloaded)."""


class EncodedChunk(NamedTuple):
    """One encoded chunk: its id, its row range ``[start, stop)`` and the encoded data."""

    chunk_id: int
    start: int
    stop: int
    data: Any

    @property
    def count(self) -> int:
        """Rows in the chunk."""
        return self.stop - self.start


class ChunkResult(NamedTuple):
    """What the E-step of one chunk yields: rows, log-likelihood of the model used, statistics."""

    count: float
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
    """A backend: places encoded chunks on workers once and maps functions over them."""

    name: str
    num_workers: int

    def scatter(self, chunks: Sequence[Any]) -> None: ...

    def map_chunks(
        self, fn: Callable[[Any, Any], Any], payload: Any, chunk_ids: Sequence[int] | None = None
    ) -> list[Any]: ...

    def close(self) -> None: ...


# ---- chunking ---------------------------------------------------------------------------------
def chunk_bounds(
    num_rows: int, num_chunks: int | None = None, chunk_size: int | None = None
) -> tuple[tuple[int, int], ...]:
    """Row ranges of the chunks; they depend only on the row count and the chunking controls."""
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


def _num_rows(data: Any) -> int:
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


def _ordered_sum(values: Sequence[float]) -> float:
    total = 0.0
    for v in values:
        total += float(v)
    return total


# ---- the generic handle -----------------------------------------------------------------------
class ChunkedEncodedData:
    """An encoded-data handle over any :class:`ChunkRunner`; same bits on every backend."""

    def __init__(
        self,
        runner: ChunkRunner,
        data: Any = None,
        *,
        estimator: Any = None,
        model: Any = None,
        encoder: Any = None,
        num_chunks: int | None = None,
        chunk_size: int | None = None,
        num_rows: int | None = None,
        controls: dict[str, Any] | None = None,
        owns_runner: bool = True,
    ) -> None:
        self.runner = runner
        self._data = data
        self.num_rows = _num_rows(data) if num_rows is None else int(num_rows)
        self.bounds = chunk_bounds(self.num_rows, num_chunks, chunk_size)
        self.controls = dict(controls or {})
        self._owns_runner = owns_runner
        self._scattered = False
        self._closed = False
        self._encoder = encoder if encoder is not None else (
            resolve_encoder(estimator, model) if (estimator is not None or model is not None) else None
        )
        if self._encoder is not None:
            self._ensure_scattered(None, None)

    # -- identity -------------------------------------------------------------------------------
    @property
    def backend(self) -> str:
        """Name of the runner's backend."""
        return self.runner.name

    @property
    def num_workers(self) -> int:
        """Workers of the runner."""
        return self.runner.num_workers

    @property
    def num_chunks(self) -> int:
        """Chunks the data is cut into."""
        return len(self.bounds)

    def __repr__(self) -> str:
        return (f"ChunkedEncodedData(backend={self.backend!r}, rows={self.num_rows}, "
                f"chunks={self.num_chunks}, workers={self.num_workers})")

    # -- placement ------------------------------------------------------------------------------
    def _ensure_scattered(self, estimator: Any, model: Any) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed; create a new handle with encoded_data(...)")
        if self._scattered:
            return
        if self._encoder is None:
            self._encoder = resolve_encoder(estimator, model)
        if self._data is None:
            raise ValueError("this handle has no data to encode; pass the rows to encoded_data()")
        chunks = encode_chunks(self._data, self._encoder, self.bounds)
        self.runner.scatter(chunks)
        self._scattered = True
        self._data = None  # the runner holds the encoded chunks now

    def _map(self, fn: Callable[[Any, Any], Any], payload: Any, estimator: Any = None, model: Any = None) -> list[Any]:
        self._ensure_scattered(estimator, model)
        results = self.runner.map_chunks(fn, payload)
        if len(results) != self.num_chunks:
            raise RuntimeError(
                f"backend {self.backend!r} returned {len(results)} chunk results for {self.num_chunks} "
                "chunks; a runner must return one result per chunk, ordered by chunk id"
            )
        return results

    # -- EM ---------------------------------------------------------------------------------------
    def chunk_statistics(self, estimator: Any, model: Any) -> list[ChunkResult]:
        """Per-chunk E-step results in chunk order (for audits: compare with ``statistic_digest``)."""
        return [ChunkResult(*r) for r in self._map(chunk_estep, (estimator, model), estimator, model)]

    def chunk_digests(self, estimator: Any, model: Any) -> list[str]:
        """``sha256:`` digest of each chunk's statistics, in chunk order."""
        return [statistic_digest(r.stats) for r in self.chunk_statistics(estimator, model)]

    def estep(self, estimator: Any, model: Any) -> EStepResult:
        """One data pass: the statistics under ``model``, its log-likelihood, and the M-step."""
        results = self.chunk_statistics(estimator, model)
        nobs = _ordered_sum([r.count for r in results])
        ll = _ordered_sum([r.log_likelihood for r in results])
        stats = combine_in_chunk_order(estimator, [r.stats for r in results])
        return EStepResult(nobs, ll, stats, estimator.estimate(nobs, stats))

    def pysp_seq_estimate(self, estimator: Any, prev_estimate: Any) -> Any:
        """One E/M update from ``prev_estimate`` (the new model)."""
        return self.estep(estimator, prev_estimate).model

    def pysp_seq_log_density_sum(self, estimate: Any) -> tuple[float, float]:
        """Rows and total log-likelihood of ``estimate`` over the data."""
        results = self._map(chunk_log_density, estimate, None, estimate)
        return _ordered_sum([r[0] for r in results]), _ordered_sum([r[1] for r in results])

    def pysp_seq_initialize(self, estimator: Any, rng: Any, p: float) -> Any:
        """A random start: rows kept with probability ``p``; draws depend on (seed, chunk id) only."""
        if not (isinstance(p, (int, float)) and 0.0 < float(p) <= 1.0):
            raise ValueError(f"init_p must be in (0, 1], got {p!r}")
        seed = seed_from(rng)
        results = self._map(chunk_initialize, (estimator, seed, float(p)), estimator)
        nobs = _ordered_sum([r[0] for r in results])
        if nobs == 0.0 and self.num_rows > 0:
            # Nothing was drawn (tiny data, small p): start from every row instead.
            results = self._map(chunk_initialize, (estimator, seed, 1.0), estimator)
            nobs = _ordered_sum([r[0] for r in results])
        stats = combine_in_chunk_order(estimator, [r[1] for r in results])
        return estimator.estimate(nobs, stats)

    # -- lifetime ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Release the runner's workers and memory (idempotent)."""
        if not self._closed:
            self._closed = True
            if self._owns_runner:
                self.runner.close()

    def __enter__(self) -> "ChunkedEncodedData":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter shutdown
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


def handle_from_runner(
    runner: ChunkRunner,
    data: Any,
    *,
    estimator: Any = None,
    model: Any = None,
    encoder: Any = None,
    num_chunks: int | None = None,
    chunk_size: int | None = None,
    num_rows: int | None = None,
    controls: dict[str, Any] | None = None,
    **_: Any,
) -> ChunkedEncodedData:
    """Wrap a runner as an encoded-data handle (encoding happens now if an encoder is known)."""
    return ChunkedEncodedData(
        runner, data, estimator=estimator, model=model, encoder=encoder, num_chunks=num_chunks,
        chunk_size=chunk_size, num_rows=num_rows, controls=controls,
    )
