"""The ``spark`` chunk runner: encoded chunks as the records of one cached RDD.

The chunks are parallelized once as ``(chunk id, chunk)`` records into contiguous partitions
(one per worker) and cached. With ``direct_channel=True`` (the default) and no more partitions than task slots,
the passes are served by one barrier stage whose tasks keep the partitions' chunks and answer each pass over a
socket (``backends.spark_channel``: a pass without a job's ~0.1 s start), released when idle and before any other
job of the runner; a stage that fails hands the passes back to jobs. As a job, a data pass maps ``fn`` over the
cached partitions and collects ``(chunk id, result)`` pairs, which the runner orders by chunk id. Spark retries a
failed task (a Python worker that died) from the partition's lineage. A task still running at the straggler
deadline (``deadline.straggler_deadline``, well below ``timeout``) while the pass's other tasks finished
(a SIGSTOPped or hung Python worker) has its job cancelled (Spark kills the worker) and the pass runs
again from the cached partitions: same bits, since a chunk's result depends only on the chunk. Spark's
own speculation cannot do it on ``local[n]`` (a copy never runs on the host of the original). A pass
that does not finish within ``timeout`` seconds is cancelled and raises ``WorkerTimeoutError``.
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from ....contracts.resources import local_cpu_count
from ..em_pass.chunks import WorkerTimeoutError, apply_chunk_fn
from ..handle import handle_from_runner
from ..options import EncodedDataOptions
from ..sources.recipes import is_recipe, materialize
from .chunk_assignment import (
    block_assignment,
    ordered_results,
    requested_ids,
)
from .deadline import DEFAULT_TIMEOUT_S, Deadline, StragglerClock, check_straggler_timeout, check_timeout
from .optional_engine import require_engine
from .runner_families import CountedTransport, DeclinesPlacement
from .spark_channel import SparkPassStage
from .spark_served import ServedWork
from .wire_bytes import WireBytes, dumps

__all__ = ["LOCAL_TASK_ATTEMPTS", "SparkRunner", "spark_encoded_data"]

_log = logging.getLogger(__name__)

POLL_S = 0.25
"""How often a pass that may straggle reads its job's progress (only passes longer than this are read)."""

LOCAL_TASK_ATTEMPTS = 4
"""Attempts per task on a ``local[n, F]`` master the runner starts (Spark's cluster default)."""


def _built(record: tuple[int, Any]) -> tuple[int, Any]:
    """A ``(chunk id, recipe)`` record as ``(chunk id, chunk)``: the recipe read and encoded on the executor."""
    return record[0], materialize(record[1])


def _partition_runner(task: bytes, wanted: frozenset[int] | None) -> Callable:
    """A partition's pass: ``task`` is the pickled ``(fn, payload)`` (the closure Spark ships with each task);
    the partition's ``(chunk id, result)`` pairs come back as one pickled record."""
    def run(records: Any) -> Any:
        fn, payload = pickle.loads(task)
        chunks = {chunk_id: chunk for chunk_id, chunk in records  # a source's rows record (key < 0) is not a chunk
                  if chunk_id >= 0 and (wanted is None or chunk_id in wanted)}
        ids = sorted(chunks)
        return [dumps(list(zip(ids, apply_chunk_fn(fn, payload, ids, chunks.__getitem__))))]

    return run


def _started_context(pyspark: Any, num_workers: int | None, master: str | None, conf: dict[str, str] | None) -> Any:
    """A SparkContext the runner starts (and owns): ``local[n, F]`` by default, this interpreter on the workers."""
    from ....contracts.resources import local_cpu_count

    n = local_cpu_count() if num_workers is None else int(num_workers)
    settings = {
        # local[n, F]: n threads, and a failed task (say a killed Python worker) is
        # retried up to F times from the cached partition's lineage; plain local[n] never retries.
        "spark.master": master or f"local[{n},{LOCAL_TASK_ATTEMPTS}]",
        "spark.app.name": "mixle-parallel-em",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.pyspark.driver.python": sys.executable,
        "spark.executorEnv.OMP_NUM_THREADS": "1",
        "spark.executorEnv.OPENBLAS_NUM_THREADS": "1",
        "spark.executorEnv.MKL_NUM_THREADS": "1",
    }
    # Python workers run PYSPARK_PYTHON (default: "python3" on PATH, which may lack this
    # package); the driver's interpreter is the one that has it, unless the user named one.
    python = os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    settings["spark.pyspark.python"] = python
    settings.update(conf or {})
    spark_context = pyspark.SparkContext(conf=pyspark.SparkConf().setAll(list(settings.items())))
    spark_context.setLogLevel("ERROR")
    return spark_context


class SparkRunner(ServedWork, DeclinesPlacement, CountedTransport):
    """Chunk runner over a SparkContext (given, or a ``local[n]`` one it starts and owns)."""

    name = "spark"
    placement_refusal = "a Spark task cannot be aimed at a chosen executor"

    def __init__(
        self,
        spark_context: Any = None,
        *,
        num_workers: int | None = None,
        master: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        conf: dict[str, str] | None = None,
        straggler_timeout: float | None = None,
        direct_channel: bool = True,
    ) -> None:
        pyspark = require_engine("pyspark", "spark")
        self.timeout = check_timeout(timeout)
        self.straggler_timeout = check_straggler_timeout(straggler_timeout, self.timeout)
        """``straggler_timeout=``: the straggler deadline in seconds (None: ``deadline.straggler_deadline``'s rule)."""
        if spark_context is None:
            spark_context = pyspark.SparkContext._active_spark_context  # reuse a running one
        self._owns_context = spark_context is None
        if spark_context is None:
            spark_context = _started_context(pyspark, num_workers, master, conf)
        self.sc = spark_context
        n = int(self.sc.defaultParallelism) if num_workers is None else int(num_workers)
        if n < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers!r}")
        self.num_workers = n
        self._rdd: Any = None
        self._build: Callable[[], Any] | None = None
        """Builds the chunks' RDD where a serving stage holds them and none is cached yet (``ServedWork``)."""
        self._num_chunks = 0
        self._partitions = 0
        self._owners: list[int] | None = None
        """The partition of each chunk when a source's partitions hold them (``place_partitions``)."""
        self.wire = WireBytes()
        """Pass bytes: the pickled ``(fn, payload)`` in each partition's task, the pickled results collected."""
        self.stragglers: list[int] = []
        """Partitions whose task the others outran by the straggler deadline: cancelled, the pass (or the audit's read
        of a source's rows, ``run_job``) run again."""
        self.recovered_chunks: list[int] = []
        """Chunk ids of those partitions, recomputed (for tests and logs)."""
        self._answered = False  # a pass finished: the Python workers are warm, a slow task is a straggler
        self.direct_channel = bool(direct_channel)
        """``direct_channel=``: serve the passes from tasks kept alive (``backends.spark_channel``); False: a job
        per pass."""
        self._stage: SparkPassStage | None = None
        self.serving_stopped: str | None = None
        """Why this runner stopped serving passes and runs them as jobs (None while it may serve)."""
        self.served_passes = 0
        """Passes answered by a serving stage rather than a job."""
        self.task_slots = self._task_slots()
        """Tasks the context runs at once, read once here (not on every pass): a stage serves only where its
        partitions fit them."""
        self._pass_s: float | None = None  # seconds of the last whole data pass that no straggler held up

    # -- placement ----------------------------------------------------------------------------
    def scatter(self, chunks: Sequence[Any]) -> None:
        """Parallelize ``(id, chunk)`` records into contiguous partitions, cache and materialize them. Recipes
        (``files``) are parallelized instead and read by the executors (a lost partition is read again)."""
        self._unpersist()
        records = list(enumerate(chunks))
        self._num_chunks = len(records)
        partitions = max(1, min(self.num_workers, len(records)))
        rdd = self.sc.parallelize(records, partitions)
        self._rdd = (rdd.map(_built) if any(is_recipe(c) for c in chunks) else rdd).cache()
        self._partitions = partitions
        self._owners = None
        self._run_job(lambda: self._rdd.count(), "placing chunks")

    def place_partitions(self, encoded: Any, parts: Sequence[int]) -> None:
        """Cache ``encoded`` (an RDD of ``(chunk id, chunk)`` built next to a source's partitions; chunk ``i`` in
        partition ``parts[i]``) as the chunks, and materialize it: the rows never reach the driver."""
        self._unpersist()
        self._num_chunks = len(parts)
        self._owners = [int(p) for p in parts]
        self._cache(encoded, "encoding the source's partitions")

    def _cache(self, encoded: Any, what: str) -> None:
        """Cache ``encoded`` as the chunks' RDD and materialize it."""
        self._partitions = int(encoded.getNumPartitions())
        self._rdd = encoded.cache()
        self._run_job(lambda: self._rdd.count(), what)

    # -- data passes --------------------------------------------------------------------------
    def run_job(self, job: Callable[[], Any], what: str, partitions: Sequence[int] | None = None) -> Any:
        """Run a source's Spark action (``what``, in words) under this runner's ``timeout``: cancelled and
        ``WorkerTimeoutError`` past it. ``partitions``: the source partitions its tasks read, in task order (the
        audit's read of the sampled rows, far less work than a pass); a task still running at the straggler
        deadline of the runner's last pass (``deadline.straggler_deadline`` of its seconds) then has the job
        cancelled (Spark kills a stopped Python worker) and run again, as a pass's: a read gives the same rows
        whenever it runs."""
        if partitions is None or self._pass_s is None:
            return self._run_job(job, what)
        return self._run_job(job, what, watch=True, tasks=tuple(int(p) for p in partitions), expect_s=self._pass_s)

    def _run_job(self, job: Callable[[], Any], what: str, watch: bool = False,
                 tasks: tuple[int, ...] | None = None, expect_s: float | None = None) -> Any:
        """Run a Spark action under a job group; cancel it and raise after ``timeout`` seconds. With ``watch``
        (a data pass over several partitions, once a pass has finished), a task outrun by the others by the
        straggler deadline has the job cancelled and the action run again, unwatched. ``tasks``: the partition
        each task of a job over some partitions reads (a data pass's tasks are the partitions themselves);
        ``expect_s``: the straggler deadline is that of an answer after so many seconds, from the job's start."""
        self._release_stage()  # a serving stage holds the task slots this job needs
        watch = watch and self._answered and (expect_s is not None or self._partitions > 1)
        if self.timeout is None and not watch:
            return job()
        group = f"mixle-em-{uuid.uuid4().hex}"
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                self.sc.setJobGroup(group, what, interruptOnCancel=True)
                box["value"] = job()
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                box["error"] = exc

        thread = threading.Thread(target=target, name=group, daemon=True)
        thread.start()
        stuck = self._await_job(thread, group, what, watch, expect_s)
        if stuck is not None:
            self.sc.cancelJobGroup(group)  # Spark kills the stuck task's Python worker (even a stopped one)
            thread.join(30.0)
            if tasks is None:
                self._note_stragglers(stuck)
            else:
                self._note_stalled_read([tasks[i] for i in stuck if 0 <= i < len(tasks)], what)
            return self._run_job(job, what)
        if "error" in box:
            raise box["error"]
        return box["value"]

    def _await_job(self, thread: threading.Thread, group: str, what: str, watch: bool,
                   expect_s: float | None = None) -> list[int] | None:
        """Wait for the job's thread; the tasks still running when the straggler deadline passed (``watch``),
        or None once it ended. Past ``timeout`` the job is cancelled and ``WorkerTimeoutError`` raised."""
        deadline, clock = Deadline(self.timeout), StragglerClock(self.timeout, self.straggler_timeout)
        if expect_s is not None:
            clock.expect(expect_s)
        while True:
            wait = deadline.remaining()
            if watch:  # read the job's progress every POLL_S, and when the straggler deadline passes
                until = clock.wait_s(wait)
                wait = POLL_S if until is None else min(POLL_S, until)
            thread.join(wait)
            if not thread.is_alive():
                return None
            if watch:
                done, stages = self._progress(group)
                if done:
                    clock.answered()
                if clock.due():
                    return self._running_partitions(stages)
            if deadline.expired():
                self.sc.cancelJobGroup(group)
                thread.join(30.0)
                raise WorkerTimeoutError(
                    f"spark job {what!r} did not finish within {self.timeout} s and was cancelled; an executor "
                    "is hung or overloaded. Raise timeout= (seconds) or check the executors."
                )

    def _progress(self, group: str) -> tuple[int, list[tuple[int, int]]]:
        """Tasks finished in the job group's stages, and those stages as ``(stage id, attempt)``."""
        tracker = self.sc.statusTracker()
        done, stages = 0, []
        for job_id in tracker.getJobIdsForGroup(group):
            info = tracker.getJobInfo(job_id)
            for stage_id in info.stageIds if info is not None else ():
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    done += stage.numCompletedTasks
                    stages.append((stage_id, stage.currentAttemptId))
        return done, stages

    def _running_partitions(self, stages: list[tuple[int, int]]) -> list[int]:
        """The partitions whose task is still running in ``stages`` (read from Spark's status store; [] when
        this Spark does not expose it: the pass is run again all the same)."""
        running: list[int] = []
        try:
            store = self.sc._jsc.sc().statusStore()
            for stage_id, attempt in stages:
                tasks = store.taskList(stage_id, attempt, 10_000).iterator()
                while tasks.hasNext():
                    task = tasks.next()
                    if task.status() == "RUNNING":
                        running.append(int(task.index()))
        except Exception as exc:  # noqa: BLE001 - an internal API: the partitions go unnamed
            _log.warning("spark: could not name the straggling partitions (%r)", exc)
        return sorted(set(running))

    def _note_stragglers(self, partitions: list[int]) -> None:
        parts = self._owners if self._owners is not None else [
            p for p, ids in enumerate(block_assignment(self._num_chunks, self._partitions)) for _ in ids]
        chunks = [c for c, p in enumerate(parts) if p in partitions] if partitions else list(range(self._num_chunks))
        _log.warning("spark: partition(s) %s still running at the straggler deadline; their job was cancelled and the "
                     "pass runs again (chunks %s recomputed)", partitions, chunks)
        self.stragglers.extend(partitions)
        self.recovered_chunks.extend(chunks)

    def _note_stalled_read(self, partitions: list[int], what: str) -> None:
        _log.warning("spark: partition(s) %s still running at the straggler deadline in %s; the job was cancelled "
                     "and runs again", partitions or "(unnamed)", what)
        self.stragglers.extend(partitions)

    def chunk_owners(self) -> list[int]:
        """The partition each chunk is in (``parallelize`` slices contiguously, like ``block_assignment``)."""
        if self._owners is not None:  # a source's partitions, numbered within the worker count
            return [p % self.num_workers for p in self._owners]
        n = self._num_chunks
        return [w for w, ids in enumerate(block_assignment(n, max(1, min(self.num_workers, n)))) for _ in ids]

    def map_chunks(
        self, fn: Callable[[Any, Any], Any], payload: Any, chunk_ids: Sequence[int] | None = None
    ) -> list[Any]:
        """``fn(chunk, payload)`` over the cached partitions; results in chunk-id order."""
        if self._rdd is None and self._build is None:
            raise RuntimeError("spark runner has no chunks; call scatter(chunks) first")
        ids = requested_ids(chunk_ids, self._num_chunks)
        wanted = None if chunk_ids is None else frozenset(ids)
        from pyspark import cloudpickle

        task = cloudpickle.dumps((fn, payload), protocol=pickle.HIGHEST_PROTOCOL)
        served = self._served_pass(task, ids, whole=wanted is None)
        if served is not None:
            return ordered_results(served, ids, self.name)
        self._ensure_rdd()
        rdd = self._rdd.mapPartitions(_partition_runner(task, wanted))
        began, held_up = time.monotonic(), len(self.stragglers)
        blobs = self._run_job(rdd.collect, "map_chunks", watch=True)
        if wanted is None and len(self.stragglers) == held_up:
            self._pass_s = time.monotonic() - began
        self._answered = True
        self.wire.count_sent(task, copies=self._partitions)
        self.wire.count_received(*blobs)
        return ordered_results({i: r for blob in blobs for i, r in pickle.loads(blob)}, ids, self.name)

    # -- lifetime -----------------------------------------------------------------------------
    def _unpersist(self) -> None:
        self._release_stage()
        self._build = None
        if self._rdd is not None:
            try:
                self._rdd.unpersist()
            except Exception:  # noqa: BLE001 - a stopped context has nothing cached
                pass
            self._rdd = None

    def close(self) -> None:
        """Drop the cached chunks; stop the SparkContext when this runner started it."""
        self._unpersist()
        if self._owns_context and self.sc is not None:
            self.sc.stop()
            self.sc = None


def spark_encoded_data(
    data: Any,
    *,
    spark_context: Any = None,
    client: Any = None,
    num_workers: int | None = None,
    master: str | None = None,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    straggler_timeout: float | None = None,
    direct_channel: bool = True,
    **params: Any,
) -> Any:
    """``encoded_data(..., backend="spark")``: a handle over a :class:`SparkRunner`.

    ``client`` (the generic engine handle of ``encoded_data``) may be a SparkContext or a
    SparkSession; ``spark_context`` names it explicitly. ``direct_channel=False``: every pass is a Spark job
    (no serving stage holds the task slots between passes; see ``backends.spark_channel``).
    """
    sc = spark_context if spark_context is not None else client
    if sc is not None and hasattr(sc, "sparkContext"):
        sc = sc.sparkContext  # a SparkSession
    runner = SparkRunner(sc, num_workers=num_workers, master=master, timeout=timeout,
                         straggler_timeout=straggler_timeout, direct_channel=direct_channel)
    try:
        return handle_from_runner(runner, data, **params)
    except BaseException:
        runner.close()
        raise


ENCODED_DATA_OPTIONS = frozenset({"client", "spark_context", "num_workers", "master", "timeout",
                                  "straggler_timeout", "direct_channel", "batch_size", "shuffle", "seed"})
"""The ``encoded_data`` options the spark backend honours besides the handle's own."""

WORKER_PROCESSES = True


def planned_workers(options: EncodedDataOptions) -> int:
    """``num_workers``, else the context's default parallelism (task slots), else the local CPUs."""
    require_engine("pyspark", "spark")
    if options.num_workers is not None:
        return int(options.num_workers)
    sc = options.extra.get("spark_context") or options.client
    if sc is not None and hasattr(sc, "sparkContext"):
        sc = sc.sparkContext
    if sc is None:
        pyspark = sys.modules.get("pyspark")
        sc = pyspark.SparkContext._active_spark_context if pyspark is not None else None
    return int(sc.defaultParallelism) if sc is not None else local_cpu_count()
