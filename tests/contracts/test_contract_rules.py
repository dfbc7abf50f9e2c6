"""Every validation rule of the contracts, one failing construction each (removing a rule fails a test)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs
import pytest

from mixle_parallel.contracts import (
    BackendCapabilities,
    CapabilityError,
    DeviceSpec,
    DistributedUpdate,
    FrozenDict,
    MeshCoordinate,
    NotAdmittedError,
    NumericsEvidence,
    ParallelPlan,
    ParameterLayout,
    Resources,
    SDCAuditRecord,
    StepReceipt,
    Tolerance,
    TorchSessionState,
    WorkerTopologyAttestation,
    admission_problems,
    check_admission,
)

from .conftest import DIGEST, ToyExecutor, context, make_certificate, make_evidence


def update(**changes: Any) -> DistributedUpdate:
    fields: dict[str, Any] = dict(node_id="grad:dp_shard", payload="gradient", collective="reduce_scatter",
                                  mesh_axes=("dp_shard",), state_layout="sharded", exact=False)
    fields.update(changes)
    return DistributedUpdate(**fields)


EVIDENCE = dict(numerics_evidence_id=DIGEST, numerics_sample_count=10, determinism_observed=True,
                maximum_absolute_error=0.0, maximum_relative_error=0.0)


def receipt(**changes: Any) -> StepReceipt:
    fields: dict[str, Any] = dict(step=1, loss=0.5, local_examples=4, local_tokens=64, microbatches=1,
                                  accumulation_steps=1, data_parallel_size=2, optimizer="SGD", precision="fp32")
    fields.update(changes)
    return StepReceipt(**fields)


def evidence(**changes: Any) -> NumericsEvidence:
    fields: dict[str, Any] = dict(node_id="grad:dp_shard", payload="gradient", executor="toy",
                                  plan=ParallelPlan(dp_shard=2), precision="fp32", trials=2, sample_count=100,
                                  maximum_absolute_error=1e-7, maximum_relative_error=1e-6, deterministic=True,
                                  within_tolerance=True, tolerance=Tolerance(1e-5, 1.3e-6))
    fields.update(changes)
    return NumericsEvidence(**fields)


def audit(**changes: Any) -> SDCAuditRecord:
    fields: dict[str, Any] = dict(family="training", step=3, rank=1, unit="grad:w", replay="same_rank",
                                  expected_digest=DIGEST, observed_digest=DIGEST, matched=True)
    fields.update(changes)
    return SDCAuditRecord(**fields)


OTHER = "sha256:" + "cd" * 32

BAD: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
    # BackendCapabilities
    ("caps name blank", lambda: BackendCapabilities(" ", {"tp"}), ValueError, "name"),
    ("caps no precision", lambda: BackendCapabilities("b", {"tp"}, precisions=()), ValueError, "at least one"),
    ("caps unknown precision", lambda: BackendCapabilities("b", {"tp"}, precisions={"fp7"}), ValueError, "fp7"),
    ("caps unknown axis", lambda: BackendCapabilities("b", {"model"}), ValueError, "ParallelAxis"),
    ("caps bool field", lambda: BackendCapabilities("b", {"tp"}, distributed_optimizer=1), TypeError, "bool"),
    ("caps one-axis incompatible set", lambda: BackendCapabilities("b", {"tp"}, incompatible_axis_sets=[{"tp"}]),
     ValueError, "at least two"),
    # DistributedUpdate
    ("collective claims exact", lambda: update(exact=True), ValueError, "cannot claim"),
    ("collective without axes", lambda: update(mesh_axes=()), ValueError, "needs the mesh"),
    ("repeated axis", lambda: update(mesh_axes=("tp", "tp")), ValueError, "repeats"),
    ("unknown payload", lambda: update(payload="weights"), ValueError, "PayloadKind"),
    ("unknown collective", lambda: update(collective="gossip"), ValueError, "CollectiveKind"),
    ("unknown layout", lambda: update(state_layout="everywhere"), ValueError, "StateLayout"),
    ("evidence id without count", lambda: update(**{**EVIDENCE, "numerics_sample_count": 0}), ValueError,
     "incomplete"),
    ("evidence id without determinism", lambda: update(**{**EVIDENCE, "determinism_observed": None}), ValueError,
     "determinism_observed"),
    ("evidence id without abs error", lambda: update(**{**EVIDENCE, "maximum_absolute_error": None}), ValueError,
     "maximum_absolute_error"),
    ("evidence id without rel error", lambda: update(**{**EVIDENCE, "maximum_relative_error": None}), ValueError,
     "maximum_relative_error"),
    ("errors without evidence id", lambda: update(maximum_absolute_error=0.1), ValueError, "all-or-nothing"),
    ("count without evidence id", lambda: update(numerics_sample_count=3), ValueError, "all-or-nothing"),
    ("determinism without evidence id", lambda: update(determinism_observed=True), ValueError, "all-or-nothing"),
    ("blank evidence id", lambda: update(**{**EVIDENCE, "numerics_evidence_id": " "}), ValueError, "blank"),
    ("negative error", lambda: update(**{**EVIDENCE, "maximum_absolute_error": -1.0}), ValueError, ">= 0"),
    ("nan error", lambda: update(**{**EVIDENCE, "maximum_relative_error": math.nan}), ValueError, "finite"),
    ("inf error", lambda: update(**{**EVIDENCE, "maximum_absolute_error": math.inf}), ValueError, "finite"),
    ("exact not bool", lambda: update(exact=0), TypeError, "bool"),
    # ParameterLayout
    ("bad placement", lambda: ParameterLayout("w", (4, 4), (("tp", "Sharded(0)"),)), ValueError, "must be"),
    ("shard beyond rank", lambda: ParameterLayout("w", (4,), (("tp", "Shard(1)"),)), ValueError, "does not have"),
    ("axis placed twice", lambda: ParameterLayout("w", (4,), (("tp", "Shard(0)"), ("tp", "Replicate()"))),
     ValueError, "twice"),
    ("derived axis placement", lambda: ParameterLayout("w", (4,), (("ep", "Shard(0)"),)), ValueError,
     "not a mesh dimension"),
    ("negative dim", lambda: ParameterLayout("w", (4, -1)), ValueError, "ints >= 0"),
    ("blank id", lambda: ParameterLayout("", (4,)), ValueError, "logical_id"),
    # StepReceipt / TorchSessionState
    ("negative step", lambda: receipt(step=-1), ValueError, "step"),
    ("zero microbatches", lambda: receipt(microbatches=0), ValueError, "microbatches"),
    ("zero accumulation", lambda: receipt(accumulation_steps=0), ValueError, "accumulation_steps"),
    ("zero dp size", lambda: receipt(data_parallel_size=0), ValueError, "data_parallel_size"),
    ("negative bytes", lambda: receipt(collective_bytes=-8), ValueError, "collective_bytes"),
    ("bool loss", lambda: receipt(loss=True), TypeError, "loss"),
    ("skipped not bool", lambda: receipt(skipped="no"), TypeError, "skipped"),
    ("global below local examples", lambda: receipt(global_examples_observed=3), ValueError, "global_examples"),
    ("global below local tokens", lambda: receipt(global_tokens_observed=10), ValueError, "global_tokens"),
    ("extra not json", lambda: receipt(extra={"x": object()}), TypeError, "JSON"),
    ("extra not mapping", lambda: receipt(extra=[1]), TypeError, "mapping"),
    ("blank optimizer", lambda: receipt(optimizer=""), ValueError, "optimizer"),
    ("session negative pending", lambda: TorchSessionState(step=0, pending_accumulation=-1), ValueError, "pending"),
    # Resources
    ("unknown device kind", lambda: DeviceSpec("d", "quantum"), ValueError, "kind"),
    ("zero throughput", lambda: DeviceSpec("d", throughput=0.0), ValueError, "throughput"),
    ("nan throughput", lambda: DeviceSpec("d", throughput=math.nan), ValueError, "finite"),
    ("negative memory", lambda: DeviceSpec("d", memory_bytes=-1), ValueError, "memory_bytes"),
    ("no devices", lambda: Resources(()), ValueError, "at least one"),
    ("duplicate device names", lambda: Resources((DeviceSpec("a"), DeviceSpec("a"))), ValueError, "unique"),
    ("not a device", lambda: Resources(("cpu",)), TypeError, "DeviceSpec"),
    ("local zero cpus", lambda: Resources.local(0), ValueError, "num_cpus"),
    # Attestation / coordinate
    ("rank beyond world", lambda: WorkerTopologyAttestation(2, 2, MeshCoordinate()), ValueError, "world_size"),
    ("negative coordinate", lambda: MeshCoordinate(tp=-1), ValueError, "tp"),
    ("coordinate type", lambda: WorkerTopologyAttestation(0, 1, {"tp": 0}), TypeError, "coordinate"),
    # Tolerance / evidence
    ("negative atol", lambda: Tolerance(-1.0, 0.0), ValueError, "atol"),
    ("bitwise with atol", lambda: Tolerance(1e-6, 0.0, True), ValueError, "bitwise"),
    ("bitwise pass with error", lambda: evidence(tolerance=Tolerance.exact()), ValueError, "bitwise"),
    ("zero trials", lambda: evidence(trials=0), ValueError, "trials"),
    ("zero samples", lambda: evidence(sample_count=0), ValueError, "sample_count"),
    ("unknown precision", lambda: evidence(precision="fp12"), ValueError, "precision"),
    # SDC audit records
    ("bitwise match, digests differ", lambda: audit(observed_digest=OTHER), ValueError, "bitwise"),
    ("match above bound", lambda: audit(bound=1e-6, maximum_absolute_difference=1e-3), ValueError, "bound"),
    ("match with action", lambda: audit(action="warn"), ValueError, "no action"),
    ("match with culprit", lambda: audit(attributed_rank=1), ValueError, "no action"),
    ("mismatch without action", lambda: audit(matched=False, observed_digest=OTHER), ValueError, "needs the action"),
    ("unknown family", lambda: audit(family="inference"), ValueError, "family"),
    ("upper-case audit digest", lambda: audit(expected_digest="sha256:" + "AB" * 32), ValueError, "lowercase"),
    ("short audit digest", lambda: audit(observed_digest="sha256:aa", matched=False, action="warn"), ValueError,
     "64 lowercase hex"),
    ("unknown replay", lambda: audit(replay="oracle"), ValueError, "replay"),
    # AdmissionCertificate
    ("no evidence", lambda: make_certificate(evidence_digests=frozenset()), ValueError, "needs evidence"),
    ("no evidence records", lambda: make_certificate(evidence=()), ValueError, "embeds the evidence"),
    ("bad digest", lambda: make_certificate(evidence_digests=frozenset({"md5:00"})), ValueError, "sha256"),
    ("upper-case digest", lambda: make_certificate(source_digest="sha256:" + "AB" * 32), ValueError, "lowercase"),
    ("empty library versions", lambda: make_certificate(library_versions={}), ValueError, "python"),
    ("empty device kind", lambda: make_certificate(device_kind=""), ValueError, "device_kind"),
    ("family vs measured plan", lambda: make_certificate(axis_family={"tp"}), ValueError, "certified family"),
    ("axes outside caps", lambda: make_certificate(
        capabilities=BackendCapabilities("toy", {"dp_shard"}), measured_plan=ParallelPlan(dp_shard=2, tp=2)),
     ValueError, "do not claim"),
    ("precision outside caps", lambda: make_certificate(precision="fp16"), ValueError, "precision"),
    ("executor vs caps name", lambda: make_certificate(executor="other"), ValueError, "differs"),
    ("naive issue time", lambda: make_certificate(issued_at="2026-11-30T09:00:00"), ValueError, "UTC offset"),
    ("garbage issue time", lambda: make_certificate(issued_at="yesterday"), ValueError, "ISO 8601"),
]


@pytest.mark.parametrize("name,build,error,match", BAD, ids=[b[0] for b in BAD])
def test_rule_rejects(name: str, build: Callable[[], Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        build()


def test_valid_examples_build() -> None:
    update(**EVIDENCE)
    update(collective="none", mesh_axes=(), exact=True)
    ParameterLayout("w", (4, 8), (("dp_shard", "Shard(0)"), ("tp", "Shard(1)"), ("dp_replicate", "Replicate()")))
    receipt(global_examples_observed=8, global_tokens_observed=128, loss=math.nan, extra={"a": [1, {"b": 2}]})
    audit(matched=False, observed_digest=OTHER, action="skip_step", attributed_rank=1)
    make_certificate()


def test_contracts_are_frozen_and_hashable() -> None:
    plan = ParallelPlan(tp=2)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        plan.tp = 4  # type: ignore[misc]
    r = receipt(extra={"a": 1})
    assert hash(r) == hash(receipt(extra={"a": 1}))
    with pytest.raises(TypeError):
        r.extra["a"] = 2  # type: ignore[index]
    assert isinstance(r.extra, FrozenDict)


def test_canonicalization() -> None:
    u = update(mesh_axes=["dp_shard"], notes=["n"])
    assert u.mesh_axes == (u.mesh_axes[0],) and isinstance(u.notes, tuple)
    caps = BackendCapabilities("b", ["tp", "tp", "dp_shard"], precisions=["fp32"])
    assert isinstance(caps.axes, frozenset) and len(caps.axes) == 2
    assert isinstance(receipt(loss=1).loss, float)


class TestCapabilities:
    caps = BackendCapabilities("toy", {"dp_shard", "tp", "cp"}, precisions={"fp32"},
                               incompatible_axis_sets=[{"tp", "cp"}])

    def test_accepts_supported_plan(self) -> None:
        self.caps.validate(ParallelPlan(dp_shard=2, tp=2))
        self.caps.validate(ParallelPlan())

    def test_rejects_unexecuted_axis_with_fix(self) -> None:
        with pytest.raises(CapabilityError, match=r"does not execute axis pp \(size 2\).*Set pp=1"):
            self.caps.validate(ParallelPlan(pp=2))

    def test_rejects_precision(self) -> None:
        with pytest.raises(CapabilityError, match="precision 'bf16'"):
            self.caps.validate(ParallelPlan(), precision="bf16")

    def test_rejects_incompatible_composition(self) -> None:
        with pytest.raises(CapabilityError, match="cannot compose axes cp, tp"):
            self.caps.validate(ParallelPlan(tp=2, cp=2))

    def test_problems_lists_all(self) -> None:
        assert len(self.caps.problems(ParallelPlan(pp=2, ep=1, tp=2, cp=2), "fp16")) == 3


class TestAdmissionCheck:
    plan = ParallelPlan(dp_shard=4, tp=2)

    def test_accepts_same_family_any_sizes(self, toy_executor: ToyExecutor) -> None:
        cert = make_certificate()
        assert check_admission(cert, toy_executor, self.plan, "fp32", context()) == cert.certificate_id

    @pytest.mark.parametrize("mutate,check,reason", [
        (lambda ex, cert, plan: (ex, None, plan), "certificate", "no admission certificate"),
        (lambda ex, cert, plan: (attrs.evolve(ex, version="2.0"), cert, plan), "executor_version",
         "toy 1.0, running 2.0"),
        (lambda ex, cert, plan: (ex, cert, ParallelPlan(dp_shard=2)), "plan_family", "plan uses"),
        (lambda ex, cert, plan: (attrs.evolve(ex, capabilities=BackendCapabilities("toy", {"dp_shard", "tp", "cp"})),
                                 cert, plan), "capabilities", "capabilities changed"),
        (lambda ex, cert, plan: (attrs.evolve(ex, capabilities=BackendCapabilities("other", {"dp_shard", "tp"})),
                                 cert, plan), "executor", "not 'other'"),
    ])
    def test_rejects_with_reason(self, toy_executor: ToyExecutor, mutate: Callable[..., Any], check: str,
                                 reason: str) -> None:
        ex, cert, plan = mutate(toy_executor, make_certificate(), self.plan)
        with pytest.raises(NotAdmittedError, match=f"check '{check}' failed: .*{reason}"):
            check_admission(cert, ex, plan, "fp32", context())

    def test_rejects_precision_library_mesh_and_source(self, toy_executor: ToyExecutor) -> None:
        problems = admission_problems(make_certificate(), toy_executor, self.plan, "bf16", context(
            library_versions={"python": "3.11.9", "numpy": "2.1.0", "torch": "2.14.0"}, device_kind="cuda",
            comm_backend="nccl", source_digest="sha256:" + "cd" * 32))
        checks = {p.split("'")[1] for p in problems}
        assert checks == {"precision", "library_versions", "device_kind", "comm_backend", "source_digest"}
        assert any("torch 2.13.0, running 2.14.0" in p for p in problems)

    def test_recomputes_evidence_and_judges_it(self, toy_executor: ToyExecutor) -> None:
        wrong = make_certificate(evidence_digests=frozenset({DIGEST}))
        assert "check 'evidence_digests' failed" in admission_problems(wrong, toy_executor, self.plan, "fp32",
                                                                        context())[0]
        failing = make_certificate(evidence=(make_evidence(ParallelPlan(dp_shard=2, tp=2), within_tolerance=False),))
        assert any("check 'evidence' failed" in p
                   for p in admission_problems(failing, toy_executor, self.plan, "fp32", context()))
        loose = make_certificate(tolerance=Tolerance(1.0, 1.0))
        policy = context(policy=lambda cert: Tolerance(1e-5, 1.3e-6))
        assert [p.split("'")[1] for p in admission_problems(loose, toy_executor, self.plan, "fp32", policy)] == [
            "tolerance_policy"]

    def test_issue_time_window(self, toy_executor: ToyExecutor) -> None:
        from datetime import datetime, timedelta

        issued = datetime.fromisoformat(make_certificate().issued_at)
        late = context(now=issued + timedelta(days=91))
        early = context(now=issued - timedelta(days=1))
        for ctx, text in ((late, "more than 90 days"), (early, "in the future")):
            (problem,) = admission_problems(make_certificate(), toy_executor, self.plan, "fp32", ctx)
            assert problem.startswith("check 'issued_at' failed") and text in problem

    def test_certificate_id_is_content_addressed(self) -> None:
        a, b = make_certificate(), make_certificate()
        assert a.certificate_id == b.certificate_id and a.certificate_id.startswith("sha256:")
        assert make_certificate(executor_version="1.1").certificate_id != a.certificate_id


@pytest.mark.parametrize("loss", [math.nan, math.inf, -math.inf])
def test_a_receipt_with_a_non_finite_loss_is_valid_under_its_schema(loss: float) -> None:
    import json

    import jsonschema

    from mixle_parallel.contracts import json_schema, to_json

    document = json.loads(to_json(receipt(loss=loss, skipped=True)))
    assert document["data"]["loss"] is None
    jsonschema.validate(document, json_schema(StepReceipt))
