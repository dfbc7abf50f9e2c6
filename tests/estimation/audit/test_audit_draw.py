"""The reference audit's sample is drawn after the pass's commitments, systematically, from recorded entropy.

Before this, the sample of a pass was drawn before the pass (an HMAC of the seed and the iteration under a
per-handle secret, independently per pass), a reference thread ran only on passes that audited something,
and the sample sat in the calling frames: a backend that cheated only on the passes that audited nothing
(54% of them at the default rate with 12 chunks) went unnoticed, a cheat on one fixed chunk of four escaped
a 5-pass fit about 60% of the time, and a group without its commitments ended in a ``KeyError``.
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs
import numpy as np
import pytest

from mixle_parallel.executors.estimation import fit, handle_from_runner
from mixle_parallel.executors.estimation.audit import reveal_mode
from mixle_parallel.executors.estimation.audit.audit_draw import Draw, SystematicDraw, fresh_entropy, recheck_draws
from mixle_parallel.executors.estimation.audit.commitments import MalformedCommitmentError
from mixle_parallel.executors.estimation.em_pass.chunks import apply_chunk_fn
from mixle_parallel.executors.estimation.em_pass.combine_order import GroupStats, SealedResult
from mixle_parallel.verification.sdc import BackendDefectError, SDCDetectedError
from tests.estimation.audit.audit_cases import start_model, third_party_backend
from tests.estimation.audit.conftest import ROWS_PER_CHUNK, estimator
from tests.estimation.audit.test_reference_audit import overwrite_half


def _caller_locals(depth: int = 14) -> list[dict[str, Any]]:
    """The local variables of the frames that called into the runner (what a backend in the driver can read)."""
    frame, out = sys._getframe(2), []
    while frame is not None and len(out) < depth:
        out.append(frame.f_locals)
        frame = frame.f_back
    return out


def _inner(fn: Any) -> Any:
    while type(fn).__name__ == "MeteredFn":  # the handle's timing envelope around the pass's function
        fn = fn.fn
    return fn


class ScriptedRunner:
    """Two in-process workers (no placement) whose E-step passes go through ``tamper(pass, chunk) -> bool`` (True:
    compute that chunk on half-overwritten rows) and whose results go through ``reshape`` (a malformed reply)."""

    def __init__(self, name: str, tamper: Callable[[Any, int], bool] | None = None,
                 reshape: Callable[[list[Any]], list[Any]] | None = None) -> None:
        self.name, self.num_workers = name, 2
        self.tamper, self.reshape = tamper, reshape
        self.passes = 0
        self._chunks: list[Any] = []

    def scatter(self, chunks: Sequence[Any]) -> None:
        self._chunks = list(chunks)

    def map_chunks(self, fn: Callable[[Any, Any], Any], payload: Any,
                   chunk_ids: Sequence[int] | None = None) -> list[Any]:
        ids = list(range(len(self._chunks))) if chunk_ids is None else sorted(chunk_ids)
        is_pass = type(_inner(fn)).__name__ == "GroupFold" and chunk_ids is None
        if is_pass:
            self.passes += 1

        def chunk(i: int) -> Any:
            bad = self.tamper is not None and self.tamper(self, i)
            return overwrite_half(self._chunks[i]) if bad else self._chunks[i]

        out = apply_chunk_fn(fn, payload, ids, chunk)
        if not (is_pass and self.reshape is not None):
            return out
        metered = [e for e in out if type(e).__name__ == "Metered"]  # the handle's timing envelope, kept
        values = self.reshape([e.value if type(e).__name__ == "Metered" else e for e in out])
        return [e._replace(value=v) for e, v in zip(metered, values)] if len(metered) == len(out) else values

    def close(self) -> None:
        self._chunks = []


@pytest.fixture
def registered() -> Iterator[Callable[[str, Callable[[int], Any]], Any]]:
    stack: list[Any] = []

    def register(name: str, make: Callable[[int], Any]) -> Any:
        ctx = third_party_backend(name, make)
        ctx.__enter__()
        stack.append(ctx)
        return name

    yield register
    for ctx in reversed(stack):
        ctx.__exit__(None, None, None)


# ---- the pure draw ------------------------------------------------------------------------------------
@pytest.mark.parametrize("rate,n", [(0.05, 12), (0.05, 64), (0.25, 4), (0.3, 10), (1.0, 5), (0.5, 1)])
def test_every_chunk_is_audited_once_in_every_cycle_and_every_pass_audits(rate, n):
    length = math.ceil(1 / rate)
    for _ in range(20):
        state = SystematicDraw(rate)
        draws = [state.draw(fresh_entropy(), n, [c % 2 for c in range(n)], first_of_fit=i == 0)
                 for i in range(3 * length)]
        assert all(d.chunks for d in draws)
        for k in range(3):
            cycle = draws[k * length:(k + 1) * length]
            assert {d.slot for d in cycle} == set(range(length)) and {d.cycle for d in cycle} == {k}
            assert set().union(*(d.chunks for d in cycle)) == set(range(n))
        first = set(draws[0].chunks)
        assert n == 1 or ({c % 2 for c in first} == {0, 1})  # one chunk of each worker on a fit's first pass
        recheck_draws(rate, n, draws)


def test_recheck_refuses_a_draw_its_entropy_does_not_give():
    state = SystematicDraw(0.25)
    draws = [state.draw(fresh_entropy(), 16, [0] * 16, first_of_fit=i == 0) for i in range(6)]
    recheck_draws(0.25, 16, draws)
    other = next(c for c in range(16) if c not in draws[3].chunks)
    forged = draws[:3] + [attrs.evolve(draws[3], chunks=tuple(sorted({*draws[3].chunks[1:], other})))]
    with pytest.raises(ValueError, match="pass 3: the recorded audit draw"):
        recheck_draws(0.25, 16, forged)
    restarted = draws[:2] + [attrs.evolve(draws[2], slot=0)]
    with pytest.raises(ValueError, match="pass 2: a new cycle started after 2 of 4 passes"):
        recheck_draws(0.25, 16, restarted)
    assert Draw.from_fields(draws[0].receipt_fields()) == draws[0]


# ---- against a backend ----------------------------------------------------------------------------------
def test_nothing_a_backend_sees_before_it_commits_tells_an_audited_pass(rows):
    """During each pass the runner sees the same threads, the same audit attributes, no drawn sample and no
    sample in the calling frames; the pass's draw exists only after the pass returned."""
    seen: list[tuple[frozenset[str], frozenset[str], int, Any, bool]] = []
    runner = ScriptedRunner("draw_observer")
    baseline = frozenset(t.name for t in threading.enumerate())

    def observe(r: ScriptedRunner, chunk: int) -> bool:
        if chunk == 0:
            audit = handle.audit
            frames = _caller_locals()
            sample_in_frames = any(k in ("audited", "secret", "references", "refs") for f in frames for k in f)
            seen.append((frozenset(t.name for t in threading.enumerate()), frozenset(vars(audit)),
                         len(audit.draws), audit.last_draw, sample_in_frames))
        return False

    runner.tamper = observe
    model = start_model(rows)
    with handle_from_runner(runner, rows, estimator=estimator(), chunk_size=ROWS_PER_CHUNK) as handle:
        handle.attach_verification(audit=True, audit_rate=0.05)
        for it in range(12):
            before = len(seen)
            handle.estep(estimator(), model)
            assert len(handle.audit.draws) == it + 1 and handle.audit.draws[it].chunks
            assert seen[before][2] == it and seen[before][3] is None and not seen[before][4]
        assert {s[0] for s in seen} == {baseline} and len({s[1] for s in seen}) == 1
        receipts = [handle.last_receipt]
    assert receipts[0].extra["audit_draw"]["entropy"] == handle.audit.draws[-1].entropy


def test_a_backend_cheating_on_passes_it_believes_unaudited_is_caught(registered, rows):
    """It cheats whenever it sees no reference thread and no sample in the frames (what gave the old audit away:
    it spared every pass that audited something and cheated on the rest, undetected)."""
    def tamper(r: ScriptedRunner, chunk: int) -> bool:
        threads = any(t.name == "em-audit-reference" for t in threading.enumerate())
        frames = _caller_locals()
        audited = next((f["audited"] for f in frames if "audited" in f), ())
        return not threads and not audited

    name = registered("draw_quiet_cheat", lambda n: ScriptedRunner("draw_quiet_cheat", tamper))
    with pytest.raises(SDCDetectedError) as caught:
        fit(rows, estimator(), max_its=20, delta=None, prev_estimate=start_model(rows), chunk_size=ROWS_PER_CHUNK,
            backend=name, num_workers=2, audit_policy="raise")
    bad = [r for r in caught.value.records if not r.matched]
    assert bad and bad[0].replay == "reference"  # its same-worker replay, seeing the sample, came back honest


@pytest.mark.parametrize("rate", [0.05, 0.25])
def test_a_cheat_on_one_fixed_chunk_is_caught_within_one_cycle(registered, rate):
    """Four chunks, chunk 2 always computed wrong: caught within ceil(1/rate) passes on every one of 25 fits."""
    rng = np.random.default_rng(5)
    data = np.concatenate([rng.normal(-3, 1, 200), rng.normal(3, 1, 200)])
    start = start_model(data)
    name = registered(f"draw_fixed_cheat_{int(rate * 100)}",
                      lambda n: ScriptedRunner("draw_fixed_cheat", lambda r, c: c == 2))
    length = math.ceil(1 / rate)
    caught_at = []
    for _ in range(25):
        with pytest.raises(BackendDefectError) as caught:
            fit(data, estimator(), max_its=length, delta=None, prev_estimate=start, num_chunks=4, backend=name,
                num_workers=2, audit_rate=rate, audit_policy="raise")
        bad = [r for r in caught.value.records if not r.matched]
        assert bad and {r.unit for r in bad} == {"chunk:2"}
        caught_at.append(bad[0].step)
    assert max(caught_at) < length, caught_at


def _strip_digests(keep: Callable[[tuple[str, ...]], Any]) -> Callable[[list[Any]], list[Any]]:
    def reshape(out: list[Any]) -> list[Any]:
        return [e._replace(digests=keep(e.digests)) if isinstance(e, GroupStats) else e for e in out]

    return reshape


@pytest.mark.parametrize("reshape,problem", [
    (_strip_digests(lambda d: ()), r"folded with 0 commitment\(s\)"),
    (_strip_digests(lambda d: d[:-1]), r"with 5 commitment\(s\) for its 6 chunks"),
    (_strip_digests(lambda d: ("sha256:nope",) + d[1:]), "malformed commitments for chunk"),
    (lambda out: [None if isinstance(e, GroupStats) else e for e in out], "a chunk missing"),
], ids=["missing", "short", "malformed", "hole"])
@pytest.mark.parametrize("shipped", [True, False], ids=["own-results-shipped", "revealed"])
def test_malformed_commitments_are_a_backend_defect_naming_the_group(registered, rows, monkeypatch, reshape, problem,
                                                                     shipped):
    """Refused before the draw whether the pass also ships every chunk's own result (small statistics) or the
    opened groups are revealed after it (the size bound set to 0 here)."""
    if not shipped:
        monkeypatch.setattr(reveal_mode, "OWN_RESULTS_MAX_BYTES", 0)
    _refused_naming_the_group(registered, rows, "draw_bad_commit", reshape, problem)


def _refused_naming_the_group(registered: Any, rows: Any, backend: str, reshape: Callable[[list[Any]], list[Any]],
                              problem: str) -> MalformedCommitmentError:
    """A short audited fit on a third-party runner whose passes ``reshape`` spoils: refused as a backend defect
    matching ``problem`` and naming the group (and its worker)."""
    name = registered(backend, lambda n: ScriptedRunner(backend, reshape=reshape))
    with pytest.raises(MalformedCommitmentError, match=problem) as caught:
        fit(rows, estimator(), max_its=2, delta=None, prev_estimate=start_model(rows), chunk_size=ROWS_PER_CHUNK,
            backend=name, num_workers=2, audit_policy="raise")
    assert isinstance(caught.value, BackendDefectError)
    assert f"{backend} backend returned the group of chunks" in str(caught.value)
    assert caught.value.group[1] > caught.value.group[0] and caught.value.worker is not None
    return caught.value


def _sealed(make: Callable[[SealedResult], Any]) -> Callable[[list[Any]], list[Any]]:
    """Every sealed own result a worker sends (beside a group's sum or as its last chunk's) replaced by ``make``."""
    def swap(e: Any) -> Any:
        if isinstance(e, GroupStats):
            return e._replace(last=make(e.last)) if isinstance(e.last, SealedResult) else e
        return make(e) if isinstance(e, SealedResult) else e

    return lambda out: [swap(e) for e in out]


@pytest.mark.parametrize("reshape,problem", [
    (_sealed(lambda s: SealedResult(b"not a pickle")), "sealed own result does not unpickle"),
    (_sealed(lambda s: SealedResult.of("not a result")), r"holds a str, not a chunk's \(count, log_likelihood"),
    (_sealed(lambda s: SealedResult(None)), r"sealed own results that hold no bytes for chunk\(s\)"),
    (lambda out: [e.last if isinstance(e, GroupStats) else e for e in out],
     r"per chunk with sealed own results for chunk\(s\) .* and no folded sum"),
], ids=["unreadable", "not-a-result", "not-bytes", "no-sum"])
def test_sealed_own_results_that_are_no_results_are_a_backend_defect_naming_the_group(registered, rows, reshape,
                                                                                    problem):
    """The own results a pass ships come sealed (the bytes their digests are of): bytes that do not unpickle (or not
    to a chunk's result), a seal holding no bytes, or sealed results standing for a group with no folded sum are
    refused as a backend defect naming the group, never an unpickling or type error from deep in the fold."""
    _refused_naming_the_group(registered, rows, "draw_bad_seal", reshape, problem)
