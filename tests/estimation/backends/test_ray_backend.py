"""RayRunner against a real local Ray (num_cpus=2): placement, ordering, actor death, hung actor."""

from __future__ import annotations

import os
import signal

import pytest

pytest.importorskip("ray")

from mixle_parallel.executors.estimation.backends.ray import RayRunner  # noqa: E402
from mixle_parallel.executors.estimation.em_pass.chunks import WorkerLostError, WorkerTask, WorkerTimeoutError  # noqa: E402
from tests.estimation.backends import chunk_probes as probes  # noqa: E402
from tests.estimation.backends import em_case  # noqa: E402
from tests.estimation.backends.engine_helpers import REPO_ROOT, by_value  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_session(ray_session):
    """The session's local Ray (tests/conftest.py), the chunk probes pickled by value."""
    by_value(probes)
    return ray_session


@pytest.mark.parametrize("direct", [True, False], ids=["direct-channel", "ray-rpc"])
def test_results_in_chunk_order_and_chunks_resident(ray_session, direct):
    chunks = probes.make_chunks(7)
    runner = RayRunner(2, timeout=120, direct_channel=direct)
    try:
        runner.scatter(chunks)
        # Passes run on each actor's own socket, or through Ray's task RPC when asked.
        # A placed run (the SDC audit's; in an audited fit it may come before any plain pass), a borrowed
        # chunk first: one call over the worker's channel
        names = runner.run_on_workers({0: WorkerTask(probes.thread_name, None, (5, 0, 1))})[0]
        assert [n == "mixle-em-channel" for n in names] == [direct] * 3
        assert len(set(runner.run_on_workers({0: WorkerTask(probes.worker_pid, None, (5, 0, 1))})[0])) == 1
        names = set(runner.map_chunks(probes.thread_name, None))
        assert (names == {"mixle-em-channel"}) if direct else ("mixle-em-channel" not in names)
        # Contiguous blocks, resident in one actor each: chunks 0-2 / 3-6 report two distinct pids.
        pids = runner.map_chunks(probes.worker_pid, None)
        assert len(set(pids[:3])) == 1 and len(set(pids[3:])) == 1 and pids[0] != pids[3]
        assert sorted(set(pids)) == sorted(runner.worker_pids())
        assert runner.map_chunks(probes.probe, {"scale": 2.0}) == probes.expected(chunks, 2.0)
        assert runner.map_chunks(probes.probe, {}, chunk_ids=[6, 0]) == [
            probes.expected(chunks)[0],
            probes.expected(chunks)[6],
        ]
        with pytest.raises(ValueError, match="bad on purpose"):
            runner.map_chunks(probes.probe, {"fail_chunk": 2})
    finally:
        runner.close()
    assert ray_session.is_initialized()  # a Ray the runner did not start stays up


def test_large_payloads_travel_through_the_object_store(ray_session):
    from mixle_parallel.executors.estimation.backends.ray import INLINE_PAYLOAD_BYTES, pack_payload

    chunks = probes.make_chunks(4)
    big = {"scale": 3.0, "ballast": bytes(2 * INLINE_PAYLOAD_BYTES)}
    assert isinstance(pack_payload({"scale": 3.0}), bytes)  # small: inside the call
    assert isinstance(pack_payload(big), ray_session.ObjectRef)  # large: put once, shared by the actors
    runner = RayRunner(2, timeout=120)
    try:
        runner.scatter(chunks)
        assert runner.map_chunks(probes.probe, big) == probes.expected(chunks, 3.0)
        expected = probes.expected(chunks, 3.0)
        # chunk 0 is resident on actor 0: actor 1 fetches it from the store
        assert runner.compute_on(1, probes.probe, big, [0, 3]) == [expected[0], expected[3]]
    finally:
        runner.close()


def test_three_workers_on_two_cpus(ray_session):
    chunks = probes.make_chunks(5)
    runner = RayRunner(3, timeout=120)
    try:
        runner.scatter(chunks)
        assert len(set(runner.map_chunks(probes.worker_pid, None))) == 3
        assert runner.map_chunks(probes.probe, {}) == probes.expected(chunks)
    finally:
        runner.close()


def test_actor_killed_mid_pass_is_recomputed_on_survivors(ray_session, tmp_path):
    chunks = probes.make_chunks(6)
    runner = RayRunner(2, timeout=180)
    try:
        runner.scatter(chunks)
        payload = {"kill_chunk": 4, "marker": str(tmp_path / "killed")}
        assert runner.map_chunks(probes.probe, payload) == probes.expected(chunks)
        assert (tmp_path / "killed").exists()
        assert runner.recoveries == 3  # the dead actor's block (chunks 3-5) moved
        assert len(runner.worker_pids()) == 1
        assert len(set(runner.map_chunks(probes.worker_pid, None))) == 1
        assert runner.map_chunks(probes.probe, {"scale": 0.5}) == probes.expected(chunks, 0.5)
    finally:
        runner.close()


def test_actor_killed_between_passes(ray_session):
    chunks = probes.make_chunks(4)
    runner = RayRunner(2, timeout=180)
    try:
        runner.scatter(chunks)
        assert runner.map_chunks(probes.probe, {}) == probes.expected(chunks)
        os.kill(runner.worker_pids()[0], signal.SIGKILL)
        assert runner.map_chunks(probes.probe, {"scale": 3.0}) == probes.expected(chunks, 3.0)
        assert runner.recoveries == 2
    finally:
        runner.close()


def test_losing_every_actor_is_a_clear_error(ray_session, tmp_path):
    chunks = probes.make_chunks(3)
    runner = RayRunner(1, timeout=180)
    try:
        runner.scatter(chunks)
        with pytest.raises(WorkerLostError, match="every ray actor died"):
            runner.map_chunks(probes.probe, {"kill_chunk": 1, "marker": str(tmp_path / "killed")})
    finally:
        runner.close()


def test_hung_actor_raises_timeout(ray_session, tmp_path):
    chunks = probes.make_chunks(4)
    runner = RayRunner(2, timeout=3.0)
    release = tmp_path / "release"
    try:
        runner.scatter(chunks)
        with pytest.raises(WorkerTimeoutError, match=r"chunk\(s\) \[2, 3\]"):
            runner.map_chunks(probes.probe, {"hang_chunk": 2, "release": str(release)})
    finally:
        release.touch()
        runner.close()


# ---- a whole fit: an actor killed mid-iteration, a hung actor, an owned Ray -------------------------
def test_fit_survives_an_actor_killed_mid_iteration(ray_session, tmp_path):
    est = probes.SabotageEstimator(em_case.estimator(), str(tmp_path), action="kill")
    got = em_case.run("ray", 2, est=est, on_step=est.arm_at(3), timeout=300)
    assert (tmp_path / "fired").exists()  # an actor process really died during pass 4
    assert got == em_case.reference()


def test_fit_with_a_hung_lone_actor_raises_timeout(ray_session, tmp_path):
    # one actor: no other answers, so no straggler deadline applies
    est = probes.SabotageEstimator(em_case.estimator(), str(tmp_path), action="hang")
    try:
        with pytest.raises(WorkerTimeoutError, match="did not return chunk"):
            em_case.run("ray", 1, est=est, on_step=est.arm_at(1), timeout=5.0)
    finally:
        (tmp_path / "release").touch()


def test_fit_with_a_hung_actor_among_healthy_ones_ends_on_the_same_bits(ray_session, tmp_path):
    # two actors: the hung one is outrun at the straggler deadline (a quarter of the timeout at most)
    est = probes.SabotageEstimator(em_case.estimator(), str(tmp_path), action="hang")
    try:
        got = em_case.run("ray", 2, est=est, on_step=est.arm_at(1), timeout=20.0)
    finally:
        (tmp_path / "release").touch()
    assert (tmp_path / "fired").exists()  # an actor really hung during pass 2
    assert got == em_case.reference()


def test_owned_ray_starts_and_shuts_down():
    """With no Ray running, the backend starts one, fits the same bits and shuts it down (own process)."""
    import json
    import subprocess
    import sys

    code = (
        "import json, ray\n"
        "from tests.estimation.backends import em_case\n"
        "sig = em_case.run('ray', 2, init_kwargs={'num_cpus': 2, 'include_dashboard': False})\n"
        "print(json.dumps({'sig': sig, 'up': ray.is_initialized()}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["up"] is False
    assert (out["sig"][0], tuple(out["sig"][1])) == em_case.reference()
