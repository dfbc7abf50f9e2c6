"""Contracts: pure data and rules (attrs/cattrs/stdlib only), shared by every executor."""

from .bounded_json import DocumentLimitError, DocumentLimits
from .calibration import (
    CALIBRATION_WORKLOADS,
    CalibrationCatalog,
    CalibrationRecord,
    DeviceCalibration,
    ResourceCalibrationError,
)
from .capabilities import BackendCapabilities
from .certificate import (
    ADMISSION_CHECKS,
    DEFAULT_MAX_AGE,
    IN_TOTO_PAYLOAD_TYPE,
    AdmissionCertificate,
    AdmissionContext,
    CertificateEnvelope,
    EnvelopeSignature,
    admission_problems,
    check_admission,
    recertify_plan_flag,
    window_covers,
)
from .enums import (
    ALL_AXES,
    DERIVED_AXES,
    EM_AUDIT_POLICIES,
    KNOWN_PRECISIONS,
    PHYSICAL_AXES,
    TRAINING_AUDIT_POLICIES,
    AdmissionMode,
    AuditPolicy,
    CollectiveKind,
    ParallelAxis,
    PayloadKind,
    StateLayout,
    choose,
    comm_backend_for,
)
from .errors import (
    CapabilityError,
    ContractError,
    ContractTypeError,
    MissingExtraError,
    NotAdmittedError,
    UnknownBackendError,
    UnknownMemoryFootprintError,
    UnusedParametersError,
)
from .estimation import (
    Accumulator,
    AccumulatorFactory,
    EncodedDataHandle,
    EncodedFold,
    Encoder,
    Estimator,
    MemorySized,
    Model,
    StatisticFormatError,
    canonical_statistic_bytes,
    statistic_digest,
    statistics_equal,
)
from .evidence import NumericsEvidence, ObservedCollective, SDCAuditRecord, Tolerance
from .frozen_mapping import FrozenDict
from .harness_protocol import (
    VERIFICATION_LAUNCHES,
    EstimationWorkload,
    TrainingWorkload,
    VerifiableExecutor,
    VerificationTrial,
)
from .in_situ import IN_SITU_PROBE_OUTCOMES, InSituMeasurement
from .placement import (
    ComponentShard,
    DeviceCapacityError,
    ModelShard,
    ModelShardingPlan,
    Placement,
    PlacementShard,
    RowShard,
)
from .plan import (
    MeshCoordinate,
    MeshShape,
    ParallelPlan,
    WorkerTopologyAttestation,
    attest_worker_coordinate,
)
from .protocols import (
    AdmissibleExecutor,
    DistributedTrainingBackend,
    DistributedTrainingSession,
    TrainingBackend,
)
from .receipts import StepReceipt, TorchSessionState
from .resources import DeviceSpec, Resources
from .serialization import (
    CONTRACT_TYPES,
    SCHEMA_VERSION,
    canonical_json,
    content_digest,
    converter,
    from_dict,
    from_json,
    json_schema,
    register_contract,
    to_dict,
    to_json,
)
from .updates import DistributedUpdate, ParameterLayout

__all__ = [
    "Accumulator", "AccumulatorFactory", "ComponentShard", "EncodedDataHandle", "Encoder", "Estimator",
    "Model", "ModelShardingPlan", "Placement", "RowShard", "StatisticFormatError",
    "canonical_statistic_bytes", "statistic_digest", "statistics_equal",
    "EstimationWorkload", "TrainingWorkload", "VERIFICATION_LAUNCHES", "VerifiableExecutor", "VerificationTrial",
    "ADMISSION_CHECKS", "DEFAULT_MAX_AGE", "IN_TOTO_PAYLOAD_TYPE", "AdmissionContext", "CertificateEnvelope",
    "EnvelopeSignature", "AdmissionMode", "AuditPolicy", "EM_AUDIT_POLICIES", "TRAINING_AUDIT_POLICIES",
    "choose", "comm_backend_for",
    "ALL_AXES", "AdmissibleExecutor", "AdmissionCertificate", "BackendCapabilities", "CONTRACT_TYPES",
    "CapabilityError", "CollectiveKind", "ContractError", "ContractTypeError", "DERIVED_AXES", "DeviceSpec",
    "DistributedUpdate", "FrozenDict", "KNOWN_PRECISIONS", "MeshCoordinate", "MeshShape",
    "MissingExtraError", "NotAdmittedError", "NumericsEvidence", "ObservedCollective", "PHYSICAL_AXES",
    "UnknownBackendError", "UnusedParametersError", "DistributedTrainingBackend", "DistributedTrainingSession",
    "ParallelAxis", "ParallelPlan", "ParameterLayout", "PayloadKind", "Resources", "SCHEMA_VERSION",
    "SDCAuditRecord", "StateLayout", "StepReceipt", "Tolerance", "TorchSessionState", "TrainingBackend",
    "WorkerTopologyAttestation", "admission_problems", "recertify_plan_flag", "window_covers",
    "attest_worker_coordinate", "canonical_json",
    "check_admission", "content_digest", "converter", "from_dict", "from_json", "json_schema",
    "register_contract", "to_dict", "to_json",
    "CALIBRATION_WORKLOADS", "CalibrationCatalog", "CalibrationRecord", "DeviceCalibration", "DeviceCapacityError",
    "EncodedFold", "MemorySized", "ModelShard", "PlacementShard", "ResourceCalibrationError",
    "UnknownMemoryFootprintError", "DocumentLimitError", "DocumentLimits",
    "IN_SITU_PROBE_OUTCOMES", "InSituMeasurement",
]
