"""mixle 0.8.2's audited mp handle on real workers: audit_rate each round, the evaluation count, the payload
corruption hook, receipts with mixle's fields, and the witness that decides whom to quarantine."""

from __future__ import annotations

import hashlib
import pickle

import numpy as np
import pytest

from mixle_parallel import GaussianEstimator, MixtureEstimator
from mixle_parallel.sdc_audit import AuditedMPEncodedData, inject_bit_flip


def test_a_flip_that_leaves_the_statistic_equal_is_no_mismatch_as_in_mixle():
    """inject_bit_flip's middle bit of this payload lands in the pickle's dtype flags: it decodes to the same
    statistic, which mixle 0.8.2's typed comparison also accepts."""
    def flip(worker_id, shard_id, role, payload):
        return inject_bit_flip(payload) if role == "audit" else payload

    with AuditedMPEncodedData(_data(), EST, num_workers=2, num_chunks=2, audit_rate=1.0) as h:
        h.arm_corruption(flip)
        h.pysp_seq_estimate(EST, _start(h))
        assert h.last_round_audited_shards == {0, 1} and h.last_round_audit_mismatches == []

EST = MixtureEstimator([GaussianEstimator()] * 2)


def _data() -> np.ndarray:
    rng = np.random.default_rng(9)
    return np.concatenate([rng.normal(-2, 1.0, 300), rng.normal(3, 1.0, 300)])


def _start(h):
    return h.pysp_seq_initialize(EST, np.random.RandomState(0), 0.5)


def test_audit_rate_is_read_each_round_and_each_audited_chunk_costs_two_evaluations():
    expected = np.random.RandomState(7)
    with AuditedMPEncodedData(_data(), EST, num_workers=2, num_chunks=8, audit_rate=0.5,
                              rng=np.random.RandomState(7)) as h:
        model = h.pysp_seq_estimate(EST, _start(h))
        first = set(int(c) for c in expected.choice(np.arange(8), size=4, replace=False))
        assert h.last_round_audited_shards == first  # round(0.5 x 8) chunks, without replacement, from rng
        assert h.last_round_audit_eval_count == 8 and h.last_round_audit_mismatches == []
        h.audit_rate = 0.25
        model = h.pysp_seq_estimate(EST, model)
        assert h.last_round_audited_shards == set(int(c) for c in expected.choice(np.arange(8), size=2, replace=False))
        assert h.last_round_audit_eval_count == 4
        h.audit_rate = 0.0
        h.pysp_seq_estimate(EST, model)
        assert h.last_round_audited_shards == set() and h.last_round_audit_eval_count == 0
        with pytest.raises(ValueError, match="audit_rate must be finite and within"):
            h.audit_rate = 1.5


def _flip_first_weight(payload: bytes) -> bytes:
    """The payload with the lowest bit of its first component weight flipped (a one-ulp silent error)."""
    count, (weights, comps) = pickle.loads(payload)
    bad = weights.copy()
    bad.view(np.uint8)[0] ^= 1
    return pickle.dumps((count, (bad, comps)), protocol=pickle.HIGHEST_PROTOCOL)


class _FlipAuditsOf:
    """A persistent fault: every payload worker ``bad`` computes as the audit copy is one ulp off."""

    def __init__(self, bad: int) -> None:
        self.bad, self.seen, self.sent = bad, [], {}

    def __call__(self, worker_id: int, shard_id: int, role: str, payload: bytes) -> bytes:
        self.seen.append((worker_id, shard_id, role))
        out = _flip_first_weight(payload) if (worker_id == self.bad and role == "audit") else payload
        self.sent[(shard_id, role)] = out
        return out


def test_a_corrupting_worker_is_named_by_the_witness_quarantined_and_the_fit_stays_clean():
    with AuditedMPEncodedData(_data(), EST, num_workers=3, num_chunks=6, audit_rate=0.0) as clean:
        start = _start(clean)
        reference = start
        for _ in range(3):
            reference = clean.pysp_seq_estimate(EST, reference)
    hook = _FlipAuditsOf(bad=2)
    with AuditedMPEncodedData(_data(), EST, num_workers=3, num_chunks=6, audit_rate=1.0,
                              rng=np.random.RandomState(3)) as h:
        h.arm_corruption(hook)
        model = h.pysp_seq_estimate(EST, start)
        receipts = h.last_round_audit_mismatches
        assert receipts and all(r.suspected_workers == (2,) and r.audit_worker == 2 for r in receipts)
        witnesses = sum(r.witness_worker is not None for r in receipts)
        assert h.last_round_audit_eval_count == 2 * len(h.last_round_audited_shards) + witnesses
        r = receipts[0]
        assert r.witness_worker not in (None, 2, r.primary_worker)
        assert r.quarantine_status == "quarantined" and h.quarantined == {2}
        primary, audit = hook.sent[(r.shard_id, "primary")], hook.sent[(r.shard_id, "audit")]
        assert (r.primary_nbytes, r.audit_nbytes) == (len(primary), len(audit))
        assert r.primary_sha256 == hashlib.sha256(primary).hexdigest()
        assert r.audit_sha256 == hashlib.sha256(audit).hexdigest()
        assert r.first_diff_byte_offset == next(i for i, (a, b) in enumerate(zip(primary, audit)) if a != b)
        assert r.mismatch_reason == "statistic[1][0]: bits differ" and 0 < r.max_rel_error < 1e-15
        assert r.primary_canonical_sha256 != r.audit_canonical_sha256
        assert {role for _, _, role in hook.seen} == {"primary", "audit", "witness"}
        assert h.audit_receipts == receipts
        for _ in range(2):  # still armed (persistent) but worker 2 gets no work now
            model = h.pysp_seq_estimate(EST, model)
            assert h.last_round_audit_mismatches == []
        h.arm_corruption(None)
    assert repr(model) == repr(reference)


def test_an_undecodable_payload_is_a_mismatch_with_its_reason():
    def garbage(worker_id, shard_id, role, payload):
        return b"not a pickle" if role == "audit" and worker_id == 1 else payload

    with AuditedMPEncodedData(_data(), EST, num_workers=3, num_chunks=3, audit_rate=1.0) as h:
        h.arm_corruption(garbage)
        h.pysp_seq_estimate(EST, _start(h))
        r = h.last_round_audit_mismatches[0]
        assert r.audit_worker == 1 and r.mismatch_reason.startswith("payload decode/schema failure")
        assert r.audit_nbytes == len(b"not a pickle") and r.suspected_workers == (1,)
