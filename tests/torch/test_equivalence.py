"""Multi-process gloo runs against the single-process reference (SGD+momentum, 3 steps, every loss and parameter).

Each process world starts once (world 2 and world 4) and runs many scenarios inside it.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.torch._models import global_batches, reference_run
from tests.torch._world import run_world

pytestmark = pytest.mark.slow

# fp32 tolerances: the distributed runs sum in a different order than the reference (reduce-scatter,
# all-reduce, per-rank partial sums), so results agree to float32 rounding, not bitwise.
LOSS_TOL = dict(rel_tol=1e-5, abs_tol=1e-6)
PARAM_TOL = dict(rtol=1e-4, atol=2e-6)
# bf16 autocast: both sides round matmul inputs to bf16, but in differently-sized matmuls.
BF16_LOSS_TOL = dict(rel_tol=2e-2, abs_tol=2e-2)
BF16_PARAM_TOL = dict(rtol=5e-2, atol=5e-3)


@pytest.fixture(scope="module")
def world2() -> list[dict]:
    return run_world(2, "tests.torch._scenarios", "world2")


@pytest.fixture(scope="module")
def world4() -> list[dict]:
    return run_world(4, "tests.torch._scenarios", "world4")


def committed(result: dict) -> list[dict]:
    return [r for r in result["receipts"] if not r["skipped"]]


def assert_matches(result: dict, ref: dict, loss_tol: dict = LOSS_TOL, param_tol: dict = PARAM_TOL) -> None:
    commits = committed(result)
    assert len(commits) == len(ref["losses"]) >= 3
    for got, want in zip(commits, ref["losses"]):
        assert math.isclose(got["loss"], want, **loss_tol), (got["loss"], want)
    assert set(result["params"]) >= set(ref["params"])
    for name, want in ref["params"].items():
        torch.testing.assert_close(result["params"][name], want, **param_tol, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("scenario", ["ddp_uneven", "ddp_counts_at_commit", "fsdp_uneven"])
def test_data_parallel_uneven_batches_match_reference(world2: list[dict], scenario: str) -> None:
    ref = reference_run("mlp", global_batches(3, [3, 5]))
    for rank in world2:
        assert_matches(rank[scenario], ref)


@pytest.mark.parametrize("scenario", ["ddp_uneven", "clip_ddp"])
def test_ddp_counts_before_backward_agree_with_counts_at_commit(world2: list[dict], scenario: str) -> None:
    """The CPU path (counts all-reduced before the backward, which yields the mean) and the CUDA path
    (counts and norm all-reduced at the commit, then a scaling pass) commit the same steps."""
    for rank in world2:
        fast, late = rank[scenario], rank[scenario.replace("_uneven", "") + "_counts_at_commit"]
        for a, b in zip(committed(fast), committed(late), strict=True):
            assert math.isclose(a["loss"], b["loss"], rel_tol=1e-6)  # rounding differs from the first update on
            assert math.isclose(a["extra"]["grad_norm"], b["extra"]["grad_norm"], rel_tol=1e-5)
            assert a["extra"]["clipped"] == b["extra"]["clipped"]
            assert a["extra"]["collectives"] == b["extra"]["collectives"]  # the same collectives, moved
        for name, value in fast["params"].items():
            torch.testing.assert_close(value, late["params"][name], rtol=1e-5, atol=1e-6)


def test_tensor_parallel_2_matches_reference(world2: list[dict]) -> None:
    ref = reference_run("mlp", global_batches(3, [6]))
    for rank in world2:
        assert_matches(rank["tp"], ref)


def test_context_parallel_2_matches_reference(world2: list[dict]) -> None:
    # non-causal attention on CPU (MATH SDPA); exact gradients rule out a 1/cp scaling defect
    ref = reference_run("attn", global_batches(3, [4]))
    for rank in world2:
        assert_matches(rank["cp"], ref)


@pytest.mark.parametrize("scenario", ["accum_fsdp", "accum_ddp"])
def test_accumulation_equals_one_big_batch(world2: list[dict], scenario: str) -> None:
    acc = global_batches(6, [3, 5], seed=11)
    merged = [[(torch.cat([acc[i][r][0], acc[i + 1][r][0]]), torch.cat([acc[i][r][1], acc[i + 1][r][1]]))
               for r in range(2)] for i in range(0, 6, 2)]
    ref = reference_run("mlp", merged)
    for rank in world2:
        assert_matches(rank[scenario], ref)
        receipts = rank[scenario]["receipts"]
        assert [r["skipped"] for r in receipts] == [True, False] * 3
        assert all(r["extra"]["reason"] == "accumulating" for r in receipts[::2])


def test_non_commit_micro_steps_issue_no_gradient_sync(world2: list[dict]) -> None:
    for rank in world2:
        ddp = rank["accum_ddp"]["receipts"]
        grad_bytes = 4 * rank["misc"]["bytes_ddp"]["n_params"]
        for skipped in ddp[::2]:  # DDP no_sync: no gradient all-reduce on a non-commit call
            assert set(skipped["extra"]["collectives"]) <= {"broadcast"}  # DDP's own small per-forward broadcast
            assert skipped["collective_bytes"] < 0.01 * grad_bytes, (skipped["collective_bytes"], grad_bytes)
        for commit in ddp[1::2]:  # one bucket all-reduce (tiny model) + the metric all-reduce
            assert commit["extra"]["collectives"] == {"all_reduce": 2}
        fsdp = rank["accum_fsdp"]["receipts"]
        groups = 3  # two blocks + the root
        for skipped in fsdp[::2]:  # set_requires_gradient_sync(False): all-gathers only
            assert "reduce_scatter" not in skipped["extra"]["collectives"]
            assert skipped["extra"]["collectives"]["all_gather"] > 0
        for commit in fsdp[1::2]:  # two micro-steps, but only the last one reduce-scatters
            assert commit["extra"]["collectives"]["reduce_scatter"] == groups
            assert commit["extra"]["collectives"]["all_reduce"] == 1


@pytest.mark.parametrize("scenario", ["clip_ddp", "clip_fsdp"])
def test_gradient_clipping_uses_the_reference_total_norm(world2: list[dict], scenario: str) -> None:
    ref = reference_run("mlp", global_batches(3, [3, 5]), max_grad_norm=0.05)
    for rank in world2:
        assert_matches(rank[scenario], ref)
        for got, want in zip(committed(rank[scenario]), ref["norms"]):
            assert got["extra"]["clipped"] is True
            assert math.isclose(got["extra"]["grad_norm"], want, rel_tol=1e-5), (got["extra"]["grad_norm"], want)


def test_bf16_autocast_matches_reference(world2: list[dict]) -> None:
    ref = reference_run("mlp", global_batches(3, [4, 4]), bf16=True)
    for rank in world2:
        assert_matches(rank["bf16_fsdp"], ref, BF16_LOSS_TOL, BF16_PARAM_TOL)
        assert all(r["precision"] == "bf16" for r in rank["bf16_fsdp"]["receipts"])


def test_commit_receipts_carry_global_counts(world2: list[dict]) -> None:
    batches = global_batches(3, [3, 5])
    for r, rank in enumerate(world2):
        for step, receipt in enumerate(committed(rank["ddp_uneven"])):
            x, y = batches[step][r]
            assert receipt["local_examples"] == x.shape[0]
            assert receipt["local_tokens"] == int((y != -100).sum())
            assert receipt["global_examples_observed"] == 8
            assert receipt["global_tokens_observed"] == sum(int((b[1] != -100).sum()) for b in batches[step])
            assert receipt["step"] == step + 1 and receipt["data_parallel_size"] == 2
            assert receipt["extra"]["admission"] == "unverified"


def test_nonfinite_skip_keeps_state_and_continues(world2: list[dict]) -> None:
    batches = global_batches(3, [3, 5])
    ref = reference_run("mlp", [batches[0], batches[2]])  # the poisoned step never happened
    for rank in world2:
        rec = rank["nonfinite"]["skip"]
        assert rec["receipt"]["skipped"] is True and rec["receipt"]["extra"]["reason"] == "nonfinite"
        assert rec["unchanged"] and rec["momentum_unchanged"] and rec["grads_cleared"]
        optimizer_receipt = rec["state_after"]["optimizer_receipt"]
        assert rec["state_after"] == {"step": 1, "pending_accumulation": 0, "optimizer_receipt": optimizer_receipt}
        assert rec["next"]["step"] == 2 and not rec["next"]["skipped"]
        assert math.isclose(rec["next"]["loss"], ref["losses"][1], **LOSS_TOL)
        for name, want in ref["params"].items():
            torch.testing.assert_close(rec["params"][name], want, **PARAM_TOL)


def test_nonfinite_raise_raises_on_every_rank_with_consistent_state(world2: list[dict]) -> None:
    for rank in world2:
        rec = rank["nonfinite"]["raise"]
        assert "nonfinite" in rec["raised"] and "nonfinite='skip'" in rec["raised"]
        assert rec["unchanged"] and rec["momentum_unchanged"] and rec["grads_cleared"]
        assert rec["state_after"]["step"] == 1 and rec["state_after"]["pending_accumulation"] == 0
        assert rec["next"]["step"] == 2 and not rec["next"]["skipped"]


def test_collective_bytes_within_5_percent_of_true_bytes(world2: list[dict]) -> None:
    for rank in world2:
        misc = rank["misc"]
        n, blocks = misc["bytes_ddp"]["n_params"], misc["bytes_ddp"]["block_params"]
        metric = 5 * 8  # the session's float64 commit all-reduce
        true_ddp = 4 * n + metric  # fp32 gradients all-reduced once
        for case in ("bytes_ddp", "bytes_ddp_builtin"):  # the counting comm hook, with the audit on and off
            got = misc[case]["receipt"]["collective_bytes"]
            assert abs(got - true_ddp) <= 0.05 * true_ddp, (case, got, true_ddp)
        # FSDP2 (no padding: every dim 0 is even): forward all-gather of everything, backward
        # re-gather of the resharded blocks (the root keeps its parameters), reduce-scatter of everything
        true_fsdp = 4 * (n + blocks + n) + metric
        got = misc["bytes_fsdp"]["receipt"]["collective_bytes"]
        assert abs(got - true_fsdp) <= 0.05 * true_fsdp, (got, true_fsdp)


def test_reduce_sums_over_data_parallel_domain(world2: list[dict]) -> None:
    for rank in world2:
        assert rank["misc"]["sums_ddp"] == (2.0, 1.0)
        assert rank["misc"]["sums_fsdp"] == (2.0, 1.0)


def test_tied_parameters_share_one_group(world2: list[dict]) -> None:
    layouts = {layout["logical_id"]: layout for layout in world2[0]["misc"]["tied_layouts"]}
    assert layouts["embed.weight"]["shared_group"] == "embed.weight"
    assert layouts["head.weight"]["shared_group"] == "embed.weight"
    assert layouts["blocks.0.up.weight"]["shared_group"] is None
    assert [tuple(map(str, p)) for p in layouts["embed.weight"]["placements"]] == [("dp_shard", "Shard(0)")]


def test_discard_and_finish_accumulation(world2: list[dict]) -> None:
    acc = global_batches(4, [3, 5], seed=3)
    ref = reference_run(
        "mlp", [[(torch.cat([acc[1][r][0], acc[2][r][0]]), torch.cat([acc[1][r][1], acc[2][r][1]])) for r in range(2)]]
    )
    init = reference_run("mlp", [])["params"]
    for rank in world2:
        misc = rank["misc"]
        assert misc["discard"]["skipped"] and misc["discard"]["extra"]["reason"] == "discarded"
        for name, want in init.items():
            assert torch.equal(misc["after_discard"][name], want), name
        assert not misc["finish"]["skipped"] and misc["finish"]["step"] == 1
        assert math.isclose(misc["finish"]["loss"], ref["losses"][0], **LOSS_TOL)
        for name, want in ref["params"].items():
            torch.testing.assert_close(misc["after_finish"][name], want, **PARAM_TOL)
        assert misc["finish_none"] is None


@pytest.mark.parametrize(
    "scenario,sizes",
    [
        ("fsdp4", [2, 3, 4, 5]),
        ("hsdp", [2, 3, 4, 5]),
        ("fsdp_tp", [3, 5]),
        ("ddp_tp", [3, 5]),
    ],
)
def test_world4_compositions_match_reference(world4: list[dict], scenario: str, sizes: list[int]) -> None:
    ref = reference_run("mlp", global_batches(3, sizes))
    for rank in world4:
        assert_matches(rank[scenario], ref)


def test_layouts_come_from_real_placements(world4: list[dict]) -> None:
    fsdp_tp = {layout["logical_id"]: dict(map(tuple, layout["placements"]))
               for layout in world4[0]["fsdp_tp"]["layouts"]}
    assert fsdp_tp["blocks.0.up.weight"] == {"dp_shard": "Shard(0)", "tp": "Shard(0)"}
    assert fsdp_tp["blocks.0.down.weight"] == {"dp_shard": "Shard(0)", "tp": "Shard(1)"}
    assert fsdp_tp["embed.weight"]["dp_shard"] == "Shard(0)"
    hsdp = {layout["logical_id"]: dict(map(tuple, layout["placements"])) for layout in world4[0]["hsdp"]["layouts"]}
    assert hsdp["head.weight"] == {"dp_replicate": "Replicate()", "dp_shard": "Shard(0)"}
