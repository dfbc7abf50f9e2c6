"""The pure analysis of RankRecords: the straggler rule, data skew, rebalance weights, the fit report."""

from __future__ import annotations

import json
import math

import pytest

from mixle_parallel.em_observability import (
    RankRecord,
    detect_stragglers,
    fit_report,
    imbalance_receipt,
    json_ready_report,
    plan_rebalance_weights,
    record_rank_round,
    records_from_events,
)


def _round(times: list[float], rnd: int = 0, rows: list[int] | None = None) -> list[RankRecord]:
    rows = rows or [100] * len(times)
    return [RankRecord(rank=i, round=rnd, e_step_seconds=t, n_obs=n, bytes_processed=8 * n)
            for i, (t, n) in enumerate(zip(times, rows))]


def test_two_workers_name_the_slow_one():
    # Pooled median/MAD (mixle 0.8.2) cannot flag either of two workers; against the other worker it can.
    report = detect_stragglers(_round([1.0, 2.0]))
    assert report.slow_ranks == (1,)
    assert report.ratios[1] == pytest.approx(2.0)


def test_one_straggler_among_jittery_workers():
    report = detect_stragglers(_round([1.00, 1.05, 0.95, 1.02, 3.0]))
    assert report.slow_ranks == (4,)
    assert report.z_scores[4] > 3.0
    assert report.median_seconds == pytest.approx(1.02)


def test_spread_without_an_outlier_flags_nobody():
    assert detect_stragglers(_round([1.0, 1.4, 0.7, 1.2, 1.6, 0.9])).slow_ranks == ()


def test_noise_floor_and_ratio_threshold():
    tiny = _round([0.001, 0.001, 0.004])
    assert detect_stragglers(tiny).slow_ranks == (2,)
    assert detect_stragglers(tiny, min_excess_seconds=0.05).slow_ranks == ()
    assert detect_stragglers(_round([1.0, 1.0, 1.4])).slow_ranks == ()
    with pytest.raises(ValueError, match="threshold_ratio must be >= 1.0"):
        detect_stragglers(tiny, threshold_ratio=0.5)


def test_round_selection_and_duplicates():
    records = _round([1.0, 3.0], 0) + _round([1.0, 1.0], 1)
    assert detect_stragglers(records).round == 1 and detect_stragglers(records).slow_ranks == ()
    assert detect_stragglers(records, round=0).slow_ranks == (1,)
    with pytest.raises(ValueError, match="two records for round 0, rank 1"):
        detect_stragglers(records + [RankRecord(rank=1, round=0, e_step_seconds=1.0)])


def test_imbalance_matches_the_planted_skew():
    # one worker holds 10x the rows of each of its three peers: bytes / mean = 10 / (13 / 4)
    im = imbalance_receipt(_round([1.0] * 4, rows=[1000, 100, 100, 100]))
    assert im.skew_by_rank[0] == pytest.approx(10 / (13 / 4))
    assert im.max_bytes_ratio == pytest.approx(im.skew_by_rank[0])
    assert im.n_obs_per_rank == {0: 1000, 1: 100, 2: 100, 3: 100}


def test_rebalance_weights_follow_throughput():
    w = plan_rebalance_weights(_round([1.0, 2.0], rows=[100, 100]))
    assert w[0] == pytest.approx(4 / 3) and w[1] == pytest.approx(2 / 3)
    assert math.fsum(w.values()) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="zero compute seconds"):
        plan_rebalance_weights(_round([0.0, 1.0]))


def test_fit_report_rolls_up_rounds():
    records = _round([1.0, 1.0, 3.0], 0) + _round([1.0, 1.1, 1.0], 1)
    rep = fit_report(records)
    assert rep.n_rounds == 2 and rep.n_ranks == 3 and rep.slow_ranks == (2,)
    assert rep.any_stragglers and rep.worst_straggler_ratio == pytest.approx(3.0)
    assert "STRAGGLERS=(2,)" in rep.render()  # mixle 0.8.2 renders the ranks as a tuple
    assert rep.as_dict()["by_round"][0]["stragglers"]["slow_ranks"] == [2] and rep.as_dict()["any_stragglers"]
    json.dumps(rep.as_dict(), allow_nan=False)  # int round keys are written as strings
    assert list(json_ready_report(rep)["by_round"]) == [str(r) for r in rep.rounds]  # what the ledger takes
    empty = fit_report([])
    assert empty.n_rounds == 0 and not empty.any_stragglers


def test_validation_names_the_field():
    with pytest.raises(ValueError, match="e_step_seconds must be a finite"):
        RankRecord(rank=0, round=0, e_step_seconds=float("nan"))
    with pytest.raises(ValueError, match="rank must be an int >= 0"):
        RankRecord(rank=-1, round=0, e_step_seconds=1.0)
    with pytest.raises(ValueError, match="measured field"):
        RankRecord(rank=0, round=0, e_step_seconds=1.0, extra={"n_obs": 3})


def test_events_round_trip_through_a_list_and_mixle_telemetry():
    events: list = []
    record_rank_round(events, rank=1, round=2, e_step_seconds=0.5, n_obs=7, run_id="r", extra={"host": "a"})
    (rec,) = records_from_events(events)
    assert (rec.rank, rec.round, rec.e_step_seconds, rec.n_obs, rec.extra) == (1, 2, 0.5, 7, {"host": "a"})
    telemetry = pytest.importorskip("mixle.telemetry.core").Telemetry()
    record_rank_round(telemetry, rank=0, round=0, e_step_seconds=0.25, bytes_processed=64)
    (back,) = records_from_events(telemetry.events())
    assert back.bytes_processed == 64 and back.e_step_seconds == 0.25
    with pytest.raises(TypeError, match="telemetry must be a list"):
        record_rank_round(object(), rank=0, round=0, e_step_seconds=1.0)
