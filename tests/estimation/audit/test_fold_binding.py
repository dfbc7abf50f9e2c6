"""Each opened combine group's folded sum is bound to its chunks' committed results (issue 23 item 5).

A worker folds the groups it holds whole and returns one sum and a digest per chunk. The chunk audit binds an
audited chunk's digest to the reference computed outside the backend; before this change nothing bound the sum
to the digests, so a registered backend that is honest under the harness and, in production, commits honest
digests but returns a wrong sum (its statistics scaled, or a chunk dropped from the fold) fitted wrong with
every audit passing. Now the groups holding audited chunks are opened after the pass (the worker hands back
the chunks' results it kept, each checked against its digest) and re-folded in the driver: the cheat is a
backend defect. A one-off flip of a folded sum is a device fault: its worker is quarantined, the run ends on
a clean run's bits. Each holds both ways a pass opens its groups: the pass brings every chunk's own result
with the sums (small statistics, the default: ``audit.reveal_mode``) or the workers reveal them in a round of
their own after the draw (statistics over ``OWN_RESULTS_MAX_BYTES``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import pytest

from mixle_parallel.executors.estimation import fit, handle_from_runner
from mixle_parallel.executors.estimation.audit.fold_binding import opened_groups
from mixle_parallel.executors.estimation.backends.chunk_assignment import block_assignment
from mixle_parallel.executors.estimation.em_pass.chunks import WorkerTask, apply_chunk_fn
from mixle_parallel.executors.estimation.em_pass.combine_order import GroupFold, GroupReveal, GroupStats, group_of
from mixle_parallel.verification.sdc import BackendDefectError
from tests.estimation.audit.audit_cases import clean_fit, same_bits, start_model, third_party_backend
from tests.estimation.audit.conftest import ROWS_PER_CHUNK, estimator
from tests.estimation.audit.fold_cheats import cheating_apply

NAME = "fold_cheating_em"


class BlockRunner:
    """Two in-process workers, each folding its contiguous block of chunks (``placement``: with
    ``run_on_workers``); ``apply`` stands for the workers' ``apply_chunk_fn`` (a cheat wraps it)."""

    name = NAME

    def __init__(self, num_workers: int, apply: Callable[..., list[Any]] = apply_chunk_fn) -> None:
        self.num_workers, self.apply = num_workers, apply
        self._chunks: list[Any] = []

    def scatter(self, chunks: Sequence[Any]) -> None:
        self._chunks = list(chunks)

    def worker_ids(self) -> list[int]:
        return list(range(self.num_workers))

    def chunk_owners(self) -> list[int]:
        return [w for w, ids in enumerate(block_assignment(len(self._chunks), self.num_workers)) for _ in ids]

    def map_chunks(self, fn: Callable[[Any, Any], Any], payload: Any,
                   chunk_ids: Sequence[int] | None = None) -> list[Any]:
        ids = range(len(self._chunks)) if chunk_ids is None else sorted(chunk_ids)
        owners = self.chunk_owners()
        tasks = {w: WorkerTask(fn, payload, tuple(c for c in ids if owners[c] == w)) for w in self.worker_ids()}
        out = self.run_on_workers({w: t for w, t in tasks.items() if t.chunk_ids}, pass_=True)
        values = {c: v for w, vs in out.items() for c, v in zip(tasks[w].chunk_ids, vs)}
        return [values[c] for c in ids]

    def run_on_workers(self, tasks: dict[int, WorkerTask], pass_: bool = False) -> dict[int, list[Any]]:
        return {w: self.apply(t.fn, t.payload, list(t.chunk_ids), self._chunks.__getitem__) for w, t in tasks.items()}

    def close(self) -> None:
        self._chunks = []


class PlacedBlockRunner(BlockRunner):
    """``BlockRunner`` with placement whose worker 1 flips one bit of every folded sum of its first pass only
    (a device fault: it does not reproduce in a replay)."""

    supports_worker_placement = True

    def __init__(self, num_workers: int, flip: bool = True) -> None:
        super().__init__(num_workers)
        self.passes = 0
        self.flipped = 0
        self.flip = flip

    def run_on_workers(self, tasks: dict[int, WorkerTask], pass_: bool = False) -> dict[int, list[Any]]:
        out = super().run_on_workers(tasks)
        self.passes += int(pass_)
        if self.flip and pass_ and self.passes == 1 and 1 in out:
            out[1] = [self._flip(e) for e in out[1]]
        return out

    def _flip(self, entry: Any) -> Any:
        value = entry.value if type(entry).__name__ == "Metered" else entry
        if not (isinstance(value, GroupStats) and value.digests):
            return entry
        weights = np.array(value.stats[0], copy=True)
        weights.view(np.uint64)[0] ^= np.uint64(1 << 40)
        self.flipped += 1
        value = value._replace(stats=(weights, *value.stats[1:]))
        return entry._replace(value=value) if type(entry).__name__ == "Metered" else value


class Opening(NamedTuple):
    """How the passes opened their groups: ``mode`` and the size of every reveal round they ran (not a replay's)."""

    mode: str
    rounds: list[int]

    @property
    def as_asked(self) -> bool:
        """Reveal rounds ran exactly when they were forced (no worker quarantined, so every pass ran as set)."""
        return bool(self.rounds) == (self.mode == "revealed")


@pytest.fixture(params=["shipped", "revealed"])
def opening(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Opening:
    """``shipped``: the pass brings every chunk's own result (the default for small statistics); ``revealed``: a
    reveal round after the draw, forced by a zero ``OWN_RESULTS_MAX_BYTES``."""
    from mixle_parallel.executors.estimation.audit import fold_binding, reveal_mode
    from mixle_parallel.executors.estimation.em_pass import estep

    if request.param == "revealed":
        monkeypatch.setattr(reveal_mode, "OWN_RESULTS_MAX_BYTES", 0)
    found = Opening(request.param, [])

    def counted(*args: Any, **kwargs: Any) -> dict[int, Any]:
        found.rounds.append(len(args[2]))
        return fold_binding.reveal_chunks(*args, **kwargs)

    monkeypatch.setattr(estep, "reveal_chunks", counted)
    return found


@pytest.fixture(params=["scale", "drop"])
def fold_cheating_backend(request: pytest.FixtureRequest) -> Iterator[str]:
    with third_party_backend(NAME, lambda n: BlockRunner(n, cheating_apply(apply_chunk_fn, request.param))):
        yield request.param


def test_a_backend_with_honest_digests_and_a_wrong_folded_sum_is_a_backend_defect(fold_cheating_backend, rows,
                                                                                  opening):
    with pytest.raises(BackendDefectError) as caught:
        fit(rows, estimator(), max_its=4, delta=None, prev_estimate=start_model(rows), chunk_size=ROWS_PER_CHUNK,
            backend=NAME, num_workers=2, audit_rate=0.2, audit_policy="raise")
    records = caught.value.records
    assert [(r.replay, r.cause, r.unit.split(":")[0]) for r in records if not r.matched] == [
        ("reference", "backend_defect", "group")]
    assert opening.as_asked, opening


def test_the_cheat_fits_wrong_without_the_audit(rows):
    """What the audit stops: the same backend, unaudited, ends on other bits than a clean run."""
    start = start_model(rows)
    with handle_from_runner(BlockRunner(2, cheating_apply(apply_chunk_fn, "scale")), rows, estimator=estimator(),
                            chunk_size=ROWS_PER_CHUNK) as handle:
        cheated = fit(handle, estimator(), max_its=3, delta=None, prev_estimate=start)
    assert not same_bits(cheated, clean_fit(rows, start, 3))


def test_an_honest_fit_has_the_same_bits_with_and_without_the_audit_and_opens_only_audited_groups(rows, opening):
    start = start_model(rows)
    with handle_from_runner(BlockRunner(2), rows, estimator=estimator(), chunk_size=ROWS_PER_CHUNK) as handle:
        handle.attach_verification(audit=True, audit_rate=0.2)
        audited = fit(handle, estimator(), max_its=4, delta=None, prev_estimate=start)
        records = handle.audit_records
    assert same_bits(audited, clean_fit(rows, start, 4)) and all(r.matched for r in records)
    assert opening.as_asked, opening
    groups = [r for r in records if r.unit.startswith("group:")]
    assert groups
    for r in groups:  # each opened group holds a chunk audited in the same pass
        first, last = (int(x) for x in r.unit.split(":")[1].split("-"))
        chunks = {int(c.unit.split(":")[1]) for c in records if c.step == r.step and c.unit.startswith("chunk:")}
        assert chunks & set(range(first, last + 1))


@pytest.mark.parametrize("backend", ["placed", "mp"])
def test_a_runner_that_places_work_opens_its_groups_as_asked_on_the_same_bits(rows, opening, backend):
    """A runner that can aim work at the worker that folded (in-process placed blocks, and ``mp``) gets the own
    results with the pass too when they are small: no reveal round after the draw (one round trip less per
    pass); forced over the bound, it reveals. Either way the fit has a clean run's bits."""
    start = start_model(rows)
    kwargs = {"max_its": 4, "delta": None, "prev_estimate": start}
    if backend == "mp":
        result = fit(rows, estimator(), backend="mp", num_workers=2, chunk_size=ROWS_PER_CHUNK,
                     admission="unverified", audit_rate=0.2, **kwargs)
    else:
        with handle_from_runner(PlacedBlockRunner(2, flip=False), rows, estimator=estimator(),
                                chunk_size=ROWS_PER_CHUNK) as handle:
            handle.attach_verification(audit=True, audit_rate=0.2)
            result = fit(handle, estimator(), **kwargs)
    assert same_bits(result, clean_fit(rows, start, 4))
    assert opening.as_asked, opening


def test_a_flipped_folded_sum_that_does_not_reproduce_is_a_device_fault_and_the_run_ends_on_clean_bits(rows,
                                                                                                     opening):
    start = start_model(rows)
    runner = PlacedBlockRunner(2)
    with handle_from_runner(runner, rows, estimator=estimator(), chunk_size=ROWS_PER_CHUNK) as handle:
        handle.attach_verification(audit=True, audit_rate=1.0, audit_policy="quarantine")
        result = fit(handle, estimator(), max_its=3, delta=None, prev_estimate=start)
        records, quarantined = handle.audit_records, handle.quarantined
    assert runner.flipped > 0
    bad = [r for r in records if not r.matched]
    assert bad and {(r.unit.split(":")[0], r.cause, r.action, r.attributed_rank) for r in bad} == {
        ("group", "device", "quarantine", 1)}
    assert quarantined == frozenset({1})
    assert same_bits(result, clean_fit(rows, start, 3))
    assert opening.mode == "shipped" or opening.rounds, opening  # once worker 1 is out, passes are placed and reveal


def test_a_worker_hands_back_the_results_it_kept_for_the_pass_without_recomputing():
    calls: list[int] = []

    def fn(chunk: Any, payload: Any) -> tuple[float, float, np.ndarray]:
        calls.append(int(chunk))
        return (1.0, float(chunk), np.full(2, float(chunk)))

    class Acc:
        def __init__(self) -> None:
            self.total = np.zeros(2)

        def combine(self, s: np.ndarray) -> None:
            self.total = self.total + s

        def value(self) -> np.ndarray:
            return self.total

    class Est:
        def accumulator_factory(self) -> Any:
            return type("F", (), {"make": staticmethod(Acc)})()

    chunk_of = int
    entries = apply_chunk_fn(GroupFold(fn, 24, frozenset(), True, "owner:7"), (Est(), None), list(range(24)), chunk_of)
    assert opened_groups(entries, [3]) == [group_of(24, 3)] == [(2, 4)]
    calls.clear()
    revealed = apply_chunk_fn(GroupReveal(fn, "owner:7"), (Est(), None), [2, 3], chunk_of)
    assert calls == [] and [r[1] for r in revealed] == [2.0, 3.0]
    apply_chunk_fn(GroupFold(fn, 24, frozenset(), True, "owner:8"), (Est(), None), [0, 1], chunk_of)  # next pass
    calls.clear()
    apply_chunk_fn(GroupReveal(fn, "owner:7"), (Est(), None), [2, 3], chunk_of)
    assert calls == [2, 3]  # the owner's next pass dropped the old one: computed again
