"""The body each gloo rank runs in test_sdc_gloo.py: data-parallel SGD with a real SDC audit per step."""

from __future__ import annotations

from typing import Any

from mixle_parallel.contracts import to_dict
from mixle_parallel.verification.sdc.digest import digest
from mixle_parallel.verification.sdc.inject import BitFlip, FaultInjector
from mixle_parallel.verification.sdc.training import AuditSchedule, SDCDetectedError, TrainingAuditor


def _grads(params: dict[str, Any], batch: tuple[Any, Any]) -> dict[str, Any]:
    import torch

    w = params["w"].detach().clone().requires_grad_(True)
    x, y = batch
    loss = torch.mean((x @ w - y) ** 2)
    (grad,) = torch.autograd.grad(loss, [w])
    return {"w": grad}


def train(rank: int, world_size: int, policy: str, flip: BitFlip | None, steps: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    torch.manual_seed(0)
    params = {"w": torch.zeros(5)}
    auditor = TrainingAuditor(AuditSchedule(rate=1.0), policy=policy)
    injector = FaultInjector([flip] if flip else [])
    skipped, raised = [], []
    for step in range(steps):
        gen = torch.Generator().manual_seed(rank * 1000 + step)
        batch = (torch.randn(8, 5, generator=gen), torch.randn(8, generator=gen))
        local = _grads(params, batch)
        injected = bool(injector.apply_all("gradient", local, rank=rank, step=step))
        try:
            verdict = auditor.audit(step=step, rank=rank, observed=local,
                                    recompute=lambda batch=batch: _grads(params, batch),
                                    inputs=(batch, params), injected=injected, defer_policy=True)
            verdict = auditor.agree(verdict)
            peer = auditor.audit_peer(step=step, rank=rank, group_ranks=list(range(world_size)), batch=batch,
                                      params=params, observed=local,
                                      recompute_on=lambda b: _grads(params, b), injected=injected)
        except SDCDetectedError as exc:
            raised.append((step, sorted({r.attributed_rank for r in exc.records if not r.matched})))
            continue
        if verdict.skip or peer.skip:
            skipped.append(step)
            continue
        grad = local["w"].clone()
        dist.all_reduce(grad)
        params["w"] -= 0.1 * grad / world_size
    return {"records": [to_dict(r) for r in auditor.records], "skipped": skipped, "raised": raised,
            "params": digest(params["w"])}
