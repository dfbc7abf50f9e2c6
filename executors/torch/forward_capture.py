"""Forward outputs of chosen submodules of a prepared torch_native session, for the verification harness.

Forward hooks (registered after ``prepare()``, so they run after FSDP2's and DTensor's own hooks) keep
what each module hands on, on this rank: its data-parallel rows, its context-parallel slice of the
sequence and, for a column-wise TP layer, its slice of the features. ``observables`` returns one
deferred unsharding per module (a zero-argument callable the harness calls after the traced step, so
these gathers are the harness's, not the executor's): features over tp (by the *workload's* tp_plan,
never by the layout the executor gave the layer), the sequence over cp (``context_parallel_unshard``),
rows over the data-parallel dims. Keys are the reference's: ``output`` for the root, ``output/<path>``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from .layouts import unwrap

SHARDED_FEATURE_STYLES = frozenset({"colwise"})
"""tp_plan style names whose layer output is this rank's slice of the last dimension (the rest are whole)."""


def output_key(path: str) -> str:
    """The observable key of a module's forward output: ``output`` for the root, else ``output/<path>``."""
    return f"output/{path}" if path else "output"


def expand_paths(module: nn.Module, patterns: Iterable[str]) -> list[str]:
    """Concrete submodule paths matching fnmatch ``patterns`` (in module order)."""
    names = [n for n, _ in module.named_modules() if n]
    wanted = list(patterns)
    return [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in wanted)]


def _local(value: Any) -> torch.Tensor | None:
    if isinstance(value, tuple) and value:
        value = value[0]
    if isinstance(value, DTensor):
        value = value.to_local()  # what the layer hands on on this rank, never a reduction the harness does
    return value.detach().clone() if isinstance(value, torch.Tensor) else None


class ForwardCapture:
    """Keeps the forward outputs of ``paths`` (path -> features sharded over tp?) of ``session``'s module."""

    def __init__(self, session: Any, paths: Mapping[str, bool]) -> None:
        self.session = session
        self.paths = dict(paths)
        self._seen: dict[str, list[torch.Tensor]] = {p: [] for p in self.paths}
        root = unwrap(session.module)
        self._handles = [root.get_submodule(path).register_forward_hook(self._hook(path)) for path in self.paths]

    def _hook(self, path: str) -> Callable[..., None]:
        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            local = _local(output)
            if local is not None:
                self._seen[path].append(local)

        return hook

    def begin_step(self) -> None:
        """Forget the outputs of the previous step."""
        for seen in self._seen.values():
            seen.clear()

    def observables(self, paths: Iterable[str]) -> dict[str, Callable[[], torch.Tensor]]:
        """Per path, a deferred unsharding of this step's outputs (micro-batches concatenated in order)."""
        out = {}
        for path in paths:
            parts = self._seen.get(path) or []
            if not parts:
                raise RuntimeError(f"module {path or '<root>'!r} produced no tensor output during the step")
            local = torch.cat(parts) if len(parts) > 1 else parts[0]
            out[output_key(path)] = self._unsharding(local, self.paths[path])
        return out

    def _unsharding(self, local: torch.Tensor, features_over_tp: bool) -> Callable[[], torch.Tensor]:
        session = self.session

        def unshard() -> torch.Tensor:
            value = local
            mesh = session.mesh
            names = tuple(mesh.mesh_dim_names or ()) if mesh is not None else ()
            if features_over_tp and "tp" in names and mesh["tp"].size() > 1:
                value = DTensor.from_local(value, mesh["tp"], [Shard(value.ndim - 1)]).full_tensor()
            if session.cp_mesh is not None:
                from torch.distributed.tensor.experimental._attention import context_parallel_unshard  # not re-exported

                value = context_parallel_unshard(session.cp_mesh, [value], [1])[0]
            data = tuple(n for n in ("dp_replicate", "dp_shard") if n in names and mesh[n].size() > 1)
            if data:
                value = DTensor.from_local(value, mesh[data], [Shard(0)] * len(data)).full_tensor()
            return value

        return unshard

    def close(self) -> None:
        """Remove the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
