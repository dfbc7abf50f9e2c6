"""megatron's tp=2 and ep=2 verification targets against the plain single-process references.

``verify --backend megatron --plan tp=2`` runs megatron's Column/RowParallelLinear with the MLP
workload's weights; ``--plan dp_replicate=2,ep=2`` (ep needs data-parallel ranks to span) runs
megatron's MoELayer against ``moe_module.TinyMoE``. A broken variant of each is refused with the
failed update named. The worlds take 20-45 s each on two shared cores, so they are marked slow.
"""

from __future__ import annotations

import importlib.util
from collections import Counter

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core not installed")

from mixle_parallel.contracts import CollectiveKind, ParallelAxis, ParallelPlan  # noqa: E402
from mixle_parallel.verification.harness.collectives import coinciding_axes, realign  # noqa: E402

A, C = ParallelAxis, CollectiveKind
BROKEN = "tests.megatron.broken_verifiable"


def test_moe_reference_equals_the_dense_top_k_formula():
    """The reference MoE's sparse dispatch equals every expert run on every token, weighted by a
    softmax over the top-k logits (zero elsewhere)."""
    import torch

    from mixle_parallel.verification.harness.workloads import MoEWorkload

    work = MoEWorkload()
    module = work.build_module(3)
    moe = module[0]
    x, _ = work.global_batch(0, 3)
    logits = moe.router(x)
    kth = logits.topk(work.topk, dim=-1).values[:, -1:]
    masked = torch.where(logits >= kth, logits, torch.full_like(logits, float("-inf")))
    weights = torch.softmax(masked, dim=-1)
    dense = sum(weights[:, e:e + 1] * expert(x) for e, expert in enumerate(moe.experts))
    torch.testing.assert_close(module(x), dense)
    assert ((weights > 0).sum(-1) == work.topk).all()


def test_a_physical_group_that_is_also_the_expert_group_matches_an_ep_declaration():
    plan = ParallelPlan(dp_replicate=2, ep=2)
    assert coinciding_axes(plan) == {(A.DP_REPLICATE,): (A.EP,)}
    assert coinciding_axes(ParallelPlan(dp_replicate=4, ep=2)) == {}  # ep groups are halves of the dp group
    declared = {(C.ALL_REDUCE, (A.DP_REPLICATE,)), (C.ALL_GATHER, (A.EP,))}
    counts = Counter({(C.ALL_GATHER, (A.DP_REPLICATE,)): 3, (C.ALL_REDUCE, (A.DP_REPLICATE,)): 2,
                      (C.BROADCAST, (A.DP_REPLICATE,)): 1})
    moved = realign(plan, counts, declared)
    # the all-gather moves to ep; the declared all-reduce stays; an undeclared kind stays undeclared
    assert moved == Counter({(C.ALL_GATHER, (A.EP,)): 3, (C.ALL_REDUCE, (A.DP_REPLICATE,)): 2,
                             (C.BROADCAST, (A.DP_REPLICATE,)): 1})


def test_the_ep_plan_error_says_how_to_give_experts_ranks():
    with pytest.raises(ValueError, match=r"e\.g\. dp_replicate=2,ep=2"):
        ParallelPlan(ep=2)


@pytest.mark.slow
@pytest.mark.parametrize("plan", ["tp=2", "dp_replicate=2,ep=2"])
def test_verify_megatron_passes(plan: str, capsys: pytest.CaptureFixture[str]):
    from mixle_parallel.cli import main

    code = main(["verify", "--backend", "megatron", "--plan", plan])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "PASSED" in out and ("act:tp" in out if "tp" in plan else "token:ep" in out)


@pytest.mark.slow
@pytest.mark.parametrize("spec, plan, update", [
    (f"{BROKEN}:RowParallelWithoutAllReduce", ParallelPlan(tp=2), "act:tp"),
    (f"{BROKEN}:ExpertGradientsSummed", ParallelPlan(dp_replicate=2, ep=2), "token:ep"),
], ids=["tp_row_without_all_reduce", "ep_expert_grads_summed"])
def test_a_broken_megatron_variant_is_refused(spec: str, plan: ParallelPlan, update: str):
    from mixle_parallel.verification.harness import verify
    from mixle_parallel.verification.harness.workloads import MLPWorkload, MoEWorkload

    workload = MoEWorkload(steps=2) if plan.ep > 1 else MLPWorkload(steps=2)
    report = verify(spec, plan, workload=workload)
    assert not report.passed
    assert "numerics" in report.failed_checks
    assert any(f"update {update!r}: check 'numerics' failed" in f for f in report.failures), report.failures
