"""Stragglers do not fail a fit (issue 25 item 7): an mp worker that stops answering (SIGSTOP) while another
answers has its chunks recomputed by the others after the straggler deadline, well below the fit's timeout,
and the fit ends on the same bits as an undisturbed one."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from mixle_parallel.contracts.estimation import canonical_statistic_bytes
from mixle_parallel.executors.estimation import GaussianEstimator, MixtureEstimator, encoded_data, fit
from mixle_parallel.executors.estimation.backends.deadline import STRAGGLER_MIN_S, straggler_deadline


def _data() -> np.ndarray:
    rng = np.random.default_rng(4)
    return np.concatenate([rng.normal(-3, 1, 1500), rng.normal(0, 0.5, 1500), rng.normal(4, 1, 1500)])


def test_the_straggler_deadline_is_well_below_the_timeout():
    assert straggler_deadline(0.01, 300.0) == STRAGGLER_MIN_S
    assert straggler_deadline(2.0, 300.0) == 20.0
    assert straggler_deadline(30.0, 300.0) == 75.0  # at most a quarter of the fit's timeout
    assert straggler_deadline(1000.0, None) == 10_000.0


@pytest.mark.timeout(240)
def test_a_sigstopped_worker_is_outrun_and_the_fit_ends_on_the_same_bits():
    x = _data()
    est = MixtureEstimator([GaussianEstimator()] * 3)
    reference = fit(x, est, max_its=4, delta=None, seed=21, chunk_size=500)
    stopped: list[int] = []
    # admission="unverified": a test mesh whose point is the recovery, compared bitwise below
    with encoded_data(x, estimator=est, backend="mp", num_workers=3, chunk_size=500, timeout=120.0,
                      admission="unverified") as h:

        def stop_one(step):
            if step.iteration == 1:
                stopped.append(h.runner.worker_pids()[1])
                os.kill(stopped[0], signal.SIGSTOP)  # alive, silent: not a death the pipe would report

        began = time.monotonic()
        try:
            got = fit(h, est, max_its=4, delta=None, seed=21, on_step=stop_one)
        finally:
            if stopped:
                try:
                    os.kill(stopped[0], signal.SIGCONT)
                except ProcessLookupError:
                    pass
        took = time.monotonic() - began
        assert h.runner.stragglers == [1], "the stopped worker was not given up on"
        assert h.runner.recovered_chunks, "no chunk was recomputed"
        assert stopped[0] not in h.runner.worker_pids() and len(h.runner.worker_pids()) == 2
    assert took < 120.0  # ended by the straggler deadline, not by the fit's timeout (which would have raised)
    assert canonical_statistic_bytes(got.model.params()) == canonical_statistic_bytes(reference.model.params())
    assert got.history == reference.history



def test_a_fresh_workers_slow_first_task_is_waited_for():
    from mixle_parallel.executors.estimation.backends.mp import MPChunkRunner
    from mixle_parallel.executors.estimation.em_pass.chunks import EncodedChunk
    from tests.estimation.perf_free.slow_first import slow_first_call

    runner = MPChunkRunner(2, timeout=60.0)
    try:
        runner.scatter([EncodedChunk(i, i, i + 1, np.zeros(4)) for i in range(2)])
        assert runner.map_chunks(slow_first_call, STRAGGLER_MIN_S + 2.0) == [0, 1]
        assert runner.stragglers == [] and len(runner.worker_pids()) == 2
    finally:
        runner.close()


def test_the_straggler_clock_arms_on_the_first_answer_and_honours_a_fixed_deadline():
    from mixle_parallel.executors.estimation.backends.deadline import Deadline, StragglerClock

    clock = StragglerClock(600.0)
    assert not clock.due() and clock.wait_s(None) is None  # nobody answered: wait for the pass's own deadline
    clock.disarm()
    clock.answered()
    assert not clock.due()  # disarmed: a fresh worker's first task waits for the timeout
    clock.restart()
    clock.answered()
    assert 0.0 < clock.wait_s(Deadline(600.0).remaining()) <= STRAGGLER_MIN_S
    fixed = StragglerClock(600.0, fixed=0.01)
    fixed.answered()
    time.sleep(0.05)
    assert fixed.due() and fixed.wait_s(None) == 0.0
    assert straggler_deadline(0.01, 300.0, fixed=2.5) == 2.5


def test_a_clock_given_an_expected_answer_time_is_armed_from_its_start():
    """A job whose tasks are not compared (the audit's read on spark) is armed by the runner's last pass time."""
    from mixle_parallel.executors.estimation.backends.deadline import StragglerClock

    clock = StragglerClock(600.0)
    clock.expect(0.2)  # 10 x 0.2 s is below the floor: due STRAGGLER_MIN_S after the start
    assert not clock.due() and 0.0 < clock.wait_s(None) <= STRAGGLER_MIN_S
    slow = StragglerClock(600.0)
    slow.expect(2.0)
    slow.answered()  # an answer at once would set the floor; it does not move a deadline already set
    assert STRAGGLER_MIN_S < slow.wait_s(None) <= 20.0  # 10 x the expected answer
    fixed = StragglerClock(600.0, fixed=0.01)
    fixed.expect(30.0)
    time.sleep(0.05)
    assert fixed.due()  # straggler_timeout= replaces the rule here too
    off = StragglerClock(600.0)
    off.disarm()
    off.expect(0.2)
    assert not off.due() and off.wait_s(None) is None


def test_straggler_timeout_is_checked_and_refused_where_it_is_not_honoured():
    from mixle_parallel.executors.estimation.backends.deadline import check_straggler_timeout
    from mixle_parallel.executors.estimation.backends.mp import MPChunkRunner

    assert check_straggler_timeout(None, 10.0) is None and check_straggler_timeout(2, None) == 2.0
    for bad in (0, -1.0, float("nan"), True, "5"):
        with pytest.raises(ValueError, match="straggler_timeout must be a positive number"):
            check_straggler_timeout(bad, 10.0)
    with pytest.raises(ValueError, match="straggler_timeout=10.0 must be below timeout=10.0"):
        check_straggler_timeout(10.0, 10.0)
    with pytest.raises(ValueError, match="straggler_timeout=30 must be below timeout=20"):
        encoded_data(_data(), estimator=GaussianEstimator(), backend="mp", num_workers=1, timeout=20,
                     straggler_timeout=30, admission="unverified")
    with pytest.raises(ValueError, match="option straggler_timeout= is not honoured by backend 'local'; backends "
                                         "honouring it: dask, mp, ray, spark"):
        encoded_data(_data(), estimator=GaussianEstimator(), straggler_timeout=5.0)
    runner = MPChunkRunner(1, timeout=60.0, straggler_timeout=1.5)
    try:
        assert runner.straggler_timeout == 1.5
    finally:
        runner.close()


def test_the_last_live_workers_are_never_given_up_as_stragglers():
    from mixle_parallel.executors.estimation.backends.deadline import stragglers_to_give_up

    assert stragglers_to_give_up(["b"], ["a", "b"]) == ["b"]  # "a" recomputes b's chunks
    assert stragglers_to_give_up(["b", "c"], ["a", "b", "c"]) == ["b", "c"]
    assert stragglers_to_give_up(["b"], ["b"]) == []  # no one would be left: wait for the timeout
    assert stragglers_to_give_up(["a", "b"], ["a", "b"]) == []
    assert stragglers_to_give_up([], ["a"]) == []
