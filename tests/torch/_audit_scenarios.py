"""Rank bodies for test_sdc_audit.py: the in-session SDC audit on a real 2-rank gloo world (DDP and FSDP2).

One world runs every scenario: clean audited runs (hundreds of audited steps, none may flag, and the
audit must not change a single bit of training), injected gradient and parameter flips under each
policy, and a certified run writing a ledger. Results are plain data checked in the parent.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from mixle_parallel.contracts import ParallelPlan, to_dict
from mixle_parallel.executors import get_training_backend
from mixle_parallel.verification import BitFlip, FaultInjector, Ledger, SDCDetectedError, digest
from tests.torch._models import VOCAB, global_batches, make_model

DDP, FSDP = ParallelPlan(dp_replicate=2), ParallelPlan(dp_shard=2)
CLEAN_STEPS = 130  # per clean run: 2 x 130 + 2 x 20 accumulation windows = 300 audited steps, none may flag
FLIP_STEPS = 10
BOTH_STEPS = 12  # clean steps audited with audit_replay="both"


def session(plan: ParallelPlan, **kwargs: Any) -> Any:
    """A torch_native session on the tiny LM with SGD+momentum; a test mesh opts out of admission unless told."""
    kwargs.setdefault("admission", "unverified")  # 2-rank test mesh without a certificate: recorded in receipts
    return get_training_backend("torch_native").prepare(
        make_model(), plan=plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), **kwargs)


def params_digest(s: Any) -> str:
    """Digest of the full parameters (all ranks take part in the gathers)."""
    from torch.distributed.tensor import DTensor

    from mixle_parallel.executors.torch.layouts import unwrap

    return digest({n: (p.full_tensor() if isinstance(p, DTensor) else p).detach()
                   for n, p in unwrap(s.module).named_parameters()})


def drive(s: Any, batches: list, calls: int = 1) -> dict[str, Any]:
    """Feed this rank's share of ``batches``; record receipts (plain JSON), the raised error, final parameters."""
    me, receipts, raised = dist.get_rank(), [], None
    try:
        for i, per_rank in enumerate(batches):  # noqa: B007 - i names the batch that raised, below
            receipts.append(to_dict(s.train_batch(*per_rank[me]))["data"])
    except SDCDetectedError as exc:
        raised = {"at_batch": i, "message": str(exc),
                  "bad": sorted({(r.replay, r.rank, r.attributed_rank, r.unit.split("[")[0].split(" inputs")[0])
                                 for r in exc.records
                                 if not r.matched})}
    out = {"receipts": receipts, "raised": raised, "params": params_digest(s), "step": s.step,
           "grads_cleared": all(p.grad is None for p in s.module.parameters()),
           "records": [to_dict(r) for r in s.audit_records]}
    s.close()
    return out


def clean_runs() -> dict[str, Any]:
    """Audited at rate 1.0 with policy 'raise' (a false positive would raise); and the same runs without audit."""
    out: dict[str, Any] = {}
    batches = global_batches(CLEAN_STEPS, [3, 5], seed=21)
    acc = global_batches(40, [4, 4], seed=22)
    for name, plan in (("ddp", DDP), ("fsdp", FSDP)):
        out[f"{name}_audited"] = drive(session(plan, audit_rate=1.0, audit_policy="raise"), batches)
        out[f"{name}_plain"] = drive(session(plan, audit=False), batches)
        accum = ParallelPlan(**{**to_dict(plan)["data"], "microbatches": 2, "gradient_accumulation_steps": 2})
        out[f"{name}_accum_audited"] = drive(session(accum, audit_rate=1.0, audit_policy="raise"), acc)
        out[f"{name}_accum_plain"] = drive(session(accum, audit=False), acc)
        # audit_replay="both": same-rank and peer replay on every audited step
        out[f"{name}_both_audited"] = drive(session(plan, audit_rate=1.0, audit_policy="raise", audit_replay="both"),
                                            batches[:BOTH_STEPS])
    return out


GRAD_FLIPS = (
    BitFlip("gradient", "blocks.0.up.weight", rank=1, step=2, index=5, bit=20),
    BitFlip("gradient", "head.weight", rank=0, step=5, index=17, bit=31),  # sign bit
    BitFlip("gradient", "embed.weight", rank=1, step=7, index=3, bit=0),  # lowest mantissa bit
)


def flip_runs() -> dict[str, Any]:
    """Gradient flips under skip_step / warn / raise, parameter flips under raise, for DDP and FSDP2."""
    out: dict[str, Any] = {}
    batches = global_batches(FLIP_STEPS, [4, 4], seed=23)
    for name, plan in (("ddp", DDP), ("fsdp", FSDP)):
        out[f"{name}_skip"] = drive(session(plan, audit_rate=1.0, audit_policy="skip_step",
                                            fault_injector=FaultInjector(GRAD_FLIPS)), batches)
        skipped = [i for i, r in enumerate(out[f"{name}_skip"]["receipts"]) if r["skipped"]]
        # the clean run that never saw the kept-out batches
        out[f"{name}_skip_clean"] = drive(session(plan, audit=False),
                                          [b for i, b in enumerate(batches) if i not in skipped])
        out[f"{name}_warn"] = drive(session(plan, audit_rate=1.0, audit_policy="warn",
                                            fault_injector=FaultInjector(GRAD_FLIPS[:1])), batches[:4])
        out[f"{name}_warn_clean"] = drive(session(plan, audit=False), batches[:4])
        out[f"{name}_raise"] = drive(session(plan, audit_rate=1.0, audit_policy="raise",
                                             fault_injector=FaultInjector(GRAD_FLIPS[1:2])), batches)
        param_flip = BitFlip("parameter", "blocks.1.down.weight", rank=0 if name == "ddp" else 1, step=3,
                             index=2, bit=25)
        out[f"{name}_param"] = drive(session(plan, audit_rate=1.0, audit_policy="raise",
                                             fault_injector=FaultInjector([param_flip])), batches)
        # a flip on an unaudited step is not seen (rate 0: only the run's first step is audited)
        out[f"{name}_unaudited"] = drive(session(plan, audit_rate=0.0, audit_policy="raise",
                                                 fault_injector=FaultInjector(GRAD_FLIPS[:1])), batches[:4])
    return out


def certified_run() -> dict[str, Any]:
    """A run admitted by the certificate named in MIXLE_PARALLEL_CERTIFICATE, writing a ledger on rank 0."""
    ledger = Ledger(os.environ["AUDIT_TEST_LEDGER"]) if dist.get_rank() == 0 else None
    flips = FaultInjector([BitFlip("gradient", "blocks.1.up.bias", rank=1, step=1, index=0, bit=22)])
    s = get_training_backend("torch_native").prepare(
        make_model(), plan=DDP, optimizer="SGD", lr=0.1, audit_rate=1.0, audit_policy="skip_step",
        fault_injector=flips, ledger=ledger)
    return drive(s, global_batches(4, [4, 4], seed=24))


def cheating(s: Any) -> Any:
    """Make ``s`` an executor that scales its backward by 1.01 whenever the verification harness is not active."""
    from mixle_parallel.verification.capability import active_harness_capability

    honest = s._backward

    def backward(loss_sum: torch.Tensor, weight: float) -> None:
        honest(loss_sum * (1.0 if active_harness_capability() is not None else 1.01), weight)

    s._backward = backward
    return s


def odd_model() -> torch.nn.Module:
    """A small LM whose dim-0 sizes (13, 7) do not divide by 2: FSDP2's shards are uneven."""
    torch.manual_seed(99)
    return torch.nn.Sequential(torch.nn.Embedding(VOCAB, 7), torch.nn.Linear(7, 13), torch.nn.Tanh(),
                               torch.nn.Linear(13, VOCAB))


def cheat_run() -> dict[str, Any]:
    """DDP and FSDP2 executors that cheat outside the harness; an honest FSDP2 run on unevenly sharded parameters
    and with accumulation, whose plain-copy reference must agree bitwise."""
    out = {name: drive(cheating(session(plan, audit_rate=1.0, audit_policy="raise")),
                       global_batches(2, [4, 4], seed=25)) for name, plan in (("ddp", DDP), ("fsdp", FSDP))}
    accum = ParallelPlan(dp_shard=2, microbatches=2, gradient_accumulation_steps=2)
    honest = get_training_backend("torch_native").prepare(
        odd_model(), plan=accum, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        admission="unverified", audit_rate=1.0, audit_policy="raise", audit_replay="both")
    out["fsdp_honest_odd"] = drive(honest, global_batches(6, [4, 4], seed=26))
    return out


def world2() -> dict[str, Any]:
    """Every scenario in one world."""
    return {"clean": clean_runs(), "flips": flip_runs(), "certified": certified_run(), "cheat": cheat_run()}
