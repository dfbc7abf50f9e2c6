"""The dask runner's calls to its chunk-holder actors: start one, await one, settle many at once.

Every actor call of ``DaskRunner`` goes through these (mixed in): ``_invoke`` starts one (counting a pass's bytes),
``_await`` waits for a plain one, ``_settle`` yields the calls of a pass as they finish (lost workers and, with a
straggler clock, outrun ones marked), ``_decode`` reads a finished ``run`` call's results.
"""

from __future__ import annotations

import itertools
import logging
import pickle
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..em_pass.chunks import WorkerLostError, WorkerTimeoutError
from .dask_channel import POLL_S, DirectPasses, call_outcomes
from .deadline import Deadline, StragglerClock, stragglers_to_give_up

__all__ = ["ActorCalls"]

_log = logging.getLogger("mixle_parallel.executors.estimation.backends.dask")


class ActorCalls(DirectPasses):
    """Calls to the holder actors (mixed into ``DaskRunner``; its attributes are declared on ``DirectPasses``)."""

    _calls: itertools.count[int]
    max_recoveries: int
    def _invoke(self, address: str, method: str, *args: Any) -> Any:
        """Start ``method(*args)`` on the actor of ``address``; None when that actor is already gone."""
        actor = self._actors.get(address)
        if actor is None or not self._alive(address):
            return None
        try:
            call = getattr(actor, method)(*args)
        except Exception:  # noqa: BLE001 - the handle refuses calls once its worker is lost
            return None
        if method == "run":  # a pass through dask's RPC: the task, work and borrowed chunks, all bytes
            self.wire.count_sent(*args)
        return call

    def _await(self, address: str, call: Any, deadline: Deadline, what: str) -> Any:
        """The value of a (non-``run``) actor call; None when its worker was lost; past the deadline
        ``WorkerTimeoutError`` saying the worker did not ``what``."""
        while call is not None:
            if call.done():
                try:
                    return call.result()
                except Exception as exc:  # noqa: BLE001 - the call failed: the worker is gone
                    _log.warning("dask: worker %s was lost during a call (%r)", address, exc)
                    break
            if not self._alive(address):
                break
            if deadline.expired():
                raise WorkerTimeoutError(
                    f"dask worker {address} did not {what} within {self.timeout} s; "
                    "raise timeout= (seconds) or restart it"
                )
            self._wait_some([call], deadline)
        self._forget(address)
        return None

    def _settle(self, pending: dict[Any, tuple[Any, ...]], deadline: Deadline, timed_out: Callable[[], Exception],
                clock: StragglerClock | None = None) -> Any:
        """Yield ``(key, entry, values)`` as the calls of ``pending`` (key -> ``(address, call, ...)``)
        settle, removing each; ``values`` is None when the worker was lost (then forgotten), or outrun by the
        straggler ``clock`` (then also dropped). The caller may add calls between yields. When nothing settles
        by the deadline, raises ``timed_out()``.

        One hand-off to the client's event loop waits for every pending call at once (up to the poll
        interval) and brings back the outcomes of those that finished: each ``ActorFuture.result()``
        would be a hand-off of its own, three or four per pass."""
        while pending:
            calls = {key: entry[1] for key, entry in pending.items() if entry[1] is not None}
            remaining = deadline.remaining()
            wait = POLL_S if remaining is None else min(POLL_S, remaining)
            outcomes = self.client.sync(call_outcomes, calls, wait) if calls else {}
            progressed = False
            outrun = clock is not None and not outcomes and clock.due()
            give_up = stragglers_to_give_up(
                sorted({entry[0] for entry in pending.values() if entry[0] in self._answered}), self._actors
            ) if outrun else []
            for key, entry in list(pending.items()):
                address, call = entry[0], entry[1]
                if key in outcomes:
                    values = self._decode(address, *outcomes[key])
                elif call is None or not self._alive(address):
                    values = None
                elif address in give_up:
                    self._outrun(address, list(entry[2]) if len(entry) > 2 else [])  # (address, call, chunk ids)
                    values = None
                else:
                    continue
                del pending[key]
                progressed = True
                if values is None:
                    self._forget(address)
                elif clock is not None:
                    self._answered.add(address)
                    clock.answered()
                yield key, entry, values
            if outrun and clock is not None:
                clock.restart() if progressed else clock.disarm()
            if pending and not progressed and deadline.expired():
                raise timed_out()

    def _decode(self, address: str, ok: bool, value: Any) -> Any:
        """A finished ``run`` call's results; None when the call failed (its worker is gone); ``fn``'s
        own error is raised."""
        if not ok:
            _log.warning("dask: worker %s was lost during a call (%r)", address, value)
            return None
        self.wire.count_received(value)
        status, result = pickle.loads(value)
        if status == "raised":
            raise result
        return result

    @staticmethod
    def _wait_some(calls: list[Any], deadline: Deadline) -> None:
        """Block until the first unfinished call finishes, the poll interval passes, or the deadline."""
        remaining = deadline.remaining()
        wait = POLL_S if remaining is None else min(POLL_S, remaining)
        for call in calls:
            if call is not None and not call.done():
                try:
                    call.result(timeout=wait)
                except Exception:  # noqa: BLE001 - timeouts and failures are read by the caller
                    pass
                return

    def _check_losses(self, losses: int, chunk_ids: Sequence[int]) -> None:
        """Give up a pass whose workers keep dying (``max_recoveries`` losses)."""
        if losses > self.max_recoveries:
            raise WorkerLostError(
                f"dask lost chunks {sorted(chunk_ids)} {losses} times in one pass (workers keep dying); "
                "check the workers' memory limits and logs"
            )

    def _pass_timeout(self, hung: Mapping[str, Sequence[int]]) -> WorkerTimeoutError:
        """The error of a pass whose workers (address -> chunk ids owed) did not answer in time."""
        return WorkerTimeoutError(
            f"dask worker(s) {sorted(hung)} did not return chunk(s) {sorted(i for ids in hung.values() for i in ids)} "
            f"within {self.timeout} s; a worker is hung or overloaded. Raise timeout= (seconds) or restart the "
            "hung worker."
        )
