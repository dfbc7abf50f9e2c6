"""The dask runner's direct pass channels: data passes over each chunk holder's own socket.

``DirectPasses`` is the part of :class:`~mixle_parallel.executors.estimation.backends.dask.DaskRunner`
that opens a holder's pass socket (``backends.channel``) on first use and runs a data pass over the
sockets, treating a closed socket (or a worker the scheduler dropped) as a lost worker whose chunks
are re-placed through dask. A holder still silent at the straggler deadline (``deadline.StragglerClock``)
while others answered is a straggler: the scheduler drops its worker, and its chunks are re-placed
and recomputed the same way (same bits). It is a mixin: it uses the runner's actors, placement and recovery
(``_channels``, ``_channel_offer``, ``direct_channel``, ``_actors``, ``_where``, ``_invoke``,
``_await``, ``_alive``, ``_forget``, ``_replace``, ``_check_losses``, ``_pass_timeout``). It also moves a
dask collection's chunk to a holder (``_packed``), bounding dask's copy by the straggler deadline, and waits for
a source's tasks the same way (``wait_for_tasks``: the audit's reads of a dask collection).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..em_pass.chunks import WorkerTimeoutError
from ..sources.dask_collections import lend_to
from .channel import ChannelClient, ChannelOffer, wait_channels
from .chunk_assignment import ordered_results
from .dask_holder import pack_for_holder
from .dask_straggler import kill_worker_process, settle_tasks, silent_in_copy
from .deadline import Deadline, straggler_deadline, stragglers_to_give_up
from .runner_families import ActorClusterRunner
from .wire_bytes import WireBytes

__all__ = ["ACTOR_START_S", "POLL_S", "DirectPasses", "call_outcomes", "channel_host"]

_log = logging.getLogger("mixle_parallel.executors.estimation.backends.dask")

POLL_S = 0.25
"""How often a waiting pass looks for actors whose worker died (a call to a dead worker can stall)."""

ACTOR_START_S = 15.0
"""Longest wait for a fresh actor on a replacement worker during recovery (survivors take over otherwise)."""


def channel_host(address: str) -> str | None:
    """The host a pass channel to the dask worker at ``address`` listens on; None unless the cluster
    talks plain TCP (``tls://`` and other comms keep every pass on dask's own RPC)."""
    scheme, _, rest = address.partition("://")
    if scheme != "tcp" or not rest:
        return None
    return rest.rsplit(":", 1)[0].strip("[]")


async def call_outcomes(calls: dict[Any, Any], timeout: float | None) -> dict[Any, tuple[bool, Any]]:
    """Inside the client's event loop: wait up to ``timeout`` seconds for all ``calls`` (key -> actor
    future) and return ``(True, value)`` or ``(False, exception)`` for each one that finished."""
    import asyncio

    async def outcome(call: Any) -> tuple[bool, Any]:
        try:
            return True, await call
        except Exception as exc:  # noqa: BLE001 - the call failed: read as a lost worker
            return False, exc

    tasks = {asyncio.ensure_future(outcome(call)): key for key, call in calls.items()}
    done, waiting = await asyncio.wait(tasks, timeout=timeout)
    for task in waiting:
        task.cancel()  # stops waiting only; the call itself goes on and is awaited again next time
    return {tasks[task]: task.result() for task in done}


class DirectPasses(ActorClusterRunner[str]):
    """Data passes over the chunk holders' own sockets (mixed into ``DaskRunner``); the family's straggler
    bookkeeping and counted bytes are ``runner_families.ActorClusterRunner``'s."""

    _channels: dict[str, ChannelClient]
    _channel_offer: ChannelOffer | None
    direct_channel: bool
    _actors: dict[str, Any]
    _where: list[str]
    _chunks: list[Any]
    _owns_client: bool  # the runner started the cluster (so it may kill a straggler's process)
    _lent: list[Any]  # futures of chunks dask copied to a borrower (held while the pass uses them)
    name: str
    # the runner's actor calls, liveness and recovery (DaskRunner's methods)
    _invoke: Callable[..., Any]  # (address, method, *args): the actor call started, None when it is gone
    _await: Callable[[str, Any, Deadline, str], Any]
    _alive: Callable[[str], bool]
    _forget: Callable[[str], None]
    _replace: Callable[[list[int], Deadline], None]
    _check_losses: Callable[[int, Sequence[int]], None]
    _pass_timeout: Callable[[Mapping[str, Sequence[int]]], WorkerTimeoutError]
    wire: WireBytes
    """Pass bytes to and from the holders: channel frames, and the blobs of ``run`` calls through dask."""
    client: Any
    _workers: list[str]

    def _outrun(self, address: str, owed: Sequence[int]) -> None:
        """Give up on the holder at ``address``, silent past the straggler deadline: on a cluster this runner
        started, its nanny kills its process (``dask_straggler``); on a cluster the caller passed in, no signal
        is sent (dask's own ``close=True`` below asks its nanny to close the worker). The scheduler drops its
        worker either way, so its keys are recomputed elsewhere and nothing waits on it; the caller re-places
        ``owed``. An abandoned actor call would keep that worker's actor thread busy, so the worker is never
        used again."""
        _log.warning("dask: worker %s is a straggler (silent past the straggler deadline); recomputing chunks "
                     "%s on the others and dropping it from the cluster", address, list(owed))
        self._note_straggler(self._workers.index(address) if address in self._workers else -1, owed)

        async def remove(dask_scheduler: Any, address: str, stimulus_id: str) -> Any:
            return await dask_scheduler.remove_worker(address=address, stimulus_id=stimulus_id, close=True)

        if self._owns_client:  # its open connections close: no survivor's fetch waits on it
            kill_worker_process(self.client, address)
        try:
            self.client.run_on_scheduler(remove, address=address, stimulus_id=f"mixle-straggler-{uuid.uuid4().hex}")
        except Exception as exc:  # noqa: BLE001 - the worker stays listed; it is not used again all the same
            _log.warning("dask: the scheduler did not drop straggler %s (%r)", address, exc)

    def _packed(self, i: int, address: str) -> bytes | None:
        """Chunk ``i`` packed for the holder at ``address`` (one in dask's memory elsewhere is moved there first);
        None when ``address`` is gone, or was given up as a straggler while the chunk was moved there."""
        if not self._alive(address):
            return None
        chunk = lend_to(self.client, self._chunks[i], address, self._lent, self._settle_copy)
        return None if chunk is None else pack_for_holder(chunk)

    def _settle_copy(self, copy: Any, source: Any, address: str) -> bool:
        """Wait for dask to copy a held chunk (``source``) to ``address``. Workers the copy waits on (``address``,
        the chunk's holders) that answered passes before and stay silent past the straggler deadline are given
        up (``_outrun``: killed, dropped; dask then recomputes the chunk from its graph). False when ``address``
        is one of them; past the pass timeout ``WorkerTimeoutError``."""
        import distributed

        deadline = Deadline(self.timeout)
        patience = straggler_deadline(0.0, self.timeout, self.straggler_timeout)
        while self._alive(address):
            remaining = deadline.remaining()
            try:
                distributed.wait(copy, timeout=patience if remaining is None else min(patience, remaining))
                return True
            except TimeoutError:
                pass
            if deadline.expired():
                raise WorkerTimeoutError(f"dask did not move chunk future {source.key!r} to worker {address} within "
                                         f"{self.timeout} s; a worker is hung. Raise timeout= (seconds) or restart it")
            silent_ones = silent_in_copy(self.client, source, address, patience)
            _log.warning("dask: moving chunk future %r to %s waits; silent past %.1f s: %s", source.key, address,
                         patience, silent_ones)
            self._give_up_silent(silent_ones)
        return False

    def _give_up_silent(self, addresses: Sequence[str]) -> None:
        """Give up the workers of ``addresses`` that are this runner's and answered passes before (``_outrun``:
        dropped from the cluster; their chunks re-placed by the next pass). Others are not this runner's to drop."""
        for silent in addresses:
            if silent in self._actors and silent in self._answered:
                self._outrun(silent, [i for i, w in enumerate(self._where) if w == silent])
                self._forget(silent)

    def wait_for_tasks(self, futures: Mapping[str, Any], what: str) -> None:
        """Wait for a source's dask tasks (the audit's reads of a collection, each future named by its part) as a
        pass waits for its workers: a worker of this runner they wait on that stays silent past the straggler
        deadline is given up (dask then runs them elsewhere); past ``timeout`` ``WorkerTimeoutError``."""
        patience = straggler_deadline(0.0, self.timeout, self.straggler_timeout)
        settle_tasks(self.client, futures, what, self.timeout, patience, self._give_up_silent)

    def _channel_for(self, address: str) -> ChannelClient | None:
        """The pass socket of the holder on ``address``, opened on first use; None when the cluster's
        comms are not plain TCP (TLS stays dask's own), or the holder is gone."""
        channel = self._channels.get(address)
        if channel is not None or not self.direct_channel:
            return channel
        host = channel_host(address)
        if host is None:
            return None
        if self._channel_offer is None:
            self._channel_offer = ChannelOffer()  # one ephemeral key pair per runner; a key per holder
        offer = self._channel_offer
        reply = self._await(
            address,
            self._invoke(address, "open_channel", offer.public, host),
            Deadline(ACTOR_START_S),
            "open its pass channel",
        )
        if reply is None:
            return None  # the worker is gone (forgotten by _await)
        try:
            if isinstance(reply, str):
                raise OSError(reply)
            where, holder_public = reply
            self._channels[address] = ChannelClient(where, offer.key_for(holder_public), wire=self.wire)
        except OSError as exc:
            _log.warning("dask: no pass channel to %s (%s); data passes go through dask's RPC", address, exc)
            self.direct_channel = False
            return None
        return self._channels[address]

    def _drop_channel(self, address: str) -> list[int]:
        """Close the pass socket of ``address``; the chunk ids it still owed."""
        channel = self._channels.pop(address, None)
        if channel is None:
            return []
        owed = channel.owed
        channel.close()
        return owed

    def _map_direct(self, task: bytes, ids: list[int], deadline: Deadline) -> list[Any]:
        """A pass over the holders' sockets. A closed socket, or a worker the scheduler dropped, is a
        lost worker: its chunks are re-placed through dask and recomputed."""
        results: dict[int, Any] = {}
        losses = 0

        def lost(address: str, extra: Sequence[int] = ()) -> None:
            nonlocal losses
            owed = sorted(set(self._drop_channel(address)) | set(extra))
            self._forget(address)
            for other in [a for a in self._channels if a not in self._actors]:  # forgotten meanwhile
                owed = sorted(set(owed) | set(self._drop_channel(other)))
            if not owed:
                return
            losses += 1
            self._check_losses(losses, owed)
            self._replace(owed, deadline)
            submit(owed)
            clock.restart()  # the survivors' recomputation is a race of its own

        def submit(chunk_list: Sequence[int]) -> None:
            by_worker: dict[str, list[int]] = {}
            for i in chunk_list:
                by_worker.setdefault(self._where[i], []).append(i)
            for address, wids in sorted(by_worker.items()):
                channel = self._channel_for(address)
                if channel is None or not channel.send(task, wids):
                    lost(address, wids)

        clock = self._straggler_clock()
        submit(ids)
        while any(channel.waiting for channel in self._channels.values()):
            wait = clock.wait_s(deadline.remaining())
            ready = wait_channels(self._channels, POLL_S if wait is None else min(POLL_S, wait))
            for address in ready:
                if address not in self._channels:
                    continue
                got = self._channels[address].receive()
                if got is None:  # the holder's socket closed: its worker died
                    lost(address)
                    continue
                results.update(zip(*got))
                self._answered.add(address)
                clock.answered()
            if not ready:  # a worker on another host can vanish without closing its socket
                for address in [a for a, ch in self._channels.items() if ch.waiting and not self._alive(a)]:
                    lost(address)
                if clock.due():
                    stuck = stragglers_to_give_up(
                        [a for a, ch in self._channels.items() if ch.waiting and a in self._answered], self._actors)
                    for address in stuck:
                        self._outrun(address, self._channels[address].owed)
                        lost(address)
                    clock.restart() if stuck else clock.disarm()
                if deadline.expired():
                    hung = {a: ch.owed for a, ch in self._channels.items() if ch.waiting}
                    raise self._pass_timeout(hung)
        return ordered_results(results, ids, self.name)
