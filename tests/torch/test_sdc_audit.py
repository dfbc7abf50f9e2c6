"""In-session SDC audit on a real 2-rank gloo world (DDP and FSDP2), plus the certified run with a ledger.

The world starts once (``_audit_scenarios.world2``) and runs every scenario; a certificate for the
dp_replicate family is produced first by the harness (``verify`` + ``certify``) and handed to the
ranks through ``MIXLE_PARALLEL_CERTIFICATE``.
"""

from __future__ import annotations

import pytest

from mixle_parallel.contracts import ParallelPlan, SDCAuditRecord, from_dict
from mixle_parallel.verification import verify, verify_ledger
from mixle_parallel.verification.admission import save_certificate
from tests.torch._audit_scenarios import BOTH_STEPS
from tests.torch._world import run_world

pytestmark = pytest.mark.slow
SPEC = "mixle_parallel.executors.torch.harness_adapter:VerifiableTorchNative"


@pytest.fixture(scope="module")
def audit_world(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("audit")
    report = verify(SPEC, ParallelPlan(dp_replicate=2), precision="fp32", workload="mlp")
    assert report.passed, report.summary()
    certificate = report.certify(SPEC)
    path = save_certificate(certificate, root / "cert.json")
    mp = pytest.MonkeyPatch()
    mp.setenv("MIXLE_PARALLEL_CERTIFICATE", str(path))
    mp.setenv("AUDIT_TEST_LEDGER", str(root / "ledger.jsonl"))
    try:
        ranks = run_world(2, "tests.torch._audit_scenarios", "world2")
    finally:
        mp.undo()
    return {"ranks": ranks, "certificate": certificate, "ledger": root / "ledger.jsonl"}


def records(run: dict) -> list[SDCAuditRecord]:
    return [from_dict(r, SDCAuditRecord) for r in run["records"]]


def bad(run: dict) -> set[tuple]:
    return {(r.step, r.replay, r.rank, r.attributed_rank, r.unit.split("[")[0].split(" inputs")[0], r.injected)
            for r in records(run) if not r.matched}


def test_clean_audited_steps_never_flag_and_change_no_bit(audit_world: dict) -> None:
    audited = 0
    for rank in audit_world["ranks"]:
        clean = rank["clean"]
        for name in ("ddp", "fsdp", "ddp_accum", "fsdp_accum"):
            run, plain = clean[f"{name}_audited"], clean[f"{name}_plain"]
            assert run["raised"] is None and not bad(run)
            commits = [r for r in run["receipts"] if not r["skipped"]]
            assert all(r["extra"]["audited"] for r in commits)
            # a peer replays each rank's gradient (no same-rank replay without a disagreement);
            # every rank holds every rank's records
            assert len(records(run)) == 2 * len(commits)
            assert {(r.replay, r.rank, r.auditor_rank) for r in records(run)} == {("peer", 0, 1), ("peer", 1, 0)}
            # the audit restores gradients, RNG and buffers: training is bitwise the un-audited run
            assert run["params"] == plain["params"] and run["step"] == plain["step"]
            assert [r["loss"] for r in commits] == [r["loss"] for r in plain["receipts"] if not r["skipped"]]
            # audit traffic is not the step's: the counted bytes equal the un-audited run's
            assert [r["collective_bytes"] for r in run["receipts"]] == [
                r["collective_bytes"] for r in plain["receipts"]
            ]
            audited += len(commits)
    assert audited == 2 * 300  # 300 clean audited steps, seen (and replayed) by each of the two ranks


def test_every_rank_holds_the_same_records_of_clean_steps(audit_world: dict) -> None:
    # on a clean step each rank makes its own peer record and rebuilds the others' from the exchange (one
    # all-reduce says every peer matched): what it rebuilds must be exactly what the auditor recorded
    ranks = audit_world["ranks"]
    for name in ("ddp", "fsdp", "ddp_accum", "fsdp_accum"):
        mine = [records(rank["clean"][f"{name}_audited"]) for rank in ranks]
        assert mine[0] and mine[0] == mine[1]  # rank 0's own records equal rank 1's rebuilt ones, and back
        assert all(r.matched and r.expected_digest == r.observed_digest for r in mine[0])


@pytest.mark.parametrize("name", ["ddp", "fsdp"])
def test_audit_replay_both_replays_on_the_same_rank_and_a_peer_every_step(audit_world: dict, name: str) -> None:
    for rank in audit_world["ranks"]:
        run, plain = rank["clean"][f"{name}_both_audited"], rank["clean"][f"{name}_plain"]
        assert run["raised"] is None and not bad(run)
        commits = [r for r in run["receipts"] if not r["skipped"]]
        # every rank also recomputes its window on a plain copy of the module (the reference; FSDP2: the full
        # parameters gathered into it)
        kinds = ("same_rank", "peer", "reference")
        assert len(commits) == BOTH_STEPS and len(records(run)) == 2 * len(kinds) * BOTH_STEPS
        assert {(r.replay, r.rank) for r in records(run)} == {(k, q) for k in kinds for q in (0, 1)}
        # bitwise the un-audited run over the same batches
        assert [r["loss"] for r in commits] == [r["loss"] for r in plain["receipts"][:BOTH_STEPS]]


@pytest.mark.parametrize("name", ["ddp", "fsdp"])
def test_every_flip_detected_attributed_and_kept_out(audit_world: dict, name: str) -> None:
    for rank in audit_world["ranks"]:
        run, clean = rank["flips"][f"{name}_skip"], rank["flips"][f"{name}_skip_clean"]
        skipped = [r for r in run["receipts"] if r["skipped"]]
        assert [(r["step"], r["extra"]["reason"]) for r in skipped] == [
            (2, "sdc_audit"),
            (5, "sdc_audit"),
            (7, "sdc_audit"),
        ]
        # each flip: the same-rank replay and the peer's replay both blame the flipped rank, so does the plain-copy
        # reference, and as the executor's replay did not reproduce the flip, the cause is the device
        kinds = ("same_rank", "peer", "reference")
        assert bad(run) == {(step, kind, flipped, flipped, "local_gradient", True)
                            for step, flipped in ((2, 1), (5, 0), (7, 1)) for kind in kinds}
        assert {r.cause for r in records(run) if not r.matched and r.replay == "reference"} <= {"device"}
        units = {r.unit for r in records(run) if not r.matched and r.replay == "same_rank"}
        assert units == {
            "local_gradient[blocks.0.up.weight]",
            "local_gradient[head.weight]",
            "local_gradient[embed.weight]",
        }
        assert all(r.action == "skip_step" for r in records(run) if not r.matched)
        # kept out of optimizer.step: bitwise the clean run that never saw those batches
        assert run["params"] == clean["params"] and run["step"] == clean["step"] == 7


@pytest.mark.parametrize("name", ["ddp", "fsdp"])
def test_warn_records_and_continues(audit_world: dict, name: str) -> None:
    ranks = audit_world["ranks"]
    for rank in ranks:
        run, clean = rank["flips"][f"{name}_warn"], rank["flips"][f"{name}_warn_clean"]
        assert not any(r["skipped"] for r in run["receipts"]) and run["step"] == 4
        kinds = ("same_rank", "peer", "reference")
        assert {(s, replay, att) for s, replay, _, att, _, _ in bad(run)} == {(2, kind, 1) for kind in kinds}
        assert all(r.action == "warn" for r in records(run) if not r.matched)
        assert run["params"] != clean["params"]  # the corrupted update went in, as warn allows
        assert run["receipts"][2]["extra"]["sdc_audit"]  # the findings travel in the receipt
    assert ranks[0]["flips"][f"{name}_warn"]["params"] == ranks[1]["flips"][f"{name}_warn"]["params"]


@pytest.mark.parametrize("name", ["ddp", "fsdp"])
def test_raise_raises_on_every_rank_and_leaves_state_consistent(audit_world: dict, name: str) -> None:
    for rank in audit_world["ranks"]:
        run = rank["flips"][f"{name}_raise"]
        assert run["raised"]["at_batch"] == 5 and run["step"] == 5 and run["grads_cleared"]
        kinds = ("peer", "reference", "same_rank")
        assert run["raised"]["bad"] == [(kind, 0, 0, "local_gradient") for kind in kinds]
        assert "silent data corruption detected" in run["raised"]["message"]


@pytest.mark.parametrize("name,flipped", [("ddp", 0), ("fsdp", 1)])
def test_parameter_flip_is_found_at_rest_on_its_rank(audit_world: dict, name: str, flipped: int) -> None:
    for rank in audit_world["ranks"]:
        run = rank["flips"][f"{name}_param"]
        assert run["raised"]["at_batch"] == 3 and run["step"] == 3
        assert run["raised"]["bad"] == [("same_rank", flipped, flipped, "parameters at rest")]


@pytest.mark.parametrize("name", ["ddp", "fsdp"])
def test_flip_on_an_unaudited_step_goes_unseen(audit_world: dict, name: str) -> None:
    for rank in audit_world["ranks"]:
        run = rank["flips"][f"{name}_unaudited"]
        assert run["raised"] is None and run["step"] == 4 and not bad(run)
        assert [r["extra"]["audited"] for r in run["receipts"]] == [True, False, False, False]


def test_certified_run_receipts_and_ledger(audit_world: dict) -> None:
    from mixle_parallel.verification import read_unverified

    cert = read_unverified(audit_world["certificate"])
    for rank in audit_world["ranks"]:
        run = rank["certified"]
        assert {(r["extra"]["admission"], r["extra"]["certificate"]) for r in run["receipts"]} == {
            ("certified", cert.certificate_id)
        }
        assert [r["skipped"] for r in run["receipts"]] == [False, True, False, False]
    report = verify_ledger(audit_world["ledger"])
    assert report.ok, report.summary()
    import json

    entries = [json.loads(line) for line in audit_world["ledger"].read_text().splitlines()]
    kinds = [e["kind"] for e in entries]
    assert kinds[0] == "run_start" and kinds[-1] == "run_end" and kinds.count("receipt") == 4
    assert {e["certificate"] for e in entries} == {cert.certificate_id}
    audits = [e["payload"]["record"]["data"] for e in entries if e["kind"] == "audit"]
    # 4 audited windows x a peer replay of each of the 2 ranks, plus the flipped window's escalation:
    # every rank's same-rank replay and its plain-copy reference (DDP)
    assert len(audits) == 4 * 2 + 2 * 2
    assert {(a["replay"], a["attributed_rank"]) for a in audits if not a["matched"]} == {
        ("same_rank", 1), ("peer", 1), ("reference", 1)}
    assert {a["cause"] for a in audits if not a["matched"] and a["replay"] == "reference"} == {"device"}


@pytest.mark.parametrize("name", ["ddp", "fsdp"])
def test_executor_that_cheats_outside_the_harness_is_a_backend_defect_on_every_rank(audit_world: dict,
                                                                                    name: str) -> None:
    for rank in audit_world["ranks"]:
        run = rank["cheat"][name]
        # its own replays agree with it; the peers' plain copies and each rank's own plain copy do not
        # (FSDP2: the full parameters gathered into the copy, compared with the pre-reduce-scatter gradient)
        assert run["raised"]["at_batch"] == 0 and run["step"] == 0 and run["grads_cleared"]
        expected = [(kind, r, r, "local_gradient") for kind in ("peer", "reference") for r in (0, 1)]
        assert run["raised"]["bad"] == expected
        assert run["raised"]["message"].startswith("backend defect:")
        causes = {(r.replay, r.cause) for r in records(run) if not r.matched}
        assert causes == {("peer", ""), ("reference", "backend_defect")}


def test_honest_fsdp_on_uneven_shards_with_accumulation_agrees_with_its_plain_reference(audit_world: dict) -> None:
    for rank in audit_world["ranks"]:
        run = rank["cheat"]["fsdp_honest_odd"]
        assert run["raised"] is None and run["step"] == 3 and not bad(run)
        assert {(r.replay, r.rank) for r in records(run)} == {(k, q) for k in ("same_rank", "peer", "reference")
                                                               for q in (0, 1)}
        assert all(r.expected_digest == r.observed_digest for r in records(run))


@pytest.fixture(scope="module")
def tp_world() -> list[dict]:
    """One world of 4 (dp_shard=2 x tp=2) running the tensor-parallel audit scenarios."""
    return run_world(4, "tests.torch._audit_tp_scenarios", "world4")


@pytest.mark.slow
def test_tensor_parallel_audit_is_clean_and_changes_no_bit(tp_world: list[dict]) -> None:
    for rank in tp_world:
        audited, plain = rank["audited"], rank["plain"]
        assert audited["raised"] is None
        assert audited["params"] == plain["params"]  # bitwise: the audit changes nothing
        assert [r["loss"] for r in audited["receipts"]] == [r["loss"] for r in plain["receipts"]]
        found = [from_dict(r, SDCAuditRecord) for r in audited["records"]]
        assert {r.replay for r in found} == {"peer", "reference"} and all(r.matched for r in found)
        # every step, every rank's gradient replayed by its peer (bitwise) and its shard judged against the plain
        # copy's full gradient (within the tolerance: bound > 0, the honest difference below it)
        assert len(found) == 12 * 4 * 2
        assert all(r.expected_digest == r.observed_digest for r in found if r.replay == "peer")
        assert all(0 < r.maximum_absolute_difference <= r.bound < 1e-4 for r in found if r.replay == "reference")


@pytest.mark.slow
def test_tensor_parallel_flip_is_attributed_and_kept_out(tp_world: list[dict]) -> None:
    for rank in tp_world:
        run = rank["flip"]
        bad = [r for r in (from_dict(d, SDCAuditRecord) for d in run["records"]) if not r.matched]
        assert bad and {r.attributed_rank for r in bad} == {3}
        assert {r.replay for r in bad} == {"same_rank", "peer", "reference"}
        assert {r.cause for r in bad if r.replay == "reference"} == {"device"}  # the executor's replay did not
        # reproduce the flip
        assert {r.auditor_rank for r in bad if r.replay == "peer"} == {1}  # rank 3's dp predecessor is rank 1
        assert [r["skipped"] for r in run["receipts"]].count(True) == 1


@pytest.mark.slow
def test_hsdp_audit_with_its_plain_reference_is_clean_and_changes_no_bit(tp_world: list[dict]) -> None:
    for rank in tp_world:
        audited, plain = rank["hsdp_audited"], rank["hsdp_plain"]
        assert audited["raised"] is None and audited["params"] == plain["params"]
        found = [from_dict(r, SDCAuditRecord) for r in audited["records"]]
        assert all(r.matched for r in found) and {r.replay for r in found} == {"peer"}
        assert len(found) == 4 * 4  # every step, every rank's gradient recomputed by its peer on the plain copy


@pytest.mark.slow
def test_hsdp_executor_that_cheats_outside_the_harness_is_a_backend_defect(tp_world: list[dict]) -> None:
    for rank in tp_world:
        run = rank["hsdp_cheat"]
        assert run["raised"]["at_batch"] == 0 and run["step"] == 0 and run["grads_cleared"]
        assert run["raised"]["bad"] == [(kind, r, r, "local_gradient") for kind in ("peer", "reference")
                                        for r in range(4)]
        assert run["raised"]["message"].startswith("backend defect:")


@pytest.mark.slow
def test_fsdp_tensor_parallel_executor_that_cheats_outside_the_harness_is_a_backend_defect(
        tp_world: list[dict]) -> None:
    for rank in tp_world:
        run = rank["cheat"]
        # its peers replay it through its own code and agree; each rank's shard of the plain copy's gradient does not
        assert run["raised"]["at_batch"] == 0 and run["step"] == 0 and run["grads_cleared"]
        assert run["raised"]["bad"] == [("reference", r, r, "local_gradient") for r in range(4)]
        assert run["raised"]["message"].startswith("backend defect:")
        found = [from_dict(r, SDCAuditRecord) for r in run["records"]]
        assert {(r.replay, r.cause) for r in found if not r.matched} == {("reference", "backend_defect")}
        assert {r.rank for r in found if r.replay == "same_rank" and r.matched} == {0, 1, 2, 3}


@pytest.fixture(scope="module")
def tp2_world() -> list[dict]:
    """One world of 2 (tp=2, no data-parallel axis) running the tensor-parallel reference scenarios."""
    return run_world(2, "tests.torch._audit_tp_scenarios", "world2")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["", "accum_"])
def test_tp2_audit_against_the_plain_reference_is_clean_and_changes_no_bit(tp2_world: list[dict], name: str) -> None:
    for rank in tp2_world:
        audited, plain = rank[f"{name}audited"], rank[f"{name}plain"]
        assert audited["raised"] is None and audited["params"] == plain["params"]
        assert [r["loss"] for r in audited["receipts"]] == [r["loss"] for r in plain["receipts"]]
        commits = [r for r in audited["receipts"] if not r["skipped"]]
        assert all(r["extra"]["audited"] and "sdc_reference_skipped" not in r["extra"] for r in commits)
        found = [from_dict(r, SDCAuditRecord) for r in audited["records"]]
        # no peer under pure TP: each rank replays its own window (bitwise) and judges it against the plain copy
        assert all(r.matched for r in found) and len(found) == len(commits) * 2 * 2
        assert {(r.replay, r.rank) for r in found} == {(k, q) for k in ("same_rank", "reference") for q in (0, 1)}
        assert all(0 < r.maximum_absolute_difference <= r.bound < 1e-4 for r in found if r.replay == "reference")


@pytest.mark.slow
def test_tp2_reference_frees_the_gathered_parameters_after_the_audit(tp2_world: list[dict]) -> None:
    for rank in tp2_world:
        assert rank["freed"] == {"audited": 1, "numel": 0, "grads": []}


@pytest.mark.slow
def test_tp2_executor_that_cheats_outside_the_harness_is_a_backend_defect_on_every_rank(tp2_world: list[dict]) -> None:
    for rank in tp2_world:
        run = rank["cheat"]
        assert run["raised"]["at_batch"] == 0 and run["step"] == 0 and run["grads_cleared"]
        assert run["raised"]["bad"] == [("reference", 0, 0, "local_gradient"), ("reference", 1, 1, "local_gradient")]
        assert run["raised"]["message"].startswith("backend defect:")
        found = [from_dict(r, SDCAuditRecord) for r in run["records"]]
        assert all(r.matched for r in found if r.replay == "same_rank")  # its own replays agree with it
        assert {r.cause for r in found if not r.matched} == {"backend_defect"}
        assert all(r.maximum_absolute_difference > 100 * r.bound for r in found if not r.matched)


@pytest.mark.slow
def test_tp2_gradient_flip_is_a_device_fault_of_its_rank(tp2_world: list[dict]) -> None:
    for rank in tp2_world:
        run = rank["flip"]
        found = [from_dict(r, SDCAuditRecord) for r in run["records"]]
        bad = [r for r in found if not r.matched]
        assert {(r.step, r.replay, r.attributed_rank, r.cause) for r in bad} == {
            (1, "same_rank", 1, ""), (1, "reference", 1, "device")}
        assert [r["skipped"] for r in run["receipts"]] == [False, True, False, False]


@pytest.mark.slow
def test_tp2_reference_skipped_for_a_module_too_large_for_one_rank_says_why(tp2_world: list[dict]) -> None:
    for rank in tp2_world:
        run = rank["oversized"]
        assert run["raised"] is None
        assert all("above the reference's one-rank limit" in r["extra"]["sdc_reference_skipped"]
                   for r in run["receipts"])
        found = [from_dict(r, SDCAuditRecord) for r in run["records"]]
        assert {r.replay for r in found} == {"same_rank"}  # the executor's own replays only, said in every receipt
