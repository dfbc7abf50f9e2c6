"""Handles emit RankRecords themselves: a slowed real mp worker is named in the report, receipts, ledger."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mixle_parallel import GaussianEstimator, MixtureEstimator, encoded_data, optimize
from tests.estimation.observability.slow_models import SlowEstimator, claimant_pid


def test_slowed_mp_worker_is_named_in_report_receipts_and_ledger(gmm_1d, tmp_path):
    marker = tmp_path / "slow"
    marker.write_text("")
    est = SlowEstimator(MixtureEstimator([GaussianEstimator()] * 2), str(marker), seconds=0.15)
    ledger = tmp_path / "fit.jsonl"
    handle = encoded_data(gmm_1d, estimator=est, backend="mp", num_workers=3, num_chunks=6,
                          admission="unverified", audit=False, ledger=str(ledger))
    try:
        model = optimize(handle, est, max_its=3, seed=0)
        assert model is not None
        slow = dict(zip(handle.runner.worker_pids(), handle.runner.live_workers))[claimant_pid(str(marker))]
        report = handle.fit_report()
        assert report.n_ranks == 3 and report.slow_ranks == (slow,), report.render()
        for rnd in report.rounds:
            by_rank = {r.rank: r for r in handle.rank_records if r.round == rnd}
            assert by_rank[slow].e_step_seconds >= 0.3  # two chunks, 0.15 s each
            fast = [r for k, r in by_rank.items() if k != slow]
            assert all(r.wait_seconds > 0.2 for r in fast)  # they waited for the straggler
            assert sum(r.n_obs for r in by_rank.values()) == len(gmm_1d)
            assert all(r.chunks == 2 and r.bytes_moved > 0 for r in by_rank.values())
    finally:
        handle.close()
    entries = [json.loads(line) for line in ledger.read_text().splitlines()]
    receipts = [e for e in entries if e["kind"] == "receipt"]
    assert receipts, "no receipts in the ledger"
    found = [_find(e, "observability") for e in receipts]
    assert all(o is not None and o["stragglers"] == [slow] for o in found), found
    (end,) = [e for e in entries if e["kind"] == "run_end"]
    assert _find(end, "fit_report")["slow_ranks"] == [slow]


def test_even_workers_are_not_flagged_and_rows_add_up(gmm_1d):
    est = MixtureEstimator([GaussianEstimator()] * 2)
    with encoded_data(gmm_1d, estimator=est, backend="local", num_workers=2, num_chunks=4, audit=False) as h:
        model = h.pysp_seq_initialize(est, 0, 0.5)
        for _ in range(2):
            model = h.pysp_seq_estimate(est, model)
        assert {r.round for r in h.rank_records} == {0, 1}
        for rnd in (0, 1):
            recs = [r for r in h.rank_records if r.round == rnd]
            assert sum(r.n_obs for r in recs) == len(gmm_1d)
            assert sum(r.chunks for r in recs) == 4
            assert all(r.bytes_moved == 0 for r in recs)  # threads share the driver's memory
        assert h.fit_report().slow_ranks == ()


def test_metering_leaves_the_bits_alone(gmm_1d):
    est = MixtureEstimator([GaussianEstimator()] * 2)
    with encoded_data(gmm_1d, estimator=est, backend="local", num_chunks=6, audit=False) as h:
        start = h.pysp_seq_initialize(est, 3, 0.5)
        metered = h.estep(est, start).stats
    from mixle_parallel.executors.estimation.em_pass.chunks import chunk_bounds, chunk_estep, encode_chunks, fold_pass

    chunks = encode_chunks(gmm_1d, est.encoder(), chunk_bounds(len(gmm_1d), 6))
    plain = fold_pass(est, [chunk_estep(c, (est, start)) for c in chunks]).stats
    assert _same(metered, plain)


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b))
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _find(obj, key):
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        for v in obj.values():
            hit = _find(v, key)
            if hit is not None:
                return hit
    if isinstance(obj, list):
        for v in obj:
            hit = _find(v, key)
            if hit is not None:
                return hit
    return None


@pytest.fixture(scope="module")
def gmm_1d() -> np.ndarray:
    rng = np.random.default_rng(7)
    return np.concatenate([rng.normal(-4, 1.0, 2000), rng.normal(0, 0.5, 2000), rng.normal(5, 1.5, 2000)])
