"""Public hypothesis strategies for every contract, for property tests here and in third-party suites."""

from __future__ import annotations

import base64
from typing import Any

import attrs
from hypothesis import strategies as st

from ..contracts import (
    CALIBRATION_WORKLOADS,
    IN_TOTO_PAYLOAD_TYPE,
    KNOWN_PRECISIONS,
    PHYSICAL_AXES,
    AdmissionCertificate,
    BackendCapabilities,
    CalibrationCatalog,
    CalibrationRecord,
    CertificateEnvelope,
    CollectiveKind,
    ComponentShard,
    DeviceCalibration,
    DeviceSpec,
    DistributedUpdate,
    EnvelopeSignature,
    InSituMeasurement,
    MeshCoordinate,
    MeshShape,
    ModelShard,
    ModelShardingPlan,
    NumericsEvidence,
    ObservedCollective,
    ParallelAxis,
    ParallelPlan,
    ParameterLayout,
    PayloadKind,
    Placement,
    PlacementShard,
    Resources,
    RowShard,
    SDCAuditRecord,
    StateLayout,
    StepReceipt,
    Tolerance,
    TorchSessionState,
    WorkerTopologyAttestation,
    attest_worker_coordinate,
)
from ..contracts.evidence import AUDIT_ACTIONS, AUDIT_FAMILIES, AUDIT_REPLAYS
from ..contracts.resources import DEVICE_KINDS

_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_:.-/", min_size=1, max_size=16)
_small = st.integers(min_value=1, max_value=4)
_finite = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)
_digests = st.binary(min_size=32, max_size=32).map(lambda b: "sha256:" + b.hex())
_json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**31), 2**31), _names,
                          st.floats(allow_nan=False, allow_infinity=False, width=32))
_json_maps = st.dictionaries(_names, _json_scalars, max_size=4)


def _divisor_of(n: int) -> st.SearchStrategy[int]:
    return st.sampled_from([d for d in range(1, n + 1) if n % d == 0])


@st.composite
def parallel_plans(draw: Any, max_world_size: int = 32) -> ParallelPlan:
    """Valid plans (ep divides the data-parallel size, etp divides tp) up to ``max_world_size`` ranks."""
    sizes: dict[str, int] = {}
    world = 1
    for axis in PHYSICAL_AXES:
        size = draw(st.integers(1, max(1, min(4, max_world_size // world))))
        sizes[axis.value] = size
        world *= size
    dp = sizes["dp_replicate"] * sizes["dp_shard"]
    sizes["ep"] = draw(_divisor_of(dp))
    sizes["etp"] = draw(_divisor_of(sizes["tp"]))
    sizes["microbatches"] = draw(_small)
    sizes["gradient_accumulation_steps"] = draw(_small)
    return ParallelPlan(**sizes)


def mesh_shapes() -> st.SearchStrategy[MeshShape]:
    """The mesh of a valid plan."""
    return parallel_plans().map(lambda p: p.mesh)


@st.composite
def plans_with_rank(draw: Any) -> tuple[ParallelPlan, int]:
    """A plan and one of its ranks."""
    plan = draw(parallel_plans())
    return plan, draw(st.integers(0, plan.world_size - 1))


def mesh_coordinates() -> st.SearchStrategy[MeshCoordinate]:
    """The coordinate of some rank of a valid plan."""
    return plans_with_rank().map(lambda pr: pr[0].coordinate(pr[1]))


def worker_attestations() -> st.SearchStrategy[WorkerTopologyAttestation]:
    """An attestation of some rank of a valid plan."""
    return plans_with_rank().map(
        lambda pr: attest_worker_coordinate(pr[0], actual_world_size=pr[0].world_size, rank=pr[1])
    )


_axis_sets = st.frozensets(st.sampled_from(list(ParallelAxis)), min_size=2, max_size=3)


def backend_capabilities() -> st.SearchStrategy[BackendCapabilities]:
    """Any well-formed capability declaration."""
    return st.builds(
        BackendCapabilities,
        name=_names,
        axes=st.frozensets(st.sampled_from(list(ParallelAxis))),
        precisions=st.frozensets(st.sampled_from(sorted(KNOWN_PRECISIONS)), min_size=1),
        distributed_optimizer=st.booleans(),
        reshardable_checkpoint=st.booleans(),
        elastic_restart=st.booleans(),
        requirements=st.lists(_names, max_size=3).map(tuple),
        incompatible_axis_sets=st.lists(_axis_sets, max_size=2).map(tuple),
    )


@st.composite
def distributed_updates(draw: Any) -> DistributedUpdate:
    """Updates with and without (complete) evidence; collectives never claim exact."""
    collective = draw(st.sampled_from(list(CollectiveKind)))
    axes = draw(st.lists(st.sampled_from(list(ParallelAxis)), unique=True,
                         min_size=0 if collective is CollectiveKind.NONE else 1, max_size=3))
    evidence: dict[str, Any] = {}
    if draw(st.booleans()):
        evidence = dict(
            determinism_observed=draw(st.booleans()),
            maximum_absolute_error=draw(_finite),
            maximum_relative_error=draw(_finite),
            numerics_evidence_id=draw(_digests),
            numerics_sample_count=draw(st.integers(1, 10**6)),
        )
    return DistributedUpdate(
        node_id=draw(_names),
        payload=draw(st.sampled_from(list(PayloadKind))),
        collective=collective,
        mesh_axes=tuple(axes),
        state_layout=draw(st.sampled_from(list(StateLayout))),
        exact=collective is CollectiveKind.NONE and draw(st.booleans()),
        notes=tuple(draw(st.lists(_names, max_size=2))),
        contract_exact=draw(st.booleans()),
        **evidence,
    )


@st.composite
def parameter_layouts(draw: Any) -> ParameterLayout:
    """Layouts whose Shard(d) placements index real dimensions."""
    shape = tuple(draw(st.lists(st.integers(0, 64), min_size=0, max_size=3)))
    axes = draw(st.lists(st.sampled_from(list(PHYSICAL_AXES)), unique=True, max_size=3))
    choices = ["Replicate()", "Partial()", "Partial(sum)"] + [f"Shard({d})" for d in range(len(shape))]
    placements = tuple((a, draw(st.sampled_from(choices))) for a in axes)
    return ParameterLayout(
        logical_id=draw(_names),
        global_shape=shape,
        placements=placements,
        shared_group=draw(st.none() | _names),
        optimizer_state=draw(st.sampled_from(list(StateLayout))),
    )


@st.composite
def step_receipts(draw: Any) -> StepReceipt:
    """Receipts with consistent local/global counts."""
    local_examples, local_tokens = draw(st.integers(0, 4096)), draw(st.integers(0, 10**6))
    observed = draw(st.booleans())
    return StepReceipt(
        step=draw(st.integers(0, 10**6)),
        loss=draw(st.floats(allow_nan=False, allow_infinity=False)),
        local_examples=local_examples,
        local_tokens=local_tokens,
        microbatches=draw(_small),
        accumulation_steps=draw(_small),
        data_parallel_size=draw(st.integers(1, 64)),
        optimizer=draw(_names),
        precision=draw(st.sampled_from(sorted(KNOWN_PRECISIONS))),
        collective_bytes=draw(st.integers(0, 2**40)),
        skipped=draw(st.booleans()),
        extra=draw(_json_maps),
        global_examples_observed=local_examples + draw(st.integers(0, 4096)) if observed else None,
        global_tokens_observed=local_tokens + draw(st.integers(0, 10**6)) if observed else None,
    )


def torch_session_states() -> st.SearchStrategy[TorchSessionState]:
    """Session clocks with a free-form optimizer receipt."""
    return st.builds(TorchSessionState, step=st.integers(0, 10**6),
                     pending_accumulation=st.integers(0, 64), optimizer_receipt=_json_maps)


def device_specs() -> st.SearchStrategy[DeviceSpec]:
    """Any valid device."""
    return st.builds(
        DeviceSpec,
        name=_names,
        kind=st.sampled_from(sorted(DEVICE_KINDS)),
        index=st.none() | st.integers(0, 64),
        memory_bytes=st.none() | st.integers(0, 2**40),
        throughput=st.floats(min_value=1e-3, max_value=1e6, allow_nan=False),
        precision=st.none() | st.sampled_from(sorted(KNOWN_PRECISIONS)),
        host=st.none() | _names,
    )


def resources() -> st.SearchStrategy[Resources]:
    """Resources with unique device names."""
    return st.lists(device_specs(), min_size=1, max_size=5, unique_by=lambda d: d.name).map(
        lambda ds: Resources(tuple(ds))
    )


@st.composite
def tolerances(draw: Any) -> Tolerance:
    """Elementwise or bitwise tolerances."""
    if draw(st.booleans()):
        return Tolerance.exact()
    return Tolerance(draw(_finite), draw(_finite), False, draw(st.text(max_size=20)))


def observed_collectives() -> st.SearchStrategy[ObservedCollective]:
    """A traced collective count."""
    return st.builds(ObservedCollective, kind=st.sampled_from(list(CollectiveKind)),
                     axes=st.lists(st.sampled_from(list(ParallelAxis)), unique=True, max_size=2).map(tuple),
                     count=st.integers(0, 1000))


@st.composite
def numerics_evidence(draw: Any) -> NumericsEvidence:
    """Evidence records; a passing bitwise record has zero error."""
    tolerance = draw(tolerances())
    within = draw(st.booleans())
    abs_err = 0.0 if tolerance.bitwise and within else draw(_finite)
    return NumericsEvidence(
        node_id=draw(_names),
        payload=draw(st.sampled_from(list(PayloadKind))),
        executor=draw(_names),
        plan=draw(parallel_plans()),
        precision=draw(st.sampled_from(sorted(KNOWN_PRECISIONS))),
        trials=draw(_small),
        sample_count=draw(st.integers(1, 10**6)),
        maximum_absolute_error=abs_err,
        maximum_relative_error=draw(_finite),
        deterministic=draw(st.booleans()),
        within_tolerance=within,
        tolerance=tolerance,
        collectives_observed=tuple(draw(st.lists(observed_collectives(), max_size=3))),
        collectives_match=draw(st.booleans()),
        notes=tuple(draw(st.lists(_names, max_size=2))),
        reference_magnitude=draw(st.none() | _finite),
    )


@st.composite
def sdc_audit_records(draw: Any) -> SDCAuditRecord:
    """Matching and mismatching audit records with consistent actions."""
    matched = draw(st.booleans())
    digest = draw(_digests)
    bound = draw(st.sampled_from([0.0, 1e-6, 1e-3]))
    return SDCAuditRecord(
        family=draw(st.sampled_from(sorted(AUDIT_FAMILIES))),
        step=draw(st.integers(0, 10**6)),
        rank=draw(st.integers(0, 63)),
        unit=draw(_names),
        replay=draw(st.sampled_from(sorted(AUDIT_REPLAYS))),
        expected_digest=digest,
        observed_digest=digest if matched and bound == 0.0 else draw(_digests),
        matched=matched,
        action="none" if matched else draw(st.sampled_from(sorted(AUDIT_ACTIONS - {"none"}))),
        auditor_rank=draw(st.none() | st.integers(0, 63)),
        attributed_rank=None if matched else draw(st.none() | st.integers(0, 63)),
        maximum_absolute_difference=draw(st.floats(0.0, bound)) if matched else draw(_finite),
        bound=bound,
        injected=draw(st.booleans()),
    )


@st.composite
def in_situ_measurements(draw: Any) -> InSituMeasurement:
    """Measurements of in-situ certificates: a passed probe carries its error, the others a reason."""
    probe = draw(st.sampled_from(["passed", "skipped", "not_applicable"]))
    error = draw(st.floats(0, 1e-3, allow_nan=False)) if probe == "passed" else None
    return InSituMeasurement(launcher=draw(st.sampled_from(["torchrun", "mpiexec", "launched"])),
                             world_size=draw(st.integers(1, 64)), workload=draw(_names), probe=probe,
                             probe_reason=draw(_names), probe_max_abs_error=error,
                             seconds=draw(st.floats(0, 1e4, allow_nan=False)))


@st.composite
def admission_certificates(draw: Any) -> AdmissionCertificate:
    """Self-consistent certificates: embedded evidence of the executor, digests recomputed from it."""
    plan = draw(parallel_plans())
    caps = draw(backend_capabilities())
    precision = draw(st.sampled_from(sorted(caps.precisions)))
    caps = BackendCapabilities(
        name=caps.name, axes=caps.axes | plan.axis_family, precisions=caps.precisions,
        distributed_optimizer=caps.distributed_optimizer, requirements=caps.requirements,
    )
    seconds = draw(st.integers(0, 2**31))
    hours, minutes = divmod(seconds // 60, 60)
    records = tuple(attrs.evolve(r, executor=caps.name, plan=plan, precision=precision)
                    for r in draw(st.lists(numerics_evidence(), min_size=1, max_size=2)))
    versions = {"python": "3.11.9", "numpy": "2.1.0", **draw(st.dictionaries(_names, _names, max_size=2))}
    return AdmissionCertificate(
        executor=caps.name,
        executor_version=draw(_names),
        source_digest=draw(_digests),
        capabilities=caps,
        axis_family=plan.axis_family,
        measured_plan=plan,
        precision=precision,
        device_kind=draw(st.sampled_from(["cpu", "cuda"])),
        comm_backend=draw(st.sampled_from(["gloo", "nccl", "mp"])),
        library_versions=versions,
        evidence=records,
        evidence_digests=frozenset(r.evidence_id for r in records),
        tolerance=draw(tolerances()),
        issued_at=f"2026-01-{1 + (hours // 24) % 28:02d}T{hours % 24:02d}:{minutes:02d}:00+00:00",
        measurement=draw(st.none() | in_situ_measurements()),
    )


_BASE64 = st.binary(min_size=1, max_size=96).map(lambda b: base64.b64encode(b).decode("ascii"))


@st.composite
def envelope_signatures(draw: Any) -> EnvelopeSignature:
    """Well-formed DSSE signatures (not valid under any key: the gate checks that)."""
    return EnvelopeSignature(keyid=draw(st.text("0123456789abcdef", min_size=64, max_size=64)), sig=draw(_BASE64))


@st.composite
def certificate_envelopes(draw: Any) -> CertificateEnvelope:
    """Well-formed DSSE envelopes of the in-toto payload type."""
    return CertificateEnvelope(payload_type=IN_TOTO_PAYLOAD_TYPE, payload=draw(_BASE64),
                               signatures=tuple(draw(st.lists(envelope_signatures(), min_size=1, max_size=2))))


@st.composite
def row_shards(draw: Any) -> RowShard:
    """One device's contiguous rows and whole chunks."""
    start, rows = draw(st.integers(0, 10**6)), draw(st.integers(0, 10**6))
    first = draw(st.integers(0, 1000))
    return RowShard(draw(_names), start, start + rows, first, first + draw(st.integers(0, 100)),
                    draw(st.integers(0, 2**40)))


@st.composite
def placements(draw: Any) -> Placement:
    """Placements whose shards tile the rows in order."""
    sizes = draw(st.lists(st.integers(0, 10**5), min_size=1, max_size=4))
    shards, start = [], 0
    for i, size in enumerate(sizes):
        shards.append(RowShard(f"cpu:{i}", start, start + size, i, i + 1, draw(st.integers(0, 2**40))))
        start += size
    return Placement(start, len(sizes), draw(st.integers(0, 4096)), draw(st.integers(0, 2**30)), tuple(shards),
                     draw(st.booleans()), tuple(draw(st.lists(_names, max_size=2))))


@st.composite
def component_shards(draw: Any) -> ComponentShard:
    """Components [start, stop) on one device."""
    start = draw(st.integers(0, 64))
    return ComponentShard(draw(_names), start, start + draw(st.integers(0, 64)), draw(st.integers(0, 2**40)))


@st.composite
def model_sharding_plans(draw: Any) -> ModelShardingPlan:
    """Replicated or split component plans."""
    shards = tuple(draw(st.lists(component_shards(), min_size=1, max_size=3)))
    return ModelShardingPlan("components", draw(st.integers(1, 256)), draw(st.integers(0, 2**30)), shards,
                             draw(st.booleans()), draw(st.booleans()), draw(_names))


_seconds = st.floats(min_value=1e-9, max_value=1e4, allow_nan=False, allow_infinity=False)


@st.composite
def device_calibrations(draw: Any, name: str | None = None) -> DeviceCalibration:
    """A device's timings and throughput, or its failure with a reason."""
    device = name if name is not None else draw(_names)
    if draw(st.booleans()):
        return DeviceCalibration(device, True, tuple(draw(st.lists(_seconds, min_size=1, max_size=4))),
                                 draw(_seconds))
    return DeviceCalibration(device, False, error=draw(_names))


@st.composite
def calibration_records(draw: Any) -> CalibrationRecord:
    """One calibration run with results for some of its devices."""
    res = draw(resources())
    names = draw(st.lists(st.sampled_from([d.name for d in res.devices]), unique=True))
    optional = st.none() | st.integers(0, 2**40)
    return CalibrationRecord(
        draw(_names), draw(st.sampled_from(CALIBRATION_WORKLOADS)), res, draw(st.integers(1, 4096)),
        draw(st.integers(1, 10)), draw(st.none() | st.sampled_from(sorted(KNOWN_PRECISIONS))), draw(st.none() | _names),
        draw(optional), draw(optional), draw(optional), draw(_finite),
        tuple(draw(device_calibrations(n)) for n in names))


def calibration_catalogs() -> st.SearchStrategy[CalibrationCatalog]:
    """Catalogs of up to three records."""
    return st.lists(calibration_records(), max_size=3).map(lambda rs: CalibrationCatalog(tuple(rs)))


@st.composite
def placement_shards(draw: Any) -> PlacementShard:
    """mixle-shaped rows of one device."""
    start = draw(st.integers(0, 10**6))
    return PlacementShard(draw(device_specs()), start, start + draw(st.integers(0, 10**6)), draw(st.integers(1, 8)),
                          draw(st.integers(0, 2**40)), draw(st.integers(0, 2**40)))


@st.composite
def model_shards(draw: Any) -> ModelShard:
    """Components of one device that fit its memory."""
    device = draw(device_specs())
    cap = 2**40 if device.memory_bytes is None else device.memory_bytes
    params = draw(st.integers(0, cap))
    start = draw(st.integers(0, 64))
    return ModelShard(device, start, start + draw(st.integers(1, 64)), params, draw(st.integers(0, cap - params)))


STRATEGIES: dict[type, Any] = {
    DeviceCalibration: device_calibrations,
    CalibrationRecord: calibration_records,
    CalibrationCatalog: calibration_catalogs,
    PlacementShard: placement_shards,
    ModelShard: model_shards,
    RowShard: row_shards,
    Placement: placements,
    ComponentShard: component_shards,
    ModelShardingPlan: model_sharding_plans,
    ParallelPlan: parallel_plans,
    MeshCoordinate: mesh_coordinates,
    WorkerTopologyAttestation: worker_attestations,
    BackendCapabilities: backend_capabilities,
    DistributedUpdate: distributed_updates,
    ParameterLayout: parameter_layouts,
    StepReceipt: step_receipts,
    TorchSessionState: torch_session_states,
    DeviceSpec: device_specs,
    Resources: resources,
    Tolerance: tolerances,
    ObservedCollective: observed_collectives,
    NumericsEvidence: numerics_evidence,
    SDCAuditRecord: sdc_audit_records,
    AdmissionCertificate: admission_certificates,
    InSituMeasurement: in_situ_measurements,
    EnvelopeSignature: envelope_signatures,
    CertificateEnvelope: certificate_envelopes,
}
"""Contract class -> zero-argument strategy factory; every registered contract has one."""


def strategy_for(cls: type) -> st.SearchStrategy[Any]:
    """The strategy of a contract class, or a KeyError naming the classes that have one."""
    try:
        return STRATEGIES[cls]()
    except KeyError:
        raise KeyError(f"no strategy for {cls.__name__}; known: {sorted(c.__name__ for c in STRATEGIES)}") from None


def register_strategy(cls: type, factory: Any) -> None:
    """Add a strategy for a contract defined outside this module (e.g. by an executor package)."""
    STRATEGIES[cls] = factory


