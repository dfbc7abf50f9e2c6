"""Generate docs/contracts.md from the code: every contract with a JSON example made by the converter.

Run ``python docs/gen_contracts.py`` after changing a contract; a test fails when the file is stale.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import attrs

from mixle_parallel import contracts as c

PLAN = c.ParallelPlan(dp_shard=2, tp=2)
CAPS = c.BackendCapabilities("torch_native", {"dp_replicate", "dp_shard", "tp", "cp"}, precisions={"fp32", "bf16"},
                             reshardable_checkpoint=True, requirements=("torch>=2.6",))
TOL = c.Tolerance(1e-5, 1.3e-6, False, "torch.testing.assert_close defaults for float32")
DIGEST = "sha256:" + "3f" * 32

EVIDENCE = c.NumericsEvidence(
    "grad:dp_shard", "gradient", "torch_native", PLAN, "fp32", 2, 4096, 2.4e-8, 3.1e-7, True, True, TOL,
    (c.ObservedCollective("reduce_scatter", ("dp_shard",), 3),), True, reference_magnitude=0.84)

CALIBRATION = c.DeviceCalibration("cpu:0", True, (0.00101, 0.00098, 0.001), 5.1e5)

EXAMPLES: dict[type, Any] = {
    c.ParallelPlan: PLAN,
    c.MeshCoordinate: PLAN.coordinate(3),
    c.WorkerTopologyAttestation: c.attest_worker_coordinate(PLAN, actual_world_size=4, rank=3),
    c.BackendCapabilities: CAPS,
    c.DistributedUpdate: c.DistributedUpdate(
        "grad:dp_shard", "gradient", "reduce_scatter", ("dp_shard",), "sharded", False,
        notes=("FSDP2 reduce-scatter of gradients",), determinism_observed=True,
        maximum_absolute_error=2.4e-8, maximum_relative_error=3.1e-7, numerics_evidence_id=DIGEST,
        numerics_sample_count=4096),
    c.ParameterLayout: c.ParameterLayout("layers.0.attn.wq.weight", (64, 64),
                                         (("dp_shard", "Shard(0)"), ("tp", "Shard(0)")), None, "sharded"),
    c.StepReceipt: c.StepReceipt(12, 2.731, 8, 1024, 2, 1, 2, "SGD", "fp32", collective_bytes=395264,
                                 extra={"admission": "sha256:" + "9a" * 32}, global_examples_observed=16,
                                 global_tokens_observed=2048, learning_rates=(0.1, 0.05)),
    c.TorchSessionState: c.TorchSessionState(12, 0, {"optimizer": "SGD", "lr": 0.1}),
    c.DeviceSpec: c.DeviceSpec("cpu:0", "cpu", 0, 6 * 2**30, 1.0, None, "node0"),
    c.Resources: c.Resources.from_specs([c.DeviceSpec("cpu:0", "cpu", 0, 2**33, 1.0, None, "node0"),
                                         c.DeviceSpec("cuda:0", "cuda", 0, 80 * 2**30, 132.0, "bf16", "node0")]),
    c.Tolerance: TOL,
    c.ObservedCollective: c.ObservedCollective("reduce_scatter", ("dp_shard",), 3),
    c.NumericsEvidence: EVIDENCE,
    c.SDCAuditRecord: c.SDCAuditRecord("training", 40, 1, "grad:layers.0.mlp.w1.weight", "peer", DIGEST,
                                       "sha256:" + "77" * 32, False, "skip_step", auditor_rank=3,
                                       attributed_rank=1, maximum_absolute_difference=0.5, injected=True),
    c.RowShard: c.RowShard("cpu:0", 0, 500_000, 0, 8, 4_000_000 + 4096),
    c.Placement: c.Placement(1_000_000, 16, 8, 4096, (c.RowShard("cpu:0", 0, 500_000, 0, 8, 4_004_096),
                                                     c.RowShard("cpu:1", 500_000, 1_000_000, 8, 16, 4_004_096)),
                             True),
    c.ComponentShard: c.ComponentShard("cpu:0", 0, 8, 4096),
    c.ModelShardingPlan: c.ModelShardingPlan("components", 8, 4096, (c.ComponentShard("cpu:0", 0, 8, 4096),), False,
                                             True, "the whole model fits on every device: replicate it"),
    c.PlacementShard: c.PlacementShard(c.DeviceSpec("cpu:0", "cpu", 0, 2**33, 1.0, None, "node0"), 0, 500_000, 8,
                                       4_000_000, 4096),
    c.ModelShard: c.ModelShard(c.DeviceSpec("cpu:0", "cpu", 0, 2**33, 1.0, None, "node0"), 0, 8, 4096, 2048),
    c.DeviceCalibration: CALIBRATION,
    c.CalibrationRecord: c.CalibrationRecord(
        "MixtureDistribution", "estep", c.Resources.from_specs([c.DeviceSpec("cpu:0", "cpu", 0, 2**33, 5.1e5)]),
        512, 3, None, "MixtureEstimator", 100_000, 4096, 4096, 1_764_590_400.0, (CALIBRATION,)),
    c.CalibrationCatalog: c.CalibrationCatalog(()),
    c.AdmissionCertificate: c.AdmissionCertificate(
        "torch_native", "0.1.0", DIGEST, CAPS, PLAN.axis_family, PLAN, "fp32", "cpu", "gloo",
        {"python": "3.11.7", "numpy": "2.1.0", "torch": "2.13.0"}, (EVIDENCE,), {EVIDENCE.evidence_id}, TOL,
        "2026-11-30T09:00:00+00:00"),
    c.InSituMeasurement: c.InSituMeasurement(
        "torchrun", 2, "mlp", "passed", "one seeded step of the module's 4 parameter gradients through the executor "
        "against a one-rank recomputation on rank 0", 5.96e-08, 3.6),
    c.EnvelopeSignature: c.EnvelopeSignature("ab" * 32, "c2lnbmF0dXJlIGJ5dGVz"),
    c.CertificateEnvelope: c.CertificateEnvelope(
        c.IN_TOTO_PAYLOAD_TYPE, "eyJfdHlwZSI6ICJodHRwczovL2luLXRvdG8uaW8vU3RhdGVtZW50L3YxIn0=",
        (c.EnvelopeSignature("ab" * 32, "c2lnbmF0dXJlIGJ5dGVz"),)),
}


def render() -> str:
    """The Markdown text of docs/contracts.md."""
    missing = set(c.CONTRACT_TYPES.values()) - set(EXAMPLES)
    if missing:
        raise SystemExit(f"no example for {sorted(m.__name__ for m in missing)}: add one to EXAMPLES")
    out = [
        "# Contracts",
        "",
        "Generated by `python docs/gen_contracts.py` from the code; do not edit by hand.",
        "",
        "Every contract is a frozen attrs class, validated when built and serialized by the one cattrs",
        "converter (`mixle_parallel.contracts.serialization`) into a versioned envelope",
        "`{\"kind\", \"version\", \"data\"}`. Every field must be present, unknown keys are refused, enums",
        "travel by value and sets as sorted lists. `mixle-parallel schema KIND` prints the JSON Schema.",
        "",
    ]
    for cls in sorted(EXAMPLES, key=lambda k: k.__name__):
        doc = (cls.__doc__ or "").strip().splitlines()[0]
        fields = ", ".join(f"`{f.name}`" for f in attrs.fields(cls))
        out += [f"## {cls.__name__}", "", doc, "", f"Fields: {fields}.", "", "```json",
                json.dumps(c.to_dict(EXAMPLES[cls]), indent=2, sort_keys=True), "```", ""]
    return "\n".join(out)


def main() -> int:
    """Write docs/contracts.md beside this script (``--check``: exit 1 if it is stale)."""
    target = Path(__file__).with_name("contracts.md")
    text = render()
    if "--check" in sys.argv:
        return 0 if target.exists() and target.read_text(encoding="utf-8") == text else 1
    target.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
