"""Detection is proved statistically: no false positives on >= 300 clean units, every audited flip
caught and attributed to the right rank, and detection over random steps matching the audit rate.

Ranks are simulated in one process here (the primitives are per rank); the real multi-process
behaviour (agreement, peer replay, skip on every rank) is in test_sdc_gloo.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binomtest

from mixle_parallel.verification.sdc.em import EMAuditor, audited_fold
from mixle_parallel.verification.sdc.inject import BitFlip, FaultInjector
from mixle_parallel.verification.sdc.training import AuditSchedule, SDCDetectedError, TrainingAuditor
from tests.verification import sdc_models as m

WORLD = 4
CONFIDENCE_P = 1e-3  # reject "detection rate == audit rate" only below p = 0.001 (99.9% confidence)


def run_training(steps: int, *, schedule: AuditSchedule, injector: FaultInjector | None = None,
                 start: int = 0, params: dict | None = None) -> tuple[TrainingAuditor, dict[str, np.ndarray]]:
    """Data-parallel SGD over WORLD simulated ranks; each rank audits its local gradient when scheduled."""
    auditor = TrainingAuditor(schedule, policy="skip_step")
    params = dict(params or m.initial_params())
    for step in range(start, start + steps):
        local = [m.local_gradients(params, rank, step) for rank in range(WORLD)]
        if injector is not None:
            for rank, grads in enumerate(local):
                injector.apply_all("gradient", grads, rank=rank, step=step)
        skip = False
        if auditor.should_audit(step):
            for rank, grads in enumerate(local):
                verdict = auditor.audit(step=step, rank=rank, observed=grads,
                                        recompute=lambda r=rank, s=step: m.local_gradients(params, r, s),
                                        inputs=(m.batch(rank, step), params))
                skip |= verdict.skip
        if not skip:
            with np.errstate(all="ignore"):  # an unaudited exponent flip may overflow: that is the point
                for name in params:
                    params[name] = params[name] - 0.01 * sum(g[name] for g in local) / WORLD
    return auditor, params


def test_clean_training_audits_have_no_false_positives():
    auditor, _ = run_training(80, schedule=AuditSchedule(rate=1.0))
    assert len(auditor.records) == 320
    assert all(r.matched and r.action == "none" for r in auditor.records)


def test_every_flip_in_an_audited_step_is_detected_and_attributed():
    rng = np.random.default_rng(11)
    schedule = AuditSchedule(rate=0.3, seed=5, first_step=None)
    audited = schedule.audited_steps(0, 400)
    flips = [BitFlip("gradient", str(rng.choice(["w", "b"])), rank=int(rng.integers(WORLD)), step=int(step),
                     index=int(rng.integers(m.N_FEATURES)), bit=int(rng.integers(32)))
             for step in rng.choice(audited, size=100, replace=False)]
    injector = FaultInjector(flips)
    auditor, _ = run_training(400, schedule=schedule, injector=injector)
    assert len(injector.applied) == 100
    bad = {(r.step, r.attributed_rank) for r in auditor.records if not r.matched}
    assert bad == {(f.step, f.rank) for f in flips}
    assert all(r.action == "skip_step" for r in auditor.records if not r.matched)
    clean = [r for r in auditor.records if r.matched]
    assert len(clean) >= 300


def test_detection_over_random_steps_matches_the_audit_rate():
    rate, trials = 0.2, 400
    rng = np.random.default_rng(2)
    schedule = AuditSchedule(rate=rate, seed=9, first_step=None)
    steps = sorted(int(s) for s in rng.choice(np.arange(1, 2000), size=trials, replace=False))
    flips = [BitFlip("gradient", "w", rank=int(rng.integers(WORLD)), step=s, index=0, bit=int(rng.integers(32)))
             for s in steps]
    detected = 0
    for flip in flips:  # one flip per short run, so each trial is independent
        auditor, _ = run_training(1, schedule=schedule, injector=FaultInjector([flip]), start=flip.step)
        found = [r for r in auditor.records if not r.matched]
        assert bool(found) == schedule.is_audited(flip.step)
        detected += bool(found)
    result = binomtest(detected, trials, rate)
    assert result.pvalue > CONFIDENCE_P, (detected, trials, result)


def test_skipped_step_keeps_the_corruption_out():
    schedule = AuditSchedule(rate=1.0)
    _, struck = run_training(6, schedule=schedule, injector=FaultInjector([BitFlip("gradient", "w", 1, 3, 0, 30)]))
    _, first = run_training(3, schedule=schedule)
    _, without_step_3 = run_training(2, schedule=schedule, start=4, params=first)
    assert all(np.array_equal(struck[k], without_step_3[k]) for k in struck)


# ---- EM ---------------------------------------------------------------------------------
CHUNKS, WORKERS = 8, (0, 1, 2)


def fit(iterations: int, *, auditor: EMAuditor | None, injector: FaultInjector | None = None,
        compute=None) -> tuple[dict[str, np.ndarray], list]:
    data = m.gmm_data()
    model = dict(m.GMM_INIT)
    outcomes = []
    for it in range(iterations):
        work = compute or (lambda worker, chunk, model=model: m.gmm_chunk_stats(data, CHUNKS, chunk, model))
        stats, found = audited_fold(CHUNKS, workers=WORKERS, compute=work, combine=m.gmm_combine, iteration=it,
                                    auditor=auditor, injector=injector)
        outcomes += found
        model = m.gmm_m_step(stats)
    return model, outcomes


def test_clean_em_audits_have_no_false_positives_and_same_bits():
    auditor = EMAuditor(rate=1.0)
    audited, outcomes = fit(40, auditor=auditor)
    plain, _ = fit(40, auditor=None)
    assert len(auditor.records) == 320 and all(r.matched for r in auditor.records)
    assert all(np.array_equal(audited[k], plain[k]) for k in plain)


def test_em_flip_is_witnessed_quarantined_and_the_fit_ends_on_clean_bits():
    clean, _ = fit(6, auditor=None)
    auditor = EMAuditor(rate=1.0)
    injector = FaultInjector([BitFlip("statistic", "chunk:4/sx", rank=1, step=2, index=1, bit=12)])
    model, outcomes = fit(6, auditor=auditor, injector=injector)
    assert injector.applied
    bad = [r for r in auditor.records if not r.matched]
    assert {(r.replay, r.attributed_rank, r.action, r.step, r.unit, r.injected) for r in bad} == {
        ("peer", 1, "quarantine", 2, "chunk:4", True), ("witness", 1, "quarantine", 2, "chunk:4", True)}
    assert len({r.auditor_rank for r in bad} | {1}) == 3  # auditor and witness are the two other workers
    assert auditor.quarantined == {1}
    assert all(np.array_equal(model[k], clean[k]) for k in clean)


def test_em_every_audited_flip_is_attributed_to_its_worker():
    rng = np.random.default_rng(4)
    clean, _ = fit(1, auditor=None)
    for trial in range(30):
        chunk = int(rng.integers(CHUNKS))
        owner = WORKERS[chunk % len(WORKERS)]
        flip = BitFlip("statistic", f"chunk:{chunk}/{rng.choice(['n', 'sx', 'sxx'])}", rank=owner, step=0,
                       index=int(rng.integers(2)), bit=int(rng.integers(64)))
        auditor = EMAuditor(rate=1.0, seed=trial)
        model, _ = fit(1, auditor=auditor, injector=FaultInjector([flip]))
        assert auditor.quarantined == {owner}, flip
        assert all(np.array_equal(model[k], clean[k]) for k in clean)


def test_em_faulty_auditor_is_the_one_quarantined():
    data = m.gmm_data()
    calls = {"n": 0}

    def compute(worker, chunk, model=dict(m.GMM_INIT)):  # noqa: B006 - one private copy of the start, on purpose
        stats = m.gmm_chunk_stats(data, CHUNKS, chunk, model)
        if worker == 1 and chunk == 0:  # worker 1 only ever recomputes chunk 0 as chunk 0's auditor
            calls["n"] += 1
            stats["n"][0] = np.nextafter(stats["n"][0], np.inf)
        return stats

    auditor = EMAuditor(rate=1.0)
    audited_fold(CHUNKS, workers=WORKERS, compute=compute, combine=m.gmm_combine, iteration=0, auditor=auditor)
    assert calls["n"] == 1 and auditor.quarantined == {1}
    bad = [r for r in auditor.records if not r.matched]
    assert bad[0].attributed_rank == 1 and bad[0].rank == 0


def test_em_with_two_workers_cannot_attribute_and_raises():
    data = m.gmm_data()
    injector = FaultInjector([BitFlip("statistic", "chunk:0/n", rank=0, step=0, index=0, bit=5)])
    with pytest.raises(SDCDetectedError, match="chunk:0"):
        audited_fold(CHUNKS, workers=(0, 1), compute=lambda w, c: m.gmm_chunk_stats(data, CHUNKS, c, m.GMM_INIT),
                     combine=m.gmm_combine, iteration=0, auditor=EMAuditor(rate=1.0), injector=injector)


def test_em_schedule_audits_at_least_one_chunk_per_fit():
    auditor = EMAuditor(rate=0.0)
    assert len(auditor.audited_chunks(0, 4)) == 1 and auditor.audited_chunks(1, 4) == ()
