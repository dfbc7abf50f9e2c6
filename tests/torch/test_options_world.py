"""What the training options promise across real gloo ranks (DDP, world 2): no warning of ours, the ledger
owned by rank 0, a fault injector honoured with the audit off."""

from __future__ import annotations

import json
import pathlib

import pytest

from mixle_parallel.verification import verify_ledger
from tests.torch._world import run_world

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("options-world")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OPTIONS_TEST_ROOT", str(root))
        ranks = run_world(2, "tests.torch._options_scenarios", "world2")
    return {"ranks": ranks, "root": root}


def test_a_ddp_run_raises_no_warning_of_ours(world: dict) -> None:
    for rank in world["ranks"]:
        assert rank["warnings"]["steps"] == 3
        assert rank["warnings"]["audited"][0] is True  # the defaults ran: the audit too


def test_a_ledger_path_on_every_rank_is_written_by_rank_0_only(world: dict) -> None:
    path = pathlib.Path(world["ranks"][0]["ledger"]["path"])
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    kinds = [e["kind"] for e in entries]
    assert kinds[0] == "run_start" and kinds[-1] == "run_end" and kinds.count("run_start") == 1
    assert kinds.count("receipt") == 3  # rank 0's receipts (their counts are global); rank 1 wrote nothing
    assert {e["payload"]["rank"] for e in entries if e["kind"] == "receipt"} == {0}
    assert kinds.count("audit") == 3 * 2  # every step audited: each rank's peer record, all written by rank 0
    assert verify_ledger(path).ok


def test_a_ledger_object_on_another_rank_is_refused_saying_rank_0_owns_it(world: dict) -> None:
    rank1 = world["ranks"][1]
    assert "rank 0 owns a training run's ledger, and rank 1 was given a Ledger" in rank1["ledger"]["object_error"]
    assert not (world["root"] / "object-1.jsonl").exists()


def test_a_fault_injector_strikes_with_the_audit_off(world: dict) -> None:
    rank0, rank1 = world["ranks"]
    assert rank1["faults"]["applied"] == 1 and rank0["faults"]["applied"] == 0
    # DDP reduced the flipped gradient: both ranks moved the same way, away from the clean run
    assert rank0["faults"]["struck"] == rank1["faults"]["struck"] != rank0["faults"]["clean"]
