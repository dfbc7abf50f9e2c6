"""``certify_in_situ`` in one process (issue 23 item 1): the gather, judge, sign and broadcast path, fast.

A stand-in group of two "ranks" hands rank 0 its own trials twice (what two honest ranks of a
``local`` EM job would send); the real multi-process runs are in tests/launchers, tests/megatron and
tests/estimation/backends (``-m slow``). A rank that reports a failure, a failed probe of the module and
a group of the wrong size are refused with the reason; nothing is signed.
"""

from __future__ import annotations

from typing import Any

import pytest

from mixle_parallel.contracts import ParallelPlan
from mixle_parallel.executors.registry import verification_target
from mixle_parallel.verification.attestation import open_envelope
from mixle_parallel.verification.certification import CertificationError
from mixle_parallel.verification.harness.worker import resolve_executor
from mixle_parallel.verification.in_situ import InSituRequest, ProbeOutcome, certify_in_situ
from mixle_parallel.verification.keys import TrustStore


class TwoRanks:
    """Rank 0 of a two-rank group whose rank 1 sends ``other(mine)``; broadcasts return rank 0's value."""

    rank, size = 0, 2

    def __init__(self, other: Any = None) -> None:
        self.other = other or (lambda mine: mine)

    def gather(self, value: Any) -> list[Any]:
        return [value, self.other(value)]

    def broadcast(self, value: Any) -> Any:
        return value


@pytest.fixture
def trust(tmp_path) -> TrustStore:
    return TrustStore(tmp_path / "home")


def _request(trust: TrustStore, group: Any, **changes: Any) -> InSituRequest:
    fields: dict[str, Any] = dict(executor=resolve_executor(verification_target("local")),
                                  plan=ParallelPlan(dp_replicate=2), precision="fp64", device_kind="cpu",
                                  comm_backend="threads", launcher="test", workload="gaussian_mixture", group=group,
                                  traced=False, trust_store=trust)
    fields.update(changes)
    return InSituRequest(**fields)


def test_two_honest_ranks_get_a_signed_in_situ_certificate(trust: TrustStore) -> None:
    envelope = certify_in_situ(_request(trust, TwoRanks()))
    certificate, _ = open_envelope(envelope, trust)
    measurement = certificate.measurement
    assert measurement is not None and measurement.site == "in_situ"
    assert (measurement.world_size, measurement.launcher, measurement.probe) == (2, "test", "not_applicable")
    assert certificate.comm_backend == "threads" and [e.node_id for e in certificate.evidence] == ["stats:data"]
    assert any("no comparison with one worker" in note for note in certificate.evidence[0].notes)
    assert not (trust.home / "certificates").exists()  # the gate stores it, after every rank checked it


def test_a_rank_reporting_a_failure_refuses_the_certificate(trust: TrustStore) -> None:
    broken = TwoRanks(lambda mine: {**mine, "runs": None, "problem": "rank 1: the reference workload failed: boom"})
    with pytest.raises(CertificationError, match="rank 1: the reference workload failed: boom"):
        certify_in_situ(_request(trust, broken))


def test_a_rank_with_other_statistics_fails_numerics(trust: TrustStore) -> None:
    def skewed(mine: dict[str, Any]) -> dict[str, Any]:
        runs = [{**run, "steps": [{**step, "observables": {node: {k: v * 1.01 for k, v in values.items()}
                                                           for node, values in step["observables"].items()}}
                                  for step in run["steps"]]} for run in mine["runs"]]
        return {**mine, "runs": runs}

    with pytest.raises(CertificationError, match="check 'determinism' failed|check 'numerics' failed"):
        certify_in_situ(_request(trust, TwoRanks(skewed)))


def test_a_failed_probe_refuses_the_certificate(trust: TrustStore) -> None:
    probe = lambda: ProbeOutcome("failed", "first.weight (max abs error 0.5)")  # noqa: E731
    with pytest.raises(CertificationError, match="check 'probe' failed: .*first.weight"):
        certify_in_situ(_request(trust, TwoRanks(), probe=probe))


def test_a_group_of_another_size_is_refused(trust: TrustStore) -> None:
    with pytest.raises(CertificationError, match="needs 4 ranks; the process group has 2"):
        certify_in_situ(_request(trust, TwoRanks(), plan=ParallelPlan(dp_replicate=4)))


def test_an_error_while_judging_is_a_refusal_every_rank_receives(trust: TrustStore) -> None:
    answers: list[Any] = []

    class Recording(TwoRanks):
        def broadcast(self, value: Any) -> Any:
            answers.append(value)
            return value

    garbled = Recording(lambda mine: {**mine, "runs": [{"seed": 0, "repeat": 0, "steps": [None]}]})
    with pytest.raises(CertificationError, match="judging the in-situ measurement failed on rank 0"):
        certify_in_situ(_request(trust, garbled))
    assert answers and answers[0][0] == "refused"  # broadcast, not raised on rank 0 alone


def test_a_rank_reporting_fewer_steps_than_the_reference_is_refused(trust: TrustStore) -> None:
    truncated = TwoRanks(lambda mine: {**mine, "runs": [{**run, "steps": run["steps"][:1]} for run in mine["runs"]]})
    with pytest.raises(CertificationError, match=r"check 'observables' failed: rank 1 reported 1 of the reference's"):
        certify_in_situ(_request(trust, truncated))


def test_a_rank_without_its_repeat_is_refused(trust: TrustStore) -> None:
    first_only = TwoRanks(lambda mine: {**mine, "runs": [run for run in mine["runs"] if not run["repeat"]]})
    with pytest.raises(CertificationError, match=r"rank 1 reported no first run and repeat for seed"):
        certify_in_situ(_request(trust, first_only))
