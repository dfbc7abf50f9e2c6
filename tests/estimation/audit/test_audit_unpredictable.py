"""A backend cannot tell which chunk the reference audit picks before it returns its statistics.

The cheating backends below compute honestly only the chunks they believe are audited and every other chunk
on half-overwritten rows. One reads the belief from the tasks it is handed (the fold's ``raw`` chunks, whose
own results the audit asked for); the other computes the published sampling rule (``audit_uniform`` of the
seed, the iteration and the chunk) with the default seed and counts its passes. Before this audit drew its
sample with a per-handle secret and committed every chunk's digest in tasks that name no chunk, both cheated
undetected; now each is caught as a backend defect.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest

from mixle_parallel.executors.estimation import encoded_data, fit, handle_from_runner
from mixle_parallel.executors.estimation.em_pass.chunks import apply_chunk_fn
from mixle_parallel.verification.sdc import BackendDefectError, EMAuditor, SDCDetectedError
from mixle_parallel.verification.sdc.schedule import audit_uniform
from tests.estimation.audit.audit_cases import start_model, third_party_backend
from tests.estimation.audit.conftest import ROWS_PER_CHUNK, estimator
from tests.estimation.audit.test_reference_audit import overwrite_half

NAME = "audit_peeking_em"
RATE = 0.2


class PeekingRunner:
    """Two in-process workers (no placement) that spare only the chunks they believe audited (``honest``: all)."""

    name = NAME

    def __init__(self, num_workers: int, belief: str) -> None:
        self.num_workers, self.belief = num_workers, belief
        self.passes = 0
        self.named: set[int] = set()
        self.seen: list[tuple[str, tuple[int, ...], tuple[int, ...], bool]] = []
        """(the task's function, the chunk ids, the chunks whose own results it asked for, whether it asked for a
        digest per chunk) of every call."""
        self._chunks: list[Any] = []

    def scatter(self, chunks: Sequence[Any]) -> None:
        self._chunks = list(chunks)

    def _believed_audited(self, fn: Any) -> set[int]:
        if self.belief == "honest":
            return set(range(len(self._chunks)))
        if self.belief == "tasks":  # the chunks the pass's fold named, spared in the replays that follow too
            if type(fn).__name__ == "GroupFold":
                self.named = {int(c) for c in fn.raw}
            return self.named
        n = len(self._chunks)  # the published rule with the default seed 0 (EMAuditor, first E-step of a fit)
        chosen = set(EMAuditor(rate=RATE, seed=0).audited_chunks(self.passes - 1, n))
        if self.passes == 1 and not chosen:
            chosen.add(int(audit_uniform(0, 0, "em-fit-first") * n))
        return chosen

    def map_chunks(self, fn: Callable[[Any, Any], Any], payload: Any,
                   chunk_ids: Sequence[int] | None = None) -> list[Any]:
        ids = list(range(len(self._chunks))) if chunk_ids is None else sorted(chunk_ids)
        inner = fn
        while type(inner).__name__ == "MeteredFn":  # the handle's timing envelope around the pass's function
            inner = inner.fn
        if type(inner).__name__ == "GroupFold":  # an E-step pass; replays come as the plain chunk function
            self.passes += 1
        spared = self._believed_audited(inner)
        self.seen.append((type(inner).__name__, tuple(ids), tuple(sorted(getattr(inner, "raw", ()))),
                          bool(getattr(inner, "commit", False))))

        def chunk(i: int) -> Any:
            return self._chunks[i] if i in spared else overwrite_half(self._chunks[i])

        return apply_chunk_fn(fn, payload, ids, chunk)

    def close(self) -> None:
        self._chunks = []


@pytest.fixture(params=["tasks", "published_rule"])
def peeking_backend(request: pytest.FixtureRequest) -> Iterator[str]:
    with third_party_backend(NAME, lambda n: PeekingRunner(n, request.param)):
        yield request.param


def test_a_backend_that_spares_only_the_chunks_it_believes_audited_is_caught(peeking_backend, rows):
    kwargs = dict(max_its=4, delta=None, prev_estimate=start_model(rows), chunk_size=ROWS_PER_CHUNK, backend=NAME,
                  num_workers=2, audit_rate=RATE)
    if peeking_backend == "tasks":
        # the pass names every chunk (each brings its own result: audit.reveal_mode), so a backend sparing the
        # chunks its tasks name spares them all: it cannot cheat, and the fit is the honest one's
        cheated = fit(rows, estimator(), audit_policy="raise", **kwargs)
        honest = fit(rows, estimator(), backend="local", **{k: v for k, v in kwargs.items() if k != "backend"})
        assert cheated.log_likelihood == honest.log_likelihood
        return
    # The fit judges its passes in a batch (deferred_judging): a replay of a chunk cheated at pass 0 may run when
    # the backend's count of passes makes it believe that chunk audited, so it answers honestly and the replay does
    # not reproduce the cheat (a `device` cause); by the reference the cheat is caught all the same.
    with pytest.raises(SDCDetectedError) as caught:
        fit(rows, estimator(), audit_policy="raise", **kwargs)
    bad = [r for r in caught.value.records if not r.matched]
    assert [r.replay for r in bad] == ["reference"] and bad[0].cause in ("backend_defect", "device")
    assert isinstance(caught.value, BackendDefectError) == (bad[0].cause == "backend_defect")


def test_a_backend_judged_pass_by_pass_that_spares_what_the_published_rule_audits_is_a_backend_defect(rows):
    """Judged as each pass ends (``on_step``), the replay meets the cheat in the same belief: reproduced, so the
    cheat is a backend defect."""
    with third_party_backend(NAME, lambda n: PeekingRunner(n, "published_rule")), \
            pytest.raises(BackendDefectError) as caught:
        fit(rows, estimator(), audit_policy="raise", on_step=lambda step: None, max_its=4, delta=None,
            prev_estimate=start_model(rows), chunk_size=ROWS_PER_CHUNK, backend=NAME, num_workers=2,
            audit_rate=RATE)
    bad = [r for r in caught.value.records if not r.matched]
    assert [(r.replay, r.cause) for r in bad] == [("reference", "backend_defect")]


def test_a_backend_that_spares_the_chunks_a_task_names_is_caught_where_a_pass_names_none(rows, monkeypatch):
    """Where a pass does not bring every chunk's own result (large statistics: a reveal round instead), the tasks
    name no chunk, so the same backend spares none it could know of and is caught."""
    from mixle_parallel.executors.estimation.audit import reveal_mode

    monkeypatch.setattr(reveal_mode, "OWN_RESULTS_MAX_BYTES", 0)
    with third_party_backend(NAME, lambda n: PeekingRunner(n, "tasks")):
        with pytest.raises(BackendDefectError) as caught:
            fit(rows, estimator(), max_its=4, delta=None, prev_estimate=start_model(rows), chunk_size=ROWS_PER_CHUNK,
                backend=NAME, num_workers=2, audit_rate=RATE, audit_policy="raise")
    bad = [r for r in caught.value.records if not r.matched]
    assert [(r.replay, r.cause) for r in bad] == [("reference", "backend_defect")]


@pytest.mark.parametrize("shipped", [True, False], ids=["own-results-shipped", "revealed"])
def test_the_pass_tasks_are_the_same_whichever_chunks_are_audited(rows, monkeypatch, shipped):
    """Every pass hands the same task, naming no chunk and asking for a digest per chunk; where the own results are
    small it also asks for every one of them (else they are revealed after the draw: the bound set to 0 here)."""
    from mixle_parallel.executors.estimation.audit import reveal_mode

    if not shipped:
        monkeypatch.setattr(reveal_mode, "OWN_RESULTS_MAX_BYTES", 0)
    runner = PeekingRunner(2, "honest")
    model = start_model(rows)
    with handle_from_runner(runner, rows, estimator=estimator(), chunk_size=ROWS_PER_CHUNK) as handle:
        handle.attach_verification(audit=True, audit_rate=RATE)
        for _ in range(6):
            runner.seen.clear()
            handle.estep(estimator(), model)
            passes = [s for s in runner.seen if s[0] == "GroupFold"]
            # every chunk, none named: with small statistics every chunk's own result comes with every pass
            # (audit.reveal_mode), so no reveal round follows the draw; otherwise none does, and the opened
            # groups are revealed after it
            every = tuple(range(handle.num_chunks))
            assert passes == [("GroupFold", every, every if shipped else (), True)]
        sampled = [d.chunks for d in handle.audit.draws]  # drawn after each pass's commitments (audit_draw)
        assert len(set(sampled)) > 1 and all(sampled) and all(r.matched for r in handle.audit_records)
        # the sample is not the published rule's: fresh entropy draws it
        public = [EMAuditor(rate=RATE, seed=0).audited_chunks(it, handle.num_chunks) for it in range(6)]
        assert sampled != public


def test_two_handles_with_the_same_seed_draw_different_samples(rows):
    model = start_model(rows)

    def sample() -> list[tuple[int, ...]]:
        with encoded_data(rows, estimator=estimator(), chunk_size=ROWS_PER_CHUNK, backend="local", num_workers=2,
                          audit_rate=RATE, audit_seed=7) as handle:
            for _ in range(8):
                handle.estep(estimator(), model)
            return [d.chunks for d in handle.audit.draws]

    first, second = sample(), sample()
    assert first != second and np.mean([len(s) for s in first + second]) > 0
