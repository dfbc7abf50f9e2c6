"""EM receipts report the pass bytes that crossed process boundaries on dask, ray and spark (mp: core tests;
mpi and torchrun: tests/estimation/backends/test_pass_bytes_spmd.py), measured by each runner on the
serialized payloads it really sent and received, checked against sizes the test computes itself.

Reuses the session's engine fixtures (tests/conftest.py); slow like every engine test."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.estimation.backends import chunk_probes as probes
from tests.estimation.backends import wire_case
from tests.estimation.backends.engine_helpers import by_value

pytestmark = pytest.mark.slow


def _check_both_channels(make_runner: Callable[[bool], Any]) -> None:
    """A driver pass counts its bytes over the holders' direct sockets and over the engine's own RPC."""
    for direct in (True, False):
        runner = make_runner(direct)
        try:
            wire_case.assert_driver_pass(runner, workers=2)
            assert bool(runner._channels) is direct
        finally:
            runner.close()


def test_dask_passes_count_channel_frames_and_rpc_blobs(dask_client):
    from mixle_parallel.executors.estimation.backends.dask import DaskRunner

    by_value(probes)
    wire_case.assert_em_receipts(wire_case.em_receipt_bytes("dask", client=dask_client, num_workers=2))
    _check_both_channels(lambda direct: DaskRunner(dask_client, num_workers=2, direct_channel=direct))


def test_ray_passes_count_channel_frames_and_rpc_blobs(ray_session):
    from mixle_parallel.executors.estimation.backends.ray import RayRunner

    by_value(probes)
    wire_case.assert_em_receipts(wire_case.em_receipt_bytes("ray", num_workers=2))
    _check_both_channels(lambda direct: RayRunner(2, direct_channel=direct))


@pytest.mark.parametrize("direct", [True, False], ids=["served", "job-per-pass"])
def test_spark_passes_count_task_closures_and_collected_records(spark_context, direct):
    from mixle_parallel.executors.estimation.backends.spark import SparkRunner

    by_value(probes)
    wire_case.assert_em_receipts(wire_case.em_receipt_bytes("spark", spark_context=spark_context, num_workers=2,
                                                            direct_channel=direct))
    runner = SparkRunner(spark_context, num_workers=2, direct_channel=direct)
    try:  # served: a request and a reply per serving task; jobs: a task closure and a record per partition
        wire_case.assert_driver_pass(runner, workers=2)
        assert (runner.served_passes > 0) == direct
    finally:
        runner.close()
