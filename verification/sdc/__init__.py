"""Silent-data-corruption audits: replay sampled steps (or EM chunks) and compare digests.

``schedule`` picks the audited steps, ``digest`` hashes what is compared, ``inject`` flips bits on
purpose to prove detection, ``training`` audits training steps, ``em`` audits EM chunk statistics.
The ``digest`` function is not re-exported here, so ``sdc.digest`` stays the module.
"""

from .em import ChunkAudit, EMAuditor, audited_fold
from .inject import BitFlip, FaultInjector, flip_bit
from .schedule import (
    AUDIT_POLICIES,
    DEFAULT_AUDIT_RATE,
    EM_AUDIT_RATE,
    TRAINING_AUDIT_RATE,
    AuditSchedule,
    BackendDefectError,
    SDCDetectedError,
    audit_uniform,
)
from .training import AuditVerdict, TrainingAuditor

__all__ = [
    "AUDIT_POLICIES", "AuditSchedule", "AuditVerdict", "BackendDefectError", "BitFlip", "ChunkAudit",
    "DEFAULT_AUDIT_RATE", "EMAuditor", "EM_AUDIT_RATE", "FaultInjector", "SDCDetectedError", "TRAINING_AUDIT_RATE",
    "TrainingAuditor", "audit_uniform",
    "audited_fold", "flip_bit",
]
