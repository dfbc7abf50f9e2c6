"""The admission gate executors call before a real mesh starts, and the decision they record.

``require_admission(executor, plan, precision, world_size=..., device_kind=..., comm_backend=...)``
lets a run through in one of these modes (``AdmissionDecision.mode``):

* ``verifying``: the harness's own run, proven by the ``HarnessCapability`` it holds (never by
  the environment); receipts name the holder;
* ``unverified``: the caller passed ``admission="unverified"`` (recorded everywhere);
* ``local``: one process on CPU, with no certificate given;
* ``certified``: a signed certificate (passed, named by ``MIXLE_PARALLEL_CERTIFICATE``, or found
  in the local store; for executors driven from one process, made on the spot by
  ``auto_certify``) whose signature is by a trusted, unrevoked key and that passes every check.

Anything else is a ``NotAdmittedError`` naming each failed check, raised before any worker starts.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import attrs

from ..contracts import (
    DEFAULT_MAX_AGE,
    AdmissibleExecutor,
    AdmissionCertificate,
    AdmissionContext,
    CertificateEnvelope,
    NotAdmittedError,
    ParallelPlan,
    Tolerance,
    check_admission,
)
from .attestation import (
    current_library_versions,
    executor_source_digest,
    load_certificate,
    open_envelope,
    reissue_hint,
    save_certificate,
)
from .capability import active_harness_capability
from .cert_store import CertificateStore
from .certification import CertificationError, certify
from .harness.tolerance import default_tolerance
from .keys import TrustStore

__all__ = [
    "ADMISSION_MODES", "CERTIFICATE_ENV", "AdmissionDecision", "CertificationError", "certify",
    "current_library_versions", "load_certificate", "require_admission", "save_certificate",
]

CERTIFICATE_ENV = "MIXLE_PARALLEL_CERTIFICATE"
"""Environment variable naming a certificate file the gate uses when none is passed (it must still verify)."""

ADMISSION_MODES = ("certified", "unverified", "local", "verifying")
"""How a run was let through: a certificate, an explicit opt-out, a single process, the harness."""

_log = logging.getLogger(__name__)

AutoCertify = Callable[[], CertificateEnvelope]
"""Certifies the executor on the spot (EM backends); returns the signed envelope."""


@attrs.frozen
class AdmissionDecision:
    """Why a run may proceed; executors copy ``receipt_extra()`` into every receipt and ledger entry."""

    mode: str = attrs.field(validator=attrs.validators.in_(ADMISSION_MODES))
    certificate_id: str | None = None
    executor: str = ""
    plan: str = ""
    precision: str = ""
    notes: tuple[str, ...] = ()
    signer: str | None = None
    envelope: CertificateEnvelope | None = attrs.field(default=None, eq=False, repr=False)

    @property
    def certified(self) -> bool:
        """True when a certificate admitted the run."""
        return self.mode == "certified"

    @property
    def ledger_link(self) -> str:
        """What ledger entries carry as ``certificate``: the certificate id or 'unverified' (the mode says why)."""
        return self.certificate_id if self.certificate_id is not None else "unverified"

    def receipt_extra(self) -> dict[str, str]:
        """The keys to put in ``StepReceipt.extra``: admission mode and certificate link (and who vouched)."""
        extra = {"admission": self.mode, "certificate": self.ledger_link}
        if self.notes and self.mode == "verifying":
            extra["admitted_by"] = self.notes[0]
        return extra


def tolerance_policy_for(executor: AdmissibleExecutor) -> Callable[[AdmissionCertificate], Tolerance]:
    """The policy a certificate's tolerance must not exceed: the harness default for its precision and family."""
    family = getattr(executor, "verification_family", "training")

    def policy(certificate: AdmissionCertificate) -> Tolerance:
        try:
            return default_tolerance(certificate.precision, family=family)
        except ValueError:
            return Tolerance.exact(f"no stated policy for {certificate.precision}: only bitwise evidence admits")

    return policy


def _context(executor: AdmissibleExecutor, device_kind: str, comm_backend: str,
             library_versions: Mapping[str, str] | None, max_age: timedelta) -> AdmissionContext:
    versions = dict(current_library_versions(executor))
    versions.update(library_versions or {})
    return AdmissionContext(device_kind=device_kind, comm_backend=comm_backend,
                            source_digest=executor_source_digest(executor), library_versions=versions,
                            policy=tolerance_policy_for(executor), max_age=max_age)


def _as_envelope(certificate: Any) -> CertificateEnvelope:
    if isinstance(certificate, CertificateEnvelope):
        return certificate
    if isinstance(certificate, AdmissionCertificate):
        raise NotAdmittedError(("check 'signature' failed: an unsigned AdmissionCertificate was passed; "
                                + reissue_hint(),))
    if isinstance(certificate, (str, os.PathLike)):
        return load_certificate(certificate)
    raise NotAdmittedError((f"check 'certificate' failed: expected a signed CertificateEnvelope or the path of one, "
                            f"got {type(certificate).__name__}",))


def _split(certificate: Any, admission: Any) -> tuple[Any, str | None]:
    """Executors' one-argument form: ``admission=`` may carry the certificate or its path."""
    if admission is None or (isinstance(admission, str) and admission in ("required", "unverified", "auto")):
        return certificate, None if admission in (None, "auto", "required") else admission
    path_like = isinstance(admission, str) and (admission.endswith(".json") or os.path.sep in admission)
    if isinstance(admission, (CertificateEnvelope, AdmissionCertificate, os.PathLike)) or path_like:
        if certificate is not None:
            raise ValueError("pass the certificate once: as certificate= or as admission=, not both")
        return admission, None
    raise ValueError(f"admission={admission!r}; expected None (automatic), 'unverified', a signed certificate "
                     "or the path of a certificate document")


def require_admission(
    executor: AdmissibleExecutor,
    plan: ParallelPlan,
    precision: str,
    *,
    certificate: Any = None,
    admission: Any = None,
    world_size: int,
    accelerator: bool = False,
    device_kind: str | None = None,
    comm_backend: str | None = None,
    library_versions: Mapping[str, str] | None = None,
    max_age: timedelta = DEFAULT_MAX_AGE,
    auto_certify: AutoCertify | None = None,
    certify_command: str | None = None,
    trust_store: TrustStore | None = None,
) -> AdmissionDecision:
    """The admission gate for ``prepare()`` / ``encoded_data()``; raises NotAdmittedError when refused."""
    certificate, mode = _split(certificate, admission)
    device = device_kind or ("cuda" if accelerator else "cpu")
    comm = comm_backend or getattr(executor, "comm_backend", None) or ("nccl" if device == "cuda" else "gloo")
    common: dict[str, Any] = {"executor": executor.capabilities.name, "plan": plan.describe(), "precision": precision}
    capability = active_harness_capability()
    if capability is not None:
        return AdmissionDecision("verifying", None, notes=(capability.receipt_note,), **common)
    if mode == "unverified":
        _log.warning("running %s on %s at %s WITHOUT admission (admission='unverified')",
                     common["executor"], common["plan"], precision)
        return AdmissionDecision("unverified", None, notes=("admission='unverified' requested",), **common)
    if certificate is None and os.environ.get(CERTIFICATE_ENV):
        certificate = os.environ[CERTIFICATE_ENV]
    real_mesh = world_size > 1 or device != "cpu"
    if certificate is None and not real_mesh:
        return AdmissionDecision("local", None, notes=("single process on CPU: no certificate needed",), **common)
    keys = trust_store or TrustStore()
    context = _context(executor, device, comm, library_versions, max_age)
    where = f"this is a real device mesh (world size {world_size}, {device}/{comm})"
    if certificate is not None:
        try:
            envelope = _as_envelope(certificate)
            found, keyid = open_envelope(envelope, keys)
            certificate_id = check_admission(found, executor, plan, precision, context)
        except NotAdmittedError as exc:
            raise NotAdmittedError((*exc.reasons, where)) from None
        return AdmissionDecision("certified", certificate_id, signer=keyid, envelope=envelope,
                                 **common)
    return _automatic(executor, plan, precision, context, keys, auto_certify, certify_command, where, common)


def _automatic(executor: AdmissibleExecutor, plan: ParallelPlan, precision: str, context: AdmissionContext,
               keys: TrustStore, auto_certify: AutoCertify | None, certify_command: str | None, where: str,
               common: dict[str, Any]) -> AdmissionDecision:
    """No certificate given: a fitting one from the local store, else certify on the spot, else refuse."""
    store = CertificateStore(keys.home)
    hit = store.find(executor, plan, precision, context)
    if hit is not None:
        stored, found, keyid = hit
        return AdmissionDecision("certified", found.certificate_id, signer=keyid, envelope=stored,
                                 notes=(f"certificate from the local store {store.folder}",), **common)
    if auto_certify is None:
        command = certify_command or (f"mixle-parallel certify --backend {common['executor']} "
                                      f"--plan {_plan_flag(plan)} --precision {precision} --out cert.json")
        raise NotAdmittedError((
            f"check 'certificate' failed: no trusted certificate in {store.folder} fits {common['executor']} "
            f"on {common['plan']} at {precision} ({context.device_kind}/{context.comm_backend})", where,
            f"run `{command}` once (it stores the certificate where this gate finds it)"))
    print(f"mixle-parallel: certifying {common['executor']} for {common['plan']} at {precision} on this machine "
          f"(once; stored in {store.folder})", file=sys.stderr, flush=True)
    try:
        envelope = auto_certify()
        found, keyid = open_envelope(envelope, keys)
        certificate_id = check_admission(found, executor, plan, precision, context)
    except (CertificationError, NotAdmittedError) as exc:
        reasons = exc.reasons if isinstance(exc, NotAdmittedError) else (str(exc),)
        raise NotAdmittedError(("automatic certification did not admit the run", *reasons, where)) from None
    store.add(envelope)
    return AdmissionDecision("certified", certificate_id, signer=keyid, envelope=envelope,
                             notes=("certified on the spot and stored for next time",), **common)


def _plan_flag(plan: ParallelPlan) -> str:
    sizes = [f"{axis.value}={plan.size(axis)}" for axis in sorted(plan.axis_family, key=lambda a: a.value)]
    return ",".join(sizes) or "dp_replicate=1"

