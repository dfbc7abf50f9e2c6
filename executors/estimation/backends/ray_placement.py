"""Work placed on chosen Ray actors (the SDC audit's replays, reveals and recomputations), and stragglers given up.

``run_on_workers`` sends each chosen actor its task over its pass channel, or as an actor call (chunks it does not
hold resolved from the object store); an actor that is gone, dies, or is outrun by the others at the straggler
deadline ends the run with ``WorkerUnavailableError`` naming it, its chunks moved to the survivors. ``_outrun``
(also used by the data passes) kills a straggler and moves its chunks.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable
from typing import Any

from ..em_pass.chunks import WorkerTask, WorkerTimeoutError, WorkerUnavailableError, check_tasks
from .channel import ChannelClient, collect_replies
from .deadline import Deadline
from .optional_engine import require_engine
from .ray_payload import INLINE_PAYLOAD_BYTES, pack_payload_sized, pickled_results
from .runner_families import ActorClusterRunner
from .wire_bytes import WireBytes

__all__ = ["RayPlacedRuns"]

_log = logging.getLogger("mixle_parallel.executors.estimation.backends.ray")


class RayPlacedRuns(ActorClusterRunner[int]):
    """Runs on chosen actors and the straggler given up (mixed into ``RayRunner``, whose state they read); the
    family's straggler bookkeeping and counted bytes are ``runner_families.ActorClusterRunner``'s."""

    name: str
    wire: WireBytes
    _actors: list[Any]
    _alive: list[bool]
    _refs: list[Any]
    _owner: list[int]
    _channels: dict[int, ChannelClient]
    _reassign: Callable[[int], list[int]]

    def _outrun(self, w: int, owed: list[int]) -> list[int]:
        """Give up on straggler ``w``: kill it, move its chunks to the others; returns ``owed`` (its unsent chunks)."""
        import ray

        _log.warning("ray: actor %d is a straggler (silent past the straggler deadline); recomputing %s", w, owed)
        try:
            ray.kill(self._actors[w], no_restart=True)
        except Exception:  # noqa: BLE001 - already gone: its chunks move all the same
            pass
        self._note_straggler(w, owed)
        self._reassign(w)
        return owed

    def worker_ids(self) -> list[int]:
        """Ids of the live actors."""
        return [w for w, ok in enumerate(self._alive) if ok]

    def chunk_owners(self) -> list[int]:
        """The actor each chunk is resident on."""
        return list(self._owner)

    def run_on_workers(self, tasks: dict[int, WorkerTask]) -> dict[int, list[Any]]:
        """Each actor computes its task's chunk ids (non-resident ones fetched from the object store);
        an actor that is gone or dies raises ``WorkerUnavailableError`` (its chunks move to survivors)."""
        ray = require_engine("ray", "ray")
        checked = check_tasks(tasks, len(self._refs), self.worker_ids(), self.name)
        deadline = Deadline(self.timeout)
        refs, direct, sent = self._send_placed(ray, checked)
        values: dict[int, dict[int, Any]] = {w: {} for w in checked}
        clock = self._straggler_clock()
        got, closed, hung, outrun = collect_replies(direct, deadline.remaining, clock, self._answered)
        for w in outrun:  # a straggler among actors that answered: lost to this placed run, like a dead one
            self._outrun(w, list(checked[w].chunk_ids))
        if hung:
            raise WorkerTimeoutError(
                f"ray actor(s) {hung} did not answer within {self.timeout} s; "
                "a worker is hung or overloaded. Raise timeout= (seconds)."
            )
        for w, (ids, entries) in got.items():
            values[w].update(zip(ids, entries))
            self._answered.add(w)
        dead = sorted(set(closed) | set(outrun) | set(self._collect_calls(ray, refs, sent, values, deadline)))
        if dead:
            for w in dead:
                self._reassign(w)
            raise WorkerUnavailableError(dead, f"ray actor(s) {dead} died while computing chosen chunks")
        return {w: [values[w][i] for i in task.chunk_ids] for w, task in checked.items()}

    def _send_placed(self, ray: Any, checked: dict[int, WorkerTask]) -> tuple[dict[Any, int], dict[int, Any],
                                                                              dict[int, list[int]]]:
        """Send each task over its actor's pass channel, or as an actor call: ``(call refs -> worker, channels
        sent to, chunk ids of each actor call)``."""
        refs: dict[Any, int] = {}
        direct: dict[int, Any] = {}
        sent: dict[int, list[int]] = {}
        for w, task in checked.items():
            if not task.chunk_ids:
                continue
            # over the actor's pass channel, borrowed chunks included (one call, so one thread computes)
            blob = pickled_results((task.fn, task.payload)) if w in self._channels else b""
            rest = list(task.chunk_ids)
            if 0 < len(blob) <= INLINE_PAYLOAD_BYTES:
                borrowed = {i: pickled_results(ray.get(self._refs[i]))
                            for i in dict.fromkeys(rest) if self._owner[i] != w}
                if self._channels[w].send(blob, rest, borrowed):
                    direct[w] = self._channels[w]
                    rest = []
            sent[w] = rest
            if rest:
                borrowed_refs = {i: [self._refs[i]] for i in rest if self._owner[i] != w}
                packed, size = pack_payload_sized(task.payload)
                refs[self._actors[w].run_any.remote(task.fn, packed, rest, borrowed_refs)] = w
                self.wire.count_message_sent(size)
        return refs, direct, sent

    def _collect_calls(self, ray: Any, refs: dict[Any, int], sent: dict[int, list[int]],
                       values: dict[int, dict[int, Any]], deadline: Deadline) -> list[int]:
        """The actor calls' results into ``values``; returns the workers whose actor died."""
        dead: list[int] = []
        pending = list(refs)
        clock = self._straggler_clock()
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=clock.wait_s(deadline.remaining()))
            if not ready and clock.due():  # stragglers among actors that answered: lost to this run
                for w in sorted({refs[r] for r in pending if refs[r] in self._answered}):
                    self._outrun(w, sent[w])
                    dead.append(w)
                pending = [r for r in pending if refs[r] not in dead]
                clock.disarm()
                continue
            if not ready and deadline.expired():
                hung = sorted(refs[r] for r in pending)
                raise WorkerTimeoutError(
                    f"ray actor(s) {hung} did not answer within {self.timeout} s; "
                    "a worker is hung or overloaded. Raise timeout= (seconds)."
                )
            for ref in ready:
                w = refs[ref]
                try:
                    reply = ray.get(ref)
                except ray.exceptions.RayActorError:
                    dead.append(w)
                    continue
                self.wire.count_received(reply)
                values[w].update(zip(sent[w], pickle.loads(reply)))
                self._answered.add(w)
                clock.answered()
        return dead
