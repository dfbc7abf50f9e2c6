"""The training audit's plain reference covers FSDP2 groups in which a parameter gets no gradient.

A layer the forward never calls and a frozen layer share the root FSDP2 group with trained parameters, so
the group's reduce-scatter input leaves them out. The audit splits that input per parameter once FSDP2 has
said which parameters got a gradient, so the peer and the same-rank check recompute the window on the plain
copy: an honest run is clean and bitwise the unaudited run, and an executor that cheats outside the
verification harness (its own replays cheat alike) is caught as a backend defect.
"""

from __future__ import annotations

import pytest

from tests.torch._world import run_world

pytestmark = pytest.mark.slow  # a 2-rank gloo world, like test_sdc_audit.py


@pytest.fixture(scope="module")
def world() -> list[dict]:
    from mixle_parallel.executors.torch.comm_taps import fsdp_taps_supported

    if not fsdp_taps_supported():
        pytest.skip("the FSDP2 audit needs FSDPModule.set_custom_reduce_scatter (torch >= 2.8)")
    return run_world(2, "tests.torch._audit_nograd_scenarios", "world2")


def test_honest_run_is_clean_uses_the_plain_reference_and_changes_no_bit(world: list[dict]) -> None:
    for rank in world:
        honest, plain = rank["honest"], rank["plain"]
        assert honest["raised"] is None and plain["raised"] is None and honest["step"] == plain["step"] == 3
        assert honest["params"] == plain["params"]
        records = honest["records"]
        assert records and all(r["matched"] for r in records)
        # every rank's window was recomputed on the plain copy, per parameter (no flat unit of the group)
        assert {(r["replay"], r["rank"]) for r in records} == {(k, q) for k in ("same_rank", "peer", "reference")
                                                               for q in (0, 1)}
        assert all(r["unit"].startswith("local_gradient") and "[" not in r["unit"] for r in records)


def test_executor_that_cheats_outside_the_harness_is_a_backend_defect(world: list[dict]) -> None:
    for rank in world:
        cheat = rank["cheat"]
        assert cheat["raised"] is not None and cheat["raised"]["type"] == "BackendDefectError"
        assert cheat["step"] == 0
        causes = {(replay, r, cause) for replay, r, cause, _unit in cheat["raised"]["bad"]}
        assert causes == {("peer", 0, ""), ("peer", 1, ""), ("reference", 0, "backend_defect"),
                          ("reference", 1, "backend_defect")}
        # the parameters that got a gradient are named; the unused and frozen ones are not in the gradient
        units = " ".join(unit for *_rest, unit in cheat["raised"]["bad"])
        assert "unused" not in units and "frozen" not in units
