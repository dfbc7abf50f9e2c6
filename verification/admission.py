"""Admission: turn passing evidence into a certificate, and the gate executors call before a real mesh.

* ``certify(evidence, executor=..., plan=..., precision=...)`` -> a content-addressed
  ``AdmissionCertificate`` (HMAC-signed when a key is given or configured, see ``keys``).
* ``save_certificate`` / ``load_certificate``: the certificate as a versioned JSON document.
* ``require_admission(executor, plan, precision, certificate=..., admission=..., world_size=...,
  accelerator=...)``: the gate. On a real device mesh (world size > 1 or an accelerator) it needs
  a certificate that ``check_admission`` accepts, else ``NotAdmittedError`` with every reason;
  ``admission="unverified"`` runs anyway and the decision says so; inside ``verifying()`` (the
  harness's own runs) nothing is required.

Environment: ``MIXLE_PARALLEL_CERTIFICATE`` (path of a certificate document used when none is
passed), ``MIXLE_PARALLEL_CERT_KEY_FILE`` / ``MIXLE_PARALLEL_CERT_KEY`` (the HMAC key).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs

from mixle_parallel.contracts import (
    AdmissibleExecutor,
    AdmissionCertificate,
    NotAdmittedError,
    NumericsEvidence,
    ParallelPlan,
    Tolerance,
    check_admission,
    from_json,
    to_json,
)
from mixle_parallel.verification.keys import load_key

__all__ = [
    "ADMISSION_MODES",
    "CERTIFICATE_ENV",
    "AdmissionDecision",
    "CertificationError",
    "certify",
    "current_library_versions",
    "is_verifying",
    "load_certificate",
    "require_admission",
    "save_certificate",
    "verifying",
]

CERTIFICATE_ENV = "MIXLE_PARALLEL_CERTIFICATE"
"""Environment variable naming a certificate file the gate uses when none is passed."""

VERIFYING_ENV = "MIXLE_PARALLEL_VERIFYING"
"""Set to ``1`` in processes the harness starts, so the gate knows they are verification runs."""

ADMISSION_MODES = ("certified", "unverified", "local", "verifying")
"""How a run was let through: a certificate, an explicit opt-out, a single process, the harness."""

_log = logging.getLogger(__name__)
_verifying: contextvars.ContextVar[bool] = contextvars.ContextVar("mixle_parallel_verifying", default=False)


class CertificationError(ValueError):
    """Evidence does not support a certificate; the message names each failing update and check."""


@attrs.frozen
class AdmissionDecision:
    """Why a run may proceed; executors copy ``receipt_extra()`` into every receipt and ledger entry."""

    mode: str = attrs.field(validator=attrs.validators.in_(ADMISSION_MODES))
    certificate_id: str | None = None
    executor: str = ""
    plan: str = ""
    precision: str = ""
    notes: tuple[str, ...] = ()

    @property
    def certified(self) -> bool:
        """True when a certificate admitted the run."""
        return self.mode == "certified"

    @property
    def ledger_link(self) -> str:
        """What ledger entries carry as ``certificate``: the certificate id or 'unverified'."""
        return self.certificate_id if self.certificate_id is not None else "unverified"

    def receipt_extra(self) -> dict[str, str]:
        """The keys to put in ``StepReceipt.extra``: admission mode and certificate link."""
        return {"admission": self.mode, "certificate": self.ledger_link}


# ---- verifying mode ----------------------------------------------------------------------
@contextlib.contextmanager
def verifying() -> Iterator[None]:
    """Run the enclosed code as a verification run: the admission gate lets it through, labelled."""
    token = _verifying.set(True)
    try:
        yield
    finally:
        _verifying.reset(token)


def is_verifying() -> bool:
    """True inside ``verifying()`` or in a process the harness started (``MIXLE_PARALLEL_VERIFYING=1``)."""
    return _verifying.get() or os.environ.get(VERIFYING_ENV) == "1"


# ---- certificate documents ---------------------------------------------------------------
def save_certificate(certificate: AdmissionCertificate, path: str | os.PathLike[str]) -> Path:
    """Write ``certificate`` as a versioned JSON document (indented, sorted keys)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(to_json(certificate, indent=2) + "\n", encoding="utf-8")
    return target


def load_certificate(path: str | os.PathLike[str]) -> AdmissionCertificate:
    """Read a certificate document written by ``save_certificate``."""
    source = Path(path)
    if not source.is_file():
        raise FileNotFoundError(
            f"no certificate at {str(source)!r}; create one with `mixle-parallel certify` or verification.certify"
        )
    return from_json(source.read_text(encoding="utf-8"), AdmissionCertificate)


def current_library_versions() -> dict[str, str]:
    """Versions of the libraries a certificate binds: python, numpy, and torch/mixle when loaded."""
    import platform

    import numpy

    versions = {"python": platform.python_version(), "numpy": numpy.__version__}
    for name in ("torch", "mpi4py", "megatron.core", "mixle"):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__version__", None):
            versions[name] = str(module.__version__)
    return versions


# ---- certify -----------------------------------------------------------------------------
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


def certify(
    evidence: Iterable[NumericsEvidence] | Any,
    *,
    executor: AdmissibleExecutor,
    plan: ParallelPlan,
    precision: str,
    key: bytes | None = None,
    key_file: str | os.PathLike[str] | None = None,
    tolerance: Tolerance | None = None,
    library_versions: Mapping[str, str] | None = None,
    issued_at: datetime | None = None,
) -> AdmissionCertificate:
    """Issue an ``AdmissionCertificate`` when every declared update has passing evidence.

    ``evidence`` is an iterable of ``NumericsEvidence`` or a harness report (anything with an
    ``evidence`` attribute). Raises ``CertificationError`` naming each failing or missing update.
    """
    records = list(getattr(evidence, "evidence", evidence))
    problems: list[str] = []
    name = executor.capabilities.name
    if not records:
        problems.append("no evidence: run verification.verify(...) first")
    problems += list(executor.capabilities.problems(plan, precision))
    for record in records:
        if not isinstance(record, NumericsEvidence):
            raise TypeError(f"evidence must hold NumericsEvidence records, got {type(record).__name__}")
        where = f"update {record.node_id!r}"
        if record.executor != name:
            problems.append(f"{where}: evidence is for executor {record.executor!r}, not {name!r}")
        if record.plan.axis_family != plan.axis_family:
            problems.append(
                f"{where}: evidence measured plan {record.plan.describe()}, not the family of {plan.describe()}"
            )
        if record.precision != precision:
            problems.append(f"{where}: evidence measured at {record.precision}, not {precision}")
        if not record.within_tolerance:
            problems.append(
                f"{where}: check 'numerics' failed: max abs error {record.maximum_absolute_error:.3g}, "
                f"max rel error {record.maximum_relative_error:.3g} outside atol={record.tolerance.atol} "
                f"rtol={record.tolerance.rtol}{' (bitwise)' if record.tolerance.bitwise else ''}"
            )
        if not record.deterministic:
            problems.append(f"{where}: check 'determinism' failed: repeated trials gave different bits")
        if not record.collectives_match:
            problems.append(f"{where}: check 'collectives' failed: observed collectives differ from the declaration")
    describe = getattr(executor, "describe_updates", None)
    if describe is not None:
        measured = {r.node_id for r in records}
        for update in describe(plan):
            if update.node_id not in measured:
                problems.append(f"declared update {update.node_id!r} has no evidence")
    if problems:
        raise CertificationError(f"cannot certify {name} for {plan.describe()} at {precision}: " + "; ".join(problems))
    stamp = issued_at or datetime.now(UTC)
    if stamp.tzinfo is None:
        raise ValueError("issued_at needs a timezone (use datetime.now(timezone.utc))")
    certificate = AdmissionCertificate(
        executor=name,
        executor_version=str(executor.version),
        capabilities=executor.capabilities,
        axis_family=plan.axis_family,
        measured_plan=plan,
        precision=precision,
        library_versions=dict(library_versions if library_versions is not None else current_library_versions()),
        evidence_digests=frozenset(r.evidence_id for r in records),
        tolerance=tolerance or _merged_tolerance(records),
        issued_at=stamp.isoformat(),
    )
    signing_key = key if key is not None else load_key(key_file=key_file, purpose="cert")
    return certificate.signed(signing_key) if signing_key else certificate


# ---- the gate ----------------------------------------------------------------------------
def require_admission(
    executor: AdmissibleExecutor,
    plan: ParallelPlan,
    precision: str,
    *,
    certificate: AdmissionCertificate | str | os.PathLike[str] | None = None,
    admission: str | None = None,
    world_size: int,
    accelerator: bool,
    key: bytes | None = None,
    library_versions: Mapping[str, str] | None = None,
) -> AdmissionDecision:
    """The admission gate for ``prepare()`` / ``encoded_data()``; raises NotAdmittedError when refused.

    ``certificate`` may be a certificate or a path to its document (else ``MIXLE_PARALLEL_CERTIFICATE``);
    ``admission`` is None (require a certificate on a real mesh), ``"unverified"`` (run anyway), or
    the certificate itself (or its path), for executors that take one ``admission=`` argument.
    """
    if isinstance(admission, (AdmissionCertificate, os.PathLike)) or (
        isinstance(admission, str)
        and admission not in ("required", "unverified")
        and (admission.endswith(".json") or os.path.sep in admission)
    ):
        if certificate is not None:
            raise ValueError("pass the certificate once: as certificate= or as admission=, not both")
        certificate, admission = admission, None  # executors' one-argument form: admission=<certificate>
    if admission not in (None, "required", "unverified"):
        raise ValueError(
            f"admission={admission!r}; expected None, 'required', 'unverified', a certificate "
            "or the path of a certificate document"
        )
    name = executor.capabilities.name
    common: dict[str, Any] = {"executor": name, "plan": plan.describe(), "precision": precision}
    if is_verifying():
        return AdmissionDecision("verifying", None, notes=("run by the verification harness",), **common)
    if admission == "unverified":
        _log.warning(
            "running %s on %s at %s WITHOUT admission (admission='unverified')", name, plan.describe(), precision
        )
        return AdmissionDecision("unverified", None, notes=("admission='unverified' requested",), **common)
    if certificate is None and os.environ.get(CERTIFICATE_ENV):
        certificate = os.environ[CERTIFICATE_ENV]
    if certificate is not None and not isinstance(certificate, AdmissionCertificate):
        certificate = load_certificate(certificate)
    real_mesh = world_size > 1 or bool(accelerator)
    if certificate is None and not real_mesh:
        return AdmissionDecision("local", None, notes=("single process on CPU: no certificate needed",), **common)
    if key is None:
        key = load_key(purpose="cert")
    versions = library_versions if library_versions is not None else current_library_versions()
    try:
        certificate_id = check_admission(certificate, executor, plan, precision, key=key, library_versions=versions)
    except NotAdmittedError as exc:
        where = f"world size {world_size}" + (" with an accelerator" if accelerator else "")
        raise NotAdmittedError(tuple(exc.reasons) + (f"this is a real device mesh ({where})",)) from None
    return AdmissionDecision("certified", certificate_id, **common)
