"""Resource calibration evidence (mixle's planner names): per-device timings, records, and their catalog.

A :class:`DeviceCalibration` is one device's measured timings (or its failure), a
:class:`CalibrationRecord` one calibration run over a set of resources, and a
:class:`CalibrationCatalog` the append-only list of records a program keeps on disk (JSON through the
one converter, written atomically). The measuring is ``executors.estimation.calibration``'s job.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Any

import attrs

from ._checks import (
    exact_bool,
    finite_non_negative,
    non_empty_str,
    optional_non_negative_int,
    optional_str,
    positive_int,
    to_float,
    to_optional_float,
    tuple_of,
)
from .resources import Resources
from .serialization import from_dict, from_json, register_contract, to_dict, to_json

__all__ = ["CALIBRATION_WORKLOADS", "CalibrationCatalog", "CalibrationRecord", "DeviceCalibration",
           "ResourceCalibrationError"]

CALIBRATION_WORKLOADS = ("score", "estep", "em")
"""What a calibration times: scoring (log density), the E-step (statistics), or an E-step plus the M-step."""


def _timings(values: Any) -> tuple[float, ...]:
    return tuple(to_float(v) for v in values)


def _positive_timings(inst: Any, attribute: Any, value: tuple[float, ...]) -> None:
    for v in value:
        if isinstance(v, bool) or not isinstance(v, float) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"DeviceCalibration.elapsed_seconds must be finite seconds > 0, got {v!r}")


def _optional_positive_finite(inst: Any, attribute: Any, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{type(inst).__name__}.{attribute.name} must be a finite number > 0 or None, got {value!r}")


@register_contract
@attrs.frozen
class DeviceCalibration:
    """One device's calibration: its measured timings and rows per second, or why it failed."""

    device_name: str = attrs.field(validator=non_empty_str)
    success: bool = attrs.field(validator=exact_bool)
    elapsed_seconds: tuple[float, ...] = attrs.field(default=(), converter=_timings, validator=_positive_timings)
    throughput: float | None = attrs.field(default=None, converter=to_optional_float,
                                           validator=_optional_positive_finite)
    error: str | None = attrs.field(default=None, validator=optional_str)

    def __attrs_post_init__(self) -> None:
        if self.success:
            if not self.elapsed_seconds or self.throughput is None:
                raise ValueError(f"a successful calibration of {self.device_name!r} needs its timings and throughput")
            if self.error is not None:
                raise ValueError(f"a successful calibration of {self.device_name!r} cannot carry an error")
        elif not self.error:
            raise ValueError(f"a failed calibration of {self.device_name!r} must say why (error=)")


def _workload(inst: Any, attribute: Any, value: Any) -> None:
    if value not in CALIBRATION_WORKLOADS:
        raise ValueError(f"CalibrationRecord.workload={value!r}; one of {list(CALIBRATION_WORKLOADS)}")


_device_results = tuple_of(DeviceCalibration, "CalibrationRecord.device_results")


@register_contract
@attrs.frozen
class CalibrationRecord:
    """One calibration run: what was timed on which resources, and each device's result."""

    model_type: str = attrs.field(validator=non_empty_str)
    workload: str = attrs.field(validator=_workload)
    resources: Resources = attrs.field(validator=attrs.validators.instance_of(Resources))
    sample_size: int = attrs.field(validator=positive_int)
    repeats: int = attrs.field(validator=positive_int)
    precision: str | None = attrs.field(default=None, validator=optional_str)
    estimator_type: str | None = attrs.field(default=None, validator=optional_str)
    row_count: int | None = attrs.field(default=None, validator=optional_non_negative_int)
    model_bytes: int | None = attrs.field(default=None, validator=optional_non_negative_int)
    statistic_bytes: int | None = attrs.field(default=None, validator=optional_non_negative_int)
    timestamp: float = attrs.field(default=0.0, converter=to_float, validator=finite_non_negative)
    device_results: tuple[DeviceCalibration, ...] = attrs.field(default=(), converter=_device_results)  # type: ignore[misc]  # a named tuple_of converter

    def __attrs_post_init__(self) -> None:
        names = [d.name for d in self.resources.devices]
        seen: set[str] = set()
        for result in self.device_results:
            if result.device_name not in names:
                raise ValueError(f"CalibrationRecord has a result for {result.device_name!r}, which is not one of "
                                 f"its resources {names}")
            if result.device_name in seen:
                raise ValueError(f"CalibrationRecord has two results for {result.device_name!r}")
            seen.add(result.device_name)

    @property
    def fully_successful(self) -> bool:
        """Whether every device of the resources has a successful result."""
        return len(self.device_results) == len(self.resources.devices) and all(r.success for r in self.device_results)

    def to_dict(self) -> dict[str, Any]:
        """The versioned JSON document."""
        return to_dict(self)

    @classmethod
    def from_dict(cls, payload: dict[str, Any]) -> CalibrationRecord:
        """Inverse of ``to_dict``."""
        return from_dict(payload, cls)


_records = tuple_of(CalibrationRecord, "CalibrationCatalog.records")


@register_contract
@attrs.define
class CalibrationCatalog:
    """Append-only catalog of calibration records (``add`` appends in place, as mixle's does)."""

    records: tuple[CalibrationRecord, ...] = attrs.field(default=(), converter=_records)  # type: ignore[misc]  # a named tuple_of converter

    def add(self, record: CalibrationRecord) -> CalibrationRecord:
        """Append ``record`` and return it."""
        if not isinstance(record, CalibrationRecord):
            raise TypeError(f"add() takes a CalibrationRecord, got {type(record).__name__}")
        self.records = (*self.records, record)
        return record

    def latest(self, model_type: str | None = None, workload: str | None = None,
               precision: str | None = None) -> CalibrationRecord | None:
        """The newest record matching every given filter (``accumulate`` means ``estep``), or None."""
        wanted = None if workload is None else ("estep" if str(workload).lower() == "accumulate"
                                                else str(workload).lower())
        for record in sorted(self.records, key=lambda r: r.timestamp, reverse=True):
            if ((model_type is None or record.model_type == model_type)
                    and (wanted is None or record.workload == wanted)
                    and (precision is None or record.precision == precision)):
                return record
        return None

    def resources_for(self, model_type: str | None = None, workload: str | None = None,
                      precision: str | None = None) -> Resources | None:
        """The calibrated resources of the newest matching record, None unless every device succeeded."""
        record = self.latest(model_type, workload, precision)
        return record.resources if record is not None and record.fully_successful else None

    def to_dict(self) -> dict[str, Any]:
        """The versioned JSON document."""
        return to_dict(self)

    @classmethod
    def from_dict(cls, payload: dict[str, Any]) -> CalibrationCatalog:
        """Inverse of ``to_dict``."""
        return from_dict(payload, cls)

    def to_json(self, **kwargs: Any) -> str:
        """Serialize; ``kwargs`` go to ``json.dumps``."""
        return to_json(self, **kwargs)

    @classmethod
    def from_json(cls, text: str) -> CalibrationCatalog:
        """Inverse of ``to_json``."""
        return from_json(text, cls)

    def save(self, path: str | os.PathLike[str], **kwargs: Any) -> Path:
        """Write the catalog to ``path`` atomically (a temporary file in the same folder, fsync, rename)."""
        target = Path(path).absolute()
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as stream:
                stream.write(self.to_json(**kwargs))
                stream.flush()
                os.fsync(stream.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return target

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CalibrationCatalog:
        """Read a catalog written by ``save``."""
        return cls.from_json(Path(path).read_text(encoding="utf-8"))


class ResourceCalibrationError(RuntimeError):
    """One or more devices failed the calibration workload; ``results`` and ``resources`` hold the evidence."""

    def __init__(self, results: tuple[DeviceCalibration, ...], resources: Resources) -> None:
        self.results = tuple(results)
        self.resources = resources
        failed = [f"{r.device_name} ({r.error})" for r in self.results if not r.success]
        super().__init__(f"resource calibration failed for device(s): {', '.join(failed)}; fix or drop those "
                         "devices from the Resources, or pass their throughput by hand")
