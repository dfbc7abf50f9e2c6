"""Receipts against an independent count: PyTorch's flight recorder, read around every train_batch call.

The flight recorder logs each collective a c10d process group runs (DDP's C++ reducer, FSDP2's
comms, DTensor's functional collectives) with its tensor sizes and dtypes, so its bytes do not come
from the session's own accounting. The byte definition is the meter's: all-reduce / broadcast
buffer, the gathered output of an all-gather, the full input of a reduce-scatter.
"""

from __future__ import annotations

import contextlib
import json
import math
from typing import Any

import torch
import torch._C._distributed_c10d as c10d
from torch import nn

from mixle_parallel.contracts import ParallelPlan
from mixle_parallel.executors import get_training_backend
from mixle_parallel.verification.harness.collectives import collective_kind, group_ranks_by_name
from tests.torch._models import TP_PLAN, VOCAB, global_batches, make_model
from tests.torch._scenarios import dp_index, plain

_DTYPE_BYTES = {"Float": 4, "Double": 8, "BFloat16": 2, "Half": 2, "Long": 8, "Int": 4, "Byte": 1, "Bool": 1,
                "Char": 1, "Short": 2}


_FLOATS = {"Float", "Double", "BFloat16", "Half"}


def _entries() -> list[dict[str, Any]]:
    return list(json.loads(c10d._dump_fr_trace_json()).get("entries", []))


def _sizes_bytes(sizes: list[list[int]], dtypes: list[str]) -> int:
    return sum(math.prod(shape) * _DTYPE_BYTES[dtype] for shape, dtype in zip(sizes, dtypes))


def recorded_since(mark: set[int]) -> tuple[int, dict[str, int], list[Any]]:
    """(bytes, counts per kind, entries as text) of the collectives the flight recorder logged after ``mark``."""
    nbytes, counts, seen = 0, {}, []
    groups = group_ranks_by_name()
    for entry in _entries():
        if int(entry["record_id"]) in mark:
            continue
        kind = collective_kind(str(entry["profiling_name"]))
        if kind is None:
            continue
        if kind.value == "broadcast" and not set(entry["input_dtypes"]) & _FLOATS:
            continue  # DDP's bucket-order sync after its first iteration: integer metadata, no update's data
        if kind.value == "all_gather":  # gloo's record keeps one output slot: input bytes x group size
            group = len(groups.get(str(entry["process_group"][0]), ()))
            nbytes += _sizes_bytes(entry["input_sizes"], entry["input_dtypes"]) * group
        else:
            nbytes += _sizes_bytes(entry["input_sizes"], entry["input_dtypes"])
        counts[kind.value] = counts.get(kind.value, 0) + 1
        seen.append((entry["profiling_name"], entry["input_sizes"], entry["output_sizes"], entry["input_dtypes"]))
    return nbytes, counts, seen


def _mark() -> set[int]:
    return {int(e["record_id"]) for e in _entries()}


class RunningStatsLM(nn.Module):
    """The test LM keeping running statistics of its logits in buffers, like BatchNorm: a float32 mean and a
    float64 count. DDP broadcasts buffers before each forward, one broadcast per dtype bucket (two here)."""

    def __init__(self) -> None:
        super().__init__()
        self.lm = make_model()
        self.register_buffer("mean", torch.zeros(VOCAB))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out = self.lm(tokens)
        with torch.no_grad():
            self.mean.mul_(0.9).add_(out.mean((0, 1)), alpha=0.1)
            self.count += tokens.numel()
        return out


def _model(kind: str) -> nn.Module:
    return RunningStatsLM() if kind == "buffers" else make_model(kind)


def _run(plan: ParallelPlan, batches: list, calls: int = 1, *, kind: str = "mlp", break_no_sync: bool = False,
         ) -> list[dict[str, Any]]:
    session = get_training_backend("torch_native").prepare(
        _model(kind), plan=plan, optimizer="SGD", lr=0.1, audit=False, admission="unverified",
        tp_plan=TP_PLAN if plan.tp > 1 else None)  # test mesh, no certificate
    if break_no_sync:  # the bug: DDP's no_sync() is never entered, so every micro-step all-reduces
        session._sync_context = lambda sync: contextlib.nullcontext()
    me = dp_index(plan)
    out = []
    for batch in batches[: 2 * calls]:
        mark = _mark()
        receipt = session.train_batch(*batch[me])
        recorded = recorded_since(mark)
        out.append({"receipt": plain(receipt), "recorded_bytes": recorded[0], "recorded_counts": recorded[1],
                    "recorded_entries": recorded[2],
                    "grad_bytes": sum(p.numel() * 4 for p in _model(kind).parameters())})
    session.close()
    return out


def world2() -> dict[str, Any]:
    """DDP with accumulation (correct, no_sync broken, with buffers), FSDP2, TP, CP: receipts and recorded counts."""
    acc = global_batches(4, [4, 4], seed=5)
    return {
        "ddp_accum": _run(ParallelPlan(dp_replicate=2, gradient_accumulation_steps=2), acc, calls=2),
        "ddp_broken_no_sync": _run(ParallelPlan(dp_replicate=2, gradient_accumulation_steps=2), acc, calls=2,
                                   break_no_sync=True),
        "ddp_buffers": _run(ParallelPlan(dp_replicate=2, gradient_accumulation_steps=2), acc, calls=1, kind="buffers"),
        "fsdp": _run(ParallelPlan(dp_shard=2), global_batches(2, [4, 4])),
        "tp": _run(ParallelPlan(tp=2), global_batches(2, [6])),
        "cp": _run(ParallelPlan(cp=2), global_batches(2, [4]), kind="attn"),
    }


def world4() -> dict[str, Any]:
    """HSDP (dp_replicate=2 x dp_shard=2): receipts and recorded counts."""
    return {"hsdp": _run(ParallelPlan(dp_replicate=2, dp_shard=2), global_batches(2, [2, 2, 2, 2]))}


__all__ = ["recorded_since", "world2", "world4"]
