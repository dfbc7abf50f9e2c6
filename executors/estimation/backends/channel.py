"""A direct socket for data passes between the driver and an engine's chunk holders (dask, ray).

The engine places the chunk holders, keeps them alive, loads their chunks and reports their
deaths. A data pass, though, is one small request and one small reply per worker, and the
engines' RPC stacks spend about 1.5 ms on each (measured here, 2 workers: a ray actor call took
1.6 ms to start and 1.2 ms to bring its result back, a dask actor call 1.5 and 1.4; ``mp``'s pipe
0.5 and 0.45), against a half-pass of 9 ms at 200k rows x 8-D. So each holder also serves pass
requests on a socket of its own: ``multiprocessing.connection``, authenticated (HMAC challenge)
with a key derived per holder. The key itself never travels: the driver sends an ephemeral X25519
public key through the engine's RPC, each holder answers with its own ephemeral public key, and
both sides derive the holder's channel key (HKDF-SHA256 of the shared secret and both public
keys), so an eavesdropper on a plain-TCP engine link learns nothing it can authenticate with, and
each holder's key differs. Both ends give the handshake :data:`HANDSHAKE_TIMEOUT_S`: a client
that connects and stays silent is dropped and the holder keeps waiting for the driver. The holder's process,
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
import contextvars
import os
import pickle
import socket
import struct
import threading
import time
import traceback
from collections.abc import Callable, Collection, Sequence
from multiprocessing import AuthenticationError, connection
from typing import Any, NamedTuple

from ....contracts.errors import MissingExtraError
from ..em_pass.combine_order import apply_chunk_fn
from ..sources.recipes import materialize
from .deadline import StragglerClock
from .wire_bytes import WireBytes
from .worker_process import yield_on_wakeup

__all__ = [
    "CLOSE_REQUEST", "HANDSHAKE_TIMEOUT_S", "ChannelAuthenticationError", "ChannelClient", "ChannelOffer",
    "ChannelServer", "accept_authenticated", "answer", "collect_replies", "derive_channel_key", "dial", "holder_key",
    "new_channel_key", "serve_requests", "wait_channels",
]

_ACCEPT_TIMEOUT_S = 60.0
"""How long a holder waits for the driver to connect after opening its socket."""

HANDSHAKE_TIMEOUT_S = 10.0
"""Seconds either end of a pass channel waits for the other's part of the HMAC handshake."""

_KEY_INFO = b"mixle-parallel em pass channel v1"


class ChannelAuthenticationError(OSError, AuthenticationError):
    """The other end of a pass channel failed the HMAC handshake (a wrong key); an ``OSError``, so a
    runner falls back to the engine's RPC as for any socket failure."""


def _x25519() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import x25519
    except ImportError as exc:  # pragma: no cover - cryptography ships with the dask and ray extras
        raise MissingExtraError("cryptography", "dask") from exc
    return x25519


def derive_channel_key(private: Any, peer_public: bytes, driver_public: bytes, holder_public: bytes) -> bytes:
    """The 32-byte channel key of one holder: HKDF-SHA256 over the X25519 secret and both public keys."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    shared = private.exchange(_x25519().X25519PublicKey.from_public_bytes(peer_public))
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=driver_public + holder_public, info=_KEY_INFO).derive(shared)


def _raw_public(private: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    raw = serialization.Encoding.Raw
    return bytes(private.public_key().public_bytes(raw, serialization.PublicFormat.Raw))


class ChannelOffer:
    """The driver's half of the key agreement: an ephemeral X25519 key pair; ``public`` goes to the holders."""

    def __init__(self) -> None:
        self._private = _x25519().X25519PrivateKey.generate()
        self.public = _raw_public(self._private)

    def key_for(self, holder_public: bytes) -> bytes:
        """The channel key of the holder that answered with ``holder_public``."""
        return derive_channel_key(self._private, holder_public, self.public, holder_public)


def holder_key(driver_public: bytes) -> tuple[bytes, bytes]:
    """The holder's half: ``(channel key, holder public key)`` for the driver's ``driver_public``."""
    private = _x25519().X25519PrivateKey.generate()
    public = _raw_public(private)
    return derive_channel_key(private, driver_public, driver_public, public), public


def _recv_timeout(conn: Any, seconds: float) -> None:
    """Bound (``seconds`` > 0) or unbound (0) every blocking read of ``conn``'s socket (SO_RCVTIMEO)."""
    whole = int(seconds)
    value = struct.pack("ll", whole, int((seconds - whole) * 1e6))
    with socket.fromfd(conn.fileno(), socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)


def _handshake(conn: Any, authkey: bytes, *, server: bool, timeout: float) -> None:
    """multiprocessing's mutual HMAC challenge, each read bounded by ``timeout`` s; raises on failure."""
    _recv_timeout(conn, timeout)
    try:
        if server:
            connection.deliver_challenge(conn, authkey)
            connection.answer_challenge(conn, authkey)
        else:
            connection.answer_challenge(conn, authkey)
            connection.deliver_challenge(conn, authkey)
    finally:
        _recv_timeout(conn, 0.0)


def _no_delay(conn: Any) -> None:
    """Send small messages at once: with Nagle's algorithm a request waited for the delayed ACK of
    the previous reply (measured: 1-worker passes took 65 ms instead of 26)."""
    try:
        with socket.fromfd(conn.fileno(), socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:  # pragma: no cover - not a TCP socket (nothing to do)
        pass


def new_channel_key() -> bytes:
    """A fresh random 32-byte key (tests and callers that agree a key out of band)."""
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
        """Listen on ``host`` (an ephemeral port) and serve the first client that authenticates with
        ``authkey`` within :data:`HANDSHAKE_TIMEOUT_S`; returns the address to connect to. The serving thread
        runs in the caller's context (a dask actor's: a recipe built there finds its worker)."""
        listener = connection.Listener((host, 0))
        context = contextvars.copy_context()
        threading.Thread(target=context.run, args=(self._serve, listener, authkey), name="mixle-em-channel",
                         daemon=True).start()
        return listener.address

    def _serve(self, listener: Any, authkey: bytes) -> None:
        try:
            conn = accept_authenticated(listener, authkey, time.monotonic() + _ACCEPT_TIMEOUT_S)
        finally:
            listener.close()
        if conn is None:
            return
        if self._batch:
            yield_on_wakeup()  # this thread computes: do not preempt the driver when woken (backends.worker_process)
        serve_requests(conn, self._chunk_of, f"{self._where} (pass channel)")


def accept_authenticated(listener: Any, authkey: bytes, deadline: float, *, server: bool = True) -> Any:
    """The first connection to ``listener`` that passes the HMAC handshake for ``authkey`` before ``deadline``
    (``time.monotonic()``), else None; a silent, slow or unauthenticated client is dropped and the wait goes on."""
    raw = listener._listener._socket
    while (left := deadline - time.monotonic()) > 0:
        raw.settimeout(left)  # never wait forever for a peer that failed
        try:
            conn = listener.accept()
        except OSError:
            return None
        try:
            _handshake(conn, authkey, server=server, timeout=min(HANDSHAKE_TIMEOUT_S, max(left, 0.1)))
            return conn
        except (OSError, EOFError, AuthenticationError):
            conn.close()
    return None


CLOSE_REQUEST = b"close"
"""The request that ends a holder's serving loop (:func:`serve_requests`) cleanly."""


def serve_requests(conn: Any, chunk_of: Callable[[int], Any], where: str) -> None:
    """Answer pass requests on the authenticated ``conn`` until the driver sends :data:`CLOSE_REQUEST` or goes."""
    _no_delay(conn)
    with conn:
        while True:
            try:
                request = conn.recv_bytes()
            except (EOFError, OSError):
                return  # the driver closed the runner, or is gone
            if request == CLOSE_REQUEST:
                return
            conn.send_bytes(_answer_request(request, chunk_of, where))


def _answer_request(request: bytes, chunk_of: Callable[[int], Any], where: str) -> bytes:
    try:
        task, ids, borrowed = pickle.loads(request)
    except Exception as exc:  # noqa: BLE001 - a request this holder cannot read
        return _dump_reply(("raised", exc))
    return answer(task, ids, borrowed, chunk_of, where)


def answer(task: bytes, ids: Sequence[int], borrowed: dict[int, bytes], chunk_of: Callable[[int], Any],
           where: str, adopt: Callable[[dict[int, Any]], None] | None = None) -> bytes:
    """A chunk holder's reply to one request: ``fn`` of the pickled ``(fn, payload)`` over ``ids``
    (through ``apply_chunk_fn``; ``borrowed`` chunks come pickled and ``adopt`` may keep some), as the
    pickled ``("ok", entries)``, or ``("raised", exception)`` -- noted with ``where`` -- when it raised,
    so the driver tells a failing ``fn`` from a lost worker."""
    try:
        fn, payload = pickle.loads(task)
        extra = {int(i): materialize(pickle.loads(blob)) for i, blob in borrowed.items()}  # a recipe is built here
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


def dial(address: Any, authkey: bytes, handshake_timeout: float = HANDSHAKE_TIMEOUT_S) -> Any:
    """A connection to ``address`` that passed the HMAC handshake for ``authkey`` (the dialling side's half);
    ``OSError`` (``ChannelAuthenticationError`` for a wrong key) when it did not."""
    conn = connection.Client(tuple(address) if isinstance(address, list) else address)
    try:
        _handshake(conn, authkey, server=False, timeout=handshake_timeout)
    except AuthenticationError as exc:
        conn.close()
        raise ChannelAuthenticationError(f"pass channel handshake with {address} failed: {exc}") from exc
    except EOFError as exc:
        conn.close()
        raise OSError(f"pass channel to {address} closed during the handshake") from exc
    except OSError as exc:
        conn.close()
        raise OSError(f"pass channel handshake with {address} got no answer within {handshake_timeout} s "
                      f"({exc!r})") from exc
    return conn


class ChannelClient:
    """Driver side: one holder's socket; replies come back in request order."""

    def __init__(self, address: Any, authkey: bytes, handshake_timeout: float = HANDSHAKE_TIMEOUT_S,
                 wire: WireBytes | None = None) -> None:
        """Connect to the holder serving at ``address`` and authenticate with ``authkey``."""
        self._adopt(dial(address, authkey, handshake_timeout), wire)

    @classmethod
    def over(cls, conn: Any, wire: WireBytes | None = None) -> ChannelClient:
        """A client over ``conn``, already authenticated: the holder connected to the driver (Spark's serving
        tasks, ``backends.spark_channel``) rather than the driver to the holder."""
        client = cls.__new__(cls)
        client._adopt(conn, wire)
        return client

    def _adopt(self, conn: Any, wire: WireBytes | None) -> None:
        self.wire = wire if wire is not None else WireBytes()
        """Bytes of the request and reply frames through this socket (the runner may share one across holders)."""
        self.conn = conn
        _no_delay(self.conn)
        self.waiting: collections.deque[list[int]] = collections.deque()
        """Chunk ids of the requests sent and not yet answered, oldest first."""

    def send(self, task: bytes, ids: Sequence[int], borrowed: dict[int, bytes] | None = None) -> bool:
        """Send a request (``borrowed``: pickled chunks the holder does not hold); False when the socket
        is gone (the holder died)."""
        message = pickle.dumps((task, list(ids), borrowed or {}), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self.conn.send_bytes(message)
        except (OSError, ValueError):
            return False
        self.wire.count_sent(message)
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
            raw = self.conn.recv_bytes()
            status, value = pickle.loads(raw)
        except (EOFError, OSError, ValueError):
            return None
        self.wire.count_received(raw)
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


class Replies(NamedTuple):
    """What :func:`collect_replies` gathered: replies by key, keys whose socket closed, keys still silent when
    the time ran out, and keys given up as stragglers (silent past the straggler deadline, others answered)."""

    got: dict[Any, tuple[list[int], Any]]
    closed: list[Any]
    hung: list[Any]
    outrun: list[Any]


def collect_replies(channels: dict[Any, ChannelClient], remaining: Callable[[], float | None],
                    clock: StragglerClock | None = None, eligible: Collection[Any] = ()) -> Replies:
    """One reply from each channel in ``channels`` (each has exactly one request out). With a straggler
    ``clock``, the keys of ``eligible`` still silent when it is due are given up (``outrun``), the others
    are waited for until ``remaining()`` runs out (``hung``)."""
    out = Replies({}, [], [], [])
    waiting = dict(channels)
    while waiting:
        ready = wait_channels(waiting, remaining() if clock is None else clock.wait_s(remaining()))
        if not ready and clock is not None and clock.due():
            out.outrun.extend(sorted(k for k in waiting if k in eligible))
            for key in out.outrun:
                waiting.pop(key, None)
            clock.disarm()
            continue
        if not ready and (remaining() or 0.0) <= 0.0:
            break
        for key in ready:
            reply = waiting.pop(key).receive()
            if reply is None:
                out.closed.append(key)
            else:
                out.got[key] = reply
                if clock is not None:
                    clock.answered()
    out.hung.extend(sorted(waiting))
    return out
