"""The canonical two-level combine order, and folding its groups on the workers.

Folding a group on a worker is a speed-up only: one small result per group travels back instead
of one per chunk. These tests show the bits never depend on where (or whether) a group was
folded, and that real mp workers do fold.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixle_parallel.executors.estimation import (
    DEFAULT_CHUNK_MULTIPLE,
    DiagonalGaussianDistribution,
    DiagonalGaussianEstimator,
    GaussianDistribution,
    GaussianEstimator,
    MixtureDistribution,
    MixtureEstimator,
    encoded_data,
)
from mixle_parallel.executors.estimation.backends.chunk_assignment import block_assignment
from mixle_parallel.executors.estimation.em_pass.chunks import (
    ChunkResult,
    GroupFold,
    GroupStats,
    apply_chunk_fn,
    chunk_bounds,
    chunk_estep,
    chunk_result,
    combine_groups,
    encode_chunks,
    fold_pass,
)
from mixle_parallel.executors.estimation.em_pass.combine_order import SealedResult, UnreadableOwnResult, commit_digest


def _bits(total: GroupStats) -> bytes:
    from mixle_parallel.contracts.estimation import canonical_statistic_bytes

    return canonical_statistic_bytes((total.count, total.log_likelihood, total.stats))


@pytest.fixture(scope="module")
def case():
    """30 chunks of a 1-D 3-component mixture (groups of 3), with a start model."""
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.normal(-5, 1, 3000), rng.normal(0.3, 0.2, 3000), rng.normal(6, 2, 3000)])
    est = MixtureEstimator([GaussianEstimator()] * 3)
    model = MixtureDistribution([GaussianDistribution(m, 2.0) for m in (-4.0, 0.0, 4.0)], np.full(3, 1 / 3))
    chunks = encode_chunks(x, est.encoder(), chunk_bounds(len(x), num_chunks=30))
    return est, model, chunks


@pytest.mark.parametrize("n", [1, 5, 12, 13, 24, 30, 72, 100])
def test_groups_cover_the_chunks_in_order_and_depend_on_the_count_only(n):
    groups = combine_groups(n)
    assert groups[0][0] == 0 and groups[-1][1] == n
    assert all(b0 == a1 for (_, b0), (a1, _) in zip(groups, groups[1:]))
    assert len(groups) <= DEFAULT_CHUNK_MULTIPLE
    assert combine_groups(n) == groups


@pytest.mark.parametrize("rows", [200_000, 1_000_000])
@pytest.mark.parametrize("workers", [1, 2, 3, 4, 6])
def test_default_chunking_puts_whole_groups_on_each_worker(rows, workers):
    n = len(chunk_bounds(rows))
    starts = {a for a, _ in combine_groups(n)}
    assert all(ids[0] in starts for ids in block_assignment(n, workers))


def test_a_pass_folded_per_chunk_or_by_group_has_the_same_bits(case):
    est, model, chunks = case
    raw = [chunk_estep(c, (est, model)) for c in chunks]
    folded = GroupFold(chunk_estep, len(chunks)).apply_block(range(len(chunks)), chunks.__getitem__, (est, model))
    assert sum(isinstance(e, GroupStats) for e in folded) == len(combine_groups(len(chunks))) == 10
    assert sum(e is None for e in folded) == 20
    assert _bits(fold_pass(est, raw)) == _bits(fold_pass(est, folded))


def test_sealed_own_results_are_the_bytes_their_digests_are_of_and_open_to_the_chunks_bits(case):
    """With ``seal`` every raw chunk of a folded group comes back as the bytes its commitment digests: hashing them
    gives the group's digest, which is also the digest of the opened result pickled again (so a result that crossed
    a transport digests alike), and the opened result has the chunk's bits; the folded total is unchanged."""
    est, model, chunks = case
    n = len(chunks)
    raw = [chunk_estep(c, (est, model)) for c in chunks]
    sealed = GroupFold(chunk_estep, n, frozenset(range(n)), True, "", True).apply_block(
        range(n), chunks.__getitem__, (est, model))
    plain = GroupFold(chunk_estep, n, frozenset(range(n)), True).apply_block(range(n), chunks.__getitem__, (est, model))
    for a, b in combine_groups(n):
        group = sealed[b - 1]
        own = [*sealed[a:b - 1], group.last]
        assert all(isinstance(e, SealedResult) for e in own)
        assert group.digests == plain[b - 1].digests == tuple(commit_digest(e) for e in own)
        for c, e in zip(range(a, b), own):
            value = e.open(c)
            assert commit_digest(value) == commit_digest(e)
            assert _bits(GroupStats(*value)) == _bits(GroupStats(*raw[c]))
            assert _bits(GroupStats(*chunk_result(sealed, c))) == _bits(GroupStats(*raw[c]))
    assert _bits(fold_pass(est, sealed)) == _bits(fold_pass(est, raw))
    with pytest.raises(UnreadableOwnResult, match="chunk 4's sealed own result does not unpickle"):
        SealedResult(b"not a pickle").open(4)
    with pytest.raises(UnreadableOwnResult, match="holds a dict, not a chunk's"):
        SealedResult.of({"count": 1.0}).open(4)


@settings(max_examples=40, deadline=None)
@given(cuts=st.lists(st.integers(1, 29), max_size=5, unique=True), audited=st.sets(st.integers(0, 29), max_size=4))
def test_any_split_over_workers_and_any_audited_set_gives_the_same_bits(case, cuts, audited):
    """Workers hold arbitrary contiguous blocks (groups may straddle two of them) and audited chunks
    bring their own results back too: the folded total never changes, and each audited chunk's own
    result is bitwise the one computed alone."""
    est, model, chunks = case
    n = len(chunks)
    edges = [0, *sorted(cuts), n]
    fold = GroupFold(chunk_estep, n, frozenset(audited))
    entries = []
    for a, b in zip(edges, edges[1:]):
        entries += apply_chunk_fn(fold, (est, model), list(range(a, b)), chunks.__getitem__)
    raw = [chunk_estep(c, (est, model)) for c in chunks]
    for c in audited:  # what the audit compares is the chunk's own result
        own = chunk_result(entries, c)
        assert isinstance(own, ChunkResult) and _bits(GroupStats(*own)) == _bits(GroupStats(*raw[c]))
    assert _bits(fold_pass(est, entries)) == _bits(fold_pass(est, raw))
    for c in range(n):  # a folded chunk that was not asked for has no own result to give
        if c not in audited and (entries[c] is None or isinstance(entries[c], GroupStats)):
            with pytest.raises(KeyError, match="did not come back"):
                chunk_result(entries, c)


def test_a_partly_folded_group_is_refused_as_a_runner_bug(case):
    est, model, chunks = case
    entries = [chunk_estep(c, (est, model)) for c in chunks]
    entries[1] = None  # chunk 1 claims to be folded into chunk 2, which came back per chunk
    with pytest.raises(RuntimeError, match="partly folded"):
        fold_pass(est, entries)


def test_a_plain_function_is_applied_per_chunk_and_a_failure_names_its_chunk(case):
    est, model, chunks = case

    assert apply_chunk_fn(lambda c, p: c.chunk_id * p, 2, [3, 4], chunks.__getitem__) == [6, 8]
    with pytest.raises(ZeroDivisionError) as info:
        apply_chunk_fn(lambda c, p: 1 / (c.chunk_id - 4), None, [3, 4, 5], chunks.__getitem__)
    assert info.value.chunk_id == 4


@pytest.mark.parametrize("workers", [1, 2, 3, 5])
def test_mp_workers_fold_their_groups_and_fit_the_local_bits(workers):
    """Real mp workers: every group wholly on one worker comes back folded (48 chunks in 12 groups
    of 4; 5 workers cut some groups, whose chunks come back per chunk), and the E-steps of the
    handle equal the local single-worker ones bit for bit."""
    rng = np.random.default_rng(9)
    x = rng.normal(0, 1, (4800, 3)) + rng.integers(0, 3, 4800)[:, None] * 4.0
    est = MixtureEstimator([DiagonalGaussianEstimator(3)] * 3)
    model = MixtureDistribution([DiagonalGaussianDistribution(np.full(3, m), np.ones(3)) for m in (0.0, 4.0, 8.0)],
                                np.full(3, 1 / 3))
    options = dict(estimator=est, num_chunks=48, admission="unverified", audit=False)
    with encoded_data(x, backend="local", num_workers=1, **options) as ref, \
            encoded_data(x, backend="mp", num_workers=workers, **options) as h:
        entries = h.runner.map_chunks(GroupFold(chunk_estep, 48), (est, model))
        blocks = block_assignment(48, workers)
        whole = [(a, b) for a, b in combine_groups(48) if any(a >= ids[0] and b - 1 <= ids[-1] for ids in blocks)]
        assert [i for i, e in enumerate(entries) if isinstance(e, GroupStats)] == [b - 1 for _, b in whole]
        assert (len(whole) == 12) == (workers < 5)  # 5 workers cut 3 of the 12 groups
        m_ref, m = model, model
        for _ in range(3):
            r_ref, r = ref.estep(est, m_ref), h.estep(est, m)
            assert (r.nobs, r.log_likelihood) == (r_ref.nobs, r_ref.log_likelihood)
            m_ref, m = r_ref.model, r.model
        assert np.array_equal(np.concatenate([c.mu for c in m.components]),
                              np.concatenate([c.mu for c in m_ref.components]))


def test_a_failure_inside_a_folded_group_names_its_chunk(case):
    est, model, chunks = case

    def failing(chunk, payload):
        if chunk.chunk_id == 4:
            raise ZeroDivisionError("bad chunk")
        return chunk_estep(chunk, payload)

    with pytest.raises(ZeroDivisionError) as info:
        apply_chunk_fn(GroupFold(failing, len(chunks)), (est, model), list(range(6)), chunks.__getitem__)
    assert info.value.chunk_id == 4  # what the mp worker reports to the driver
