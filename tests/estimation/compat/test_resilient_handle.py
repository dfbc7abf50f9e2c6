"""mixle 0.8.2's resilient mp handle on real workers: the per-round sets and the one-shot arm_kill hook."""

from __future__ import annotations

import numpy as np
import pytest

from mixle_parallel import GaussianEstimator, MixtureEstimator
from mixle_parallel.resilient_em import ResilientMPEncodedData

EST = MixtureEstimator([GaussianEstimator()] * 2)


def _data() -> np.ndarray:
    rng = np.random.default_rng(5)
    return np.concatenate([rng.normal(-2, 1.0, 400), rng.normal(3, 1.0, 400)])


def _fit(handle, hook=None, rounds: int = 3):
    model = handle.pysp_seq_initialize(EST, np.random.RandomState(1), 0.5)
    history = []
    for r in range(rounds):
        if r == 0 and hook is not None:
            handle.arm_kill(hook)
        model = handle.pysp_seq_estimate(EST, model)
        history.append((set(handle.last_round_reused_shards), set(handle.last_round_recomputed_shards),
                        set(handle.last_round_failed_workers), set(handle.last_round_blacklisted_workers)))
    return repr(model), history


class _KillFirst:
    """Kills worker 0 at the rendezvous; records every (worker, alive, pid) it is shown."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, bool, int]] = []

    def __call__(self, worker_id: int, process) -> None:
        self.seen.append((worker_id, process.is_alive(), process.pid))
        if worker_id == 0:
            process.kill()
            process.join()


@pytest.mark.parametrize("max_retries", [2, 1])
def test_a_worker_killed_in_its_first_estep_gives_the_bits_of_a_clean_fit(max_retries):
    with ResilientMPEncodedData(_data(), EST, num_workers=2, num_chunks=4, max_retries=max_retries) as clean:
        reference, clean_history = _fit(clean)
    assert clean_history[0] == ({0, 1, 2, 3}, set(), set(), set())
    hook = _KillFirst()
    with ResilientMPEncodedData(_data(), EST, num_workers=2, num_chunks=4, max_retries=max_retries) as h:
        pids = h.runner.worker_pids()
        model, history = _fit(h, hook)
        assert [(w, alive) for w, alive, _ in hook.seen] == [(0, True), (1, True)]  # every worker, before work
        assert [pid for _, _, pid in hook.seen] == pids
        blacklisted = {0} if max_retries == 1 else set()
        # worker 0's chunks (0, 1) were recomputed; worker 1's came back as sent
        assert history[0] == ({2, 3}, {0, 1}, {0}, blacklisted)
        assert history[1] == history[2] == ({0, 1, 2, 3}, set(), set(), set())  # one-shot: later rounds clean
        assert len(hook.seen) == 2
        assert h.runner.live_workers == ([1] if max_retries == 1 else [0, 1])
    assert model == reference


def test_arm_kill_refuses_a_non_callable_and_none_disarms():
    with ResilientMPEncodedData(_data(), EST, num_workers=2, num_chunks=4) as h:
        with pytest.raises(TypeError, match="arm_kill takes a callable"):
            h.arm_kill(3)
        hook = _KillFirst()
        h.arm_kill(hook)
        h.arm_kill(None)
        _fit(h, rounds=1)
        assert hook.seen == [] and h.last_round_failed_workers == set()


def test_the_first_task_after_a_worker_start_waits_up_to_start_timeout(monkeypatch):
    """A fresh worker's first task imports the user's modules (mixle: seconds): it gets ``start_timeout``."""
    from mixle_parallel.executors.estimation.backends.resilient_mp import ResilientMPChunkRunner

    runner = ResilientMPChunkRunner(2, timeout=0.5, start_timeout=90.0)
    seen = []
    monkeypatch.setattr(runner, "_map_round", lambda fn, payload, ids: seen.append(runner.timeout) or [])
    runner._shm = object()  # stands for a scattered block: no worker is needed to see the timeout chosen
    try:
        runner.map_chunks(None, None)
        runner.map_chunks(None, None)
        runner._cold = True  # what _restart sets
        runner.map_chunks(None, None)
    finally:
        runner._shm = None
    assert seen == [90.0, 0.5, 90.0] and runner.timeout == 0.5
