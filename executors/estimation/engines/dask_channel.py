"""The dask runner's direct pass channels: data passes over each chunk holder's own socket.

``DirectPasses`` is the part of :class:`~mixle_parallel.executors.estimation.engines.dask.DaskRunner`
that opens a holder's pass socket (``engines.channel``) on first use and runs a data pass over the
sockets, treating a closed socket (or a worker the scheduler dropped) as a lost worker whose chunks
are re-placed through dask. It is a mixin: it uses the runner's actors, placement and recovery
(``_channels``, ``_channel_offer``, ``direct_channel``, ``_actors``, ``_where``, ``_invoke``,
``_await``, ``_alive``, ``_forget``, ``_replace``, ``_check_losses``, ``_pass_timeout``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..chunks import WorkerTimeoutError
from .channel import ChannelClient, ChannelOffer, wait_channels
from .chunk_assignment import ordered_results
from .deadline import Deadline
from .wire_bytes import WireBytes

__all__ = ["ACTOR_START_S", "POLL_S", "DirectPasses", "channel_host"]

_log = logging.getLogger("mixle_parallel.executors.estimation.engines.dask")

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


class DirectPasses:
    """Data passes over the chunk holders' own sockets (mixed into ``DaskRunner``)."""

    _channels: dict[str, ChannelClient]
    _channel_offer: ChannelOffer | None
    direct_channel: bool
    _actors: dict[str, Any]
    _where: list[str]
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

    @property
    def transport_bytes(self) -> int:
        """Pass bytes sent to and received from the holders so far (models out, statistics back)."""
        return self.wire.total

    @property
    def transport_messages(self) -> int:
        """Messages handed to and taken from the transport so far (``WireBytes.messages``)."""
        return self.wire.messages

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

        def submit(chunk_list: Sequence[int]) -> None:
            by_worker: dict[str, list[int]] = {}
            for i in chunk_list:
                by_worker.setdefault(self._where[i], []).append(i)
            for address, wids in sorted(by_worker.items()):
                channel = self._channel_for(address)
                if channel is None or not channel.send(task, wids):
                    lost(address, wids)

        submit(ids)
        while any(channel.waiting for channel in self._channels.values()):
            remaining = deadline.remaining()
            ready = wait_channels(self._channels, POLL_S if remaining is None else min(POLL_S, remaining))
            for address in ready:
                if address not in self._channels:
                    continue
                got = self._channels[address].receive()
                if got is None:  # the holder's socket closed: its worker died
                    lost(address)
                    continue
                results.update(zip(*got))
            if not ready:  # a worker on another host can vanish without closing its socket
                for address in [a for a, ch in self._channels.items() if ch.waiting and not self._alive(a)]:
                    lost(address)
                if deadline.expired():
                    hung = {a: ch.owed for a, ch in self._channels.items() if ch.waiting}
                    raise self._pass_timeout(hung)
        return ordered_results(results, ids, self.name)
