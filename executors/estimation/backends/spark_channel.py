"""Spark passes served by tasks kept alive: one barrier stage holds the cached chunks and answers the passes.

Why: a Spark job costs about 0.1 s whatever it does (measured on ``local[2]``: a job over two elements 94-109 ms,
a pass that does nothing per chunk 130 ms), as much as an E-step over a million rows; a fit of ten passes spends
more than a second starting jobs. So the runner starts one barrier stage over its cached chunk partitions (all its
tasks run at once); each task reads its partition's ``(chunk id, chunk)`` records, dials the driver back and
answers pass requests over that socket (``backends.channel``: the requests, replies and ``fn`` the dask and ray
holders serve) until the driver releases it. A served pass measured 1.8-1.9 ms against 123-129 ms for a job.

The socket is authenticated (HMAC challenge) with a random key that travels inside the stage's task, protected as
Spark protects its own tasks (``spark.authenticate``, ``spark.network.crypto.enabled``); the traffic itself is not
encrypted: where it must not cross the network in clear, pass ``direct_channel=False`` and every pass is a job.

Where a source's rows are cached with the chunks (``runner_protocols.PARTITION_ROWS``), the tasks also slice them for
the audit's reads (``SparkRunner.read_held``): a read without a job either.

The stage holds every task slot it was given while it serves, so it serves only while passes come: it is released
after :data:`IDLE_RELEASE_S` without a request, before the runner starts any Spark job of its own (placing chunks,
a read no stage serves) and when another runner on the context starts a stage, so the context's other jobs wait at
most that long. A task that dies, one outrun by
the others at the straggler deadline, or a stage that cannot start (too few free slots, dynamic allocation) ends
the stage: the runner cancels it and runs that pass and the later ones as jobs (``SparkRunner``), whose retries
and lineage recompute what was lost; a chunk's result does not depend on where it ran, so the bits are the same.
"""

from __future__ import annotations

import logging
import pickle
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from multiprocessing import connection
from typing import Any, NamedTuple

from ..em_pass.runner_protocols import PARTITION_ROWS, StageJob, TaskBody
from .channel import (
    CLOSE_REQUEST,
    HANDSHAKE_TIMEOUT_S,
    ChannelClient,
    accept_authenticated,
    collect_replies,
    dial,
    new_channel_key,
    serve_requests,
)
from .deadline import Deadline, StragglerClock
from .wire_bytes import WireBytes

__all__ = ["HELD", "IDLE_RELEASE_S", "START_TIMEOUT_S", "ServedPass", "SparkPassStage", "barrier_partitions",
           "held_chunks", "held_rows", "serving_task"]

_log = logging.getLogger("mixle_parallel.executors.estimation.backends.spark")

IDLE_RELEASE_S = 0.5
"""Seconds a serving stage waits for the next pass before it releases its task slots."""

START_TIMEOUT_S = 60.0
"""The longest a serving stage may take for every task to dial in (capped by the runner's ``timeout``); past it
the stage is cancelled and the passes run as jobs."""

_POLL_S = 0.25

_LIVE: weakref.WeakSet[SparkPassStage] = weakref.WeakSet()
"""The stages serving now, in this process: a runner starting one releases the others on its context first (two
handles fitted in turn would otherwise each wait out the other's idle hold)."""


HELD = -2
"""The key under which a serving task's holdings are the holdings themselves: a request on it adds chunks (the
encoding of rows the task read, ``SparkRunner.place_held``)."""


def held_chunks(records: Iterable[Any]) -> dict[int, Any]:
    """A partition of ``(chunk id, chunk)`` records as a task's holdings (a source's rows too, as PARTITION_ROWS)."""
    return {int(i): chunk for i, chunk in records}


def held_rows(records: Iterable[Any]) -> dict[int, Any]:
    """A partition of one record, its rows (``spark_rows``' read), as a task's holdings: the rows only."""
    (rows,) = list(records)
    return {PARTITION_ROWS: rows}


Holds = Callable[[Iterable[Any]], dict[int, Any]]
"""What a serving task makes of its partition's records: its holdings, by key (``held_chunks``, ``held_rows``)."""


def barrier_partitions(rdd: Any) -> StageJob:
    """The stage as a barrier over ``rdd``'s partitions: each task runs the body over its partition's records."""
    return lambda body: rdd.barrier().mapPartitions(body)


def serving_task(address: Any, authkey: bytes, hold: Holds = held_chunks) -> TaskBody:
    """What each task of the stage runs: keep what ``hold`` makes of the partition's records, dial the driver at
    ``address``, send the keys held (and the rows' count), answer requests until released; nothing is returned
    through Spark. A task that cannot dial (a retried attempt of a stage the driver gave up) ends at once."""
    def serve(records: Iterable[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        store = hold(records)
        context = TaskContext.get()
        partition = int(context.partitionId()) if context is not None else -1
        try:
            conn = dial(address, authkey)
        except OSError:
            return iter(())
        rows = len(store[PARTITION_ROWS]) if PARTITION_ROWS in store else None
        conn.send_bytes(pickle.dumps((partition, sorted(store), rows), protocol=pickle.HIGHEST_PROTOCOL))
        serve_requests(conn, lambda i: store if i == HELD else store[i], "a Spark task serving passes")
        return iter(())

    return serve


class ServedPass(NamedTuple):
    """A served pass's outcome: results by chunk id, or why the stage ended (``lost``: partitions whose socket
    closed; ``outrun``: partitions silent at the straggler deadline while others answered; ``hung``: partitions
    silent at the pass's deadline), or ``released`` (the stage had ended before the pass began: start another)."""

    results: dict[int, Any]
    lost: tuple[int, ...] = ()
    outrun: tuple[int, ...] = ()
    hung: tuple[int, ...] = ()
    released: bool = False

    @property
    def failed(self) -> bool:
        """Whether the stage ended in this pass (its results are not whole)."""
        return bool(self.lost or self.outrun or self.hung)


class SparkPassStage:
    """The driver's end of one serving stage: its job (in a thread of its own), one channel per partition."""

    def __init__(self, sc: Any, group: str, thread: threading.Thread, box: dict[str, Any]) -> None:
        self.sc, self.group, self._thread, self._box = sc, group, thread, box
        self._channels: dict[int, ChannelClient] = {}
        self._holder: dict[int, int] = {}
        """The partition (channel) holding each chunk id."""
        self.holds_rows = False
        """Whether every task holds its partition's rows (a source's ``PARTITION_ROWS`` record): reads are served."""
        self.row_counts: dict[int, int] = {}
        """Each partition's rows, where the tasks hold rows."""
        self._lock = threading.Lock()
        self._last_used = time.monotonic()
        self.ended = threading.Event()
        self.passes = 0
        """Passes this stage served."""

    @classmethod
    def start(cls, sc: Any, job: StageJob, partitions: int, wire: WireBytes, timeout: float | None,
              hold: Holds = held_chunks) -> SparkPassStage | str:
        """Start serving ``partitions`` partitions by ``job`` (:func:`barrier_partitions` of an RDD), each task
        holding what ``hold`` makes of its records (``(chunk id, chunk)`` records by default); the stage once every
        task dialled in, or why it could not start (it is cancelled then). The driver listens where Spark's own
        driver endpoint does (``spark.driver.bindAddress``), and the tasks dial it as they dial Spark's
        (``spark.driver.host``)."""
        for other in list(_LIVE):  # another runner's stage on this context holds the slots between its passes
            if other.sc is sc:
                other.release()
        conf = sc.getConf()
        host = conf.get("spark.driver.host", "127.0.0.1")
        listener = connection.Listener((conf.get("spark.driver.bindAddress", host), 0))
        key = new_channel_key()
        group = f"mixle-em-serve-{uuid.uuid4().hex}"
        served = job(serving_task((host, listener.address[1]), key, hold))
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                sc.setJobGroup(group, "serving EM passes", interruptOnCancel=True)
                served.collect()
            except BaseException as exc:  # noqa: BLE001 - read by the driver's thread
                box["error"] = exc

        thread = threading.Thread(target=run, name=group, daemon=True)
        stage = cls(sc, group, thread, box)
        thread.start()
        try:
            why = stage._accept(listener, key, partitions, min(START_TIMEOUT_S, timeout or START_TIMEOUT_S), wire)
        finally:
            listener.close()
        if why is not None:
            stage.abort()
            return why
        stage._last_used = time.monotonic()  # idle from now: a slow start is not idle time
        threading.Thread(target=stage._reap, name=f"{group}-idle", daemon=True).start()
        _LIVE.add(stage)
        return stage

    def _accept(self, listener: Any, key: bytes, partitions: int, within: float, wire: WireBytes) -> str | None:
        """Take every task's connection and the chunk ids it holds; None, or why not within ``within`` s."""
        deadline = time.monotonic() + within
        rows: list[bool] = []
        while len(self._channels) < partitions:
            if not self._thread.is_alive():
                error = self._box.get("error")
                first = (str(error).splitlines() or [""])[0][:200]
                said = "" if error is None else f": {type(error).__name__}: {first}"
                return f"the serving stage ended before its tasks dialled in{said}"
            if time.monotonic() >= deadline:
                return (f"{len(self._channels)} of {partitions} serving tasks dialled in within {within:.0f} s "
                        "(too few free task slots?)")
            conn = accept_authenticated(listener, key, min(deadline, time.monotonic() + _POLL_S))
            if conn is None:
                continue
            if not conn.poll(HANDSHAKE_TIMEOUT_S):
                conn.close()
                continue
            partition, held, count = pickle.loads(conn.recv_bytes())
            self._channels[int(partition)] = ChannelClient.over(conn, wire)
            self._holder.update({int(i): int(partition) for i in held if i >= 0})
            rows.append(PARTITION_ROWS in held)
            if count is not None:
                self.row_counts[int(partition)] = int(count)
        self.holds_rows = all(rows)
        return None

    def run_pass(self, task: bytes, ids: Sequence[int], deadline: Deadline, clock: StragglerClock) -> ServedPass:
        """Send each task its share of ``ids`` (``task``: the pickled ``(fn, payload)``) and gather the results by
        chunk id; a reply of ``fn``'s own exception ends the stage and is raised. A task lost, outrun or silent at
        ``deadline`` ends the stage (``ServedPass.failed``: no results)."""
        shares: dict[int, list[int]] = {}
        for i in ids:
            shares.setdefault(self._holder[i], []).append(i)
        outcome = self._exchange({p: (task, share) for p, share in shares.items()}, deadline,
                                 clock if len(shares) > 1 else None)  # one task: no other to outrun it
        if outcome.failed or outcome.released:
            return outcome
        self.passes += 1
        return outcome._replace(results={i: r for share, entries in outcome.results.values()
                                         for i, r in zip(share, entries)})

    def read(self, tasks: Mapping[int, bytes], deadline: Deadline, clock: StragglerClock,
             key: int = PARTITION_ROWS) -> ServedPass:
        """``fn(held[key], ask)`` in each partition's task of ``tasks`` (``tasks[p]``: the pickled ``(fn, ask)``;
        ``key``: the rows, or :data:`HELD`, the holdings themselves); the results by partition, as :meth:`run_pass`
        ends. ``clock`` is armed by the caller (these tasks are not compared with each other)."""
        outcome = self._exchange({p: (task, [key]) for p, task in tasks.items()}, deadline, clock)
        if outcome.failed or outcome.released:
            return outcome
        return outcome._replace(results={p: entries[0] for p, (_, entries) in outcome.results.items()})

    def adopt(self, held: Mapping[int, Sequence[int]]) -> None:
        """Record the chunk ids each partition's task now holds (built there from its rows)."""
        for partition, ids in held.items():
            self._holder.update({int(i): int(partition) for i in ids})

    def _exchange(self, requests: Mapping[int, tuple[bytes, list[int]]], deadline: Deadline,
                  clock: StragglerClock | None) -> ServedPass:
        """One request to each partition's task of ``requests`` and its reply: ``results`` maps a partition to its
        ``(ids, entries)``. ``clock``: the straggler rule (None: the tasks are waited for until ``deadline``)."""
        with self._lock:
            if self.ended.is_set():
                return ServedPass({}, released=True)
            try:
                lost = sorted(p for p, (task, ids) in requests.items() if not self._channels[p].send(task, ids))
                if lost:
                    outcome = ServedPass({}, lost=tuple(lost))
                else:
                    asked = {p: self._channels[p] for p in requests}
                    got, closed, hung, outrun = collect_replies(asked, deadline.remaining, clock, set(asked))
                    outcome = ServedPass(dict(got), lost=tuple(sorted(closed)), outrun=tuple(sorted(outrun)),
                                         hung=tuple(sorted(hung)))
            except BaseException:
                self._end(cleanly=False)
                raise
            self._last_used = time.monotonic()
            if outcome.failed:
                self._end(cleanly=False)
            return outcome

    def release(self) -> None:
        """End the stage cleanly: each task is told to stop, and the stage's job finishes."""
        with self._lock:
            self._end(cleanly=True)

    def abort(self) -> None:
        """Cancel the stage (Spark kills its tasks' Python workers)."""
        with self._lock:
            self._end(cleanly=False)

    def _end(self, cleanly: bool) -> None:
        if self.ended.is_set():
            return
        self.ended.set()
        _LIVE.discard(self)
        for channel in self._channels.values():
            if cleanly:
                try:
                    channel.conn.send_bytes(CLOSE_REQUEST)
                except (OSError, ValueError):
                    cleanly = False
            channel.close()
        if cleanly:
            self._thread.join(30.0)
        if self._thread.is_alive():
            self.sc.cancelJobGroup(self.group)
            self._thread.join(30.0)

    def _reap(self) -> None:
        """Release the stage once no pass came for :data:`IDLE_RELEASE_S` (its slots go back to other jobs)."""
        while not self.ended.wait(_POLL_S):
            if self._lock.acquire(blocking=False):
                try:
                    if time.monotonic() - self._last_used >= IDLE_RELEASE_S:
                        self._end(cleanly=True)
                finally:
                    self._lock.release()
        _log.debug("spark: serving stage %s released after %d pass(es)", self.group, self.passes)
