"""The harness on real gloo meshes: a correct DDP toy is admitted, a wrong-group toy is rejected with
the failing checks named, EM statistics are judged bitwise, non-determinism is caught."""

from __future__ import annotations

import numpy as np
import pytest

from mixle_parallel.contracts import CapabilityError, ParallelPlan
from mixle_parallel.verification.admission import CertificationError
from mixle_parallel.verification.attestation import read_unverified
from mixle_parallel.verification.harness.collectives import axes_of_group, collective_kind
from mixle_parallel.verification.harness.run import verify
from mixle_parallel.verification.harness.worker import resolve_executor
from tests.verification.toy_executors import PerWorkerEMExecutor, ToyDDPExecutor, ToyEMExecutor, WrongGroupDDPExecutor
from tests.verification.vhelpers import admits


def test_correct_ddp_toy_passes_and_is_certified():
    plan = ParallelPlan(dp_shard=2)
    report = verify(ToyDDPExecutor(), plan, precision="fp32", workload="mlp", trials=1, seed=3)
    assert report.passed, report.summary()
    grad = {u.node_id: u for u in report.updates}["grad:dp_shard"]
    assert grad.has_evidence and grad.determinism_observed and grad.maximum_absolute_error < 1e-5
    evidence = {e.node_id: e for e in report.evidence}["grad:dp_shard"]
    assert [(c.kind.value, [a.value for a in c.axes], c.count) for c in evidence.collectives_observed] == [
        ("all_reduce", ["dp_shard"], 3)]  # one gradient all-reduce per step, counted by the flight recorder
    assert evidence.sample_count == 2 * 3 * 212  # ranks x steps x parameters elements
    cert = report.certify(ToyDDPExecutor())
    assert admits(cert, ToyDDPExecutor(), ParallelPlan(dp_shard=8), "fp32") == read_unverified(cert).certificate_id


def test_wrong_group_toy_is_rejected_with_the_failing_checks_named():
    plan = ParallelPlan(dp_replicate=2, dp_shard=2)
    report = verify(WrongGroupDDPExecutor(), plan, precision="fp32", workload="mlp")
    assert not report.passed
    assert report.failed_checks == {"numerics", "collectives"}
    text = "\n".join(report.failures)
    assert "update 'grad:dp_replicate,dp_shard': check 'numerics' failed" in text
    assert "declared all_reduce over ['dp_replicate', 'dp_shard'] was never observed" in text
    assert "undeclared collectives observed in steps: all_reduce over ['dp_shard']" in text
    with pytest.raises(CertificationError, match="check 'numerics' failed"):
        report.certify(WrongGroupDDPExecutor())


def test_em_statistics_are_judged_on_the_reference_and_bitwise_across_worker_counts():
    plan = ParallelPlan(dp_replicate=3)
    good = verify(ToyEMExecutor(), plan, precision="fp64", workload="gaussian_mixture", trials=2)
    assert good.passed, good.summary()
    assert not good.evidence[0].tolerance.bitwise and good.evidence[0].maximum_relative_error < 1e-12
    assert good.evidence[0].trials == 2
    bad = verify(PerWorkerEMExecutor(), plan, precision="fp64", workload="gaussian_mixture")
    # within the fp64 bound of the one-piece reference, but not the same bits as one worker
    assert bad.failed_checks == {"determinism"}, bad.failures
    assert "with 3 workers differs in bits from 1 worker" in bad.failures[0]
    assert bad.evidence[0].within_tolerance and not bad.evidence[0].deterministic


class NoisyEMExecutor(ToyEMExecutor):
    """Adds unseeded noise: different bits on every run."""

    name = "toy_em_noisy"

    def combine(self, parts, owners):
        total = super().combine(parts, owners)
        return {k: v + np.random.default_rng().uniform(0, 1e-12, v.shape) for k, v in total.items()}


def test_nondeterminism_fails_the_determinism_check():
    report = verify(NoisyEMExecutor(), ParallelPlan(dp_replicate=2), precision="fp64", workload="gaussian_mixture")
    assert "determinism" in report.failed_checks
    assert any("check 'determinism' failed: rank 0: repeats differ" in f for f in report.failures)


def test_em_executor_that_reports_no_collectives_fails_collectives():
    class Silent(ToyEMExecutor):
        name = "toy_em_silent"

        def open_trial(self, *args, **kwargs):
            trial = super().open_trial(*args, **kwargs)
            trial.observed_collectives = None
            return trial

    report = verify(Silent(), ParallelPlan(dp_replicate=2), precision="fp64", workload="gaussian_mixture")
    assert report.failed_checks == {"collectives"} and "reports no collectives" in report.failures[0]


def test_plans_and_arguments_are_checked_before_anything_runs():
    with pytest.raises(CapabilityError, match="does not execute axis tp"):
        verify(ToyDDPExecutor(), ParallelPlan(tp=2), precision="fp32")
    with pytest.raises(CapabilityError, match="precision 'bf16'"):
        verify(ToyDDPExecutor(), ParallelPlan(dp_shard=2), precision="bf16")
    with pytest.raises(ValueError, match="unknown workload"):
        verify(ToyDDPExecutor(), ParallelPlan(dp_shard=2), workload="resnet")
    with pytest.raises(ValueError, match="repeats >= 2"):
        verify(ToyDDPExecutor(), ParallelPlan(dp_shard=2), repeats=1)


def test_executor_specs_resolve_from_strings():
    assert resolve_executor("tests.verification.toy_executors:ToyDDPExecutor").capabilities.name == "toy_ddp"
    with pytest.raises(ValueError, match="package.module:attribute"):
        resolve_executor("tests.verification.toy_executors")
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        resolve_executor("tests.verification.toy_executors:Nope")
    with pytest.raises(TypeError, match="not an executor"):
        resolve_executor("tests.verification.toy_executors:DP_AXES")


def test_axis_mapping_of_process_groups():
    plan = ParallelPlan(dp_shard=2, tp=2)
    assert [a.value for a in axes_of_group(plan, (0, 1))] == ["tp"]
    assert [a.value for a in axes_of_group(plan, (0, 2))] == ["dp_shard"]
    assert [a.value for a in axes_of_group(plan, (0, 1, 2, 3))] == ["dp_shard", "tp"]
    assert axes_of_group(plan, (0, 3)) is None
    assert axes_of_group(plan, (2,)) == ()
    assert [collective_kind(n) for n in ("gloo:all_reduce", "nccl:_reduce_scatter_base", "gloo:allgather",
                                         "gloo:send", "gloo:barrier")] == [
        "all_reduce", "reduce_scatter", "all_gather", "p2p", None]


@pytest.mark.slow
def test_tiny_lm_workload_with_ddp_toy():
    report = verify(ToyDDPExecutor(), ParallelPlan(dp_replicate=2), precision="fp32", workload="tiny_lm")
    assert report.passed, report.summary()


def test_mesh_backend_is_gloo_without_gpus_and_can_be_forced(monkeypatch) -> None:
    import torch

    from mixle_parallel.verification.harness.mesh import process_group_backend

    monkeypatch.delenv("MIXLE_PARALLEL_MESH_BACKEND", raising=False)
    expected = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= 2 else "gloo"
    assert process_group_backend(2) == expected
    monkeypatch.setenv("MIXLE_PARALLEL_MESH_BACKEND", "gloo")
    assert process_group_backend(2) == "gloo"
