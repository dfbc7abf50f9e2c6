"""``calibrate_resources``: time a short workload per device and return resources weighted by measured throughput.

For every device the encoded sample is scored (``score``), run through the E-step (``estep``, alias
``accumulate``) or the E-step plus the M-step (``em``) ``repeats`` times after one untimed warm-up;
the median time gives rows per second. ``backend="local"`` times in this process, ``backend="mp"``
in a spawned worker process (what an ``mp`` worker slot runs in). A device that fails is recorded
with its error and the call raises :class:`ResourceCalibrationError` carrying every result; with
``catalog=`` / ``catalog_path=`` the run is appended to a :class:`CalibrationCatalog` first.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from numbers import Integral
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from ....contracts.calibration import (
    CalibrationCatalog,
    CalibrationRecord,
    DeviceCalibration,
    ResourceCalibrationError,
)
from ....contracts.errors import UnknownMemoryFootprintError
from ....contracts.resources import DeviceSpec, Resources
from ..backends.worker_process import prepare_worker
from ..compat.mixle_interop import adapt_mixle_objects, as_estimator
from ..em_pass.chunks import resolve_encoder
from .memory import estimate_estimator_stat_nbytes, estimate_model_nbytes

__all__ = ["CALIBRATION_BACKENDS", "CalibrationCatalog", "CalibrationRecord", "DeviceCalibration",
           "ResourceCalibrationError", "calibrate_resources"]

CALIBRATION_BACKENDS = ("local", "mp")
_WORKLOADS = {"score": "score", "estep": "estep", "accumulate": "estep", "em": "em"}
_CPU_PRECISIONS = (None, "fp64", "float64")
_SPAWN_HINT = ("; a spawned worker that dies at start-up usually failed to re-import the launching script: keep "
               "its top level behind `if __name__ == \"__main__\":`")


def timed_workload(workload: str, encoded: Any, rows: int, model: Any, estimator: Any,
                   repeats: int) -> tuple[float, ...]:
    """Seconds of ``repeats`` runs of ``workload`` on ``encoded`` (after one untimed warm-up run)."""
    def run() -> None:
        if workload == "score":
            np.sum(model.log_density(encoded))
            return
        acc = estimator.accumulator_factory().make()
        acc.update(encoded, None, model)
        if workload == "em":
            estimator.estimate(float(rows), acc.value())

    run()
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        timings.append(max(time.perf_counter() - start, 1e-12))
    return tuple(timings)


def _positive(value: Any, name: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if int(value) < 1:
        raise ValueError(f"{name} must be >= 1, got {int(value)}")
    return int(value)


def _check_arguments(data: Any, workload: Any, backend: Any, precision: Any, catalog: Any) -> str:
    try:
        rows = len(data)
    except TypeError:
        raise TypeError(f"data must be a sized sequence of rows, got {type(data).__name__}") from None
    if rows == 0:
        raise ValueError("calibrate_resources needs at least one row of data")
    name = _WORKLOADS.get(str(workload).lower())
    if name is None:
        raise ValueError(f"workload={workload!r}; one of {sorted(_WORKLOADS)}")
    if backend not in CALIBRATION_BACKENDS:
        raise ValueError(f"backend={backend!r}; calibration runs on {list(CALIBRATION_BACKENDS)}")
    if precision not in _CPU_PRECISIONS:
        raise ValueError(f"precision={precision!r}: the numpy E-step runs in float64; pass precision=None or 'fp64'")
    if catalog is not None and not isinstance(catalog, CalibrationCatalog):
        raise TypeError(f"catalog must be a CalibrationCatalog, got {type(catalog).__name__}")
    return name


def _objects(model: Any, estimator: Any, encoder: Any, workload: str) -> tuple[Any, Any, Any]:
    """Our protocol's (model, estimator, encoder), mixle objects adapted; the estimator from the model when needed."""
    if model is None:
        raise ValueError("calibrate_resources needs the model whose workload it times (model=)")
    estimator, model, encoder = adapt_mixle_objects(estimator, model, encoder)
    if estimator is None and workload != "score":
        make = getattr(getattr(model, "dist", model), "estimator", None)
        if not callable(make):
            raise ValueError(f"workload={workload!r} needs an estimator: pass estimator= or a model with estimator()")
        estimator = make()
    if estimator is not None:
        estimator = as_estimator(estimator)
    return model, estimator, encoder


def _calibrate_device(device: DeviceSpec, run: Any, rows: int, precision: str | None) -> tuple[DeviceSpec,
                                                                                               DeviceCalibration]:
    if device.kind != "cpu":
        error = (f"the numpy E-step runs on cpu devices; a {device.kind!r} device has no engine here, so calibrate "
                 "it where it runs or give its throughput by hand")
        return device, DeviceCalibration(device.name, False, error=error)
    try:
        timings = run()
    except Exception as exc:  # noqa: BLE001 - a failed device is evidence, recorded with its error
        hint = _SPAWN_HINT if isinstance(exc, BrokenProcessPool) else ""
        return device, DeviceCalibration(device.name, False, error=f"{type(exc).__name__}: {exc}{hint}")
    throughput = rows / statistics.median(timings)
    calibrated = attrs.evolve(device, throughput=throughput,
                              precision=device.precision if precision is None else precision)
    return calibrated, DeviceCalibration(device.name, True, timings, throughput)


def _size_or_none(fn: Any, obj: Any) -> int | None:
    try:
        return int(fn(obj))
    except UnknownMemoryFootprintError:
        return None


def _record(catalog: CalibrationCatalog | None, catalog_path: Any, fields: dict[str, Any]) -> None:
    if catalog is None and catalog_path is None:
        return
    if catalog is None:
        path = Path(os.fspath(catalog_path))
        catalog = CalibrationCatalog.load(path) if path.exists() and path.stat().st_size else CalibrationCatalog()
    catalog.add(CalibrationRecord(**fields, timestamp=time.time()))
    if catalog_path is not None:
        catalog.save(catalog_path, sort_keys=True)


def calibrate_resources(
    data: Sequence[Any],
    model: Any,
    resources: Resources | None = None,
    estimator: Any = None,
    encoder: Any = None,
    sample_size: int = 512,
    repeats: int = 3,
    workload: str = "score",
    precision: str | None = None,
    catalog: CalibrationCatalog | None = None,
    catalog_path: Any = None,
    *,
    backend: str = "local",
) -> Resources:
    """Resources with each device's throughput measured (rows per second of ``workload`` on a sample).

    Raises :class:`ResourceCalibrationError` (with every device's result) when any device fails; an
    unmeasured device is never returned as calibrated.
    """
    name = _check_arguments(data, workload, backend, precision, catalog)
    sample_size, repeats = _positive(sample_size, "sample_size"), _positive(repeats, "repeats")
    resources = Resources.single_cpu() if resources is None else resources
    if not isinstance(resources, Resources):
        raise TypeError(f"resources must be a Resources, got {type(resources).__name__}")
    model, estimator, encoder = _objects(model, estimator, encoder, name)
    rows = min(sample_size, len(data))
    encoded = resolve_encoder(estimator, model, encoder).encode(data[:rows])
    args = (name, encoded, rows, model, estimator, repeats)
    pool = None if backend == "local" else ProcessPoolExecutor(
        max_workers=1, mp_context=multiprocessing.get_context("spawn"), initializer=prepare_worker)
    try:
        if pool is None:
            outcomes = [_calibrate_device(d, lambda: timed_workload(*args), rows, precision)
                        for d in resources.devices]
        else:
            outcomes = [_calibrate_device(d, lambda: pool.submit(timed_workload, *args).result(), rows, precision)
                        for d in resources.devices]
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    calibrated = Resources(tuple(d for d, _ in outcomes))
    results = tuple(r for _, r in outcomes)
    _record(catalog, catalog_path, {
        "model_type": type(getattr(model, "dist", model)).__name__, "workload": name, "resources": calibrated,
        "sample_size": rows, "repeats": repeats, "precision": precision,
        "estimator_type": None if estimator is None else type(getattr(estimator, "inner", estimator)).__name__,
        "row_count": len(data), "model_bytes": _size_or_none(estimate_model_nbytes, model),
        "statistic_bytes": None if estimator is None else _size_or_none(estimate_estimator_stat_nbytes, estimator),
        "device_results": results})
    if not all(r.success for r in results):
        raise ResourceCalibrationError(results, calibrated)
    return calibrated
