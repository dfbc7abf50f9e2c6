"""Checkpoint state encoding on the torch side: small tensors inside JSON, DCP tensor references, RNG states.

Split from ``checkpoint`` (which saves and loads); everything here is pure encoding with no file access.
"""

from __future__ import annotations

import base64
import random
from typing import Any

import numpy as np
import torch
from torch.distributed.tensor import DTensor

from .checkpoint_manifest import TAG, CheckpointError, from_json_value, to_json_value

__all__: list[str] = []


# ---- tensors inside JSON --------------------------------------------------------------------
def _inline_tensor(value: Any, where: str) -> Any:
    """Encode a small plain CPU/GPU tensor (scheduler scalars, RNG states) inside JSON."""
    if not isinstance(value, torch.Tensor):
        return NotImplemented
    if isinstance(value, DTensor):
        raise TypeError(f"{where} is a DTensor; distributed tensors belong in the model/optimizer state")
    flat = value.detach().cpu().contiguous().reshape(-1)
    raw = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    return {TAG: "tensor", "dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape),
            "data": base64.b64encode(raw).decode("ascii")}


def _decode_inline_tensor(doc: dict[str, Any], where: str) -> torch.Tensor:
    dtype = getattr(torch, doc["dtype"], None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"{where}: unknown tensor dtype {doc['dtype']!r}")
    raw = base64.b64decode(doc["data"])
    if not raw:
        return torch.empty(doc["shape"], dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(doc["shape"]).clone()


def _to_json(value: Any, where: str) -> Any:
    return to_json_value(value, where=where, default=_inline_tensor)


def _from_json(doc: Any, where: str, tensors: dict[str, torch.Tensor] | None = None) -> Any:
    decoders: dict[str, Any] = {"tensor": _decode_inline_tensor}
    if tensors is not None:
        decoders["dcp"] = lambda d, _w: tensors[d["key"]]
    return from_json_value(doc, where=where, decoders=decoders)


def _split(tree: Any, where: str) -> tuple[Any, dict[str, torch.Tensor]]:
    """JSON of ``tree`` with every tensor replaced by a reference to a DCP key (its path)."""
    tensors: dict[str, torch.Tensor] = {}

    def collect(value: Any, path: str) -> Any:
        if not isinstance(value, torch.Tensor):
            return NotImplemented
        tensors[path] = value
        return {TAG: "dcp", "key": path}

    return to_json_value(tree, where=where, default=collect), tensors


def _shape_record(tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    return {k: {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")} for k, t in tensors.items()}


# ---- RNG ------------------------------------------------------------------------------------
def _capture_rng() -> dict[str, Any]:
    state: dict[str, Any] = {"torch_cpu": torch.get_rng_state(), "torch_initial_seed": torch.initial_seed(),
                             "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        device = torch.cuda.current_device()
        state["torch_cuda"] = {"device": device, "state": torch.cuda.get_rng_state(device)}
    return state


def _restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch_cpu"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "torch_cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["torch_cuda"]["state"], torch.cuda.current_device())


def _reseed_rng(seed: int) -> None:
    torch.manual_seed(seed)  # also seeds every CUDA device
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
