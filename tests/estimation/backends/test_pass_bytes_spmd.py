"""EM pass bytes on the SPMD backends (mpi under mpiexec, torchrun in a real gloo world of 2): each rank's
count equals, byte for byte, the pickles of the payload and results it computes itself; on two ranks every
byte crosses the one boundary, so both ranks report the same total; receipts carry it per iteration."""

from __future__ import annotations

from typing import Any

import pytest

from tests.estimation.backends.engine_helpers import run_mpi

pytestmark = pytest.mark.slow


def _check_em(ranks: list[dict[str, Any]]) -> None:
    for r in ranks:
        receipts = r["em"]["receipts"]
        assert all(observed for _, observed in receipts)
        assert all(b > r["em"]["model_pickle"] for b, _ in receipts), r["em"]  # the model reached the peer
        # the same each iteration; the runner's count also holds any pass outside the two E-steps
        assert len({b for b, _ in receipts}) == 1 and sum(b for b, _ in receipts) <= r["em"]["runner_total"]
    assert len({tuple(b for b, _ in r["em"]["receipts"]) for r in ranks}) == 1  # equal on both ranks


def test_torchrun_counts_the_broadcasts_and_the_tree_exactly():
    from mixle_parallel.verification.harness.mesh import run_world
    from tests.estimation.backends import wire_spmd

    root, other = run_world(wire_spmd.torchrun_body, 2, timeout=300, torchrun_env=True, backend="gloo")
    for r in (root, other):
        assert r["probe"]["ok"]
    p = root["probe"]
    # root: the payload to its peer and the ordered results back down; it hears rank 1's subtree
    assert (p["sent"], p["received"]) == (p["payload"] + p["ordered"], p["own_dicts"][1])
    q = other["probe"]
    assert (q["sent"], q["received"]) == (q["own_dicts"][1], q["payload"] + q["ordered"])
    _check_em([root, other])


@pytest.mark.mpi
def test_mpi_counts_the_broadcast_and_the_all_gather_exactly():
    ranks = run_mpi("wire_bytes_check.py", 2)
    for r in ranks:
        p = r["probe"]
        assert p["ok"]
        mine, peer = p["own_lists"][r["rank"]], p["own_lists"][1 - r["rank"]]
        if r["rank"] == 0:
            assert (p["sent"], p["received"]) == (p["payload"] + mine, peer)
        else:
            assert (p["sent"], p["received"]) == (mine, p["payload"] + peer)
    assert ranks[0]["probe"]["sent"] + ranks[0]["probe"]["received"] == \
        ranks[1]["probe"]["sent"] + ranks[1]["probe"]["received"]
    _check_em(ranks)
