"""The EM harness observes the messages a backend hands to its transport (issue 23 item 7).

Before, an EM trial reported one gather per step whenever it had more than one worker, whatever the
backend sent. Now each step's count is read from the runner's transport counter (pipe writes and
reads for ``mp``, thread-pool hand-offs for ``local``, ...), so a backend that sends more or fewer
messages is reported with its real count, and a backend that declares a count is held to it.
"""

from __future__ import annotations

from typing import Any

import pytest

from mixle_parallel.contracts import CollectiveKind, ParallelPlan
from mixle_parallel.executors.estimation.backends.local import LocalChunkRunner
from mixle_parallel.executors.estimation.backends.wire_bytes import WireBytes
from mixle_parallel.executors.estimation.em_pass.chunks import apply_chunk_fn
from mixle_parallel.executors.estimation.handle import handle_from_runner
from mixle_parallel.executors.registry import register_encoded_data_backend, unregister_encoded_data_backend
from mixle_parallel.verification.harness.run import verify

EM2 = ParallelPlan(dp_replicate=2)
PER_STEP = 2 * 8  # the local runner hands each of the workload's 8 chunks to a thread and takes its answer back


class HonestRunner(LocalChunkRunner):
    name = "counts_honest"


class ChattyRunner(LocalChunkRunner):
    """Sends every chunk's task twice (a retry loop that always fires) and keeps the second answer."""

    name = "counts_chatty"

    def map_chunks(self, fn: Any, payload: Any, chunk_ids: Any = None) -> list[Any]:
        super().map_chunks(fn, payload, chunk_ids)
        return super().map_chunks(fn, payload, chunk_ids)


class SilentRunner(LocalChunkRunner):
    """Claims workers but computes every chunk in the driver: nothing is handed to any worker."""

    name = "counts_silent"

    def map_chunks(self, fn: Any, payload: Any, chunk_ids: Any = None) -> list[Any]:
        ids = list(range(len(self._chunks))) if chunk_ids is None else list(chunk_ids)
        return apply_chunk_fn(fn, payload, ids, self._chunks.__getitem__)


def _factory(runner_class: type, declared: int | None) -> Any:
    def factory(data: Any, *, num_workers: int | None = None, **params: Any) -> Any:
        return handle_from_runner(runner_class(num_workers or 1), data, **params)

    factory.encoded_data_options = frozenset({"num_workers"})  # type: ignore[attr-defined]
    factory.planned_workers = lambda options: options.num_workers or 1  # type: ignore[attr-defined]
    factory.worker_processes = False  # type: ignore[attr-defined]
    if declared is not None:
        factory.collectives_per_step = lambda plan: {"stats:data": declared}  # type: ignore[attr-defined]
    return factory


@pytest.fixture
def registered():
    names = []

    def register(runner_class: type, declared: int | None = None) -> str:
        name = f"{runner_class.name}_{len(names)}"
        register_encoded_data_backend(name, _factory(runner_class, declared))
        names.append(name)
        return name

    yield register
    for name in names:
        unregister_encoded_data_backend(name)


def _counts(report) -> list[int]:
    (record,) = report.evidence
    return [c.count for c in record.collectives_observed if c.kind is CollectiveKind.CUSTOM]


def test_wire_bytes_counts_one_message_per_delivery():
    wire = WireBytes()
    wire.count_sent(b"abcd", copies=3)  # a broadcast to three peers
    wire.count_received(b"x", b"yz")  # one blob from each of two peers
    wire.count_message_sent(10)
    assert (wire.sent, wire.received, wire.messages) == (22, 3, 6)


def test_counts_are_observed_and_a_declared_count_is_enforced(registered):
    honest = verify(registered(HonestRunner, declared=PER_STEP), EM2, precision="fp64", workload="gaussian_mixture")
    assert honest.passed, honest.summary()
    steps = 3  # the workload's E-steps (repeat 0 is counted)
    assert _counts(honest) == [steps * PER_STEP]  # not one "gather" per step: what crossed to the threads

    chatty = verify(registered(ChattyRunner), EM2, precision="fp64", workload="gaussian_mixture")
    assert chatty.passed and _counts(chatty) == [steps * 2 * PER_STEP]  # undeclared: reported with its real count
    declared = verify(registered(ChattyRunner, declared=PER_STEP), EM2, precision="fp64", workload="gaussian_mixture")
    assert not declared.passed and "collectives" in declared.failed_checks
    assert any(f"handed {2 * PER_STEP} custom message(s) over ['dp_replicate'] to its transport, the executor "
               f"declares {PER_STEP} per step" in f for f in declared.failures), declared.failures


def test_a_backend_that_hands_nothing_to_its_workers_is_refused(registered):
    silent = verify(registered(SilentRunner), EM2, precision="fp64", workload="gaussian_mixture")
    assert _counts(silent) == []  # before, one gather per step was reported for it
    assert not silent.passed and "collectives" in silent.failed_checks


@pytest.mark.slow
def test_mp_is_held_to_one_request_and_one_reply_per_worker():
    from mixle_parallel.executors.estimation.admission.executor_identity import EMExecutorIdentity

    assert EMExecutorIdentity("mp").collectives_per_step(ParallelPlan(dp_replicate=3)) == {"stats:data": 6}
    report = verify("mp", ParallelPlan(dp_replicate=3), precision="fp64", workload="gaussian_mixture")
    assert report.passed, report.summary()
    assert _counts(report) == [3 * 6]
