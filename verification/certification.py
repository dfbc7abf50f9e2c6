"""Turn passing evidence into a signed certificate: ``certify(evidence, executor=..., plan=..., precision=...)``.

The certificate (``contracts.AdmissionCertificate``) embeds every evidence record, the executor's
source digest, the library versions, device kind and communication backend; it is wrapped in a
DSSE envelope signed with the trust store's Ed25519 key (made on first use) and, unless
``store=False``, kept in the local certificate store where automatic admission finds it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from ..contracts import (
    AdmissibleExecutor,
    AdmissionCertificate,
    CertificateEnvelope,
    InSituMeasurement,
    NumericsEvidence,
    ParallelPlan,
    Tolerance,
)
from .attestation import (
    current_library_versions,
    executor_source_digest,
    executor_source_files,
    sign_certificate,
)
from .cert_store import CertificateStore
from .keys import TrustStore

__all__ = ["CertificationError", "certify"]


class CertificationError(ValueError):
    """Evidence does not support a certificate; the message names each failing update and check."""


def _merged_tolerance(records: list[NumericsEvidence]) -> Tolerance:
    tolerances = {r.tolerance for r in records}
    if len(tolerances) == 1:
        return tolerances.pop()
    loose = [t for t in tolerances if not t.bitwise]
    if not loose:
        return Tolerance.exact()
    return Tolerance(
        atol=max(t.atol for t in loose),
        rtol=max(t.rtol for t in loose),
        source="loosest of: " + " | ".join(sorted(t.source or f"atol={t.atol} rtol={t.rtol}" for t in loose)),
    )


def _record_problems(record: NumericsEvidence, name: str, plan: ParallelPlan, precision: str) -> list[str]:
    where = f"update {record.node_id!r}"
    problems = []
    if record.executor != name:
        problems.append(f"{where}: evidence is for executor {record.executor!r}, not {name!r}")
    if record.plan.axis_family != plan.axis_family:
        problems.append(f"{where}: evidence measured plan {record.plan.describe()}, "
                        f"not the family of {plan.describe()}")
    if record.precision != precision:
        problems.append(f"{where}: evidence measured at {record.precision}, not {precision}")
    if not record.within_tolerance:
        problems.append(
            f"{where}: check 'numerics' failed: max abs error {record.maximum_absolute_error:.3g}, "
            f"max rel error {record.maximum_relative_error:.3g} outside atol={record.tolerance.atol} "
            f"rtol={record.tolerance.rtol}{' (bitwise)' if record.tolerance.bitwise else ''}")
    if not record.deterministic:
        problems.append(f"{where}: check 'determinism' failed: repeated trials gave different bits")
    if not record.collectives_match:
        problems.append(f"{where}: check 'collectives' failed: observed collectives differ from the declaration")
    return problems


def certify(
    evidence: Iterable[NumericsEvidence] | Any,
    *,
    executor: AdmissibleExecutor,
    plan: ParallelPlan,
    precision: str,
    device_kind: str = "cpu",
    comm_backend: str = "gloo",
    tolerance: Tolerance | None = None,
    library_versions: Mapping[str, str] | None = None,
    issued_at: datetime | None = None,
    trust_store: TrustStore | None = None,
    store: bool = True,
    measurement: InSituMeasurement | None = None,
) -> CertificateEnvelope:
    """A signed certificate when every declared update has passing evidence, else ``CertificationError``;
    ``evidence`` is an iterable of ``NumericsEvidence`` or a harness report (anything with an ``evidence``
    attribute); ``measurement`` marks a certificate measured in situ (``in_situ``), None one by the harness.
    """
    records = list(getattr(evidence, "evidence", evidence))
    name = executor.capabilities.name
    problems = [] if records else ["no evidence: run verification.verify(...) first"]
    problems += list(executor.capabilities.problems(plan, precision))
    for record in records:
        if not isinstance(record, NumericsEvidence):
            raise TypeError(f"evidence must hold NumericsEvidence records, got {type(record).__name__}")
        problems += _record_problems(record, name, plan, precision)
    describe = getattr(executor, "describe_updates", None)
    if describe is not None:
        measured = {r.node_id for r in records}
        problems += [f"declared update {u.node_id!r} has no evidence"
                     for u in describe(plan) if u.node_id not in measured]
    if problems:
        raise CertificationError(f"cannot certify {name} for {plan.describe()} at {precision}: " + "; ".join(problems))
    stamp = issued_at or datetime.now(UTC)
    if stamp.tzinfo is None:
        raise ValueError("issued_at needs a timezone (use datetime.now(timezone.utc))")
    certificate = AdmissionCertificate(
        executor=name,
        executor_version=str(executor.version),
        source_digest=executor_source_digest(executor),
        capabilities=executor.capabilities,
        axis_family=plan.axis_family,
        measured_plan=plan,
        precision=precision,
        device_kind=device_kind,
        comm_backend=comm_backend,
        library_versions=dict(library_versions if library_versions is not None else current_library_versions(executor)),
        evidence=tuple(records),
        evidence_digests=frozenset(r.evidence_id for r in records),
        tolerance=tolerance or _merged_tolerance(records),
        issued_at=stamp.isoformat(),
        measurement=measurement,
        source_files=executor_source_files(executor),
    )
    keys = trust_store or TrustStore()
    envelope = sign_certificate(certificate, keys.ensure_signer())
    if store:
        CertificateStore(keys.home).add(envelope)
    return envelope
