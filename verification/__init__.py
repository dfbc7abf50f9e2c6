"""Verification: evidence machinery that works on executor objects typed by the contracts' protocols.

Nothing here imports torch at import time; the harness, the workloads and the torch helpers of the
SDC audit import it when they run.
"""

from .admission import (
    ADMISSION_MODES,
    CERTIFICATE_ENV,
    AdmissionDecision,
    CertificationError,
    certify,
    current_library_versions,
    is_verifying,
    load_certificate,
    require_admission,
    save_certificate,
    verifying,
)
from .cli import main_certify, main_verify
from .conformance import CHECKS, ConformanceFailure, main_conformance, run_conformance
from .harness import VerificationReport, verify
from .keys import KEY_ENV, load_key
from .ledger import Ledger, LedgerEntry, LedgerError, read_ledger, truncate_torn_tail
from .ledger_audit import LedgerFault, LedgerReport, main_audit, verify_ledger
from .mesh import MeshError, run_on_gloo_mesh
from .sdc_digest import digest
from .sdc_em import ChunkAudit, EMAuditor, audited_fold
from .sdc_inject import BitFlip, FaultInjector, flip_bit
from .sdc_training import (
    DEFAULT_AUDIT_RATE,
    AuditSchedule,
    AuditVerdict,
    SDCDetectedError,
    TrainingAuditor,
)
from .tolerance import compare, default_tolerance, tolerance_policy
from .workloads import BUILTIN_WORKLOADS, GaussianMixtureWorkload, MLPWorkload, TinyLMWorkload

__all__ = [
    "ADMISSION_MODES", "AdmissionDecision", "AuditSchedule", "AuditVerdict", "BUILTIN_WORKLOADS", "BitFlip",
    "CERTIFICATE_ENV", "CHECKS", "CertificationError", "ChunkAudit", "ConformanceFailure", "DEFAULT_AUDIT_RATE",
    "EMAuditor", "FaultInjector", "GaussianMixtureWorkload", "KEY_ENV", "Ledger", "LedgerEntry", "LedgerError",
    "LedgerFault", "LedgerReport", "MLPWorkload", "MeshError", "SDCDetectedError", "TinyLMWorkload",
    "TrainingAuditor", "VerificationReport", "audited_fold", "certify", "compare", "current_library_versions",
    "default_tolerance", "digest", "flip_bit", "is_verifying", "load_certificate", "load_key", "main_audit",
    "main_certify", "main_conformance", "main_verify", "read_ledger", "require_admission", "run_conformance", "run_on_gloo_mesh",
    "save_certificate", "tolerance_policy", "truncate_torn_tail", "verify", "verify_ledger", "verifying",
]
