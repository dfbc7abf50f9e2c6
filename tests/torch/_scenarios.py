"""Rank-agnostic scenario bodies: every rank runs the same code; results are compared in the parent test."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from mixle_parallel.contracts import ParallelPlan, to_dict
from mixle_parallel.executors import get_training_backend
from mixle_parallel.executors.torch.backend import lm_token_loss
from mixle_parallel.executors.torch.layouts import pre_wrap_fqn, unwrap
from tests.torch._models import TP_PLAN, global_batches, make_model


def plain(contract: Any) -> dict:
    """A contract as plain JSON data (the envelope removed)."""
    return to_dict(contract)["data"]


STEPS = 3


def full_params(session: Any) -> dict[str, torch.Tensor]:
    """Every parameter as a whole tensor (all ranks take part in the gathers)."""
    out = {}
    for name, p in unwrap(session.module).named_parameters():
        t = p.full_tensor() if isinstance(p, DTensor) else p
        out[pre_wrap_fqn(name)] = t.detach().float().clone()
    return out


def dp_index(plan: ParallelPlan) -> int:
    """This rank's index in the data-parallel domain (its share of the global batch)."""
    c = plan.coordinate(dist.get_rank())
    return c.dp_replicate * plan.dp_shard + c.dp_shard


def train(plan: ParallelPlan, batches: list, *, kind: str = "mlp", calls: int = 1, loss_fn: Any = None,
          **kwargs: Any) -> dict:
    """Run a session over ``batches`` (``calls`` train_batch calls per optimizer step); record everything."""
    backend = get_training_backend("torch_native")
    session = backend.prepare(
        make_model(kind), plan=plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        tp_plan=TP_PLAN if plan.tp > 1 else None, loss_fn=loss_fn, admission="unverified", **kwargs,
    )
    me = dp_index(plan)
    receipts = []
    for i in range(0, len(batches), calls):
        for call in batches[i:i + calls]:
            x, y = call[me]
            receipts.append(session.train_batch(x, y))
    result = {"receipts": [plain(r) for r in receipts], "params": full_params(session),
              "layouts": [plain(layout) for layout in session.parameter_layouts], "state": plain(session.state())}
    session.close()
    return result


def world2() -> dict:
    """DDP, FSDP (uneven), TP 2, CP 2, accumulation (FSDP and DDP), clipping, bf16, non-finite, sums, layouts."""
    out: dict[str, Any] = {}
    even, uneven = global_batches(STEPS, [4, 4]), global_batches(STEPS, [3, 5])
    out["ddp_uneven"] = train(ParallelPlan(dp_replicate=2), uneven)
    out["ddp_counts_at_commit"] = counts_at_commit(lambda: train(ParallelPlan(dp_replicate=2), uneven))
    out["clip_ddp_counts_at_commit"] = counts_at_commit(
        lambda: train(ParallelPlan(dp_replicate=2), uneven, max_grad_norm=0.05))
    out["fsdp_uneven"] = train(ParallelPlan(dp_shard=2), uneven)
    out["tp"] = train(ParallelPlan(tp=2), global_batches(STEPS, [6]))
    out["cp"] = train(ParallelPlan(cp=2), global_batches(STEPS, [4]), kind="attn")
    acc = global_batches(2 * STEPS, [3, 5], seed=11)
    out["accum_fsdp"] = train(ParallelPlan(dp_shard=2, microbatches=2, gradient_accumulation_steps=2), acc, calls=2)
    out["accum_ddp"] = train(ParallelPlan(dp_replicate=2, microbatches=2, gradient_accumulation_steps=2), acc, calls=2)
    out["clip_ddp"] = train(ParallelPlan(dp_replicate=2), uneven, max_grad_norm=0.05)
    out["clip_fsdp"] = train(ParallelPlan(dp_shard=2), uneven, max_grad_norm=0.05)
    out["bf16_fsdp"] = train(ParallelPlan(dp_shard=2), even, precision="bf16")
    out["nonfinite"] = nonfinite_cases()
    out["misc"] = misc_cases()
    return out


def counts_at_commit(run: Any) -> dict:
    """``run()`` with DDP's CUDA path on the CPU: the counts all-reduced at the commit, after the backward."""
    from mixle_parallel.executors.torch import session

    saved, session.COUNTS_BEFORE_BACKWARD_DEVICES = session.COUNTS_BEFORE_BACKWARD_DEVICES, frozenset()
    try:
        return run()
    finally:
        session.COUNTS_BEFORE_BACKWARD_DEVICES = saved


def world4() -> dict:
    """FSDP 4, HSDP 2x2, FSDP+TP 2x2, DDP+TP 2x2."""
    out: dict[str, Any] = {}
    out["fsdp4"] = train(ParallelPlan(dp_shard=4), global_batches(STEPS, [2, 3, 4, 5]))
    out["hsdp"] = train(ParallelPlan(dp_replicate=2, dp_shard=2), global_batches(STEPS, [2, 3, 4, 5]))
    out["fsdp_tp"] = train(ParallelPlan(dp_shard=2, tp=2), global_batches(STEPS, [3, 5]))
    out["ddp_tp"] = train(ParallelPlan(dp_replicate=2, tp=2), global_batches(STEPS, [3, 5]))
    return out


def _poisoned_loss(bad_call: int, bad_rank: int) -> Any:
    state = {"call": 0}

    def loss_fn(module: Any, x: Any, y: Any) -> Any:
        loss, count = lm_token_loss(module, x, y)
        state["call"] += 1
        if state["call"] == bad_call and dist.get_rank() == bad_rank:
            loss = loss * float("nan")
        return loss, count
    return loss_fn


def nonfinite_cases() -> dict:
    """A NaN loss on one rank at step 2: 'skip' keeps state and continues, 'raise' raises on every rank."""
    out: dict[str, Any] = {}
    batches = global_batches(STEPS, [3, 5])
    for policy in ("skip", "raise"):
        backend = get_training_backend("torch_native")
        session = backend.prepare(
            make_model(), plan=ParallelPlan(dp_shard=2), loss_fn=_poisoned_loss(2, 1), nonfinite=policy,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
            admission="unverified",  # a 2-rank test mesh without a certificate: opt out, recorded in receipts
            audit=False,  # the poisoned loss counts its calls; audit replays would call it too
        )
        me, rec = dp_index(session.plan), {}
        session.train_batch(*batches[0][me])
        before = full_params(session)
        momentum_before = [s["momentum_buffer"].full_tensor().clone() for s in session.optimizer.state.values()]
        try:
            rec["receipt"] = plain(session.train_batch(*batches[1][me]))
        except FloatingPointError as err:
            rec["raised"] = str(err)
        rec["unchanged"] = all(torch.equal(before[k], v) for k, v in full_params(session).items())
        momentum_after = [s["momentum_buffer"].full_tensor() for s in session.optimizer.state.values()]
        rec["momentum_unchanged"] = all(torch.equal(a, b) for a, b in zip(momentum_before, momentum_after))
        rec["grads_cleared"] = all(p.grad is None for p in session.module.parameters())
        rec["state_after"] = plain(session.state())
        rec["next"] = plain(session.train_batch(*batches[2][me]))
        rec["params"] = full_params(session)
        out[policy] = rec
        session.close()
    return out


def misc_cases() -> dict:
    """Byte counting (DDP, FSDP), reduce_sums, tied-parameter layouts, finish/discard accumulation."""
    out: dict[str, Any] = {}
    backend = get_training_backend("torch_native")
    batches = global_batches(2, [4, 4])
    for name, plan, audit in (("ddp", ParallelPlan(dp_replicate=2), None), ("fsdp", ParallelPlan(dp_shard=2), None),
                              ("ddp_builtin", ParallelPlan(dp_replicate=2), False)):
        # audit=None (on) and audit=False (off) count bytes the same way: the counting comm hook sees each bucket
        # DDP really all-reduces (the comm hook of gradient_mean.DDPMean); only the audit's gradient hooks differ
        s = backend.prepare(make_model(), plan=plan, optimizer="SGD", lr=0.1, audit=audit,
                            admission="unverified")  # test mesh, no certificate
        r = s.train_batch(*batches[0][dp_index(plan)])
        out[f"bytes_{name}"] = {"receipt": plain(r), "n_params": sum(p.numel() for p in make_model().parameters()),
                                "block_params": sum(p.numel() for p in make_model().blocks.parameters())}
        out[f"sums_{name}"] = s.reduce_sums(1.0, float(dist.get_rank()))
        s.close()
    tied = backend.prepare(make_model(tied=True), plan=ParallelPlan(dp_shard=2), optimizer="SGD", lr=0.1,
                        admission="unverified")  # test mesh, no certificate
    out["tied_layouts"] = [plain(layout) for layout in tied.parameter_layouts]
    tied.close()
    plan = ParallelPlan(dp_shard=2, gradient_accumulation_steps=3)
    s = backend.prepare(make_model(), plan=plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
                        admission="unverified")  # test mesh, no certificate
    me = dp_index(plan)
    acc = global_batches(4, [3, 5], seed=3)
    s.train_batch(*acc[0][me])
    out["discard"] = plain(s.discard_accumulation())
    out["after_discard"] = full_params(s)
    s.train_batch(*acc[1][me])
    s.train_batch(*acc[2][me])
    out["finish"] = plain(s.finish_accumulation())
    out["after_finish"] = full_params(s)
    out["finish_none"] = s.finish_accumulation()
    s.close()
    return out
