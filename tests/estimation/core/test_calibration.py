"""calibrate_resources: real timed workloads per device (local and mp), the catalog's JSON round trip, failures."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mixle_parallel.contracts import (
    CalibrationCatalog,
    CalibrationRecord,
    ContractError,
    DeviceCalibration,
    DeviceSpec,
    ResourceCalibrationError,
    Resources,
)
from mixle_parallel.executors.estimation import (
    GaussianDistribution,
    MixtureDistribution,
    calibrate_resources,
    plan,
)


def _mixture() -> MixtureDistribution:
    return MixtureDistribution([GaussianDistribution(-4.0, 1.0), GaussianDistribution(5.0, 1.5)], [0.5, 0.5])


class _BrokenModel:
    """A model whose E-step fails: calibration must record the failure, not a throughput."""

    def encoder(self):
        return _mixture().encoder()

    def log_density(self, encoded):
        raise ArithmeticError("scoring kernel failed")


@pytest.mark.parametrize("workload", ["score", "estep", "accumulate", "em"])
def test_local_calibration_measures_every_device(gmm_1d: np.ndarray, workload: str) -> None:
    catalog = CalibrationCatalog()
    out = calibrate_resources(gmm_1d, _mixture(), Resources.local(2), sample_size=400, repeats=3, workload=workload,
                              catalog=catalog)
    record = catalog.latest()
    assert record is not None and record.fully_successful and record.sample_size == 400 and record.repeats == 3
    assert record.workload == ("estep" if workload == "accumulate" else workload)
    for device, result in zip(out.devices, record.device_results):
        assert result.success and len(result.elapsed_seconds) == 3
        assert device.throughput == pytest.approx(400 / float(np.median(result.elapsed_seconds)))
    assert record.model_bytes == 2 * 2 * 8 + 2 * 2 * 8  # two Gaussians (mean, sd) + weights and log weights
    assert record.row_count == len(gmm_1d) and catalog.resources_for(workload=workload) == out


def test_mp_calibration_times_in_a_worker_process_and_the_weights_drive_a_fit(gmm_1d: np.ndarray, tmp_path) -> None:
    path = tmp_path / "calibration.json"
    calibrated = calibrate_resources(gmm_1d, _mixture(), Resources.local(2), workload="estep", backend="mp",
                                     catalog_path=path)
    loaded = CalibrationCatalog.load(path)
    assert len(loaded.records) == 1 and loaded.records[0].resources == calibrated
    assert all(d.throughput > 1.0 for d in calibrated.devices)  # measured rows/s, not the default weight 1.0
    # a second run appends to the same file
    calibrate_resources(gmm_1d, _mixture(), Resources.single_cpu(), workload="score", catalog_path=path)
    assert [r.workload for r in CalibrationCatalog.load(path).records] == ["estep", "score"]
    placement = plan(gmm_1d, model=_mixture(), resources=calibrated, num_chunks=64)  # the planner weighs by them
    share = calibrated.devices[0].throughput / calibrated.total_throughput
    assert placement.shards[0].stop - placement.shards[0].start == pytest.approx(share * len(gmm_1d), abs=100)


def test_a_failing_device_is_recorded_and_raises(gmm_1d: np.ndarray) -> None:
    resources = Resources((DeviceSpec("cpu:0"), DeviceSpec("cuda:0", "cuda", 0)))
    catalog = CalibrationCatalog()
    with pytest.raises(ResourceCalibrationError, match="cuda:0") as info:
        calibrate_resources(gmm_1d, _mixture(), resources, catalog=catalog)
    ok, failed = info.value.results
    assert ok.success and not failed.success and "cuda" in failed.error
    assert info.value.resources.devices[1].throughput == 1.0  # the unmeasured device keeps its declared weight
    assert not catalog.latest().fully_successful and catalog.resources_for() is None
    with pytest.raises(ResourceCalibrationError, match="ArithmeticError: scoring kernel failed"):
        calibrate_resources(gmm_1d, _BrokenModel(), Resources.single_cpu())


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"workload": "train"}, ValueError, "workload='train'"),
    ({"backend": "spark"}, ValueError, "backend='spark'"),
    ({"sample_size": 0}, ValueError, "sample_size must be >= 1"),
    ({"repeats": True}, TypeError, "repeats must be an int"),
    ({"precision": "fp16"}, ValueError, "float64"),
    ({"catalog": {}}, TypeError, "CalibrationCatalog"),
])
def test_bad_arguments_are_refused_before_timing(gmm_1d: np.ndarray, kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        calibrate_resources(gmm_1d, _mixture(), **kwargs)
    with pytest.raises(ValueError, match="at least one row"):
        calibrate_resources([], _mixture())


def test_catalog_round_trips_through_json_and_filters(tmp_path) -> None:
    res = Resources.local(2)
    ok = DeviceCalibration("cpu:0", True, (0.01, 0.02, 0.015), 2000.0)
    bad = DeviceCalibration("cpu:1", False, error="boom")
    old = CalibrationRecord("Mixture", "estep", res, 64, 3, timestamp=1.0, device_results=(ok, bad))
    new = CalibrationRecord("Mixture", "estep", res, 64, 3, "fp64", timestamp=2.0, device_results=(ok,))
    catalog = CalibrationCatalog((old,))
    assert catalog.add(new) is new and catalog.records == (old, new)
    assert CalibrationCatalog.from_json(catalog.to_json()) == catalog
    assert CalibrationCatalog.load(catalog.save(tmp_path / "sub" / "c.json")) == catalog
    assert CalibrationRecord.from_dict(new.to_dict()) == new
    assert catalog.latest(workload="accumulate") is new and catalog.latest(precision=None) is new
    assert catalog.latest(model_type="Other") is None
    assert catalog.resources_for("Mixture") is None  # newest record covers one of two devices
    document = json.loads(catalog.to_json())
    document["data"]["records"][0]["device_results"][0]["throughput"] = -1.0
    with pytest.raises(ContractError, match="throughput"):
        CalibrationCatalog.from_json(json.dumps(document))


def test_calibration_records_check_their_evidence() -> None:
    with pytest.raises(ValueError, match="needs its timings"):
        DeviceCalibration("cpu:0", True)
    with pytest.raises(ValueError, match="must say why"):
        DeviceCalibration("cpu:0", False)
    with pytest.raises(ValueError, match="finite seconds"):
        DeviceCalibration("cpu:0", True, (0.0,), 1.0)
    with pytest.raises(ValueError, match="not one of its resources"):
        CalibrationRecord("M", "em", Resources.single_cpu(), 1, 1,
                          device_results=(DeviceCalibration("gpu:9", False, error="x"),))


def test_mixle_objects_calibrate_through_the_interop(gmm_1d: np.ndarray) -> None:
    stats = pytest.importorskip("mixle.stats", reason="the mixle extra (mixle==0.8.2) is not installed")
    mixle_model = stats.MixtureDistribution([stats.GaussianDistribution(-4.0, 1.0),
                                             stats.GaussianDistribution(5.0, 1.5)], [0.5, 0.5])
    catalog = CalibrationCatalog()
    out = calibrate_resources(gmm_1d, mixle_model, Resources.local(2), workload="estep", catalog=catalog)
    record = catalog.latest()
    assert record.fully_successful and all(d.throughput > 1.0 for d in out.devices)
    assert (record.model_type, record.estimator_type) == ("MixtureDistribution", "MixtureEstimator")
    assert record.model_bytes == 2 * 2 * 8 + 2 * 2 * 8  # through mixle's family table (model_decomposition)
    assert record.statistic_bytes is not None and record.statistic_bytes > 0
