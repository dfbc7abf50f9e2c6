"""CollectiveMeter: counts the collectives a step really issues (DDP, FSDP2, DTensor TP/CP) and their bytes.

A ``TorchDispatchMode`` sees every c10d op that goes through the dispatcher: the DDP reducer's
bucket all-reduces, FSDP2's all-gathers and reduce-scatters, and the functional collectives that
DTensor (tensor and context parallelism) issues. For DTensor arguments it returns
``NotImplemented`` first, so DTensor lowers the op to plain-tensor collectives that the mode then
sees (the same trick as ``torch.distributed.tensor.debug.CommDebugMode``, without its per-module
bookkeeping). Bytes are the size of the logical buffer a collective moves per rank: the tensor of
an all-reduce/broadcast/point-to-point, the gathered output of an all-gather, the full input of a
reduce-scatter or all-to-all.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

_NAMESPACES = frozenset({"c10d", "_c10d_functional"})
# op name -> (collective kind, which argument holds the logical buffer, or "ret" / "ret*n")
_RULES: dict[str, tuple[str, str]] = {
    "allreduce_": ("all_reduce", "arg0"),
    "allreduce_coalesced_": ("all_reduce", "arg0"),
    "all_reduce": ("all_reduce", "arg0"),
    "all_reduce_": ("all_reduce", "arg0"),
    "all_reduce_coalesced": ("all_reduce", "arg0"),
    "all_reduce_coalesced_": ("all_reduce", "arg0"),
    "_allgather_base_": ("all_gather", "arg0"),
    "allgather_": ("all_gather", "arg0"),
    "allgather_into_tensor_coalesced_": ("all_gather", "arg0"),
    "all_gather_into_tensor": ("all_gather", "ret"),
    "all_gather_into_tensor_out": ("all_gather", "ret"),
    "all_gather_into_tensor_coalesced": ("all_gather", "ret"),
    "_reduce_scatter_base_": ("reduce_scatter", "arg1"),
    "reduce_scatter_": ("reduce_scatter", "arg1"),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", "arg1"),
    "reduce_scatter_tensor": ("reduce_scatter", "arg0"),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", "arg0"),
    "alltoall_base_": ("all_to_all", "arg1"),
    "alltoall_": ("all_to_all", "arg1"),
    "all_to_all_single": ("all_to_all", "arg0"),
    "broadcast_": ("broadcast", "arg0"),
    "broadcast": ("broadcast", "arg0"),
    "send": ("p2p", "arg0"),
    "recv_": ("p2p", "arg0"),
    "recv_any_source_": ("p2p", "arg0"),
    "reduce_": ("reduce", "arg0"),
    "gather_": ("gather", "arg0"),
    "scatter_": ("scatter", "arg0"),
}
# bookkeeping ops of the functional collectives: no data moves
_IGNORED = frozenset({"wait_tensor", "_wrap_tensor_autograd", "barrier", "monitored_barrier_"})


def tensor_bytes(value: Any) -> int:
    """Bytes held by a tensor or a (nested) list/tuple of tensors; 0 for anything else."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(v) for v in value)
    return 0


def _op_name(func: Any) -> str:
    return func._schema.name.split("::", 1)[-1]


class CollectiveMeter(TorchDispatchMode):
    """Counts collectives (per kind) and their payload bytes while it is active (``with meter:``)."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0
        self.counts: Counter[str] = Counter()
        self.unclassified: Counter[str] = Counter()

    def reset(self) -> None:
        """Forget what was counted so far."""
        self.bytes = 0
        self.counts.clear()
        self.unclassified.clear()

    def snapshot(self) -> tuple[int, dict[str, int]]:
        """(bytes, counts per collective kind) counted so far."""
        return self.bytes, dict(self.counts)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if any(t is DTensor for t in types):
            return NotImplemented  # let DTensor lower to plain collectives, which we then see
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if isinstance(func, torch._ops.OpOverload) and func.namespace in _NAMESPACES:
            name = _op_name(func)
            if name in _IGNORED:
                return out
            rule = _RULES.get(name)
            if rule is None:
                self.unclassified[name] += 1
                self.counts["other"] += 1
                self.bytes += tensor_bytes(args)
                return out
            kind, where = rule
            source = out if where == "ret" else args[int(where[3:])]
            self.counts[kind] += 1
            self.bytes += tensor_bytes(source)
        return out
