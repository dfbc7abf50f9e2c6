"""The direct pass channel of the dask and ray chunk holders, on a real loopback socket.

(Engine-level behaviour -- passes on the channel, a holder killed mid-pass, a hung one -- is in
tests/estimation/backends/test_dask_backend.py and test_ray_backend.py.)
"""

from __future__ import annotations

import pickle
import socket
import threading
import time
from multiprocessing import AuthenticationError

import cloudpickle
import pytest

from mixle_parallel.executors.estimation.backends.channel import (
    ChannelClient,
    ChannelServer,
    new_channel_key,
    wait_channels,
)


def _scaled(chunk: float, payload: dict) -> float:
    if chunk < 0:
        raise ValueError(f"chunk {chunk} is bad on purpose")
    return chunk * payload["scale"]


def _task(payload: dict) -> bytes:
    return cloudpickle.dumps((_scaled, payload))


@pytest.fixture
def chunks():
    return {0: 1.0, 1: 2.0, 2: 3.0, 3: -1.0}


def _open(chunks, key=None):
    key = key or new_channel_key()
    address = ChannelServer(chunks.__getitem__, "a test holder").open("127.0.0.1", key)
    return address, key


def test_requests_are_answered_in_order_over_an_authenticated_socket(chunks):
    address, key = _open(chunks)
    client = ChannelClient(address, key)
    try:
        assert client.send(_task({"scale": 2.0}), [0, 2]) and client.send(_task({"scale": 10.0}), [1])
        assert wait_channels({"h": client}, 5.0) == ["h"]
        assert client.receive() == ([0, 2], [2.0, 6.0])
        assert client.receive() == ([1], [20.0])
        assert wait_channels({"h": client}, 0.0) == []  # nothing owed, nothing to wait for
        with socket.fromfd(client.conn.fileno(), socket.AF_INET, socket.SOCK_STREAM) as sock:
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)  # small messages go at once
    finally:
        client.close()


def test_a_wrong_key_is_refused(chunks):
    address, _ = _open(chunks)
    with pytest.raises(AuthenticationError):
        ChannelClient(address, new_channel_key())


def test_an_exception_of_fn_comes_back_with_where_it_was_raised(chunks):
    address, key = _open(chunks)
    client = ChannelClient(address, key)
    try:
        client.send(_task({"scale": 1.0}), [1, 3])
        with pytest.raises(ValueError, match="bad on purpose") as err:
            client.receive()
        assert any("a test holder (pass channel)" in note for note in err.value.__notes__)
        client.send(_task({"scale": 1.0}), [0])  # the holder keeps serving
        assert client.receive() == ([0], [1.0])
    finally:
        client.close()


def test_closing_the_client_ends_the_holders_thread_and_a_closed_socket_reads_as_lost(chunks):
    before = [t for t in threading.enumerate() if t.name == "mixle-em-channel"]  # earlier tests' threads may still end
    address, key = _open(chunks)
    client = ChannelClient(address, key)
    serving = [t for t in threading.enumerate() if t.name == "mixle-em-channel" and all(t is not o for o in before)]
    assert len(serving) == 1
    client.close()
    serving[0].join(timeout=5)
    assert not serving[0].is_alive()
    assert client.send(_task({"scale": 1.0}), [0]) is False  # what a runner reads as a lost holder

    # the holder side going away mid-request: the reply is None (the runner re-places the chunks)
    server_side = {}
    listener_key = new_channel_key()
    from multiprocessing.connection import Listener

    listener = Listener(("127.0.0.1", 0), authkey=listener_key)
    accept = threading.Thread(target=lambda: server_side.setdefault("conn", listener.accept()))
    accept.start()
    lost = ChannelClient(listener.address, listener_key)
    accept.join(timeout=5)
    assert lost.send(_task({"scale": 1.0}), [0])
    server_side["conn"].close()
    listener.close()
    deadline = time.monotonic() + 5
    while not wait_channels({"h": lost}, 0.1) and time.monotonic() < deadline:
        pass
    assert lost.receive() is None
    lost.close()


def test_requests_and_replies_are_plain_pickles(chunks):
    """What travels: ``(task, ids, borrowed chunks)`` in, ``("ok", entries)`` out -- nothing engine-specific."""
    address, key = _open(chunks)
    from multiprocessing.connection import Client

    with Client(address, authkey=key) as conn:
        conn.send_bytes(pickle.dumps((_task({"scale": 3.0}), [2], {})))
        assert pickle.loads(conn.recv_bytes()) == ("ok", [9.0])


def test_borrowed_chunks_are_used_for_the_call_and_not_kept(chunks):
    address, key = _open(chunks)
    client = ChannelClient(address, key)
    try:
        client.send(_task({"scale": 1.0}), [0, 7, 1], {7: pickle.dumps(70.0)})  # 7 is held elsewhere
        assert client.receive() == ([0, 7, 1], [1.0, 70.0, 2.0])
        assert 7 not in chunks
        client.send(_task({"scale": 1.0}), [7])
        with pytest.raises(KeyError):  # not resident, not lent this time
            client.receive()
    finally:
        client.close()


def test_channels_are_opened_only_where_the_engine_talks_plain_tcp(monkeypatch):
    from mixle_parallel.executors.estimation.backends.dask import channel_host
    from mixle_parallel.executors.estimation.backends.ray import ray_uses_tls

    assert channel_host("tcp://10.0.0.7:40123") == "10.0.0.7"
    assert channel_host("tcp://[::1]:40123") == "::1"
    assert channel_host("tls://10.0.0.7:40123") is None  # TLS stays dask's own
    assert channel_host("ucx://10.0.0.7:40123") is None
    monkeypatch.setenv("RAY_USE_TLS", "1")
    assert ray_uses_tls()
    monkeypatch.setenv("RAY_USE_TLS", "0")
    assert not ray_uses_tls()


def test_a_silent_client_neither_blocks_the_holder_nor_the_driver(chunks, monkeypatch):
    from mixle_parallel.executors.estimation.backends import channel

    monkeypatch.setattr(channel, "HANDSHAKE_TIMEOUT_S", 0.5)
    address, key = _open(chunks)
    squatter = socket.create_connection(tuple(address))  # connects first and never says a word
    try:
        t0 = time.monotonic()
        client = ChannelClient(address, key, handshake_timeout=5.0)  # served once the squatter is dropped
        assert time.monotonic() - t0 < 4.0
        client.send(_task({"scale": 1.0}), [1])
        assert client.receive() == ([1], [2.0])
        client.close()
    finally:
        squatter.close()

    silent = socket.create_server(("127.0.0.1", 0))  # a "holder" that accepts and never answers
    try:
        t0 = time.monotonic()
        with pytest.raises(OSError, match="got no answer within 0.3 s"):
            ChannelClient(silent.getsockname(), key, handshake_timeout=0.3)
        assert time.monotonic() - t0 < 3.0
    finally:
        silent.close()


def test_the_channel_key_is_agreed_per_holder_and_never_sent():
    from mixle_parallel.executors.estimation.backends.channel import ChannelOffer, holder_key

    offer = ChannelOffer()
    key_a, public_a = holder_key(offer.public)
    key_b, public_b = holder_key(offer.public)
    assert offer.key_for(public_a) == key_a and offer.key_for(public_b) == key_b
    assert key_a != key_b and len(key_a) == 32
    on_the_wire = offer.public + public_a + public_b  # all that crosses the engine's RPC
    assert key_a not in on_the_wire and key_b not in on_the_wire
    address = ChannelServer({0: 4.0}.__getitem__, "a test holder").open("127.0.0.1", key_a)
    client = ChannelClient(address, offer.key_for(public_a))
    client.send(_task({"scale": 0.5}), [0])
    assert client.receive() == ([0], [2.0])
    client.close()


def test_ray_pass_channels_bind_loopback_only_on_a_one_node_cluster():
    from mixle_parallel.executors.estimation.backends.ray import one_node_cluster

    class FakeRay:
        def __init__(self, nodes):
            self._nodes = nodes
            self.util = type("util", (), {"get_node_ip_address": staticmethod(lambda: "10.0.0.5")})

        def nodes(self):
            return self._nodes

    here = {"Alive": True, "NodeManagerAddress": "10.0.0.5"}
    other = {"Alive": True, "NodeManagerAddress": "10.0.0.6"}
    assert one_node_cluster(FakeRay([here]))
    assert one_node_cluster(FakeRay([here, {"Alive": False, "NodeManagerAddress": "10.0.0.6"}]))
    assert not one_node_cluster(FakeRay([here, other]))
    assert not one_node_cluster(FakeRay([other]))
