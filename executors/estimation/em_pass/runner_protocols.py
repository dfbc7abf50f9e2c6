"""What the EM pass needs of a chunk runner, and the fit loop of a handle, as Protocols (never a probe of a name).

:class:`~.chunks.ChunkRunner` is the work on all chunks every backend does. The audit's placed work (replays on
a chosen worker, reveals, the recomputation of a quarantined worker's chunks) needs :class:`WorkerPlacement`,
which a runner declares with ``supports_worker_placement = True`` (``mpi``, ``spark`` and the task runners
declare False: an SPMD rank or a Spark task cannot be aimed at a chosen worker). The rest are optional
capabilities the pass, the handle and the sources read where a runner has them: the worker each chunk is
resident on (:class:`ChunkOwnership`), chunk blocks assigned to workers by a placement (:class:`AssignsChunks`),
the counters of its transport (:class:`CountsTransport`), its worker processes (:class:`PoolProcesses`), the
ranks of an SPMD program (:class:`RankGather`; with the root and each chunk's rank, :class:`RankCollective`), a
dask client its actors live on, which waits for a source's tasks too (:class:`ClientCluster`), Spark partitions
placed as chunks (:class:`PlacesPartitions`) and the seconds it waits for its workers (:class:`TimedRunner`,
which a source's reads for the audit keep too).

A handle meets the fit loop (``optimize``), the gate and the harness through mixle 0.8.2's shape
(``contracts.estimation.EncodedDataHandle``) and what ours adds where a third-party handle may lack it: one
pass with its M-step (:class:`EStepHandle`), a function mapped over its chunks (:class:`ChunkedHandle`), a
random start (:class:`InitializableHandle`), mini-batches (:class:`MinibatchHandle`), a fit's lifecycle
(:class:`FitLifecycle`), its audit and admission (:class:`AuditedHandle`, :class:`AdmittedHandle`), its rows
(:class:`SizedHandle`) and workers (:class:`CountsWorkers`), its measured transport (:class:`MeteredHandle`),
the verification it binds (:class:`BindsVerification`) and its runner (:class:`RunsOnRunner`); the pass writes
to the run's ledger (:class:`RunLedger`). Every check is an ``isinstance`` against one of these
(``runtime_checkable``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .chunks import EStepResult
    from .deferred_judging import JudgedBatch

__all__ = ["PARTITION_ROWS", "AdmittedHandle", "AssignsChunks", "AuditedHandle", "BindsVerification", "ChunkOwnership",
           "ChunkedHandle", "ClientCluster", "CountsTransport", "CountsWorkers", "DefersJudging", "EStepHandle",
           "FitLifecycle", "InitializableHandle", "MeteredHandle", "MinibatchHandle", "PlacesPartitions",
           "PoolProcesses", "RankCollective", "RankGather", "RunLedger", "RunsOnRunner", "SizedHandle", "TimedRunner",
           "WorkerPlacement", "places_work", "runner_timeout", "transport_count"]


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


@runtime_checkable
class PoolProcesses(Protocol):
    """A runner of worker processes whose pids it knows (``mp``): a result is attributed to its worker by pid."""

    @property
    def live_workers(self) -> Sequence[int]: ...

    def worker_pids(self) -> Sequence[int]: ...


@runtime_checkable
class RankGather(Protocol):
    """A runner whose workers are ranks, this process one of them, that gathers a value from every rank."""

    @property
    def rank(self) -> int: ...

    def all_gather(self, value: Any) -> list[Any]: ...


@runtime_checkable
class RankCollective(RankGather, ChunkOwnership, Protocol):
    """A runner whose workers are the ranks of one SPMD program (``mpi``, ``torchrun``): this process is one."""

    @property
    def root(self) -> int: ...

    @property
    def is_root(self) -> bool: ...


@runtime_checkable
class ClientCluster(WorkerPlacement, Protocol):
    """A runner whose workers are actors on a dask cluster reached through ``client`` (a ``distributed.Client``):
    a dask collection is computed there and its chunks held by the actors. It waits for a source's tasks as for
    its own passes (``wait_for_tasks``: silent workers given up at the straggler deadline, ``WorkerTimeoutError``
    past the timeout)."""

    @property
    def client(self) -> Any: ...

    def wait_for_tasks(self, futures: Mapping[str, Any], what: str) -> None: ...


TaskBody = Callable[[Iterable[Any]], Iterator[Any]]
"""What each task of a Spark serving stage runs over its partition's records (``spark_channel.serving_task``)."""

StageJob = Callable[[TaskBody], Any]
"""A Spark serving stage's job made from what its tasks run: a barrier stage, one task per partition, whose
``collect()`` runs it (``spark_channel.barrier_partitions``, or a DataFrame's Arrow batches read in the tasks)."""

PARTITION_ROWS = -1
"""The record key of a partition's rows among its encoded ``(chunk id, chunk)`` records (``PlacesPartitions``):
the rows travel and stay cached with the chunks encoded from them, for the audit's reads."""


@runtime_checkable
class PlacesPartitions(Protocol):
    """A runner whose chunks are an RDD's partitions encoded and cached on Spark's executors (``spark``); it runs
    a source's Spark jobs under its deadline (``run_job``: cancelled and ``WorkerTimeoutError`` past it; a job over
    several ``partitions`` with a pass's straggler rule). Where tasks kept alive serve it: ``open_rows`` has them
    read a source's partitions (their row counts, or None: read them with a job), ``place_held`` has them encode
    their chunks (False: place them with a job), ``read_held`` runs ``fn(rows, ask)`` on the rows each asked
    partition holds (its :data:`PARTITION_ROWS` record; None: read them with a job)."""

    def place_partitions(self, encoded: Any, parts: Sequence[int]) -> None: ...

    def run_job(self, job: Callable[[], Any], what: str, partitions: Sequence[int] | None = None) -> Any: ...

    def open_rows(self, rows: Any, job: StageJob | None = None) -> list[int] | None: ...

    def place_held(self, encode: Callable[[Any, Any], list[int]], asks: Mapping[int, Any], parts: Sequence[int],
                   build: Callable[[], Any]) -> bool: ...

    def read_held(self, fn: Callable[[Any, Any], Any], asks: Mapping[int, Any]) -> dict[int, Any] | None: ...


@runtime_checkable
class TimedRunner(Protocol):
    """A runner that gives up on its workers after ``timeout`` seconds (None: never); a source reading rows for
    the audit on the runner's cluster waits no longer (``WorkerTimeoutError``)."""

    timeout: float | None


# ---- handles --------------------------------------------------------------------------------------------
@runtime_checkable
class EStepHandle(Protocol):
    """A handle whose one pass gives the statistics, the log-likelihood and the M-step together."""

    def estep(self, estimator: Any, model: Any) -> EStepResult: ...


@runtime_checkable
class ChunkedHandle(Protocol):
    """A handle that maps a function over its resident chunks (``ChunkedEncodedData``; k-means++ starts use it)."""

    def map_chunks(self, fn: Callable[[Any, Any], Any], payload: Any, estimator: Any = None) -> list[Any]: ...


@runtime_checkable
class InitializableHandle(Protocol):
    """A handle (or one mini-batch of one) that draws a random start from its rows (mixle's name)."""

    def pysp_seq_initialize(self, estimator: Any, rng: Any, p: float) -> Any: ...


@runtime_checkable
class MinibatchHandle(Protocol):
    """A handle stepwise EM runs on: its chunks' row ranges and the E-step of chosen chunks (a mini-batch)."""

    @property
    def bounds(self) -> Sequence[tuple[int, int]]: ...

    @property
    def num_rows(self) -> int: ...

    @property
    def num_chunks(self) -> int: ...

    def batch_statistics(self, estimator: Any, model: Any, chunk_ids: Sequence[int]) -> list[Any]: ...

    def map_batch(self, fn: Callable[[Any, Any], Any], payload: Any, chunk_ids: Sequence[int],
                  estimator: Any = None) -> list[Any]: ...


@runtime_checkable
class FitLifecycle(Protocol):
    """A handle told where a fit begins (its first pass audits at least one chunk) and why it failed."""

    def begin_fit(self) -> None: ...

    def record_failure(self, error: BaseException) -> None: ...


@runtime_checkable
class DefersJudging(Protocol):
    """A handle that judges a fit's audited passes in batches (``deferred_judging``): the fit loop turns it on and
    off, asks when a batch is due and has it judged."""

    def defer_judging(self, on: bool) -> bool: ...

    @property
    def passes_held(self) -> int: ...

    def judging_due(self) -> bool: ...

    def judge_deferred(self) -> JudgedBatch: ...


@runtime_checkable
class AuditedHandle(Protocol):
    """A handle with an SDC audit: the records of its last pass and the workers it quarantined."""

    @property
    def last_audit_records(self) -> tuple[Any, ...]: ...

    @property
    def quarantined(self) -> frozenset[int]: ...


@runtime_checkable
class AdmittedHandle(Protocol):
    """A handle that keeps the gate's admission decision (None before it is bound)."""

    admission: Any


@runtime_checkable
class SizedHandle(Protocol):
    """A handle that knows its rows."""

    @property
    def num_rows(self) -> int: ...


@runtime_checkable
class CountsWorkers(Protocol):
    """A runner or handle that knows its worker count."""

    @property
    def num_workers(self) -> int: ...


@runtime_checkable
class MeteredHandle(Protocol):
    """A handle that measures its passes: its runner's transport messages and its workers' records."""

    @property
    def last_transport_messages(self) -> int | None: ...

    @property
    def last_rank_records(self) -> Sequence[Any]: ...


@runtime_checkable
class BindsVerification(Protocol):
    """A handle that binds the gate's decision, the SDC audit and the ledger (``ChunkedEncodedData``)."""

    def attach_verification(self, verification: Any = None, *, admission: Any = None, certificate: Any = None,
                            **controls: Any) -> None: ...


@runtime_checkable
class RunsOnRunner(Protocol):
    """A handle over a chunk runner (whose code a certificate must bind as well as the handle's)."""

    @property
    def runner(self) -> Any: ...


@runtime_checkable
class RunLedger(Protocol):
    """The run's ledger as a handle writes it (``verification.Ledger``): run start, receipts, audit records,
    notes, run end."""

    def run_start(self, *, plan: Any, certificate: Any, executor: str = "", versions: Mapping[str, str] | None = None,
                  host: str | None = None, extra: Mapping[str, Any] | None = None) -> Any: ...

    def receipt(self, receipt: Any, *, rank: int = 0, extra: Mapping[str, Any] | None = None) -> Any: ...

    def audit(self, record: Any) -> Any: ...

    def note(self, message: str, **extra: Any) -> Any: ...

    def run_end(self, *, status: str = "ok", steps: int | None = None,
                extra: Mapping[str, Any] | None = None) -> Any: ...


def places_work(runner: object) -> bool:
    """Whether ``runner`` computes chosen chunks on chosen workers: it has the members and declares it."""
    return isinstance(runner, WorkerPlacement) and bool(runner.supports_worker_placement)


def runner_timeout(runner: object) -> float | None:
    """The seconds ``runner`` waits for its workers (:class:`TimedRunner`), or None where it sets no limit."""
    return runner.timeout if isinstance(runner, TimedRunner) else None


def transport_count(runner: object, name: str) -> int | None:
    """The runner's ``transport_bytes`` / ``transport_messages`` so far, or None where it does not count."""
    if name not in ("transport_bytes", "transport_messages"):
        raise ValueError(f"no transport counter named {name!r}: transport_bytes or transport_messages")
    if not isinstance(runner, CountsTransport):
        return None
    found = runner.transport_bytes if name == "transport_bytes" else runner.transport_messages
    return None if found is None else int(found)
