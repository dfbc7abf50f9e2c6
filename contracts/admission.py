"""AdmissionCertificate and the pure admission check an executor runs before touching a real mesh."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from datetime import datetime

import attrs

from mixle_parallel.contracts._checks import enum_frozenset, non_empty_str, optional_str, str_frozenset
from mixle_parallel.contracts.capabilities import BackendCapabilities
from mixle_parallel.contracts.enums import ParallelAxis
from mixle_parallel.contracts.errors import NotAdmittedError
from mixle_parallel.contracts.evidence import Tolerance
from mixle_parallel.contracts.frozen_mapping import FrozenDict, to_frozen_dict
from mixle_parallel.contracts.plan import ParallelPlan
from mixle_parallel.contracts.protocols import AdmissibleExecutor
from mixle_parallel.contracts.serialization import content_digest, register_contract


def _iso_time(inst: object, attribute: attrs.Attribute, value: str) -> None:
    non_empty_str(inst, attribute, value)
    try:
        stamp = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"AdmissionCertificate.issued_at={value!r} is not an ISO 8601 time") from None
    if stamp.tzinfo is None:
        raise ValueError(f"AdmissionCertificate.issued_at={value!r} needs a UTC offset, e.g. '+00:00'")


def _digests(inst: object, attribute: attrs.Attribute, value: frozenset[str]) -> None:
    if not value:
        raise ValueError("AdmissionCertificate.evidence_digests is empty; a certificate needs evidence")
    for digest in value:
        if not digest.startswith("sha256:") or len(digest) != 71:
            raise ValueError(f"AdmissionCertificate.evidence_digests holds {digest!r}; expected 'sha256:<64 hex>'")


@register_contract
@attrs.frozen
class AdmissionCertificate:
    """Evidence-backed permission for one executor version to run one plan family at one precision.

    Content-addressed (``certificate_id`` is the sha256 of the canonical JSON without the
    signature) and optionally HMAC-signed.
    """

    executor: str = attrs.field(validator=non_empty_str)
    executor_version: str = attrs.field(validator=non_empty_str)
    capabilities: BackendCapabilities = attrs.field(validator=attrs.validators.instance_of(BackendCapabilities))
    axis_family: frozenset[ParallelAxis] = attrs.field(converter=enum_frozenset(ParallelAxis))  # type: ignore[misc]  # mypy's attrs plugin reads only named converters
    measured_plan: ParallelPlan = attrs.field(validator=attrs.validators.instance_of(ParallelPlan))
    precision: str = attrs.field(validator=non_empty_str)
    library_versions: FrozenDict = attrs.field(converter=to_frozen_dict)
    evidence_digests: frozenset[str] = attrs.field(converter=str_frozenset, validator=_digests)
    tolerance: Tolerance = attrs.field(validator=attrs.validators.instance_of(Tolerance))
    issued_at: str = attrs.field(validator=_iso_time)
    signature: str | None = attrs.field(default=None, validator=optional_str)

    def __attrs_post_init__(self) -> None:
        if self.measured_plan.axis_family != self.axis_family:
            raise ValueError(
                "AdmissionCertificate.measured_plan has axes "
                f"{sorted(a.value for a in self.measured_plan.axis_family)}, not the certified family "
                f"{sorted(a.value for a in self.axis_family)}"
            )
        outside = self.axis_family - self.capabilities.axes
        if outside:
            raise ValueError(
                f"AdmissionCertificate certifies axes {sorted(a.value for a in outside)} that the "
                "capabilities do not claim"
            )
        if self.precision not in self.capabilities.precisions:
            raise ValueError(
                f"AdmissionCertificate.precision={self.precision!r} is not among the capabilities' "
                f"{sorted(self.capabilities.precisions)}"
            )
        if self.capabilities.name != self.executor:
            raise ValueError(
                f"AdmissionCertificate.executor={self.executor!r} differs from capabilities.name="
                f"{self.capabilities.name!r}"
            )

    @property
    def certificate_id(self) -> str:
        """sha256 of the canonical JSON of every field but the signature."""
        return content_digest(attrs.evolve(self, signature=None))

    def signed(self, key: bytes) -> AdmissionCertificate:
        """A copy carrying an HMAC-SHA256 of ``certificate_id`` under ``key``."""
        return attrs.evolve(self, signature=_hmac(key, self.certificate_id))

    def signature_valid(self, key: bytes) -> bool:
        """True when the certificate is signed and the signature verifies under ``key``."""
        return self.signature is not None and hmac.compare_digest(self.signature, _hmac(key, self.certificate_id))


def _hmac(key: bytes, message: str) -> str:
    if not isinstance(key, (bytes, bytearray)) or not key:
        raise ValueError("an HMAC key must be non-empty bytes")
    return "hmac-sha256:" + hmac.new(bytes(key), message.encode("utf-8"), hashlib.sha256).hexdigest()


def admission_problems(
    certificate: AdmissionCertificate | None,
    executor: AdmissibleExecutor,
    plan: ParallelPlan,
    precision: str,
    *,
    key: bytes | None = None,
    library_versions: Mapping[str, str] | None = None,
) -> tuple[str, ...]:
    """Every reason ``certificate`` does not admit ``executor`` for ``plan`` at ``precision``."""
    if certificate is None:
        return (f"no admission certificate for executor {executor.capabilities.name!r} "
                f"on plan {plan.describe()} at {precision}",)
    if not isinstance(certificate, AdmissionCertificate):
        return (f"expected an AdmissionCertificate, got {type(certificate).__name__}",)
    problems: list[str] = []
    name, version = executor.capabilities.name, str(executor.version)
    if certificate.executor != name:
        problems.append(f"certificate is for executor {certificate.executor!r}, not {name!r}")
    if certificate.executor_version != version:
        problems.append(f"certificate is for {name} version {certificate.executor_version}, running {version}")
    if certificate.capabilities != executor.capabilities:
        problems.append("the executor's capabilities changed since the certificate was issued")
    if certificate.axis_family != plan.axis_family:
        problems.append(
            f"certificate covers axes {sorted(a.value for a in certificate.axis_family) or ['none']}, "
            f"the plan uses {sorted(a.value for a in plan.axis_family) or ['none']}"
        )
    if certificate.precision != precision:
        problems.append(f"certificate is for precision {certificate.precision}, the run uses {precision}")
    for library, running in sorted((library_versions or {}).items()):
        certified = certificate.library_versions.get(library)
        if certified is not None and certified != running:
            problems.append(f"certificate was measured with {library} {certified}, running {running}")
    if key is not None:
        if certificate.signature is None:
            problems.append("a signing key is configured but the certificate is unsigned")
        elif not certificate.signature_valid(key):
            problems.append("the certificate's signature does not verify under the configured key")
    return tuple(problems)


def check_admission(
    certificate: AdmissionCertificate | None,
    executor: AdmissibleExecutor,
    plan: ParallelPlan,
    precision: str,
    *,
    key: bytes | None = None,
    library_versions: Mapping[str, str] | None = None,
) -> str:
    """Return the certificate id when it admits the run, else raise NotAdmittedError with every reason."""
    problems = admission_problems(
        certificate, executor, plan, precision, key=key, library_versions=library_versions
    )
    if problems:
        raise NotAdmittedError(problems)
    assert certificate is not None
    return certificate.certificate_id


