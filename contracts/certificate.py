"""AdmissionCertificate (what a signed attestation vouches for) and the pure checks the gate runs on it.

A certificate is the predicate of an in-toto Statement carried in a DSSE envelope
(``CertificateEnvelope``) signed with Ed25519; signing and signature checks live in
``verification.attestation`` (contracts import no crypto). ``admission_problems`` is every check
that needs no key: identity, plan family, precision, device kind and communication backend, library
versions, evidence digests recomputed from the embedded evidence, every recorded error within the
recorded tolerance and that tolerance within the policy, every recorded error consistent with its
record's verdict (``NumericsEvidence.largest_passing_error``), every update the executor declares for
the plan covered by a passing record and no record for an update it does not declare, and the issue
time, and the plan's accumulation window (``gradient_accumulation_steps`` and ``microbatches``: a
measured 1 covers only 1, a measured k > 1 covers any size > 1, see ``window_covers``): a signature
alone admits nothing. Each failure starts ``check '<name>' failed:`` so callers and tests can tell which check refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs

from ._checks import enum_frozenset, non_empty_str
from .bounded_json import MAX_SIGNATURES
from .capabilities import BackendCapabilities
from .enums import ParallelAxis
from .errors import NotAdmittedError
from .evidence import NumericsEvidence, Tolerance
from .frozen_mapping import FrozenDict, to_frozen_dict
from .in_situ import InSituMeasurement
from .plan import ParallelPlan
from .protocols import AdmissibleExecutor
from .serialization import OPTIONAL_KEY, SCHEMA_METADATA, content_digest, register_contract

__all__ = [
    "ADMISSION_CHECKS", "DEFAULT_MAX_AGE", "IN_TOTO_PAYLOAD_TYPE", "AdmissionCertificate", "AdmissionContext",
    "CertificateEnvelope", "EnvelopeSignature", "admission_problems", "changed_files", "check_admission",
    "recertify_plan_flag", "window_covers",
]

IN_TOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"
"""DSSE payload type of an in-toto Statement."""

DEFAULT_MAX_AGE = timedelta(days=90)
"""A certificate older than this is refused (re-certify: libraries and machines drift)."""

ADMISSION_CHECKS = (
    "certificate", "signature", "executor", "executor_version", "source_digest", "capabilities", "plan_family",
    "precision", "accumulation", "device_kind", "comm_backend", "library_versions", "evidence_digests", "evidence",
    "declared_updates", "tolerance_policy", "issued_at",
)
"""The names of the gate's checks, as they appear in ``check '<name>' failed:`` reasons."""

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_B64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")
_REQUIRED_LIBRARIES = ("python", "numpy")
_DIGEST_SCHEMA = {SCHEMA_METADATA: {"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"}}


def _failed(check: str, message: str) -> str:
    return f"check '{check}' failed: {message}"


def _iso_time(inst: object, attribute: attrs.Attribute, value: str) -> None:
    non_empty_str(inst, attribute, value)
    try:
        stamp = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"AdmissionCertificate.issued_at={value!r} is not an ISO 8601 time") from None
    if stamp.tzinfo is None:
        raise ValueError(f"AdmissionCertificate.issued_at={value!r} needs a UTC offset, e.g. '+00:00'")


def _digest(inst: object, attribute: attrs.Attribute, value: str) -> None:
    if not isinstance(value, str) or not _DIGEST.fullmatch(value):
        raise ValueError(f"{type(inst).__name__}.{attribute.name}={value!r}; expected 'sha256:<64 lowercase hex>'")


def _digests(inst: object, attribute: attrs.Attribute, value: frozenset[str]) -> None:
    if not value:
        raise ValueError("AdmissionCertificate.evidence_digests is empty; a certificate needs evidence")
    for digest in value:
        _digest(inst, attribute, digest)


def _versions(inst: object, attribute: attrs.Attribute, value: FrozenDict) -> None:
    missing = [name for name in _REQUIRED_LIBRARIES if not value.get(name)]
    if missing:
        raise ValueError(f"AdmissionCertificate.library_versions lacks {missing}; it must name at least "
                         f"{list(_REQUIRED_LIBRARIES)} and every engine the executor loads")
    for name, version in value.items():
        if not isinstance(version, str) or not version:
            raise ValueError(f"AdmissionCertificate.library_versions[{name!r}] must be a non-empty version string")


def _file_digests(inst: object, attribute: attrs.Attribute, value: FrozenDict | None) -> None:
    for name, digest in (value or {}).items():
        if not isinstance(name, str) or not name or not isinstance(digest, str) or not _HEX64.fullmatch(digest):
            raise ValueError(f"AdmissionCertificate.source_files[{name!r}]={digest!r}; expected a relative path "
                             "mapped to 64 lowercase hex (the file's sha256)")


def changed_files(recorded: Mapping[str, str] | None, current: Mapping[str, str] | None) -> str:
    """Which bound files differ between a certificate and the code now (empty when either side records none)."""
    if not recorded or current is None:
        return ""
    changed = sorted(n for n in recorded.keys() & current.keys() if recorded[n] != current[n])
    parts = [f"{label}: {', '.join(names[:10])}{' ...' if len(names) > 10 else ''}" for label, names in (
        ("changed", changed), ("added", sorted(current.keys() - recorded.keys())),
        ("removed", sorted(recorded.keys() - current.keys()))) if names]
    return "; ".join(parts)


def _evidence(values: Iterable[Any]) -> tuple[NumericsEvidence, ...]:
    out = tuple(values)
    for record in out:
        if not isinstance(record, NumericsEvidence):
            raise TypeError(f"AdmissionCertificate.evidence holds {type(record).__name__}, expected NumericsEvidence")
    if not out:
        raise ValueError("AdmissionCertificate.evidence is empty; a certificate embeds the evidence it rests on")
    return out


@register_contract
@attrs.frozen
class AdmissionCertificate:
    """What a signed certificate vouches for: one executor build, one plan family, precision and mesh kind.

    Subject: ``executor``, ``executor_version`` and ``source_digest`` (sha256 over the executor's
    own source files). Predicate: the rest, including the full evidence records.
    """

    executor: str = attrs.field(validator=non_empty_str)
    executor_version: str = attrs.field(validator=non_empty_str)
    source_digest: str = attrs.field(validator=_digest, metadata=_DIGEST_SCHEMA)
    capabilities: BackendCapabilities = attrs.field(validator=attrs.validators.instance_of(BackendCapabilities))
    axis_family: frozenset[ParallelAxis] = attrs.field(converter=enum_frozenset(ParallelAxis))  # type: ignore[misc]  # mypy's attrs plugin reads only named converters
    measured_plan: ParallelPlan = attrs.field(validator=attrs.validators.instance_of(ParallelPlan))
    precision: str = attrs.field(validator=non_empty_str)
    device_kind: str = attrs.field(validator=non_empty_str)
    comm_backend: str = attrs.field(validator=non_empty_str)
    library_versions: FrozenDict = attrs.field(converter=to_frozen_dict, validator=_versions)
    evidence: tuple[NumericsEvidence, ...] = attrs.field(converter=_evidence)
    evidence_digests: frozenset[str] = attrs.field(
        validator=_digests, metadata={SCHEMA_METADATA: {"minItems": 1, "items": _DIGEST_SCHEMA[SCHEMA_METADATA]}})
    tolerance: Tolerance = attrs.field(validator=attrs.validators.instance_of(Tolerance))
    issued_at: str = attrs.field(validator=_iso_time)
    measurement: InSituMeasurement | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(InSituMeasurement)),
        metadata={OPTIONAL_KEY: True})
    """How it was measured in situ, on a launched run's own ranks; None (absent from the document): by the harness
    on a mesh it spawned. Absent in certificates of earlier releases, which keep their ids."""
    source_files: FrozenDict | None = attrs.field(
        default=None, converter=attrs.converters.optional(to_frozen_dict), validator=_file_digests,
        metadata={OPTIONAL_KEY: True})
    """sha256 (64 hex) of each third-party file ``source_digest`` covers, by path relative to their common folder,
    so a refusal can name what changed; None (absent): only built-in code, or a certificate of an earlier release."""

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
        """sha256 of the canonical JSON of the certificate (the Statement's predicate and subject)."""
        return content_digest(self)

    @property
    def issued(self) -> datetime:
        """``issued_at`` as an aware datetime."""
        return datetime.fromisoformat(self.issued_at)


def _keyid(inst: object, attribute: attrs.Attribute, value: str) -> None:
    if not isinstance(value, str) or not _HEX64.fullmatch(value):
        raise ValueError(f"EnvelopeSignature.keyid={value!r}; expected 64 lowercase hex digits")


def _b64(inst: object, attribute: attrs.Attribute, value: str) -> None:
    if not isinstance(value, str) or not value.isascii() or not _B64.fullmatch(value) or len(value) % 4:
        raise ValueError(f"{type(inst).__name__}.{attribute.name} must be standard base64 text")


@register_contract
@attrs.frozen
class EnvelopeSignature:
    """One DSSE signature: the signing key's id and the base64 signature over the PAE of the payload."""

    keyid: str = attrs.field(validator=_keyid, metadata={SCHEMA_METADATA: {"pattern": "^[0-9a-f]{64}$"}})
    sig: str = attrs.field(validator=_b64)


def _payload_type(inst: object, attribute: attrs.Attribute, value: str) -> None:
    if value != IN_TOTO_PAYLOAD_TYPE:
        raise ValueError(f"CertificateEnvelope.payload_type={value!r}; expected {IN_TOTO_PAYLOAD_TYPE!r}")


def _signatures(values: Iterable[Any]) -> tuple[EnvelopeSignature, ...]:
    out = tuple(values)
    if not out:
        raise ValueError("CertificateEnvelope.signatures is empty; an unsigned certificate is not admitted")
    if len(out) > MAX_SIGNATURES:
        raise ValueError(f"CertificateEnvelope.signatures holds {len(out)} signatures, more than the limit of "
                         f"{MAX_SIGNATURES}")
    for sig in out:
        if not isinstance(sig, EnvelopeSignature):
            raise TypeError(f"CertificateEnvelope.signatures holds {type(sig).__name__}, expected EnvelopeSignature")
    return out


@register_contract
@attrs.frozen
class CertificateEnvelope:
    """A DSSE envelope: base64 of an in-toto Statement whose predicate is an ``AdmissionCertificate``."""

    payload_type: str = attrs.field(validator=_payload_type)
    payload: str = attrs.field(validator=_b64)
    signatures: tuple[EnvelopeSignature, ...] = attrs.field(
        converter=_signatures, metadata={SCHEMA_METADATA: {"minItems": 1, "maxItems": MAX_SIGNATURES}})


@attrs.frozen
class AdmissionContext:
    """What the gate compares a certificate against: the run about to start and the policy."""

    device_kind: str = "cpu"
    comm_backend: str = "gloo"
    source_digest: str | None = None
    library_versions: Mapping[str, str] = attrs.field(factory=dict)
    source_files: Mapping[str, str] | None = None
    """Per-file sha256 of the third-party code now (``AdmissionCertificate.source_files``), to name what changed."""
    policy: Callable[[AdmissionCertificate], Tolerance] | None = None
    max_age: timedelta = DEFAULT_MAX_AGE
    now: datetime | None = None


def _identity_problems(cert: AdmissionCertificate, executor: AdmissibleExecutor, plan: ParallelPlan,
                       precision: str, context: AdmissionContext) -> list[str]:
    problems: list[str] = []
    name, version = executor.capabilities.name, str(executor.version)
    if cert.executor != name:
        problems.append(_failed("executor", f"certificate is for executor {cert.executor!r}, not {name!r}"))
    if cert.executor_version != version:
        problems.append(_failed("executor_version", f"certificate is for {name} {cert.executor_version}, "
                                                    f"running {version}"))
    if context.source_digest is not None and cert.source_digest != context.source_digest:
        which = changed_files(cert.source_files, context.source_files)
        problems.append(_failed("source_digest", "the executor's source files changed since the certificate was "
                                f"issued ({cert.source_digest[:19]}... vs {context.source_digest[:19]}...)"
                                + (f"; {which}" if which else "") + "; re-certify the code that runs now"))
    if cert.capabilities != executor.capabilities:
        problems.append(_failed("capabilities", "the executor's capabilities changed since the certificate was issued"))
    if cert.axis_family != plan.axis_family:
        problems.append(_failed("plan_family", f"certificate covers axes "
                                f"{sorted(a.value for a in cert.axis_family) or ['none']}, the plan uses "
                                f"{sorted(a.value for a in plan.axis_family) or ['none']}"))
    if cert.precision != precision:
        problems.append(_failed("precision", f"certificate is for {cert.precision}, the run uses {precision}"))
    if cert.device_kind != context.device_kind:
        problems.append(_failed("device_kind", f"certificate was measured on {cert.device_kind}, the mesh about to "
                                               f"start runs on {context.device_kind}"))
    if cert.comm_backend != context.comm_backend:
        problems.append(_failed("comm_backend", f"certificate was measured over {cert.comm_backend}, the mesh about "
                                                f"to start communicates over {context.comm_backend}"))
    return problems


_WINDOW_FIELDS = ("gradient_accumulation_steps", "microbatches")
"""The plan's accumulation window: what a step does between two commits, which a certificate must have measured."""


def window_covers(measured: int, wanted: int) -> bool:
    """The accumulation rule: a measured window of 1 covers only 1; a measured window > 1 covers any size.

    A window of k > 1 runs the non-commit calls (no gradient reduction) and the commit call; every k > 1
    runs the same two code paths, only more often, and the commit's rescaling is checked at the measured k.
    """
    return wanted == 1 or measured > 1


def recertify_plan_flag(plan: ParallelPlan) -> str:
    """The ``--plan`` value of ``mixle-parallel certify`` that measures ``plan``'s axes and accumulation window."""
    sizes = [f"{axis.value}={plan.size(axis)}" for axis in sorted(plan.axis_family, key=lambda a: a.value)]
    sizes += [f"{name}={getattr(plan, name)}" for name in _WINDOW_FIELDS if getattr(plan, name) > 1]
    return ",".join(sizes) or "dp_replicate=1"


def _accumulation_problems(cert: AdmissionCertificate, plan: ParallelPlan, precision: str) -> list[str]:
    """The plan's accumulation window must have been measured (``window_covers``): by the measured plan and by
    every evidence record (the gate trusts what the evidence says ran, not the plan's label alone)."""
    problems = []
    for name in _WINDOW_FIELDS:
        have = min(getattr(p, name) for p in (cert.measured_plan, *(r.plan for r in cert.evidence)))
        want = getattr(plan, name)
        if not window_covers(have, want):
            problems.append(_failed("accumulation", f"the plan asks for {name}={want}, but the certificate measured "
                                    f"only {name}={have}, so that path was never compared with the reference; "
                                    f"re-certify: `mixle-parallel certify --backend {cert.executor} --plan "
                                    f"{recertify_plan_flag(plan)} --precision {precision}`"))
    return problems


def _looser(tolerance: Tolerance, bound: Tolerance) -> bool:
    """True when ``tolerance`` accepts something ``bound`` would not."""
    if tolerance.bitwise:
        return False
    return bound.bitwise or tolerance.atol > bound.atol or tolerance.rtol > bound.rtol


def _error_problem(record: NumericsEvidence, tol: Tolerance) -> list[str]:
    """The record's own numbers against the certificate's tolerance: a 'passed' that its errors contradict."""
    largest = record.largest_passing_error(tol)
    scale = record.reference_magnitude
    if scale and record.maximum_absolute_error / scale > record.maximum_relative_error * (1 + 1e-9):
        return [_failed("evidence", f"update {record.node_id!r}: max abs error {record.maximum_absolute_error:.3g} "
                                    f"at reference magnitude {scale:.3g} means a relative error of at least "
                                    f"{record.maximum_absolute_error / scale:.3g}, above the recorded max relative "
                                    f"error {record.maximum_relative_error:.3g}; the record contradicts itself")]
    if record.maximum_absolute_error <= largest:
        return []
    described = ("no recorded reference magnitude, so only atol counts" if scale is None
                 else f"reference magnitude {scale:.3g}")
    return [_failed("evidence", f"update {record.node_id!r}: max abs error {record.maximum_absolute_error:.3g} "
                                f"cannot pass atol={tol.atol} rtol={tol.rtol}{' bitwise' if tol.bitwise else ''} "
                                f"({described}: a passing element differs by at most {largest:.3g}); the record's "
                                "verdict contradicts its own numbers")]


def _declared_problems(cert: AdmissionCertificate, executor: AdmissibleExecutor, plan: ParallelPlan) -> list[str]:
    """Every update the executor declares for ``plan`` has a passing record, and no record is for anything else."""
    describe = getattr(executor, "describe_updates", None)
    if describe is None:  # an executor that declares nothing: the harness could not have judged it update by update
        return []
    try:
        declared = [u.node_id for u in describe(plan)]
    except Exception as exc:  # noqa: BLE001 - a plan the executor cannot describe admits nothing
        return [_failed("declared_updates", f"the executor cannot describe its updates for {plan.describe()}: {exc}")]
    recorded = {r.node_id for r in cert.evidence}
    passing = {r.node_id for r in cert.evidence if r.passed}
    problems = [_failed("declared_updates", f"declared update {node!r} of {cert.executor} for {plan.describe()} has "
                        f"{'no passing' if node in recorded else 'no'} evidence record in the certificate")
                for node in declared if node not in passing]
    problems += [_failed("declared_updates", f"evidence record {node!r} is for an update {cert.executor} does not "
                         f"declare for {plan.describe()} (it declares {sorted(set(declared))})")
                 for node in sorted(recorded - set(declared))]
    return problems


def _evidence_problems(cert: AdmissionCertificate, context: AdmissionContext) -> list[str]:
    problems: list[str] = []
    recomputed = frozenset(r.evidence_id for r in cert.evidence)
    if recomputed != cert.evidence_digests:
        problems.append(_failed("evidence_digests", f"{len(cert.evidence_digests ^ recomputed)} digest(s) do not match "
                                                    "the embedded evidence records"))
    tol = cert.tolerance
    for record in cert.evidence:
        where = f"update {record.node_id!r}"
        problems += _error_problem(record, tol)
        if not record.passed:
            problems.append(_failed("evidence", f"{where}: the recorded evidence failed (within_tolerance="
                                    f"{record.within_tolerance}, deterministic={record.deterministic}, "
                                    f"collectives_match={record.collectives_match})"))
        if _looser(record.tolerance, tol) or (tol.bitwise and record.maximum_absolute_error != 0.0):
            problems.append(_failed("evidence", f"{where}: judged with atol={record.tolerance.atol} "
                                    f"rtol={record.tolerance.rtol} (max abs error {record.maximum_absolute_error:.3g}),"
                                    f" looser than the certificate's atol={tol.atol} rtol={tol.rtol}"
                                    f"{' bitwise' if tol.bitwise else ''}"))
        if record.executor != cert.executor or record.precision != cert.precision:
            problems.append(_failed("evidence", f"{where}: measured {record.executor} at {record.precision}, "
                                                f"not {cert.executor} at {cert.precision}"))
        if record.plan.axis_family != cert.axis_family:
            problems.append(_failed("evidence", f"{where}: measured plan {record.plan.describe()} is outside the "
                                                "certified family"))
    if context.policy is not None:
        policy = context.policy(cert)
        if _looser(tol, policy):
            problems.append(_failed("tolerance_policy", f"the certificate's tolerance atol={tol.atol} rtol={tol.rtol}"
                                    f"{' bitwise' if tol.bitwise else ''} is looser than the policy for "
                                    f"{cert.precision} (atol={policy.atol} rtol={policy.rtol}"
                                    f"{' bitwise' if policy.bitwise else ''})"))
    return problems


def _version_problems(cert: AdmissionCertificate, context: AdmissionContext) -> list[str]:
    problems = []
    for library, certified in sorted(cert.library_versions.items()):
        running = context.library_versions.get(library)
        if running is None:
            problems.append(_failed("library_versions", f"certificate was measured with {library} {certified}, "
                                                        f"which is not installed here"))
        elif running != certified:
            problems.append(_failed("library_versions", f"certificate was measured with {library} {certified}, "
                                                        f"running {running}"))
    for library in sorted(set(context.library_versions) - set(cert.library_versions)):
        problems.append(_failed("library_versions", f"the run loads {library} {context.library_versions[library]}, "
                                                    "which the certificate does not name"))
    return problems


def _time_problems(cert: AdmissionCertificate, context: AdmissionContext) -> list[str]:
    now = context.now or datetime.now(UTC)
    issued = cert.issued
    if issued > now + timedelta(minutes=5):
        return [_failed("issued_at", f"certificate claims to be issued at {cert.issued_at}, in the future")]
    if now - issued > context.max_age:
        return [_failed("issued_at", f"certificate was issued at {cert.issued_at}, more than "
                                     f"{context.max_age.days} days ago; re-certify")]
    return []


def admission_problems(
    certificate: AdmissionCertificate | None,
    executor: AdmissibleExecutor,
    plan: ParallelPlan,
    precision: str,
    context: AdmissionContext | None = None,
) -> tuple[str, ...]:
    """Every reason ``certificate`` does not admit ``executor`` for ``plan`` at ``precision`` (signature aside)."""
    if certificate is None:
        return (_failed("certificate", f"no admission certificate for executor {executor.capabilities.name!r} "
                                       f"on plan {plan.describe()} at {precision}"),)
    if not isinstance(certificate, AdmissionCertificate):
        return (_failed("certificate", f"expected an AdmissionCertificate, got {type(certificate).__name__}"),)
    context = context or AdmissionContext()
    return tuple(_identity_problems(certificate, executor, plan, precision, context)
                 + _accumulation_problems(certificate, plan, precision) + _version_problems(certificate, context)
                 + _evidence_problems(certificate, context)
                 + _declared_problems(certificate, executor, plan) + _time_problems(certificate, context))


def check_admission(
    certificate: AdmissionCertificate | None,
    executor: AdmissibleExecutor,
    plan: ParallelPlan,
    precision: str,
    context: AdmissionContext | None = None,
) -> str:
    """Return the certificate id when every check passes, else raise NotAdmittedError with every reason."""
    problems = admission_problems(certificate, executor, plan, precision, context)
    if problems:
        raise NotAdmittedError(problems)
    assert certificate is not None
    return certificate.certificate_id


def evidence_verdict_problems(certificate: AdmissionCertificate) -> tuple[str, ...]:
    """The verdict re-derived from a certificate alone, for an auditor with no executor at hand: every reason its
    embedded evidence does not support it (digests, each record passed and within the certificate's tolerance)."""
    return tuple(_evidence_problems(certificate, AdmissionContext()))
