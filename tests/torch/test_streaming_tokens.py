"""StreamingTokenEncodedData (mixle's torch_neural): 2 real gloo ranks against a single-process reference."""

from __future__ import annotations

import math
import socket

import pytest
import torch

from tests.torch import _streaming_scenarios as sc

pytestmark = pytest.mark.slow  # one 2-rank world: ~25 s to spawn and import torch + mixle on a loaded machine

# fp32: the ranks sum their halves of the loss and gradients separately before the all-reduce, so the
# parameters agree with the one-process reference to float32 rounding (a few ulps per AdamW step), not bitwise
PARAM_TOL = dict(rtol=1e-5, atol=1e-6)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def world2() -> list[dict]:
    pytest.importorskip("mixle", reason="the mixle extra (mixle==0.8.2) is not installed")
    from mixle_parallel.verification.harness.mesh import run_world

    return run_world(sc.streaming_world, 2, _free_port(), torchrun_env=True, timeout=600)


def test_two_ranks_end_equal_to_the_union_reference(world2: list[dict]) -> None:
    ref = sc.reference(sc.TOKENS, 2)
    for rank in world2:
        for name, want in ref["params"].items():
            torch.testing.assert_close(rank["params"][name], want, **PARAM_TOL)
        assert [r[1] for r in rank["receipts"]] == pytest.approx(ref["losses"], rel=1e-5)
    for name in ref["params"]:  # DDP keeps replicas identical: bit for bit
        assert torch.equal(world2[0]["params"][name], world2[1]["params"][name])


def test_the_handle_owns_its_group_and_returns_mixles_leaf(world2: list[dict]) -> None:
    for rank in world2:
        assert rank["owned"] and rank["closed"]
        assert rank["type"] == "StreamingTransformer"  # mixle's StreamingTransformerLeaf
        assert rank["plan"] == "dp_replicate=2 (world 2)"
        schedule = rank["schedule"]
        assert schedule["window_counts_by_rank"] == (8, 9) and schedule["steps_per_epoch"] == 3
    assert world2[0]["schedule"]["local_masked_target_tokens"] == (3 * 4 - 8) * 2
    assert world2[0]["shard"] == (sc.TOKENS[:12].tolist(), True)  # each rank holds its own slice, copied
    assert world2[1]["shard"] == (sc.TOKENS[12:].tolist(), True)


def test_receipts_count_every_step_and_its_all_reduces(world2: list[dict]) -> None:
    for r, rank in enumerate(world2):
        receipts = rank["receipts"]
        assert [x[0] for x in receipts] == list(range(1, 7))  # 3 steps x 2 epochs, all committed
        assert not any(x[2] for x in receipts)
        # global targets per step: 4+4, 4+4, 0+1 (rank 0's third batch is all padding)
        assert [x[4] for x in receipts] == [8, 8, 1] * 2
        local = [4, 4, 0] if r == 0 else [4, 4, 1]
        assert [x[3] for x in receipts] == local * 2
        for x in receipts:  # one DDP bucket all-reduce (a tiny model) + the session's metric all-reduce
            assert x[6].get("all_reduce") == 2 and x[5] > 0 and x[7] == 2


def test_log_density_is_summed_over_both_shards(world2: list[dict]) -> None:
    count, total = world2[0]["log_density"]
    assert world2[1]["log_density"] == (count, total)
    assert count == 17 and math.isfinite(total) and total < 0


def test_fsdp2_in_an_existing_group_matches_the_same_reference(world2: list[dict]) -> None:
    ref = sc.reference(sc.TOKENS, 2)
    for rank in world2:
        fsdp = rank["fsdp"]
        assert not fsdp["owned"] and fsdp["plan"] == "dp_shard=2 (world 2)"
        for name, want in ref["params"].items():
            torch.testing.assert_close(fsdp["params"][name], want, **PARAM_TOL)
        assert fsdp["log_density"][0] == 17
        assert fsdp["log_density"][1] == pytest.approx(world2[0]["log_density"][1], rel=1e-5)
        for counts in fsdp["collectives"]:  # gradients reduce-scattered, parameters all-gathered
            assert counts.get("reduce_scatter", 0) >= 1 and counts.get("all_gather", 0) >= 1
