"""The E-step SDC audit on real mp worker processes: clean audits, attributed flips, rate of detection."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binomtest

from mixle_parallel.executors.estimation import encoded_data, fit
from mixle_parallel.verification import BitFlip, FaultInjector, Ledger, read_ledger, verify_ledger
from tests.estimation.audit.audit_cases import clean_fit, flip_trial, same_bits, start_model
from tests.estimation.audit.conftest import ROWS_PER_CHUNK, estimator

CONFIDENCE_P = 1e-3  # reject "detection rate == audit rate" only below p = 0.001 (99.9% confidence)
ITS = 3


@pytest.fixture(scope="module")
def start(rows):
    return start_model(rows)


def test_300_clean_audited_chunks_no_false_positive_same_bits_and_ledger(rows, start, tmp_path):
    ledger = Ledger(tmp_path / "clean.jsonl")
    # admission="unverified": a test mesh; the audit is what is checked here
    result = fit(rows, estimator(), max_its=5, delta=None, prev_estimate=start, chunk_size=ROWS_PER_CHUNK,
                 backend="mp", num_workers=3, admission="unverified", audit_rate=1.0, ledger=ledger)
    references = [r for r in result.audit_records if r.replay == "reference"]  # recomputed outside the backend
    # the reference is the one recomputation of an audited chunk: the backend computes no chunk twice; each
    # folded group holding one is opened too (its chunks' kept results re-folded in the driver)
    chunks = [r for r in references if r.unit.startswith("chunk:")]
    groups = [r for r in references if r.unit.startswith("group:")]
    assert len(references) == len(result.audit_records) == len(chunks) + len(groups)
    assert len(chunks) == 5 * 64 >= 300 and len(groups) == 5 * 10  # 3 workers hold 10 of the 11 groups whole
    assert all(r.matched and r.cause == "" for r in references)
    assert same_bits(result, clean_fit(rows, start, 5))
    report = verify_ledger(ledger.path)
    assert report.ok and (report.receipts, report.audits) == (5, 370), report.summary()
    kinds = [e.kind for e in read_ledger(ledger.path).entries]
    assert kinds[0] == "run_start" and kinds[-1] == "run_end"


def test_every_flip_in_an_audited_chunk_is_attributed_quarantined_and_recomputed(rows, start):
    clean = clean_fit(rows, start, ITS)
    injector = FaultInjector()
    rng = np.random.default_rng(8)
    with encoded_data(rows, estimator=estimator(), chunk_size=ROWS_PER_CHUNK, backend="mp", num_workers=3,
                      admission="unverified", audit_rate=1.0, fault_injector=injector) as handle:  # test mesh
        struck = [flip_trial(handle, injector, rng, start, clean, its=ITS) for _ in range(9)]
    assert len(injector.applied) == 9 and len({w for _, _, w in struck}) > 1


def test_detection_over_random_chunks_matches_the_audit_rate(rows, start):
    """400 flips at random (iteration, chunk) units, mantissa bits only so an undetected one cannot
    make the (fixed-model) M-step fail; policy 'warn' keeps every worker, so each flip is one trial."""
    rate, trials, iterations = 0.2, 400, 10
    injector = FaultInjector()
    rng = np.random.default_rng(3)
    with encoded_data(rows, estimator=estimator(), chunk_size=ROWS_PER_CHUNK, backend="mp", num_workers=3,
                      admission="unverified", audit_rate=rate, audit_policy="warn", audit_seed=5,
                      fault_injector=injector) as handle:  # admission: a test mesh
        handle.estep(estimator(), start)  # the fit's forced first audit is not part of the sample
        base, n = handle.iteration, handle.num_chunks
        owners = handle.runner.chunk_owners()
        units = [(base + int(k) // n, int(k) % n) for k in rng.choice(iterations * n, size=trials, replace=False)]
        for step, chunk in units:
            injector.add(BitFlip("statistic", f"chunk:{chunk}", rank=owners[chunk], step=step,
                                 index=int(rng.integers(12)), bit=int(rng.integers(52))))
        for _ in range(iterations):
            handle.estep(estimator(), start)
        audited = {(s, c) for s, c in units if c in handle.audit.draws[s].chunks}  # drawn after each pass
        bad = [r for r in handle.audit_records if not r.matched and r.replay == "reference"]
    assert len(injector.applied) == trials
    assert {(r.step, int(r.unit.split(":")[1])) for r in bad} == audited
    assert all(r.attributed_rank == owners[int(r.unit.split(":")[1])] and r.action == "warn" for r in bad)
    result = binomtest(len(audited), trials, rate)
    print(f"detected {len(audited)} of {trials} flips at audit rate {rate}: two-sided p = {result.pvalue:.3f}")
    assert result.pvalue > CONFIDENCE_P, (len(audited), trials, result)
