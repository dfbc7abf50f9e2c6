"""SDC audit on a real 2-rank gloo mesh: a flipped gradient bit on rank 1 is found by the same-rank
replay and by the peer replay, attributed to rank 1 on every rank, and kept out of the optimizer by
every rank together (skip_step) or raised on every rank (raise)."""

from __future__ import annotations

from mixle_parallel.contracts import SDCAuditRecord, from_dict
from mixle_parallel.verification.harness.mesh import run_on_gloo_mesh
from mixle_parallel.verification.sdc.inject import BitFlip
from tests.verification import sdc_gloo_job


def test_flip_detected_attributed_and_skipped_on_every_rank():
    flip = BitFlip("gradient", "w", rank=1, step=2, index=3, bit=20)
    ranks = run_on_gloo_mesh(sdc_gloo_job.train, 2, "skip_step", flip, 4)
    clean = run_on_gloo_mesh(sdc_gloo_job.train, 2, "skip_step", None, 4)
    for result in ranks:
        assert result["skipped"] == [2] and result["raised"] == []
        records = [from_dict(r, SDCAuditRecord) for r in result["records"]]
        bad = [r for r in records if not r.matched]
        assert {(r.replay, r.step, r.rank, r.attributed_rank, r.injected) for r in bad} == {
            ("same_rank", 2, 1, 1, True), ("peer", 2, 1, 1, True)}
        assert [r.auditor_rank for r in bad if r.replay == "peer"] == [0]
        assert sum(r.matched for r in records) == len(records) - 2
    assert ranks[0]["params"] == ranks[1]["params"]  # both ranks kept the same model
    assert clean[0]["skipped"] == [] and clean[0]["params"] != ranks[0]["params"]
    assert all(from_dict(r, SDCAuditRecord).matched for r in clean[0]["records"])


def test_raise_policy_raises_on_every_rank():
    flip = BitFlip("gradient", "w", rank=0, step=1, index=0, bit=31)
    ranks = run_on_gloo_mesh(sdc_gloo_job.train, 2, "raise", flip, 3)
    assert [r["raised"] for r in ranks] == [[(1, [0])], [(1, [0])]]
