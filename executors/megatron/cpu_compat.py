"""CPU compatibility layer for megatron-core: redirects its hard-coded CUDA calls to the CPU.

megatron-core allocates some tensors with ``device="cuda"`` or ``torch.cuda.current_device()``
and calls ``torch.cuda.synchronize()`` unconditionally. On a CPU-only machine (gloo process
groups) those calls fail although the computation itself is device-agnostic. This layer swaps
the module-global name ``torch`` inside a fixed list of megatron-core modules
(``PATCHED_MODULES``) for a thin proxy that

* answers ``torch.cuda.current_device()`` with ``"cpu"``,
* makes ``torch.cuda.synchronize()`` a no-op,
* rewrites ``device="cuda"`` (or ``"cuda:N"``, ``torch.device("cuda")``) to ``"cpu"`` in the
  tensor factories listed in ``REDIRECTED_FACTORIES``,

and forwards every other attribute to the real ``torch``. Nothing else in the process sees the
proxy: ``torch`` itself, other libraries and megatron modules outside the list are untouched.
The layer is installed only for a CPU device (``cpu_compat(device)`` does nothing for CUDA),
is reference-counted (idempotent when nested) and fully reversible (the original module
globals are restored when the last user leaves). docs/megatron.md lists every patched symbol.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
import types
from collections.abc import Iterator
from typing import Any

import torch

# megatron-core modules whose global ``torch`` is replaced while the layer is active, each with
# the hard-coded CUDA calls it makes on the code paths this backend runs (megatron-core 0.16.1).
PATCHED_MODULES: dict[str, tuple[str, ...]] = {
    "megatron.core.pipeline_parallel.schedules": ('torch.zeros(..., device="cuda")',),
    "megatron.core.pipeline_parallel.p2p_communication": (
        "torch.cuda.current_device()",
        "torch.cuda.synchronize()",
    ),
    "megatron.core.distributed.param_and_grad_buffer": (
        'torch.zeros(..., device="cuda")',
        "torch.cuda.current_device()",
    ),
    "megatron.core.optimizer.optimizer": (
        "torch.tensor(..., device='cuda')",
        "torch.cuda.current_device()",
    ),
    "megatron.core.utils": ('torch.tensor(..., device="cuda") in local_multi_tensor_l2_norm',),
    "megatron.core.transformer.moe.router": ("torch.cuda.current_device()",),
    "megatron.core.tensor_parallel.mappings": ("torch.cuda.current_device()",),
    "megatron.core.dist_checkpointing.strategies.filesystem_async": ("torch.cuda.synchronize()",),
    "megatron.core.dist_checkpointing.strategies.state_dict_saver": (
        "torch.tensor(..., device='cuda')",
        "torch.cuda.current_device()",
    ),
    "megatron.core.optimizer.clip_grads": (
        "torch.tensor(..., device='cuda')",
        "torch.zeros(..., device='cuda')",
    ),
}

# Names megatron-core 0.16.1 reads but defines only when Transformer Engine imports: the MoE
# router's gating reads ``te_general_gemm`` unconditionally (a NameError without TE). While the
# layer is active it is bound to None, which selects megatron's own torch.mm path.
MISSING_NAMES: dict[str, dict[str, Any]] = {
    "megatron.core.transformer.moe.moe_utils": {"te_general_gemm": None},
}

# Tensor factories whose ``device=`` argument is redirected from CUDA to the CPU.
REDIRECTED_FACTORIES: tuple[str, ...] = ("zeros", "empty", "ones", "tensor", "full", "arange")


def _is_cuda(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device == "cuda" or device.startswith("cuda:")
    return False


def _redirect_factory(name: str) -> Any:
    real = getattr(torch, name)

    def factory(*args: Any, **kwargs: Any) -> Any:
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        return real(*args, **kwargs)

    factory.__name__ = name
    factory.__doc__ = f"torch.{name} with a CUDA device redirected to the CPU (megatron CPU compat)."
    return factory


class _CudaOnCpu(types.ModuleType):
    """Stands in for ``torch.cuda`` inside the patched modules: CPU device, no-op synchronize."""

    def __init__(self) -> None:
        super().__init__("torch.cuda<megatron-cpu-compat>")

    @staticmethod
    def current_device() -> str:
        """The CPU, where megatron-core asked for the current CUDA device."""
        return "cpu"

    @staticmethod
    def synchronize(device: Any = None) -> None:
        """Nothing to wait for: CPU kernels are synchronous."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)


class _TorchOnCpu(types.ModuleType):
    """Stands in for ``torch`` inside the patched modules; forwards everything not redirected."""

    def __init__(self) -> None:
        super().__init__("torch<megatron-cpu-compat>")
        self.cuda = _CudaOnCpu()
        for name in REDIRECTED_FACTORIES:
            setattr(self, name, _redirect_factory(name))

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


_PROXY = _TorchOnCpu()
_lock = threading.RLock()
_users = 0
_originals: dict[str, Any] = {}
_added: dict[str, list[str]] = {}


def is_installed() -> bool:
    """True while the compatibility layer is active in this process."""
    with _lock:
        return _users > 0


def install_cpu_compat() -> None:
    """Activate the layer (reference-counted: a second install only counts another user)."""
    global _users
    with _lock:
        if _users == 0:
            for name in PATCHED_MODULES:
                module = importlib.import_module(name)
                current = module.__dict__.get("torch")
                if current is not torch:
                    raise RuntimeError(
                        f"{name}.torch is {current!r}, not the torch module; another patch is active. "
                        "Remove it before using the megatron backend on the CPU"
                    )
                _originals[name] = current
            for name in PATCHED_MODULES:
                importlib.import_module(name).__dict__["torch"] = _PROXY
            for name, values in MISSING_NAMES.items():
                namespace = importlib.import_module(name).__dict__
                added = [key for key in values if key not in namespace]
                for key in added:
                    namespace[key] = values[key]
                _added[name] = added
        _users += 1


def uninstall_cpu_compat() -> None:
    """Release one user; the last release restores every patched module's ``torch``."""
    global _users
    with _lock:
        if _users == 0:
            raise RuntimeError("uninstall_cpu_compat() called while the layer is not installed")
        _users -= 1
        if _users == 0:
            for name, original in _originals.items():
                importlib.import_module(name).__dict__["torch"] = original
            _originals.clear()
            for name, added in _added.items():
                namespace = importlib.import_module(name).__dict__
                for key in added:
                    namespace.pop(key, None)
            _added.clear()


@contextlib.contextmanager
def cpu_compat(device: Any = "cpu") -> Iterator[bool]:
    """Run the block with the layer active when ``device`` is the CPU; yields whether it is active."""
    if torch.device(device).type != "cpu":
        yield False
        return
    install_cpu_compat()
    try:
        yield True
    finally:
        uninstall_cpu_compat()
