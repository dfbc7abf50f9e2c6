"""The admission gate executors call before a real mesh starts, and the decision they record.

``require_admission(executor, plan, precision, options, world_size=...)`` decides with an
``AdmissionOptions`` (the certificate or ``admission=`` value, device kind, communication backend,
trust store, automatic certification; its fields may also be passed as keywords) and lets a run
through in one of these modes (``AdmissionDecision.mode``, a ``contracts.AdmissionMode``):

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
    AdmissionMode,
    CertificateEnvelope,
    NotAdmittedError,
    ParallelPlan,
    Tolerance,
    check_admission,
    choose,
    comm_backend_for,
    recertify_plan_flag,
)
from .attestation import (
    current_library_versions,
    executor_source_digest,
    executor_source_files,
    load_certificate,
    open_envelope,
    reissue_hint,
    save_certificate,
)
from .capability import active_harness_capability
from .cert_store import CertificateStore
from .certification import CertificationError, certify
from .harness.tolerance import default_tolerance
from .keys import TrustStore, TrustStoreError

__all__ = [
    "ADMISSION_MODES", "CERTIFICATE_ENV", "AdmissionDecision", "AdmissionOptions", "CertificationError", "certify",
    "current_library_versions", "load_certificate", "require_admission", "save_certificate",
]

CERTIFICATE_ENV = "MIXLE_PARALLEL_CERTIFICATE"
"""Environment variable naming a certificate file the gate uses when none is passed (it must still verify)."""

ADMISSION_MODES: tuple[AdmissionMode, ...] = tuple(AdmissionMode)
"""How a run was let through: a certificate, an explicit opt-out, a single process, the harness
(``contracts.AdmissionMode``'s members; kept under this name for earlier callers)."""

_REQUESTS = ("required", "auto", AdmissionMode.UNVERIFIED)
"""The string values ``admission=`` takes besides a certificate or its path (None: automatic)."""

_log = logging.getLogger(__name__)

AutoCertify = Callable[[], CertificateEnvelope]
"""Certifies the executor on the spot (EM backends); returns the signed envelope."""


def _mode(value: object) -> AdmissionMode:
    """A mode from its member or its string (receipts and ledgers hold the string)."""
    return AdmissionMode(choose(AdmissionMode, value, option="AdmissionDecision.mode"))


@attrs.frozen
class AdmissionDecision:
    """Why a run may proceed; executors copy ``receipt_extra()`` into every receipt and ledger entry."""

    mode: AdmissionMode = attrs.field(converter=_mode)
    certificate_id: str | None = None
    executor: str = ""
    plan: str = ""
    precision: str = ""
    notes: tuple[str, ...] = ()
    signer: str | None = None
    envelope: CertificateEnvelope | None = attrs.field(default=None, eq=False, repr=False)
    probe: str | None = None
    """What the probe of the user's module found at ``prepare`` ("passed: ...", "skipped: <why>"), where one ran."""

    @property
    def certified(self) -> bool:
        """True when a certificate admitted the run."""
        return self.mode is AdmissionMode.CERTIFIED

    @property
    def ledger_link(self) -> str:
        """What ledger entries carry as ``certificate``: the certificate id or 'unverified' (the mode says why)."""
        return self.certificate_id if self.certificate_id is not None else AdmissionMode.UNVERIFIED.value

    def receipt_extra(self) -> dict[str, str]:
        """The keys to put in ``StepReceipt.extra``: admission mode and certificate link (and who vouched)."""
        extra = {"admission": self.mode.value, "certificate": self.ledger_link}
        if self.notes and self.mode is AdmissionMode.VERIFYING:
            extra["admitted_by"] = self.notes[0]
        if self.probe is not None:
            extra["module_probe"] = self.probe
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
                            source_files=executor_source_files(executor),
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


def _readable_envelope(certificate: Any, named_by: str) -> CertificateEnvelope:
    """``_as_envelope``; a ``MIXLE_PARALLEL_CERTIFICATE`` that is not a readable certificate file (missing, a folder,
    a device, a FIFO) is refused as ``NotAdmittedError`` naming it and the variable (the environment is not the
    caller's argument: a run must not fail with an ``OSError`` from deep in the gate because of it)."""
    try:
        return _as_envelope(certificate)
    except OSError as exc:
        if named_by != CERTIFICATE_ENV:
            raise  # a path passed in is the caller's: FileNotFoundError naming it and `mixle-parallel certify`
        raise NotAdmittedError((
            f"check 'certificate' failed: {named_by} names {str(certificate)!r}, which is not a readable "
            f"certificate file ({exc.strerror or exc})",
            f"point {named_by} at a certificate written by `mixle-parallel certify --out cert.json`, or unset it",
        )) from None


def _split(certificate: Any, admission: Any) -> tuple[Any, AdmissionMode | None]:
    """Executors' one-argument form: ``admission=`` may carry the certificate or its path."""
    if admission is None or (isinstance(admission, str) and admission in _REQUESTS):
        return certificate, AdmissionMode.UNVERIFIED if admission == AdmissionMode.UNVERIFIED else None
    path_like = isinstance(admission, str) and (admission.endswith(".json") or os.path.sep in admission)
    if isinstance(admission, (CertificateEnvelope, AdmissionCertificate, os.PathLike)) or path_like:
        if certificate is not None:
            raise ValueError("pass the certificate once: as certificate= or as admission=, not both")
        return admission, None
    raise ValueError(f"admission={admission!r}; expected None (automatic), 'unverified', a signed certificate "
                     "or the path of a certificate document")


def _optional(kind: type | tuple[type, ...]) -> Any:
    return attrs.validators.optional(attrs.validators.instance_of(kind))


@attrs.frozen(kw_only=True)
class AdmissionOptions:
    """How the gate decides for one run (``require_admission``), beside who asks and the world size.

    Every field is optional: with none the gate admits a single CPU process, else a fitting certificate
    from the local store, else refuses naming the ``certify`` command.
    """

    certificate: Any = None
    """A signed ``CertificateEnvelope`` or the path of one (``MIXLE_PARALLEL_CERTIFICATE`` when None)."""
    admission: Any = None
    """None (automatic), ``"unverified"`` (the recorded opt-out), or the certificate / its path."""
    accelerator: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    """The run uses an accelerator (``device_kind`` ``cuda`` unless given): a real mesh even on one process."""
    device_kind: str | None = attrs.field(default=None, validator=_optional(str))
    """The device the run uses (``cpu``, ``cuda``); a certificate must have been measured on the same."""
    comm_backend: str | None = attrs.field(default=None, validator=_optional(str))
    """Its communication backend (default: the executor's ``comm_backend``, else ``comm_backend_for(device)``)."""
    library_versions: Mapping[str, str] | None = attrs.field(default=None, validator=_optional(Mapping))
    """Versions that override the ones this process reports (what the run really loads)."""
    max_age: timedelta = attrs.field(default=DEFAULT_MAX_AGE, validator=attrs.validators.instance_of(timedelta))
    """The oldest certificate admitted."""
    auto_certify: AutoCertify | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.is_callable()))
    """Certifies on the spot when no stored certificate fits (EM backends driven from one process)."""
    certify_command: str | None = attrs.field(default=None, validator=_optional(str))
    """The command a refusal tells the user to run once (default: ``mixle-parallel certify ...``)."""
    trust_store: TrustStore | None = attrs.field(default=None, validator=_optional(TrustStore))
    """The trust store to check signatures against (default: the user's)."""


_OPTION_NAMES = tuple(field.name for field in attrs.fields(AdmissionOptions))


def _admission_options(options: AdmissionOptions | None, keywords: Mapping[str, Any]) -> AdmissionOptions:
    """``options``, or one built at once from the keyword form (the form executors used before the object)."""
    unknown = sorted(set(keywords) - set(_OPTION_NAMES))
    if unknown:
        raise TypeError(f"require_admission() got unknown option(s) {', '.join(unknown)}; it takes "
                        f"AdmissionOptions fields: {', '.join(_OPTION_NAMES)}")
    if options is None:
        return AdmissionOptions(**keywords)
    if not isinstance(options, AdmissionOptions):
        raise TypeError(f"options must be an AdmissionOptions, got {type(options).__name__}")
    if keywords:
        raise TypeError("pass AdmissionOptions or its fields as keywords, not both "
                        f"(got {', '.join(sorted(keywords))})")
    return options


def require_admission(
    executor: AdmissibleExecutor,
    plan: ParallelPlan,
    precision: str,
    options: AdmissionOptions | None = None,
    *,
    world_size: int,
    **keywords: Any,
) -> AdmissionDecision:
    """The admission gate for ``prepare()`` / ``encoded_data()``; raises NotAdmittedError when refused.

    ``options`` (``AdmissionOptions``) says how to decide; its fields may be given as keywords instead
    (``certificate=``, ``admission=``, ``device_kind=``, ...), which build one at once; an unknown keyword is
    a ``TypeError`` naming it.
    """
    opts = _admission_options(options, keywords)
    certificate, mode = _split(opts.certificate, opts.admission)
    device = opts.device_kind or ("cuda" if opts.accelerator else "cpu")
    comm = opts.comm_backend or getattr(executor, "comm_backend", None) or comm_backend_for(device)
    common: dict[str, Any] = {"executor": executor.capabilities.name, "plan": plan.describe(), "precision": precision}
    capability = active_harness_capability()
    if capability is not None:
        return AdmissionDecision(AdmissionMode.VERIFYING, None, notes=(capability.receipt_note,), **common)
    if mode is AdmissionMode.UNVERIFIED:
        _log.warning("running %s on %s at %s WITHOUT admission (admission='unverified')",
                     common["executor"], common["plan"], precision)
        return AdmissionDecision(mode, None, notes=("admission='unverified' requested",), **common)
    named_by = "certificate="
    if certificate is None and os.environ.get(CERTIFICATE_ENV):
        certificate, named_by = os.environ[CERTIFICATE_ENV], CERTIFICATE_ENV
    real_mesh = world_size > 1 or device != "cpu"
    if certificate is None and not real_mesh:
        return AdmissionDecision(AdmissionMode.LOCAL, None, notes=("single process on CPU: no certificate needed",),
                                 **common)
    keys = opts.trust_store or TrustStore()
    context = _context(executor, device, comm, opts.library_versions, opts.max_age)
    where = f"this is a real device mesh (world size {world_size}, {device}/{comm})"
    if certificate is not None:
        try:
            envelope = _readable_envelope(certificate, named_by)
            found, keyid = open_envelope(envelope, keys)
            certificate_id = check_admission(found, executor, plan, precision, context)
        except NotAdmittedError as exc:
            raise NotAdmittedError((*exc.reasons, where)) from None
        return AdmissionDecision(AdmissionMode.CERTIFIED, certificate_id, signer=keyid, envelope=envelope, **common)
    return _automatic(executor, plan, precision, context, keys, opts, where, common)


_RANK_ENV = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
"""Where launchers put a rank's number (torchrun, Open MPI, MPICH/PMI)."""


def _lead_rank() -> bool:
    """True in a job's rank 0, or outside a job: an existing torch process group says, else the launcher's
    variables (torch is not imported here for this)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank()) == 0
    for name in _RANK_ENV:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value) == 0
    return True


def _changed_code_reason(certificate: AdmissionCertificate, reason: str) -> str:
    """Why the stored certificate of this executor no longer fits: its code changed (``reason`` is the
    ``source_digest`` check's, naming the changed files where the certificate records them)."""
    return (f"a certificate of {certificate.executor} is stored ({certificate.certificate_id[:19]}..., issued "
            f"{certificate.issued_at}) but its code digest differs from the code here: {reason}")


def _automatic(executor: AdmissibleExecutor, plan: ParallelPlan, precision: str, context: AdmissionContext,
               keys: TrustStore, opts: AdmissionOptions, where: str, common: dict[str, Any]) -> AdmissionDecision:
    """No certificate given: a fitting one from the local store, else certify on the spot, else refuse."""
    store = CertificateStore(keys.home)
    hit = store.find(executor, plan, precision, context)
    if hit is not None:
        stored, found, keyid = hit
        return AdmissionDecision(AdmissionMode.CERTIFIED, found.certificate_id, signer=keyid, envelope=stored,
                                 notes=(f"certificate from the local store {store.folder}",), **common)
    try:  # the trust store's policy may forbid certifying here (keys policy off / trusted-keys-only)
        refusal = keys.automatic_certification_refusal() if opts.auto_certify is not None else None
    except TrustStoreError as exc:
        raise NotAdmittedError((f"check 'signature' failed: {exc}", where)) from None
    stale = store.changed_code(executor, plan, precision, context)
    if opts.auto_certify is None or refusal is not None:
        command = opts.certify_command or (f"mixle-parallel certify --backend {common['executor']} "
                                      f"--plan {recertify_plan_flag(plan)} --precision {precision} --out cert.json")
        raise NotAdmittedError((
            f"check 'certificate' failed: no trusted certificate in {store.folder} fits {common['executor']} "
            f"on {common['plan']} at {precision} ({context.device_kind}/{context.comm_backend})", where,
            *((_changed_code_reason(*stale),) if stale else ()),
            *((refusal,) if refusal else ()),
            f"run `{command}` once (it stores the certificate where this gate finds it)"))
    again = " again: its code changed since the stored certificate" if stale else ""
    if _lead_rank():  # once per job, not once per rank
        print(f"mixle-parallel: certifying {common['executor']} for {common['plan']} at {precision} on this machine"
              f"{again} (once; stored in {store.folder})", file=sys.stderr, flush=True)
    try:
        envelope = opts.auto_certify()
        found, keyid = open_envelope(envelope, keys)
        certificate_id = check_admission(found, executor, plan, precision, context)
    except (CertificationError, NotAdmittedError) as exc:
        reasons = exc.reasons if isinstance(exc, NotAdmittedError) else (str(exc),)
        raise NotAdmittedError((f"automatic certification of {common['executor']} did not admit the run", *reasons,
                                where)) from None
    store.add(envelope)
    return AdmissionDecision(AdmissionMode.CERTIFIED, certificate_id, signer=keyid, envelope=envelope,
                             notes=("certified on the spot and stored for next time",), **common)


