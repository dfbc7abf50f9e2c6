"""A direct socket for data passes between the driver and an engine's chunk holders (dask, ray).

The engine places the chunk holders, keeps them alive, loads their chunks and reports their
deaths. A data pass, though, is one small request and one small reply per worker, and the
engines' RPC stacks spend about 1.5 ms on each (measured here, 2 workers: a ray actor call took
1.6 ms to start and 1.2 ms to bring its result back, a dask actor call 1.5 and 1.4; ``mp``'s pipe
0.5 and 0.45), against a half-pass of 9 ms at 200k rows x 8-D. So each holder also serves pass
requests on a socket of its own: ``multiprocessing.connection``, authenticated (HMAC challenge)
with a random per-runner key that travels through the engine's own RPC. The holder's process,
chunks and lifetime are still the engine's; a lost socket is read as a lost worker, and the
runner's usual recovery (through the engine) takes over.

Requests and replies are pickles: a request is ``(task, chunk ids, borrowed)`` with ``task`` the
pickled ``(fn, payload)`` (cloudpickle, once per pass) and ``borrowed`` the pickled chunks the
holder does not hold (the SDC audit's replays; used for the call, not kept), a reply
``("ok", entries)`` from
:func:`~.combine_order.apply_chunk_fn` or ``("raised", exception)`` when ``fn`` raised. The traffic
is not encrypted: where the network between driver and workers must carry only the engine's own
(TLS) traffic, pass ``direct_channel=False`` and every pass goes through the engine's RPC.
"""

from __future__ import annotations

import collections
import os
import pickle
import socket
import threading
import traceback
from collections.abc import Callable, Sequence
from multiprocessing import connection
from typing import Any

from mixle_parallel.executors.estimation.combine_order import apply_chunk_fn
from mixle_parallel.executors.estimation.engines.support import yield_on_wakeup

__all__ = ["ChannelClient", "ChannelServer", "answer", "collect_replies", "new_channel_key", "wait_channels"]

_ACCEPT_TIMEOUT_S = 60.0
"""How long a holder waits for the driver to connect after opening its socket."""


def _no_delay(conn: Any) -> None:
    """Send small messages at once: with Nagle's algorithm a request waited for the delayed ACK of
    the previous reply (measured: 1-worker passes took 65 ms instead of 26)."""
    try:
        with socket.fromfd(conn.fileno(), socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:  # pragma: no cover - not a TCP socket (nothing to do)
        pass


def new_channel_key() -> bytes:
    """A fresh random key for one runner's channels (32 bytes)."""
    return os.urandom(32)


class ChannelServer:
    """Holder side: answers pass requests on one authenticated socket, in a thread of its own."""

    def __init__(self, chunk_of: Callable[[int], Any], where: str, batch_schedule: bool = True) -> None:
        """``chunk_of(id)`` reads a resident chunk; ``where`` names the holder in the note of an
        exception ``fn`` raised (e.g. "a dask worker's chunk holder")."""
        self._chunk_of = chunk_of
        self._where = where
        self._batch = batch_schedule

    def open(self, host: str, authkey: bytes) -> tuple[str, int]:
        """Listen on ``host`` (an ephemeral port) and serve the first client that authenticates;
        returns the address to connect to."""
        listener = connection.Listener((host, 0), authkey=authkey)
        threading.Thread(target=self._serve, args=(listener,), name="mixle-em-channel", daemon=True).start()
        return listener.address

    def _serve(self, listener: Any) -> None:
        try:
            listener._listener._socket.settimeout(_ACCEPT_TIMEOUT_S)  # never wait forever for a driver that failed
            conn = listener.accept()
        except Exception:  # noqa: BLE001 - no driver came, or it failed to authenticate: stop serving
            return
        finally:
            listener.close()
        _no_delay(conn)
        if self._batch:
            yield_on_wakeup()  # this thread computes: do not preempt the driver when woken (see engines.support)
        with conn:
            while True:
                try:
                    request = conn.recv_bytes()
                except (EOFError, OSError):
                    return  # the driver closed the runner, or is gone
                conn.send_bytes(self._answer(request))

    def _answer(self, request: bytes) -> bytes:
        try:
            task, ids, borrowed = pickle.loads(request)
        except Exception as exc:  # noqa: BLE001 - a request this holder cannot read
            return _dump_reply(("raised", exc))
        return answer(task, ids, borrowed, self._chunk_of, f"{self._where} (pass channel)")


def answer(task: bytes, ids: Sequence[int], borrowed: dict[int, bytes], chunk_of: Callable[[int], Any],
           where: str, adopt: Callable[[dict[int, Any]], None] | None = None) -> bytes:
    """A chunk holder's reply to one request: ``fn`` of the pickled ``(fn, payload)`` over ``ids``
    (through ``apply_chunk_fn``; ``borrowed`` chunks come pickled and ``adopt`` may keep some), as the
    pickled ``("ok", entries)``, or ``("raised", exception)`` -- noted with ``where`` -- when it raised,
    so the driver tells a failing ``fn`` from a lost worker."""
    try:
        fn, payload = pickle.loads(task)
        extra = {int(i): pickle.loads(blob) for i, blob in borrowed.items()}
        if adopt is not None:
            adopt(extra)
        lookup = (lambda i: extra[i] if i in extra else chunk_of(i)) if extra else chunk_of
        reply: tuple[str, Any] = ("ok", apply_chunk_fn(fn, payload, ids, lookup))
    except Exception as exc:  # noqa: BLE001 - returned to the driver, which re-raises it
        exc.add_note(f"raised in {where}:\n{traceback.format_exc()}")
        reply = ("raised", exc)
    return _dump_reply(reply)


def _dump_reply(reply: tuple[str, Any]) -> bytes:
    """Plain pickle (fast); cloudpickle for what it cannot carry; an exception neither can, as text."""
    try:
        return pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - results or an exception that plain pickle cannot carry
        import cloudpickle

        try:
            return cloudpickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001 - sent as text
            cause = reply[1] if reply[0] == "raised" else exc
            text = "\n".join([f"{type(cause).__name__}: {cause}", *getattr(cause, "__notes__", ())])
            return pickle.dumps(("raised", RuntimeError(text)))


class ChannelClient:
    """Driver side: one holder's socket; replies come back in request order."""

    def __init__(self, address: Any, authkey: bytes) -> None:
        self.conn = connection.Client(tuple(address) if isinstance(address, list) else address, authkey=authkey)
        _no_delay(self.conn)
        self.waiting: collections.deque[list[int]] = collections.deque()
        """Chunk ids of the requests sent and not yet answered, oldest first."""

    def send(self, task: bytes, ids: Sequence[int], borrowed: dict[int, bytes] | None = None) -> bool:
        """Send a request (``borrowed``: pickled chunks the holder does not hold); False when the socket
        is gone (the holder died)."""
        try:
            self.conn.send_bytes(pickle.dumps((task, list(ids), borrowed or {}), protocol=pickle.HIGHEST_PROTOCOL))
        except (OSError, ValueError):
            return False
        self.waiting.append(list(ids))
        return True

    @property
    def owed(self) -> list[int]:
        """Chunk ids of every request not yet answered, in order."""
        return [i for ids in self.waiting for i in ids]

    def receive(self) -> tuple[list[int], Any] | None:
        """The oldest request's chunk ids and entries; None when the socket is gone. ``fn``'s own
        exception is raised."""
        try:
            status, value = pickle.loads(self.conn.recv_bytes())
        except (EOFError, OSError, ValueError):
            return None
        ids = self.waiting.popleft()
        if status == "raised":
            raise value
        return ids, value

    def close(self) -> None:
        """Close the socket (the holder's serving thread then ends)."""
        self.waiting.clear()
        try:
            self.conn.close()
        except OSError:  # pragma: no cover - already closed
            pass


def wait_channels(channels: dict[Any, ChannelClient], timeout: float | None) -> list[Any]:
    """Keys of the channels with a reply (or a closed socket) to read, waiting up to ``timeout`` s."""
    by_conn = {ch.conn: key for key, ch in channels.items() if ch.waiting}
    if not by_conn:
        return []
    ready: list[Any] = connection.wait(list(by_conn), timeout=timeout)  # some of the connections it was given
    return [by_conn[c] for c in ready]


def collect_replies(channels: dict[Any, ChannelClient], remaining: Callable[[], float | None]
                    ) -> tuple[dict[Any, tuple[list[int], Any]], list[Any], list[Any]]:
    """One reply from each channel in ``channels`` (each has exactly one request out): the replies by
    key, the keys whose socket closed, and the keys still silent when ``remaining()`` ran out."""
    got: dict[Any, tuple[list[int], Any]] = {}
    closed: list[Any] = []
    waiting = dict(channels)
    while waiting:
        ready = wait_channels(waiting, remaining())
        if not ready:
            break
        for key in ready:
            reply = waiting.pop(key).receive()
            if reply is None:
                closed.append(key)
            else:
                got[key] = reply
    return got, closed, sorted(waiting)
