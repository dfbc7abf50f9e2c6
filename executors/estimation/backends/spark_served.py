"""The ``spark`` runner's served work: when a pass, a read or a source's opening goes to a serving stage.

Mixed into ``SparkRunner`` (whose state it reads): the decisions beside the stage itself
(``backends.spark_channel``). A pass, the audit's read of a source's rows, and a source's first reading and
encoding are served by a stage while this runner may serve (``direct_channel=True``, its partitions fit the task
slots, no stage of it has failed); otherwise they are Spark jobs. A source opened by a stage has no cached RDD
until one is needed (a pass or read as a job, a stage started again after its release): ``_ensure_rdd`` then
builds it from the source, as the jobs would have at the start.
"""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..em_pass.chunks import WorkerTimeoutError
from ..em_pass.runner_protocols import PARTITION_ROWS, StageJob
from .deadline import Deadline, StragglerClock
from .spark_channel import HELD, SparkPassStage, barrier_partitions, held_rows
from .wire_bytes import WireBytes

__all__ = ["ServedWork"]

_log = logging.getLogger("mixle_parallel.executors.estimation.backends.spark")


class ServedWork:
    """Passes, reads and a source's opening served by a stage (mixed into ``SparkRunner``)."""

    sc: Any
    timeout: float | None
    straggler_timeout: float | None
    wire: WireBytes
    direct_channel: bool
    serving_stopped: str | None
    served_passes: int
    task_slots: int
    _stage: SparkPassStage | None
    _rdd: Any
    _build: Callable[[], Any] | None
    _partitions: int
    _num_chunks: int
    _owners: list[int] | None
    _answered: bool
    _pass_s: float | None
    _note_stragglers: Callable[[list[int]], None]
    _cache: Callable[[Any, str], None]

    def _may_serve(self, partitions: int) -> bool:
        """Whether ``partitions`` partitions may be served by a stage (the option on, no stage failed, they fit)."""
        return self.direct_channel and self.serving_stopped is None and 0 < partitions <= self.task_slots

    def _served_pass(self, task: bytes, ids: list[int], whole: bool) -> dict[int, Any] | None:
        """The pass answered by the serving stage (started, or started again once released while idle); None when
        this runner does not serve (``direct_channel=False``, more partitions than task slots, a stage that failed
        before): the pass then runs as a job. A task lost or outrun ends the stage; the pass runs as a job."""
        if not self._may_serve(self._partitions):
            return None
        for _ in range(2):
            if self._stage is None:
                self._ensure_rdd()
                started = SparkPassStage.start(self.sc, barrier_partitions(self._rdd), self._partitions, self.wire,
                                               self.timeout)
                if isinstance(started, str):
                    self._stop_serving(f"its serving stage did not start: {started}")
                    return None
                self._stage = started
            began = time.monotonic()
            outcome = self._stage.run_pass(task, ids, Deadline(self.timeout),
                                           StragglerClock(self.timeout, self.straggler_timeout))
            if outcome.released:  # released while idle: start another
                self._stage = None
                continue
            if outcome.hung:
                self.serving_stopped, self._stage = "a pass hung", None
                raise WorkerTimeoutError(
                    f"spark job 'map_chunks' did not finish within {self.timeout} s and was cancelled (serving tasks "
                    f"of partitions {list(outcome.hung)}); an executor is hung or overloaded. Raise timeout= "
                    "(seconds) or check the executors.")
            if outcome.outrun:
                self._note_stragglers(list(outcome.outrun))
                self._stop_serving(f"partition(s) {list(outcome.outrun)} were outrun at the straggler deadline")
                return None
            if outcome.lost:
                self._stop_serving(f"the task(s) serving partition(s) {list(outcome.lost)} were lost")
                return None
            if whole:
                self._pass_s = time.monotonic() - began
            self._answered = True
            self.served_passes += 1
            return outcome.results
        return None

    def read_held(self, fn: Callable[[Any, Any], Any], asks: Mapping[int, Any]) -> dict[int, Any] | None:
        """``fn(rows, asks[p])`` on the rows each partition ``p`` holds (``runner_protocols.PARTITION_ROWS``), by
        the live serving stage's tasks; None when no stage serves now or it holds no rows (the caller reads them
        with a job). A task lost, outrun (the straggler deadline of the last pass) or hung ends the stage and
        serving, as in a pass: None."""
        if self._rows_stage() is None:
            return None
        return self._stage_call(fn, asks, "the read of", PARTITION_ROWS)

    def _rows_stage(self) -> SparkPassStage | None:
        """The live serving stage when its tasks hold a source's rows, else None (reads and encoding go to jobs)."""
        stage = self._stage
        return stage if stage is not None and not stage.ended.is_set() and stage.holds_rows else None

    def _stage_call(self, fn: Callable[[Any, Any], Any], asks: Mapping[int, Any], what: str,
                    key: int) -> dict[int, Any] | None:
        """``fn(held, asks[p])`` in each partition's task (``held``: its rows, or with ``key=HELD`` its holdings);
        None, serving stopped, when a task was lost, outrun or hung; None when the stage was released."""
        from pyspark import cloudpickle

        assert self._stage is not None
        clock = StragglerClock(self.timeout, self.straggler_timeout)
        clock.expect(self._pass_s or 0.0)  # far less work than a pass: its deadline is a pass's
        tasks = {int(p): cloudpickle.dumps((fn, ask), protocol=pickle.HIGHEST_PROTOCOL) for p, ask in asks.items()}
        outcome = self._stage.read(tasks, Deadline(self.timeout), clock, key=key)
        if outcome.released:
            self._stage = None
            return None
        if outcome.failed:
            self._stop_serving(f"{what} partition(s) {list(outcome.lost + outcome.outrun + outcome.hung)} failed")
            return None
        return outcome.results

    def open_rows(self, rows: Any, job: StageJob | None = None) -> list[int] | None:
        """Serve ``rows`` (an RDD of one record per partition, its rows; not cached) from a stage whose tasks read
        and keep them: each partition's row count, in order, or None when this runner does not serve (the source
        then reads them with a job). ``job``: the stage made another way over the same partitions, each task's
        record its rows (a DataFrame's Arrow batches read in the serving tasks, ``spark_rows``)."""
        partitions = int(rows.getNumPartitions())
        if not self._may_serve(partitions):
            return None
        self._release_stage()
        started = SparkPassStage.start(self.sc, job or barrier_partitions(rows), partitions, self.wire, self.timeout,
                                       hold=held_rows)
        if isinstance(started, str):  # over the source's own lineage; the passes may still be served from a cache
            _log.warning("spark: a stage reading the source did not start (%s); a job reads it", started)
            return None
        self._stage = started
        return [started.row_counts[p] for p in range(partitions)]

    def place_held(self, encode: Callable[[Any, Any], list[int]], asks: Mapping[int, Any], parts: Sequence[int],
                   build: Callable[[], Any]) -> bool:
        """Have the tasks holding a source's rows (``open_rows``) encode their chunks (``encode(holdings, asks[p])``,
        the chunk ids added); chunk ``i`` is in partition ``parts[i]``. ``build()``: the same chunks as an RDD,
        built when one is needed. False, nothing placed, when no such stage serves now."""
        stage = self._rows_stage()
        if stage is None:
            return False
        held = self._stage_call(encode, asks, "encoding", HELD)
        if held is None:
            return False
        stage.adopt(held)
        self._num_chunks, self._owners = len(parts), [int(p) for p in parts]
        self._partitions, self._rdd, self._build = len(stage.row_counts), None, build
        return True

    def _ensure_rdd(self) -> None:
        """The chunks as a cached RDD, built from the source (``place_held``'s ``build``) if none is yet."""
        if self._rdd is None and self._build is not None:
            self._cache(self._build(), "encoding the source's partitions")
            self._build = None

    def _task_slots(self) -> int:
        """Tasks the context runs at once: its default parallelism over the cores each task takes."""
        cpus = int(self.sc.getConf().get("spark.task.cpus", "1") or 1)
        return int(self.sc.defaultParallelism) // max(cpus, 1)

    def _stop_serving(self, why: str) -> None:
        """Run this pass and every later one as a Spark job (whose retries and lineage recompute what was lost)."""
        _log.warning("spark: %s; this runner's passes and reads run as Spark jobs from now on", why)
        self.serving_stopped = why
        self._stage = None

    def _release_stage(self) -> None:
        """Give the serving stage's task slots back (before a job of this runner's own, or at close)."""
        if self._stage is not None:
            self._stage.release()
            self._stage = None
