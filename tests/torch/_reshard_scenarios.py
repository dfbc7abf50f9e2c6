"""Rank bodies of the dcp_checkpoint reshard tests: a torch_native session's checkpoint saved under one
plan (TP, HSDP, DDP at world 4) and loaded under another at world 2, through the dcp_checkpoint names."""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from mixle_parallel.contracts import ParallelPlan
from mixle_parallel.dcp_checkpoint import load_training_metadata, load_training_state, save_training_state
from mixle_parallel.executors import get_training_backend
from tests.torch._models import TP_PLAN, global_batches, make_model

# (name, plan saved at world 4, plan loaded at world 2)
CASES = (
    ("tp", ParallelPlan(dp_shard=2, tp=2), ParallelPlan(tp=2)),
    ("hsdp", ParallelPlan(dp_replicate=2, dp_shard=2), ParallelPlan(dp_shard=2)),
    ("ddp", ParallelPlan(dp_replicate=4), ParallelPlan(dp_replicate=2)),
)


def _session(plan: ParallelPlan) -> Any:
    return get_training_backend("torch_native").prepare(
        make_model(), plan=plan, optimizer="AdamW", lr=0.01, admission="unverified", audit=False, health=False,
        tp_plan=TP_PLAN if plan.tp > 1 else None)


def _full_digest(session: Any) -> tuple[str, str]:
    """sha256 of every full (unsharded) parameter and of the full optimizer state, in name order."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    msd, osd = get_state_dict(session.module, session.optimizer,
                              options=StateDictOptions(full_state_dict=True, cpu_offload=False))
    def digest(tree: Any) -> str:
        h = hashlib.sha256()
        flat = []
        def walk(v: Any, path: str) -> None:
            if isinstance(v, dict):
                for k in sorted(v, key=str):
                    walk(v[k], f"{path}.{k}")
            elif isinstance(v, (list, tuple)):
                for i, x in enumerate(v):
                    walk(x, f"{path}.{i}")
            elif isinstance(v, torch.Tensor):
                t = v.full_tensor() if hasattr(v, "full_tensor") else v
                flat.append((path, t.detach().cpu().contiguous()))
        walk(tree, "")
        for path, t in flat:
            h.update(path.encode())
            h.update(t.numpy().tobytes())
        return h.hexdigest()
    return digest(msd), digest(osd["state"])


def _train(session: Any, rank: int, steps: int) -> None:
    dp = session.plan.data_parallel_size
    index = rank // session.plan.tp  # tp varies fastest: ranks of one TP group read the same rows
    for batch in global_batches(steps, [4] * dp):
        x, y = batch[index % dp]
        session.train_batch(x, y)


def save(rank: int, world_size: int, root: str) -> dict[str, Any]:
    """World 4: two steps under each saved plan, a checkpoint through save_training_state, its digests."""
    out = {}
    for name, plan, _ in CASES:
        session = _session(plan)
        _train(session, rank, 2)
        save_training_state(session.module, session.optimizer, f"{root}/{name}", step=session.step,
                            parallel_plan=plan, extra={"case": name})
        out[name] = _full_digest(session)
        session.close()
    return out


def load(rank: int, world_size: int, root: str) -> dict[str, Any]:
    """World 2: each checkpoint loaded under the other plan; its digests and metadata."""
    out = {}
    for name, saved_plan, plan in CASES:
        session = _session(plan)
        meta = load_training_metadata(f"{root}/{name}")
        loaded = load_training_state(session.module, session.optimizer, f"{root}/{name}",
                                     allow_world_size_change=True)
        out[name] = {"digests": _full_digest(session), "step": loaded["step"], "extra": loaded["extra"],
                     "plan_ok": loaded["parallel_plan"] == saved_plan and meta["parallel_plan"] == saved_plan,
                     "saved_world": loaded["saved_world_size"], "meta_step": meta["step"]}
        _train(session, rank, 1)  # the resharded state trains on
        session.close()
    return out
