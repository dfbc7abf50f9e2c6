"""The exact call the main job (`mixle-parallel demo`) makes, under a certificate from `certify`."""

from __future__ import annotations

import numpy as np

from mixle_parallel.executors.estimation import GaussianEstimator, MixtureDistribution, MixtureEstimator, optimize
from mixle_parallel.verification import Ledger, load_certificate, read_ledger, read_unverified, verify_ledger


def test_demo_call_runs_certified_audited_and_ledgered(rows, mp_certificate, tmp_path):
    certificate = load_certificate(mp_certificate)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    steps = []
    model = optimize(rows, MixtureEstimator([GaussianEstimator() for _ in range(3)]), backend="mp", num_workers=2,
                     admission=certificate, audit_rate=0.05, ledger=ledger, on_step=steps.append,
                     max_its=4, delta=None, seed=1, chunk_size=120)
    assert isinstance(model, MixtureDistribution) and np.isfinite(model.log_density(rows)).all()
    assert [s.iteration for s in steps] == [0, 1, 2, 3]
    assert sum(len(s.audit_records) for s in steps) >= 1  # at least one audited chunk per fit
    report = verify_ledger(ledger.path)
    assert report.ok and report.receipts == 4, report.summary()
    assert {e.certificate for e in read_ledger(ledger.path).entries} == {read_unverified(certificate).certificate_id}
