"""Work placed on chosen dask workers: the SDC audit's replays, reveals and recomputations (``run_on_workers``).

A placed run sends each chosen worker its task over its pass channel, or as a dask actor call when it must keep a
dead holder's chunks; chunks it does not hold are lent from the driver's copy. A chosen worker that is gone, or
dies, or is outrun by the others, ends the run with ``WorkerUnavailableError`` naming it (the audit re-places).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..em_pass.chunks import WorkerTask, WorkerTimeoutError, WorkerUnavailableError, check_tasks
from .channel import ChannelClient, collect_replies
from .dask_calls import ActorCalls
from .dask_holder import pack_for_holder, work_for_holder
from .deadline import Deadline

__all__ = ["PlacedRuns"]


class _PlacedCalls(NamedTuple):
    """The calls of one placed run: dask calls pending (worker -> (address, future)), pass channels sent to,
    the chunk ids of each dask call, and the orphaned chunks each worker keeps."""

    pending: dict[int, tuple[str, Any]]
    direct: dict[int, ChannelClient]
    sent: dict[int, list[int]]
    adopted: dict[int, list[int]]

class PlacedRuns(ActorCalls):
    """Runs on chosen workers (mixed into ``DaskRunner``): what the audit's placement protocol asks of a runner."""

    recoveries: int
    def worker_ids(self) -> list[int]:
        """Ids (positions in the worker list fixed at start) of the workers whose holder is alive.

        Read from the holders' futures, which the scheduler turns to ``error`` when it loses a worker:
        no round trip (asking the scheduler each time cost ~1 ms, and an audited pass asks 4-5 times);
        a worker lost a moment ago that still reads as alive fails its next call, which recovers."""
        return [i for i, address in enumerate(self._workers) if self._alive(address)]

    def chunk_owners(self) -> list[int]:
        """The worker id each chunk is resident on (-1 for a chunk re-placed on a worker not in the list)."""
        index = {address: i for i, address in enumerate(self._workers)}
        return [index.get(address, -1) for address in self._where]

    def run_on_workers(self, tasks: dict[int, WorkerTask]) -> dict[int, list[Any]]:
        """One actor call per chosen worker; chunks it does not hold are sent from the driver's copy and
        not kept, except a chunk whose holder died, which stays on the (first) worker that computes it.
        A chosen worker that is gone, or dies meanwhile, raises ``WorkerUnavailableError``."""
        checked = check_tasks(tasks, len(self._chunks), self.worker_ids(), self.name)
        deadline = Deadline(self.timeout)
        calls = self._send_placed(checked)
        values = self._collect_placed(checked, calls, deadline)
        return {w: [values[w][i] for i in t.chunk_ids] for w, t in checked.items()}

    def _send_placed(self, checked: dict[int, WorkerTask]) -> _PlacedCalls:
        """Send each chosen worker its task: over its pass channel, or as a dask call (orphaned chunks it keeps)."""
        calls = _PlacedCalls({}, {}, {}, {})
        self._lent = []  # the chunks lent in the last pass are in their borrowers' hands or done with
        for w, t in sorted(checked.items()):
            if not t.chunk_ids:
                continue
            address = self._workers[w]
            task = pack_for_holder((t.fn, t.payload), task=True)
            ids = list(t.chunk_ids)
            packed = {i: self._packed(i, address) for i in dict.fromkeys(ids) if self._where[i] != address}
            borrowed = {i: blob for i, blob in packed.items() if blob is not None}
            if len(borrowed) < len(packed):  # the worker is gone, or was given up while chunks were moved there
                calls.sent[w], calls.pending[w] = ids, (address, None)
                continue
            orphans = [
                i
                for i in dict.fromkeys(borrowed)
                if not self._alive(self._where[i]) and all(i not in kept for kept in calls.adopted.values())
            ]
            calls.adopted[w] = orphans
            # over the holder's pass channel, borrowed chunks included, unless a dead holder's chunks are
            # to stay here (that goes through dask); one call either way, so one thread computes
            channel = None if orphans else self._channel_for(address)  # opened here when no plain pass came first
            if channel is not None and channel.send(task, ids, borrowed):
                calls.direct[w] = channel
                calls.sent[w] = []
                continue
            calls.sent[w] = ids
            calls.pending[w] = (
                address,
                self._invoke(address, "run", task, work_for_holder(ids, orphans), *([borrowed] if borrowed else [])),
            )
        return calls

    def _collect_placed(self, checked: dict[int, WorkerTask], calls: _PlacedCalls,
                        deadline: Deadline) -> dict[int, dict[int, Any]]:
        """Every chosen worker's results by chunk id; lost workers raise ``WorkerUnavailableError``."""
        values: dict[int, dict[int, Any]] = {w: {} for w in checked}
        clock = self._straggler_clock()
        answered = {w for w in calls.direct if self._workers[w] in self._answered}
        got, closed, hung, outrun = collect_replies(calls.direct, deadline.remaining, clock, answered)
        for w in outrun:  # a straggler among workers that answered: lost to this placed run, like a dead one
            self._outrun(self._workers[w], list(checked[w].chunk_ids))
        if hung:
            raise WorkerTimeoutError(
                f"dask worker(s) {[self._workers[w] for w in hung]} did not return chunks "
                f"within {self.timeout} s; raise timeout= (seconds) or restart it"
            )
        for w, (ids, entries) in got.items():
            values[w].update(zip(ids, entries))
            self._answered.add(self._workers[w])
        dead: list[int] = list(closed) + list(outrun)
        for w in dead:
            self._drop_channel(self._workers[w])

        def timed_out() -> WorkerTimeoutError:
            w = min(calls.pending)
            return WorkerTimeoutError(
                f"dask worker {self._workers[w]} did not return chunks "
                f"{list(checked[w].chunk_ids)} within {self.timeout} s; "
                "raise timeout= (seconds) or restart it"
            )

        for w, (address, _), entries in self._settle(calls.pending, deadline, timed_out, clock):
            if entries is None:
                dead.append(w)
                continue
            values[w].update(zip(calls.sent[w], entries))
            for i in calls.adopted[w]:
                self._where[i] = address
            self.recoveries += len(calls.adopted[w])
        if dead:
            dead = sorted(set(dead))
            for w in dead:
                self._forget(self._workers[w])
            raise WorkerUnavailableError(
                dead, f"dask worker(s) {[self._workers[w] for w in dead]} were lost while computing chosen chunks"
            )
        return values
