"""``AdmissionCertificate.measurement`` (issue 23 item 1): in-situ certificates say so; old documents unchanged."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings

from mixle_parallel.contracts import (
    AdmissionCertificate,
    ContractError,
    InSituMeasurement,
    from_dict,
    json_schema,
    to_dict,
)
from mixle_parallel.verification.strategies import admission_certificates, in_situ_measurements

MEASURED = InSituMeasurement(launcher="torchrun", world_size=2, workload="mlp", probe="passed",
                             probe_reason="compared", probe_max_abs_error=1e-7, seconds=3.5)


@settings(max_examples=25, deadline=None)
@given(admission_certificates())
def test_a_harness_certificate_has_no_measurement_key_and_keeps_its_id(certificate: AdmissionCertificate) -> None:
    plain = attrs.evolve(certificate, measurement=None)
    document = to_dict(plain)
    assert "measurement" not in document["data"]  # what every earlier release wrote
    assert from_dict(document, AdmissionCertificate) == plain
    measured = attrs.evolve(plain, measurement=MEASURED)
    assert to_dict(measured)["data"]["measurement"]["site"] == "in_situ"
    assert from_dict(to_dict(measured), AdmissionCertificate) == measured
    assert measured.certificate_id != plain.certificate_id  # the measurement is part of what is signed


@settings(max_examples=25, deadline=None)
@given(in_situ_measurements())
def test_measurements_round_trip(measurement: InSituMeasurement) -> None:
    assert from_dict(to_dict(measurement), InSituMeasurement) == measurement


def test_schema_does_not_require_the_later_field() -> None:
    body = json_schema(AdmissionCertificate)["$defs"]["AdmissionCertificate"]
    assert "measurement" in body["properties"] and "measurement" not in body["required"]


@pytest.mark.parametrize("changes, message", [
    ({"probe_max_abs_error": None}, "probe_max_abs_error is set exactly when probe='passed'"),
    ({"probe": "skipped"}, "probe_max_abs_error is set exactly when probe='passed'"),
    ({"probe": "skipped", "probe_max_abs_error": None, "probe_reason": ""}, "needs a probe_reason"),
    ({"probe": "failed", "probe_max_abs_error": None}, "probe='failed'"),
    ({"site": "harness"}, "expected 'in_situ'"),
    ({"world_size": 0}, "world_size"),
    ({"probe_max_abs_error": float("nan")}, "finite"),
])
def test_inconsistent_measurements_are_refused(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        attrs.evolve(MEASURED, **changes)


def test_a_document_with_a_bad_measurement_is_refused() -> None:
    document = to_dict(MEASURED)
    document["data"]["site"] = "anywhere"
    with pytest.raises(ContractError, match="site"):
        from_dict(document, InSituMeasurement)
