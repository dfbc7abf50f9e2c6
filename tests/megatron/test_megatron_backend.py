"""The megatron backend in real gloo worlds against single-process references.

Each world starts once (module-scoped fixtures) and runs several scenarios; the tests below
only read its results. Tolerances: pipeline and data parallel runs reproduce the reference's
float32 arithmetic order, so parameters agree to 1e-6; tensor- and expert-parallel runs sum
partial products in a different order, so they agree to 1e-6 as well (float32 rounding).
"""

from __future__ import annotations

import importlib.util
import sys

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core not installed")

from mixle_parallel.contracts import ParallelPlan  # noqa: E402

from ._world import run_world  # noqa: E402

TOL = 1e-6


@pytest.fixture(scope="module")
def world2(tmp_path_factory):
    from . import _scenarios

    return run_world(2, _scenarios.world2_body, str(tmp_path_factory.mktemp("ckpt2")))


@pytest.fixture(scope="module")
def world4(tmp_path_factory):
    from . import _scenarios

    return run_world(4, _scenarios.world4_body, str(tmp_path_factory.mktemp("ckpt4")))


@pytest.fixture(scope="module")
def moe_reference():
    from . import _scenarios

    return run_world(1, _scenarios.reference_body)[0]["moe"]


def _check_pipeline(runs):
    from ._scenarios import HID, LR

    for run in runs:
        assert run["errors"], "every stage owns parameters"
        assert max(run["errors"].values()) <= TOL, run["errors"]
        committed = [r for r in run["receipts"] if not r["skipped"]]
        assert [r["step"] for r in committed] == [1, 2]
        assert [r["loss"] for r in committed] == pytest.approx(run["ref_losses"], abs=1e-6)
        plan = ParallelPlan(**run["plan"])
        for r in run["receipts"]:
            assert r["microbatches"] == plan.microbatches
            assert r["data_parallel_size"] == plan.data_parallel_size
            assert r["extra"]["admission"] == "unverified"
            assert r["learning_rates"] and r["learning_rates"] == pytest.approx([LR] * len(r["learning_rates"]))
        # bytes are counted from the collectives really issued: at least every microbatch's activation
        # send/receive and gradient send/receive between the two stages (2 rows x HID float32 each)
        p2p_floor = plan.microbatches * plan.gradient_accumulation_steps * 2 * (2 * HID * 4)
        for r in committed:
            assert r["collective_bytes"] >= p2p_floor, (r["collective_bytes"], p2p_floor)
            assert r["accumulation_steps"] == plan.gradient_accumulation_steps
            assert r["global_examples_observed"] == r["local_examples"] * plan.data_parallel_size
        skipped = [r for r in run["receipts"] if r["skipped"]]
        assert len(skipped) == STEPS_SKIPPED(plan) and all(r["extra"]["reason"] == "accumulating" for r in skipped)


def STEPS_SKIPPED(plan):  # noqa: N802 - reads like the quantity it is
    from ._scenarios import STEPS

    return STEPS * (plan.gradient_accumulation_steps - 1)


def _check_ranks_match_megatron(runs):
    for run in runs:
        assert run["megatron"]["pp"] == run["attested"]["pp"]
        assert run["megatron"]["tp"] == run["attested"]["tp"]
        plan_dp = run["attested"]["dp_replicate"] * ParallelPlan(**run["plan"]).dp_shard + run["attested"]["dp_shard"]
        assert run["megatron"]["dp"] == plan_dp
        assert run["attested"] == ParallelPlan(**run["plan"]).coordinate(run["rank"]).as_dict()


def test_pp2_matches_reference_with_receipts(world2):
    runs = [rank["pipeline"][0] for rank in world2]
    _check_pipeline(runs)
    assert [r["logging"] for r in runs] == [False, True]  # the last stage holds the loss
    assert runs[0]["updates"] == ["act:pp", "metric:pp"]


def test_pp2_dp2_matches_reference(world4):
    runs = [rank["pipeline"][0] for rank in world4]
    _check_pipeline(runs)
    assert sum(r["logging"] for r in runs) == 1
    plan = ParallelPlan(**runs[0]["plan"])
    for r in runs:  # reduce_sums adds over the rank's data-parallel group (the ranks sharing pp and tp)
        group = next(g for g in plan.data_parallel_group_ranks() if r["rank"] in g)
        assert r["reduce_sums"] == (2.0, float(sum(group)))
    assert [tuple(g) for g in plan.data_parallel_group_ranks()] == [(0, 1), (2, 3)]
    assert "grad:dp" in runs[0]["updates"] and "act:pp" in runs[0]["updates"]


def test_attested_coordinates_equal_megatron_ranks(world2, world4):
    _check_ranks_match_megatron([rank["pipeline"][0] for rank in world2 + world4])
    for rank, result in enumerate(world2):
        assert result["tp"]["megatron"]["tp"] == result["tp"]["attested"]["tp"] == rank
        assert result["moe"]["megatron_ep"] == result["moe"]["attested"]["ep"] == rank


def test_accumulation_discard_and_finish(world2, world4):
    for rank in world2 + world4:
        acc = rank["pipeline"][0]["accumulation"]
        assert acc["skipped"]["skipped"] and acc["skipped"]["extra"]["reason"] == "accumulating"
        assert acc["discarded"]["skipped"] and acc["discarded"]["extra"]["reason"] == "discarded"
        assert acc["unchanged_after_discard"]
        assert not acc["finished"]["skipped"] and acc["finished"]["accumulation_steps"] == 1
        assert acc["finished"]["step"] == 3 and acc["moved_after_finish"]
        assert acc["nothing_pending"] is None


def test_checkpoint_reshards_pipeline_to_data_parallel(world2, world4):
    for rank in world2 + world4:
        ckpt = rank["pipeline"][0]["checkpoint"]
        assert ckpt["keys"] == ["layers.0.bias", "layers.0.weight", "layers.2.bias", "layers.2.weight",
                                "layers.4.bias", "layers.4.weight", "layers.6.bias", "layers.6.weight"]
        assert max(ckpt["errors"].values()) == 0.0
        assert ckpt["step"] == ckpt["saved_step"] == 3
        assert max(ckpt["optimizer_errors"].values()) == 0.0


def test_tp2_column_row_parallel_matches_reference(world2):
    for rank in world2:
        tp = rank["tp"]
        assert max(tp["errors"].values()) <= TOL, tp["errors"]
        assert tp["shapes"]["layers.0.0.layer.weight"] == [4, 4]  # half of the 8 hidden rows per rank
        assert [r["skipped"] for r in tp["receipts"]] == [False, False]


def test_ep2_moe_matches_single_process_reference(world2, moe_reference):
    seen = set()
    for rank in world2:
        moe = rank["moe"]
        assert moe["local_experts"] == 2
        for name, value in moe["final"].items():
            assert float((value - moe_reference["final"][name]).abs().max()) <= TOL, name
            seen.add(name)
        assert "token:ep" in moe["updates"]
    assert seen == set(moe_reference["final"])  # the two ranks together hold all four experts
    local = [rank["moe"]["receipts"][-1]["extra"]["local_loss"] for rank in world2]
    for rank in world2:  # the receipt's loss is the data-parallel mean of the replicas' losses
        assert rank["moe"]["receipts"][-1]["loss"] == pytest.approx(sum(local) / 2, abs=1e-12)
        assert rank["moe"]["receipts"][-1]["loss"] == pytest.approx(moe_reference["receipts"][-1]["loss"], abs=1e-6)


def test_importing_the_package_does_not_import_megatron():
    import subprocess

    code = ("import sys, mixle_parallel, mixle_parallel.executors as e; e.available_training_backends();"
            "print([m for m in ('torch', 'megatron') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_seed_seeds_the_training_of_an_nn_sequential():
    """seed= once applied only to a model builder; an nn.Sequential's dropout masks now follow it too."""
    from . import _scenarios

    losses = run_world(1, _scenarios.seed_body)[0]
    assert losses["first"] == losses["again"]  # bitwise: the same seed draws the same masks
    assert losses["first"] != losses["other"]
